"""The compiled trainer's graphs, built off the critical path: a fresh node trains its first steps
eagerly in fp32 while a background thread compiles a small replica of the model, and switches to
the compiled trainer (and to a bf16 base where that was chosen) between two steps once it is done.

Why a replica: torch.compile keys a decoder layer's graphs by the layer's code and guards them by
the module's type, its flags and its tensors' kinds (dtype, which need a gradient), not by the
weights' values or how many layers there are, so a two-layer copy of the architecture with a small
vocabulary and random weights builds the very graphs the model's 30 layers run (measured: 0 graphs
built when the real model switched, a 2-core AVX2 EPYC). Compiling the model itself in the
background is not possible: its passes would run beside the node's steps on the same weights and
gradients. The replica's passes are the node's kinds: a training step on several groups (its
anchor's reference without gradients and with the adapter off, on one group), one on a single
group (one row, which torch specialises), and passes without gradients.

Why at low priority: on 2 cores the compiler competes with the node's own work. The thread (and
the child that compiles, with the C++ compiler it starts) runs at the lowest priority the OS gives,
one compile job at a time (76 s at normal priority beside eager steps that took 2-3x as long,
measured before this choice). Its passes and the node's never overlap (torch_compile.ONE_PASS_AT_A_TIME: tracing
patches torch.nn.Module.__call__ for the whole process), so it builds while the node generates,
scores or evaluates, and a step waits at most for the build's pass in progress (one of four).
Those passes find their graphs compiled already: a child process compiles the replica first
(compile_process.py), so a pass here loads and traces instead of compiling (all four passes 23 s
on one thread, where a step once waited 69 s for one compiling pass).
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from .base import TrainSample

log = logging.getLogger(__name__)

_ONE_BUILD = threading.Lock()
REPLICA_VOCAB = 512  # the vocabulary never enters a layer's graph; a small one keeps the copy ~30 MB


def write_replica(model_dir: Path, into: Path) -> Path:
    """`model_dir`'s architecture with one decoder layer of each kind it has (two at least) and a
    small vocabulary, random weights, saved in `into`. The global RNG is left as it was."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    kinds = list(dict.fromkeys(getattr(config, "layer_types", None) or []))  # Gemma 3: sliding and full attention
    config.num_hidden_layers = max(2, len(kinds))
    if kinds:
        config.layer_types = (kinds * 2)[: config.num_hidden_layers]
    config.vocab_size = REPLICA_VOCAB
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if isinstance(getattr(config, name, None), int) and getattr(config, name) >= REPLICA_VOCAB:
            setattr(config, name, 0)
    with torch.random.fork_rng():
        model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(into)
    (into / "replica.json").write_text(json.dumps({"of": str(model_dir)}))
    return into


def warm_up_batches() -> tuple[list[TrainSample], list[TrainSample]]:
    """Synthetic groups shaped like a round's (a prompt of ~40 tokens, replies of 2-9): six groups
    (so that the anchor's reference runs on two: one row and several rows are different graphs),
    and one alone."""
    def group(first: int, replies: int) -> list[TrainSample]:
        prompt = [(first + 7 * i) % REPLICA_VOCAB for i in range(36 + first % 9)]
        return [TrainSample(prompt, [(first + 3 * j + r) % REPLICA_VOCAB for j in range(2 + (r * 3) % 8)],
                            advantage=1.0 if r % 2 else -1.0) for r in range(replies)]

    return [s for first in (11, 23, 37, 53, 67, 79) for s in group(first, 4)], group(41, 3)


def exercise(trainer, stopped: threading.Event | None = None) -> None:
    """Every kind of pass a node's trainer makes, on the replica (its updates are thrown away with
    it); none after `stopped` is set (the backend closed)."""
    several, alone = warm_up_batches()
    for run in (lambda: trainer.train_step(several), lambda: trainer.train_step(alone),
                lambda: trainer.token_logprobs(several), lambda: trainer.token_logprobs(alone)):
        if stopped is not None and stopped.is_set():
            raise RuntimeError("the backend closed before the compiled graphs were built")
        run()


class BackgroundCompile:
    """Runs `build()` in a daemon thread at low priority; `done`, `failure` and `seconds` say how it went."""

    def __init__(self, build: Callable[[threading.Event], str], graphs: Callable[[], int]) -> None:
        self._build, self._graphs = build, graphs
        self.stopped = threading.Event()
        self.failure = ""
        self.how = ""  # what `build` says it did (where the graphs were compiled)
        self.seconds = 0.0
        self.graphs = 0
        self._thread = threading.Thread(target=self._run, name="swarmling-compile", daemon=True)
        self._thread.start()

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self) -> None:
        self._thread.join()

    def stop(self) -> None:
        """No pass after the one under way (the backend closes: its trainer's passes would race
        the build's tracing); returns when the thread has ended."""
        self.stopped.set()
        self._thread.join()

    def _run(self) -> None:
        lower_this_threads_priority()
        started, before = time.perf_counter(), self._graphs()
        try:
            self.how = self._build(self.stopped)
        except Exception as error:  # anything: the node trains on eagerly, and says why
            self.failure = f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"
        self.seconds = time.perf_counter() - started
        self.graphs = self._graphs() - before


def lower_this_threads_priority() -> None:
    """The calling thread (and what it starts) at the lowest priority: Linux sets a nice value per
    thread; elsewhere nothing changes."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):
        pass


def start_background_compile(make_replica: Callable[[Path], object], graphs: Callable[[], int],
                             guard: Callable[[Callable[[], None]], None],
                             prebuild: Callable[[Path, threading.Event], str] | None = None) -> BackgroundCompile:
    """The replica built now (on the calling thread: loading it seeds torch's global RNG, which the
    node's thread shares), compiled in the background by `prebuild(folder, stopped)` if given (the
    child process of compile_process.py, which says what it did), then exercised here under `guard`
    (the crash marker of a first compiled pass), then deleted."""
    folder = Path(tempfile.mkdtemp(prefix="swarmling-replica-"))
    remove_folder = functools.partial(shutil.rmtree, folder, ignore_errors=True)
    try:
        with torch.random.fork_rng():
            replica = make_replica(folder)
    except BaseException:
        remove_folder()
        raise
    def build(stopped: threading.Event) -> str:
        from torch._inductor import config as inductor

        with _ONE_BUILD:  # a backend rebuilt while one builds waits for it (one marker, one setting)
            jobs, inductor.compile_threads = inductor.compile_threads, 1  # in this thread, at its priority
            try:
                how = prebuild(folder, stopped) if prebuild is not None else "compiled in this process"
                replica.compiling.on = True
                guard(lambda: exercise(replica, stopped))
                if replica.compiling.failure:
                    raise RuntimeError(replica.compiling.failure)
            finally:
                inductor.compile_threads = jobs
                remove_folder()
        return how

    background = BackgroundCompile(build, graphs)
    # A process that ends while the thread builds (a quit in the first minutes, a command that
    # never trains) waits for the pass under way: a thread killed inside torch's C++ aborts the
    # process ("terminate called without an active exception"), and one killed in its pass would
    # leave the crash marker (read as a crash at the next start) and the replica's folder. Stopped,
    # the thread takes both down itself; a real crash runs no atexit handler, so it still counts.
    atexit.register(background.stop)
    return background
