"""The compile cache and the crash guard (backends/torch_compile.py): a start that died in its
first compiled pass is followed by one that empties the cache and trains eagerly; a second such
death keeps this machine eager; a forced quit is no crash."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from swarmling.backends import torch_compile
from swarmling.backends.settings import CpuTrainerChoice
from swarmling.backends.torch_compile import (
    FIRST_PASS_MARKER,
    CompiledLayers,
    abandon_first_pass,
    cache_folder,
    first_pass_guarded,
    from_compiling,
    prepare,
)

GXX = "/usr/bin/g++"


@pytest.fixture
def inductor_env(monkeypatch):
    """prepare() sets inductor's cache variable, compiler and worker count: put them back afterwards."""
    from torch._inductor import config as inductor

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setattr(inductor.cpp, "cxx", inductor.cpp.cxx)
    monkeypatch.setattr(inductor, "compile_threads", inductor.compile_threads)


def test_the_cache_is_one_folder_per_instruction_set_and_compiler(monkeypatch, tmp_path):
    import torch

    monkeypatch.setattr(torch_compile, "cpu_info", lambda: ("x", frozenset({"avx2", "avx512f"})))
    # torch's dispatch on an AVX-512 machine, whatever this one has (on an AVX2-only CPU torch
    # already says AVX2, and lowering it below would change nothing)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    wide = cache_folder(tmp_path, GXX)
    assert cache_folder(tmp_path, "/usr/bin/clang++") != wide
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")  # ATEN_CPU_CAPABILITY=avx2
    assert cache_folder(tmp_path, GXX) != wide
    monkeypatch.setattr(torch_compile, "cpu_info", lambda: ("x", frozenset({"avx2"})))
    assert cache_folder(tmp_path, GXX).parent == wide.parent


def test_a_start_points_inductor_at_this_machines_folder_unless_the_user_chose_one(inductor_env, monkeypatch, tmp_path):
    from torch._inductor import config as inductor

    assert prepare(GXX, tmp_path, tmp_path / "run", threads=2) is None
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(cache_folder(tmp_path, GXX))
    assert inductor.cpp.cxx == (GXX,) and inductor.compile_threads == 2  # within the node's share
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/somewhere/chosen")
    prepare(GXX, tmp_path, tmp_path / "run", threads=2)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/somewhere/chosen"


def test_the_marker_stands_only_while_a_first_compiled_pass_runs(tmp_path):
    marker = tmp_path / FIRST_PASS_MARKER
    assert first_pass_guarded(tmp_path, tmp_path, GXX, True, lambda: marker.exists()) is True
    assert not marker.exists()
    with pytest.raises(ValueError):  # an exception is no crash: the trainer's fallback handles those
        first_pass_guarded(tmp_path, tmp_path, GXX, True, lambda: (_ for _ in ()).throw(ValueError("x")))
    assert not marker.exists()
    assert first_pass_guarded(tmp_path, tmp_path, GXX, False, lambda: marker.exists()) is False  # proven


def crash_in_first_pass(cache, runtime, how="os.kill(os.getpid(), signal.SIGSEGV)"):
    code = textwrap.dedent(f"""
        import os, signal
        from swarmling.backends.torch_compile import abandon_first_pass, first_pass_guarded
        first_pass_guarded({str(runtime)!r}, {str(cache)!r}, {GXX!r}, True, lambda: {how})
    """)
    return subprocess.run([sys.executable, "-c", code], capture_output=True).returncode


def test_a_crash_in_the_first_compiled_pass_makes_the_next_start_empty_the_cache_and_run_eagerly(inductor_env, tmp_path):
    cache, runtime = tmp_path / "cache", tmp_path / "run"
    runtime.mkdir()
    cache_folder(cache, GXX).mkdir(parents=True)
    (cache_folder(cache, GXX) / "kernel.so").write_text("built for another instruction set")
    assert crash_in_first_pass(cache, runtime) == -signal.SIGSEGV
    assert (runtime / FIRST_PASS_MARKER).exists()
    why = prepare(GXX, cache, runtime, threads=2)
    assert why is not None and "died in its first compiled pass" in why
    assert not cache_folder(cache, GXX).exists() and not (runtime / FIRST_PASS_MARKER).exists()
    assert prepare(GXX, cache, runtime, threads=2) is None  # the start after compiles again, afresh
    # ... and dies again: from then on this machine trains eagerly, until the note is deleted
    assert crash_in_first_pass(cache, runtime) == -signal.SIGSEGV
    for _ in range(2):
        why = prepare(GXX, cache, runtime, threads=2)
        assert why is not None and "twice" in why and "delete" in why


