"""The replica's graphs compiled in a child process first, so that the node's own process only
loads them.

Why: tracing runs one pass at a time in a process (torch_compile.ONE_PASS_AT_A_TIME), so a step
that begins while the background build compiles waits for the build's pass in progress; with a
cold cache one such pass took 69 s at low priority on one thread (a volunteer's first update at
3 min 7 s, on a 2-core AVX2 EPYC). A child process holds no lock of ours: it compiles the replica
into the node's on-disk cache (inductor's FX graph cache and AOT autograd's cache, keyed by the
graph, not by the process), and the build in the node's process that follows finds every graph
there. Measured on the same machine at one thread (a six-group step, fp32): the real model's first
compiled step took 54 s on an empty cache and 16 s on one a child had filled from the replica
(eager steps 3.6-4.2 s), its first one-group step 40 s and 4.4 s.

A child that crashes (a compiler fault, a bad cache) takes nothing down with it: the node trains
on eagerly, and the crash counts as a death in a first compiled pass (the next start empties the
cache; a second such death keeps compiling off on this machine). The child holds the read end of
a pipe whose other end only the node holds: when the node ends, however it ends (a forced quit's
os._exit, SIGKILL), the pipe closes and the child exits at once. It costs ~0.6 GB of memory
beside the node while it runs (measured: 572 MB peak on a warm cache), the first start only.

The child builds the replica from `RECIPE` in its folder: the node's trainer settings, so that
its graphs are the node's. Once a recipe built, a note in the cache says so (keyed by the recipe,
the architecture and the versions of what builds the graphs), and the next start skips the child
(its build in the node's process then finds the graphs on disk)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

from .settings import GrpoSettings, LoraSettings, OptimSettings

RECIPE = "recipe.json"  # in the replica's folder
ERRORS = "errors.txt"  # in the replica's folder: the child's stderr (a file: a pipe it filled would block it)
BUILT_NOTES = "replicas-built"  # in the compile cache: one empty file per recipe whose graphs it holds
POLL_S = 0.5
# Signals of a fault in the child's own code (compiled kernels, a bad cache); a kill from outside
# (the OOM killer, a shutdown) says nothing about the cache.
CRASHES = {getattr(signal, name) for name in ("SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT")
           if hasattr(signal, name)}
VERSIONED = ("torch", "transformers", "peft", "swarmling")  # what builds the graphs: a new one builds anew


@dataclass(frozen=True)
class ReplicaRecipe:
    """What the replica's trainer is made with, in the node's process and in the child alike."""

    lora: LoraSettings
    optim: OptimSettings
    grpo: GrpoSettings
    temperature: float
    seed: int
    bf16_base: bool
    activation_checkpointing: bool
    compiler: str  # the C++ compiler inductor runs (torch_compile.prepare)
    threads: int  # torch's threads in the node: the generated kernels are built for that many

    def trainer(self, folder: Path):
        from .torch_lora import TorchLoraTrainer

        trainer = TorchLoraTrainer(folder, self.lora, self.optim, self.grpo, self.temperature, device="cpu",
                                   seed=self.seed)
        trainer.bf16_base, trainer.activation_checkpointing = self.bf16_base, self.activation_checkpointing
        return trainer

    def write(self, folder: Path) -> None:
        (folder / RECIPE).write_text(json.dumps(asdict(self)))

    @classmethod
    def read(cls, folder: Path) -> ReplicaRecipe:
        fields = json.loads((folder / RECIPE).read_text())
        lora = fields.pop("lora")
        lora = LoraSettings(**{**lora, "target_modules": tuple(lora["target_modules"])})  # JSON made it a list
        return cls(lora, OptimSettings(**fields.pop("optim")), GrpoSettings(**fields.pop("grpo")), **fields)

    def key(self, folder: Path) -> str:
        """This recipe on this architecture (the replica's config.json) with these versions of what
        builds the graphs: what decides them (not the folder, which is new at every start)."""
        text = json.dumps([asdict(self), json.loads((folder / "config.json").read_text()), _versions()], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _versions() -> dict[str, str]:
    found = {}
    for package in VERSIONED:
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = "?"
    return found


def inductor_cache_in_use() -> Path | None:
    """The compile cache the node's process and its child share (torch_compile.prepare set it)."""
    folder = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    return Path(folder) if folder else None


def built_note(recipe: ReplicaRecipe, folder: Path) -> Path | None:
    cache = inductor_cache_in_use()
    return cache / BUILT_NOTES / recipe.key(folder) if cache else None


def compile_in_child(recipe: ReplicaRecipe, folder: Path, stopped: threading.Event,
                     crashed: Callable[[], None]) -> str:
    """The replica saved in `folder` compiled in a child process at the lowest priority, unless
    the cache holds its graphs already; returns what happened, for the log. Raises if the child
    failed (its reason) or `stopped` was set (the child is killed: it holds no marker, no lock).
    A child that crashed (`CRASHES`) is told to `crashed()`, which counts it as a start that died in
    its first compiled pass (torch_compile.prepare's policy: the next start empties the cache)."""
    note = built_note(recipe, folder)
    if note is not None and note.exists():
        return "the cache held the graphs"
    recipe.write(folder)
    child, lifeline = _start_child(folder)
    try:
        while child.poll() is None:
            if stopped.wait(POLL_S):
                raise RuntimeError("the backend closed before the compiled graphs were built")
    finally:
        os.close(lifeline)
        if child.poll() is None:
            _kill(child)
    if child.returncode < 0:
        if -child.returncode in CRASHES:
            crashed()
        raise RuntimeError(f"the compiling process died ({_signal_name(-child.returncode)}){_last_line(folder, ': ')}")
    if child.returncode != 0:
        raise RuntimeError(_last_line(folder) or f"the compiling process failed ({child.returncode})")
    if note is not None:
        note.parent.mkdir(parents=True, exist_ok=True)
        note.touch()
    return "compiled in a child process"


def _start_child(folder: Path) -> tuple[subprocess.Popen, int]:
    """The child on `folder`, and the write end of its lifeline (the node closes it when done).
    A session of its own: a Ctrl+C in the node's terminal is the node's to handle, not a crash of
    the child's; the folder as its working directory, so no `swarmling` folder where the node was
    started from stands in for the installed package."""
    read_end, lifeline = os.pipe()
    try:
        with open(folder / ERRORS, "w") as errors:
            child = subprocess.Popen([sys.executable, "-m", __name__, str(folder), str(read_end)],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errors,
                                     pass_fds=(read_end,), start_new_session=True, cwd=folder)
    except BaseException:
        os.close(lifeline)
        raise
    finally:
        os.close(read_end)
    return child, lifeline


def _kill(child: subprocess.Popen) -> None:
    """The child and what it started (a C++ compiler): its whole process group."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (AttributeError, ProcessLookupError, PermissionError):
        child.kill()
    child.wait()


def _last_line(folder: Path, prefix: str = "") -> str:
    try:
        lines = [line for line in (folder / ERRORS).read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return prefix + lines[-1][:200] if lines else ""


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # a real-time signal has no name
        return f"signal {number}"


def main(folder: str, lifeline: int) -> int:
    """The child: the replica in `folder` built from its recipe and every pass kind run compiled;
    it exits at once when `lifeline` closes (the node has ended)."""
    threading.Thread(target=_exit_when_closed, args=(lifeline,), daemon=True).start()
    import torch

    from .compile_warmup import exercise, lower_this_threads_priority
    from .torch_compile import use_compiler

    lower_this_threads_priority()  # the C++ compilers it starts inherit it
    recipe = ReplicaRecipe.read(Path(folder))
    # A graph's cache key holds the thread count its kernels were generated for (measured: a
    # child at one thread and a node at two shared no graph).
    torch.set_num_threads(recipe.threads)
    use_compiler(recipe.compiler, jobs=1)  # as the node's own build (compile_warmup.py)
    replica = recipe.trainer(Path(folder))
    replica.compiling.on = True
    exercise(replica)
    if replica.compiling.failure:  # compiling fell back to eager: no graph was cached
        print(replica.compiling.failure, file=sys.stderr)
        return 1
    return 0


def _exit_when_closed(lifeline: int) -> None:
    while os.read(lifeline, 1):
        pass
    os._exit(3)  # the node has gone: nothing here is worth finishing


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
