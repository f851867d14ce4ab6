"""Shared fixtures: the real shipped model, real llama.cpp, real torch/peft.

The GGUF -> torch conversion (about 25 s) is cached once per machine in a test cache dir, like
the node caches it in the user's cache dir.

Two tiers: `pytest -m "not slow"` runs what needs no model (pure logic, the fake backend in
fakes.py, real libp2p hosts), in about four minutes on 2 cores; plain `pytest` (CI, the README's command) runs
everything. A test that loads the model through the fixtures below is marked slow here; one that
starts a real node another way carries `@pytest.mark.slow` itself.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs
import pytest

TEST_CACHE = Path(os.environ.get("SWARMLING_TEST_CACHE", platformdirs.user_cache_dir("swarmling-tests")))
os.environ.setdefault("SWARMLING_CACHE_DIR", str(TEST_CACHE))
# Nodes started by tests that are not about the swarm run alone (no port, no mDNS on the test
# machine); swarm tests switch it on with --set, which outranks the environment.
os.environ["SWARMLING_SWARM__ENABLED"] = "false"
# Likewise without the held-out evaluation at start (96 replies), except where a test asks for it.
os.environ["SWARMLING_EVAL__EVERY_ROUNDS"] = "0"
# And with the trainer's layers uncompiled: compiling takes ~1 min per new process on 2 cores, and
# what it computes is tested once against the eager layers (test_shared_prefix.py).
os.environ["SWARMLING_TRAIN__CPU_COMPILE"] = "off"
# The compile test's kernels: in the test cache, not torch's shared /tmp folder (another run's
# kernels there, built for another instruction set, crash a process that loads them).
def _instruction_sets() -> str:
    import hashlib

    from swarmling.backends.cpu_features import cpu_info

    key = " ".join([os.environ.get("ATEN_CPU_CAPABILITY", ""), *sorted(cpu_info()[1])])
    return hashlib.sha256(key.encode()).hexdigest()[:12]


os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(TEST_CACHE / "torch-compile-tests" / _instruction_sets()))


MODEL_FIXTURES = {"generator", "backend", "backend_factory", "torch_backend", "mlx_backend"}


def pytest_collection_modifyitems(items):
    for item in items:
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def gguf_path() -> Path:
    from swarmling.app.models import DEFAULT_MODEL, resolve_model

    return resolve_model(DEFAULT_MODEL, TEST_CACHE).gguf


def make_backend(gguf: Path, runtime: Path, temperature: float = 1.0, **kw):
    from backend_settings import trainer_settings

    from swarmling.backends.cpu import CpuBackend, CpuSettings

    kw = {"threads": os.cpu_count() or 2, **trainer_settings(), **kw}
    return CpuBackend(
        CpuSettings(
            gguf=gguf,
            model_name="smollm2-135m",
            cache_dir=TEST_CACHE,
            runtime_dir=runtime,
            temperature=temperature,
            **kw,
        )
    )


@pytest.fixture(scope="session")
def test_cache() -> Path:
    """Where tests keep converted models and compiled kernels across runs (SWARMLING_TEST_CACHE)."""
    return TEST_CACHE


@pytest.fixture(scope="session")
def hf_model(gguf_path) -> Path:
    """The shipped model as a transformers folder (converted once, cached): what torch and MLX load."""
    from swarmling.backends.hf_from_gguf import converted_folder

    return converted_folder(gguf_path, TEST_CACHE)


@pytest.fixture(scope="session")
def cpu_backend_maker():
    """`make_backend` for fixtures of any scope (the caller closes what it makes)."""
    return make_backend


@pytest.fixture(scope="session")
def generator(gguf_path):
    from swarmling.backends.llama_cpp_generator import LlamaCppGenerator

    gen = LlamaCppGenerator(gguf_path, os.cpu_count() or 2)
    yield gen
    gen.close()


@pytest.fixture
def backend_factory(gguf_path):
    made = []

    def factory(runtime: Path, **kw):
        made.append(make_backend(gguf_path, runtime, **kw))
        return made[-1]

    yield factory
    for b in made:
        b.close()


@pytest.fixture
def backend(gguf_path, tmp_path):
    b = make_backend(gguf_path, tmp_path / "runtime")
    yield b
    b.close()


def _module_imports(path: Path) -> set[str]:
    """The modules a source file of the project imports, as absolute dotted names (relative imports
    resolved from where the file sits: the repository's root is the `swarmling` package)."""
    import ast

    package = ["swarmling", *path.resolve().relative_to(Path(__file__).resolve().parents[1]).parent.parts]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            found |= {".".join([*base, node.module])} if node.module else {".".join([*base, a.name]) for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return found


@pytest.fixture(scope="session")
def module_imports():
    """`(path) -> set[str]`: what a source file imports (the layer tests read it)."""
    return _module_imports
