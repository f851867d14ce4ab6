"""torch.compile on the CPU trainer: the switch that runs its decoder layers compiled, with the
fallback to eager when compiling fails; where the code generator (inductor) keeps what it built;
and the guard against a start that dies in it.

Inductor's on-disk cache is not keyed by the instruction set its kernels were built for. Measured
here: after one run with torch held to AVX2 on an AVX-512 CPU, every compiled start crashed
(a segfault, or glibc's "corrupted size"), and a crash is not an exception the trainer's fallback
can catch: a node would crash again at every restart. So the cache lives under the node's cache
folder, one folder per torch version, instruction set torch dispatches to, CPU feature set and
compiler (a home folder moved to another machine starts afresh), and while a first compiled pass
runs a marker stands in the node's runtime folder. A process that dies in that pass leaves it
(a forced quit takes it down first: `abandon_first_pass`); the next start then empties the
folder and trains eagerly once; after a second such death (on a fresh cache) it stays eager on
this machine until the note beside the folder is deleted. A first compiled pass that ends well
deletes the note.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import torch

from .cpu_features import cpu_info

log = logging.getLogger(__name__)

CACHE_FOLDER = "torch-compile"
FIRST_PASS_MARKER = "compiling.marker"  # in the node's runtime folder while its first compiled pass runs
CRASHED_NOTE = ".crashed"  # beside a cache folder that was emptied after a crash
COMPILED_GRAPHS = 32  # graphs a compiled layer may build (see CompiledLayers.on)
T = TypeVar("T")
_standing: set[Path] = set()  # markers this process has up


# Compiling traces with torch.fx, which patches torch.nn.Module.__call__ for the whole process
# while it traces: a module called eagerly on another thread meanwhile goes through the tracer
# and fails ("module is not installed as a submodule"; seen once in the test suite when the
# graphs were built on a background thread beside eager steps). So passes through the layers,
# the node's and a background build's alike, run one at a time: a background build runs between
# the node's passes (while it generates, scores, evaluates), and a step waits at most for the
# build's pass in progress.
ONE_PASS_AT_A_TIME = threading.RLock()


class CompiledLayers:
    """Whether a model's decoder layers run through torch.compile (train.cpu_compile): inductor
    fuses the elementwise ops and casts between the matmuls into generated C++, which is most of a
    bf16 step once AMX makes the matmuls cheap (a default step 1.3-1.4x faster in bf16, ~1.2x in
    fp32, on 2 cores). The graphs are built in the first compiled passes (about a minute on 2 cores,
    ~20 s once the on-disk cache holds them), or beforehand in the background on a replica
    (`build_in_background`, compile_warmup.py), shared by all 30 layers; shapes are dynamic, so a longer
    batch needs no new graph, but a first one-row batch or a first pass of another kind (without
    gradients, with the adapter off) builds its own. A compiled pass that fails in compiling
    before the first training step has succeeded compiled (no C++ compiler after all, an inductor
    fault) runs again eagerly, and compiling stays off."""

    def __init__(self, layers: Sequence[torch.nn.Module], on_fallback: Callable[[], None]) -> None:
        self._layers = layers
        self._on_fallback = on_fallback  # what a failed pass leaves to clean up (the trainer's gradients)
        self._on = False
        self.proven = False  # a compiled training step has completed: no fallback is tried after that
        self.failure = ""  # why compiling was given up, if it was
        self._background = None  # a BackgroundCompile (compile_warmup.py) whose graphs these layers will use
        self._when_built: Callable[[], None] = lambda: None
        self._when_failed: Callable[[], None] = lambda: None
        self.built_in_background = None  # its report once adopted: seconds, graphs, where they were compiled
        self._depth = 0  # passes under way (one inside another: the anchor's reference in a step)

    @property
    def on(self) -> bool:
        return self._on

    @property
    def pending(self) -> bool:
        """Graphs are being built in the background: compiling goes on once they are."""
        return self._background is not None

    @property
    def built(self) -> bool:
        """The background build is done: the next pass adopts it."""
        return self._background is not None and self._background.done

    def build_in_background(self, background, when_built: Callable[[], None],
                            when_failed: Callable[[], None] = lambda: None) -> None:
        """Train eagerly until `background` has built the graphs, then compile (`adopt`), after
        `when_built()` (a bf16 base chosen for the compiled trainer goes on with it); `when_failed()`
        if the build fails (a bf16 base the user forced goes on without it)."""
        self._background, self._when_built, self._when_failed = background, when_built, when_failed

    def abandon_build(self) -> None:
        """The trainer is closing: the background build stops after its pass under way, unused."""
        background, self._background = self._background, None
        if background is not None:
            background.stop()

    def adopt(self, wait: bool = False) -> None:
        """Between passes, on the trainer's thread: compiling on if the background build is done
        (after waiting for it, with `wait`); off for good, and why, if it failed."""
        background = self._background
        if background is None or not (wait or background.done):
            return
        background.wait()
        self._background = None
        if background.failure:
            self.failure = background.failure
            log.warning("torch.compile failed in the background, training without it: %s", self.failure)
            self._when_failed()
            return
        self.built_in_background = (background.seconds, background.graphs, background.how)
        log.info("compiled graphs built in the background in %.0f s (%d graphs, %s); training compiled from now on",
                 background.seconds, background.graphs, background.how)
        self._when_built()
        self.on = True

    @on.setter
    def on(self, on: bool) -> None:
        if self._background is not None:  # an explicit choice waits for the build it would race with
            self.adopt(wait=True)
        if bool(on) == self._on:
            return
        if on:
            # One graph per combination of what a layer is called with (with or without gradients,
            # an input that needs one or not, one row or several, autocast on or off): up to ~12,
            # past torch's default of 8, beyond which it would run the rest eagerly.
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, COMPILED_GRAPHS)
        for layer in self._layers:
            if on:
                layer.compile(dynamic=True)
            else:
                layer._compiled_call_impl = None  # what Module.compile set: plain calls again
        self._on = bool(on)

    def run(self, run: Callable[..., T], *args, proves: bool = False) -> T:
        """`run(*args)`, and again eagerly (for good) if compiling fails in it before a compiled
        training step (`proves`) has succeeded: a compile fault costs the user speed, never a
        round. Errors of the computation itself are not compile faults: they propagate. One pass
        at a time in the process (`ONE_PASS_AT_A_TIME`)."""
        with ONE_PASS_AT_A_TIME:
            self._depth += 1
            try:
                if self._depth == 1:  # a pass inside a pass (the anchor's reference) runs as its step does
                    self.adopt()
                return self._run(run, *args, proves=proves)
            finally:
                self._depth -= 1

    def _run(self, run: Callable[..., T], *args, proves: bool = False) -> T:
        if not self._on or self.proven:
            return run(*args)
        try:
            result = run(*args)
        except Exception as error:
            if not from_compiling(error):
                raise
            self._on_fallback()
            self.on = False
            self.failure = f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"
            log.warning("torch.compile failed, training without it: %s", self.failure)
            return run(*args)
        self.proven = self.proven or proves
        return result


def graphs_compiled() -> int:
    """Graphs torch.compile has built in this process so far (dynamo's count): a stretch of work
    during which it rose was compiling (bench reports such rounds apart from steady ones)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def cache_folder(cache_dir: Path, compiler: str = "") -> Path:
    """This machine's inductor cache: keyed by torch's version, the instruction set it dispatches
    to (ATEN_CPU_CAPABILITY can lower it), the CPU's flags and the compiler."""
    key = " ".join([torch.backends.cpu.get_cpu_capability(), compiler, *sorted(cpu_info()[1])])
    return Path(cache_dir) / CACHE_FOLDER / f"torch-{torch.__version__}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def prepare(compiler: str, cache_dir: Path, runtime_dir: Path, threads: int) -> str | None:
    """Point inductor at `compiler`, this machine's cache folder and the node's thread count.
    Returns why this start does not compile (a death in the first compiled pass; a torch without
    what this needs), or None."""
    try:
        from torch._inductor import config as inductor
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        torch._dynamo.config.recompile_limit  # noqa: B018 - named in CompiledLayers.on
    except (ImportError, AttributeError) as error:
        return f"torch {torch.__version__} lacks what compiling needs here ({error})"
    folder = cache_folder(cache_dir, compiler)
    crashed = folder.with_name(folder.name + CRASHED_NOTE)
    deaths = _deaths(crashed)
    marker = Path(runtime_dir) / FIRST_PASS_MARKER
    if marker.exists():
        marker.unlink(missing_ok=True)
        deaths += 1
        shutil.rmtree(folder, ignore_errors=True)
        crashed.parent.mkdir(parents=True, exist_ok=True)
        crashed.write_text(f"{deaths} start(s) died in their first compiled pass; the cache was emptied\n")
        log.warning("the last start's first compiled pass died (in the node or the process compiling for it): "
                    "its compile cache is emptied, and this start trains without torch.compile")
        if deaths == 1:
            return "the last start died in its first compiled pass (cache emptied; the next start compiles again)"
    if deaths >= 2:
        return f"starts died in their first compiled pass twice on this machine (delete {crashed} to try again)"
    # torch fills the variable with its /tmp default once anything asks; only a user's own choice wins.
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR") in (None, os.path.abspath(default_cache_dir())):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    use_compiler(compiler, threads)  # its workers and compiler jobs, within the node's share
    return None


def use_compiler(compiler: str, jobs: int) -> None:
    """Inductor's C++ compiler, and how many compile jobs it runs at once (the node's, and the
    child that compiles for it: compile_process.py)."""
    from torch._inductor import config as inductor

    inductor.cpp.cxx = (compiler,)
    inductor.compile_threads = max(1, jobs)


def _deaths(note: Path) -> int:
    try:
        return int(note.read_text().split()[0])
    except FileNotFoundError:
        return 0
    except (OSError, ValueError, IndexError):  # unreadable: it was written after one death at least
        return 1


def first_pass_guarded(runtime_dir: Path, cache_dir: Path, compiler: str, unproven: bool, run: Callable[[], T]) -> T:
    """`run()`, with the marker standing while it runs if it is the first compiled pass: only a
    death of the process leaves it behind (an exception takes it down); a pass that ends well
    also clears a crash note."""
    if not unproven:
        return run()
    marker = Path(runtime_dir) / FIRST_PASS_MARKER
    marker.write_text(f"a compiled pass began in process {os.getpid()} and did not end\n")
    _standing.add(marker)
    try:
        result = run()
    finally:
        marker.unlink(missing_ok=True)
        _standing.discard(marker)
    folder = cache_folder(cache_dir, compiler)
    folder.with_name(folder.name + CRASHED_NOTE).unlink(missing_ok=True)
    return result


def count_a_death(runtime_dir: Path) -> None:
    """A process that compiled for this node died (compile_process.py's child): the next start
    reads it as a start that died in its first compiled pass."""
    marker = Path(runtime_dir) / FIRST_PASS_MARKER
    marker.write_text("the process compiling this node's graphs died\n")


def abandon_first_pass() -> None:
    """A forced quit is no crash: take this process's markers down before it exits."""
    for marker in list(_standing):
        marker.unlink(missing_ok=True)
        _standing.discard(marker)


def from_compiling(error: BaseException) -> bool:
    """Whether an exception came out of torch.compile's machinery (dynamo, AOT autograd,
    inductor), as opposed to the computation (a bad batch, memory)."""
    while error is not None:
        tb = error.__traceback__
        while tb is not None:
            name = tb.tb_frame.f_code.co_filename.replace(os.sep, "/")
            if any(part in name for part in ("/torch/_dynamo/", "/torch/_inductor/", "/torch/_functorch/")):
                return True
            tb = tb.tb_next
        error = error.__cause__ or error.__context__
    return False
