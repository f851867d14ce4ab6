"""The compile cache and the crash guard (backends/torch_compile.py): a start that died in its
first compiled pass is followed by one that clears the cache and trains eagerly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from swarmling.backends import torch_compile
from swarmling.backends.torch_compile import FIRST_PASS_MARKER, cache_folder, first_pass_guarded, prepare


@pytest.fixture
def inductor_env(monkeypatch):
    """prepare() sets inductor's cache variable and compiler: put both back afterwards."""
    from torch._inductor import config as inductor

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setattr(inductor.cpp, "cxx", inductor.cpp.cxx)


def test_the_cache_is_one_folder_per_cpu_feature_set(monkeypatch, tmp_path):
    monkeypatch.setattr(torch_compile, "cpu_info", lambda: ("x", frozenset({"avx2", "avx512f"})))
    wide = cache_folder(tmp_path)
    monkeypatch.setattr(torch_compile, "cpu_info", lambda: ("x", frozenset({"avx2"})))
    assert cache_folder(tmp_path) != wide and cache_folder(tmp_path).parent == wide.parent


def test_a_start_points_inductor_at_this_machines_folder_unless_the_user_chose_one(inductor_env, monkeypatch, tmp_path):
    from torch._inductor import config as inductor

    assert prepare("/usr/bin/g++", tmp_path, tmp_path / "run") is None
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(cache_folder(tmp_path)) and inductor.cpp.cxx == ("/usr/bin/g++",)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/somewhere/chosen")
    prepare("/usr/bin/g++", tmp_path, tmp_path / "run")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/somewhere/chosen"


def test_the_marker_stands_only_while_a_first_compiled_pass_runs(tmp_path):
    marker = tmp_path / FIRST_PASS_MARKER
    assert first_pass_guarded(tmp_path, True, lambda: marker.exists()) is True
    assert not marker.exists()
    with pytest.raises(ValueError):  # an exception is no crash: the trainer's fallback handles those
        first_pass_guarded(tmp_path, True, lambda: (_ for _ in ()).throw(ValueError("x")))
    assert not marker.exists()
    assert first_pass_guarded(tmp_path, False, lambda: marker.exists()) is False  # proven: no marker


def test_a_crash_in_the_first_compiled_pass_makes_the_next_start_clear_the_cache_and_run_eagerly(inductor_env, tmp_path):
    cache, runtime = tmp_path / "cache", tmp_path / "run"
    runtime.mkdir()
    cache_folder(cache).mkdir(parents=True)
    (cache_folder(cache) / "kernel.so").write_text("built for another instruction set")
    crash = textwrap.dedent(f"""
        import os, signal
        from swarmling.backends.torch_compile import first_pass_guarded
        first_pass_guarded({str(runtime)!r}, True, lambda: os.kill(os.getpid(), signal.SIGSEGV))
    """)
    died = subprocess.run([sys.executable, "-c", crash], capture_output=True)
    assert died.returncode == -signal.SIGSEGV
    assert (runtime / FIRST_PASS_MARKER).exists()
    why = prepare("/usr/bin/g++", cache, runtime)
    assert why is not None and "died in its first compiled pass" in why
    assert not cache_folder(cache).exists() and not (runtime / FIRST_PASS_MARKER).exists()
    assert prepare("/usr/bin/g++", cache, runtime) is None  # the start after compiles again


def test_the_backend_line_says_why_a_start_runs_eagerly(backend_factory, tmp_path):
    runtime = tmp_path / "run"
    runtime.mkdir()
    (runtime / FIRST_PASS_MARKER).write_text("")
    backend = backend_factory(runtime, compiler="/usr/bin/g++", compile_reason="compiled: /usr/bin/g++")
    assert not backend.trainer.compiled and backend.switches().compiled is None
    assert "eager: the last start died in its first compiled pass" in backend.info().trainer