def test_a_first_pass_that_ends_well_forgets_an_earlier_crash(inductor_env, tmp_path):
    cache, runtime = tmp_path / "cache", tmp_path / "run"
    runtime.mkdir()
    assert crash_in_first_pass(cache, runtime) == -signal.SIGSEGV
    assert prepare(GXX, cache, runtime, threads=2) is not None
    first_pass_guarded(runtime, cache, GXX, True, lambda: None)
    assert crash_in_first_pass(cache, runtime) == -signal.SIGSEGV
    assert "compiles again" in prepare(GXX, cache, runtime, threads=2)  # a first death again, not a second


def test_a_forced_quit_in_the_first_pass_is_not_taken_for_a_crash(tmp_path):
    runtime = tmp_path / "run"
    runtime.mkdir()
    assert crash_in_first_pass(tmp_path, runtime, how="(abandon_first_pass(), os._exit(130))") == 130
    assert not (runtime / FIRST_PASS_MARKER).exists()


def test_compile_faults_are_told_from_errors_of_the_computation():
    def inductor_fault():
        exec(compile("raise RuntimeError('C++ compile error')", "/x/torch/_inductor/cpp_builder.py", "exec"))

    try:
        try:
            inductor_fault()
        except RuntimeError as inner:
            raise ValueError("wrapped by the trainer") from inner
    except ValueError as error:
        assert from_compiling(error)
    try:
        raise MemoryError("the batch")
    except MemoryError as error:
        assert not from_compiling(error)


def raised_in_inductor(message: str) -> None:
    """Raise as inductor's C++ builder would: from a frame in torch/_inductor."""
    exec(compile(f"raise RuntimeError({message!r})", "/site-packages/torch/_inductor/cpp_builder.py", "exec"))


def switch_over_layers() -> tuple[CompiledLayers, list]:
    """A switch over two small layers, and the record of its fallback's clean-ups."""
    import torch

    cleaned: list[bool] = []
    return CompiledLayers([torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)], lambda: cleaned.append(True)), cleaned


def test_a_pass_that_fails_compiling_runs_again_eagerly_and_compiling_stays_off():
    """A compile fault (no C++ compiler, an inductor error) before the first compiled training
    step costs the user speed, never a round: the pass runs again eagerly, and the failure is
    kept to be shown. An error of the computation itself is no compile fault: it propagates."""
    compiling, cleaned = switch_over_layers()
    seen = []

    def first_pass(value):
        seen.append(compiling.on)
        if compiling.on:
            raised_in_inductor("InductorError: C++ compile error\n(details)")
        return value

    def bad_batch():
        raise ValueError("a bad batch")

    compiling.on = True  # compiles nothing until a layer runs
    assert all(layer._compiled_call_impl is not None for layer in compiling._layers)
    with pytest.raises(ValueError):
        compiling.run(bad_batch)
    assert compiling.on and not compiling.failure and not cleaned
    assert compiling.run(first_pass, 7) == 7
    assert seen == [True, False] and not compiling.on and cleaned == [True]
    assert all(layer._compiled_call_impl is None for layer in compiling._layers)  # plain calls again
    assert compiling.failure == "RuntimeError: InductorError: C++ compile error"


def test_only_a_compiled_training_step_ends_the_fallback():
    """A pass without gradients compiles other graphs than a training step: its success leaves
    the fallback in place for the first step."""
    compiling, _ = switch_over_layers()
    compiling.on = True
    compiling.run(lambda: None)
    assert not compiling.proven
    compiling.run(lambda: None, proves=True)
    assert compiling.proven


def test_the_backend_line_says_why_a_start_runs_eagerly(backend_factory, tmp_path, test_cache):

    note = cache_folder(test_cache, GXX).with_name(cache_folder(test_cache, GXX).name + torch_compile.CRASHED_NOTE)
    note.unlink(missing_ok=True)  # the shared test cache: no earlier run's note
    runtime = tmp_path / "run"
    runtime.mkdir()
    (runtime / FIRST_PASS_MARKER).write_text("")
    try:
        backend = backend_factory(runtime, cpu_trainer=CpuTrainerChoice(compiler=GXX, compile_reason=f"compiled: {GXX}"))
        assert not backend.trainer.compiling.on and backend.switches().compiled is None
        assert "eager: the last start died in its first compiled pass" in backend.info().trainer
    finally:
        note.unlink(missing_ok=True)
