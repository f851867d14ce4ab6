"""`swarmling bench`: per-phase round times on this machine, and in the same run raw llama.cpp
throughput for the same model, prompts and completion lengths, with the ratio.

Training is then timed again on the training set of the timed round with the most completion
tokens among those with a learning signal (a round's replies can be short: a short batch times the fixed costs, not a round's
work; with the bench's fixed seed, round 1's are the base model's, the same for every revision),
once with shared prefixes (each
group's prompt computed once, `backends/shared_prefix.py`) and once without, from the same
adapter and optimizer state: their ratio is what sharing saves on this machine, measured in one
process on the same samples (timings on a busy machine are noisy; a ratio within one run is not).
Each switch the backend's trainer offers is then flipped for a pass of its own: the bf16 base
(`train.cpu_bf16`, the CPU's) against fp32, with what they do to the sampler/trainer logprob
agreement; torch.compile of the layers (`train.cpu_compile`) against eager; per-layer activation checkpointing (`train.activation_checkpointing`), with the time
it costs and the training peak it saves (each pass's own peak on Linux, or the GPU's on CUDA);
not checkpointing off where the memory limit required it. Peak resident memory is the rounds'
(on Linux from the first round, after the start's one-time model conversion; before the
comparison, whose unshared pass is not what a node runs).

The reference decodes exactly the token counts the round produced (same prompts, same number of
sequences, each stopping where the round's did) with llama.cpp's own C sampler and no logprobs,
so the ratio measures what the node's sampling with logprobs costs on top of llama.cpp itself.
Where the sampler runs an F16 copy of the model's file (`backend.sampler_weights`), the reference
decodes the same lengths on the file as shipped too, without the adapter and with it, alternated
and repeated: what the copy saves, in the same run, and what the adapter costs each file.
Targets: generation ≥ 0.9 of the reference, adapter hand-off < 1 s. Runs in a throwaway home,
so the user's checkpoints are never touched.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from ..config import Config
from ..node.loop import Node
from ..paths import Paths, resolve_paths
from ..events import PHASES
from ..learning.draws import RoundDraws
from ..learning.round import run_round, training_samples
from ...backends.base import Backend, TrainerSwitches, TrainSample
from ...backends.registry import backend_kind
from ...backends.torch_compile import graphs_compiled
from .arguments import Invocation, add_config_flags, positive
from .bench_generation import generation_report


BENCH_SEED = 1  # the rounds every bench times (unless run.seed names others)


def bench_config(config: Config) -> Config:
    """A node without run.seed starts on a random one: the bench fixes it, so that two runs (two
    commits, two machines) time the same tasks and, thread count aside, the same replies."""
    if config.run.seed is not None:
        return config
    return config.model_copy(update={"run": config.run.model_copy(update={"seed": BENCH_SEED})})


def bench(config: Config, paths: Paths, rounds: int) -> int:
    with tempfile.TemporaryDirectory(prefix="swarmling-bench-") as tmp:
        bench_paths = replace(resolve_paths(tmp), cache_dir=paths.cache_dir)
        node = Node(bench_config(config), bench_paths)
        node.start()
        try:
            return _bench(node, rounds)
        finally:
            node.close()


def _bench(node: Node, rounds: int) -> int:
    # Every timed round trains, whatever the minimum batch: a round's cost is what is measured.
    settings = replace(node.round_settings(), min_signal_groups=0)
    info = node.backend.info()
    print(f"swarmling bench: {info.model} on {info.device}; {info.generator}; {info.trainer}")
    print(
        f"round shape: {settings.questions} questions x {settings.completions} completions, "
        f"up to {settings.max_new_tokens} new tokens, preset {node.preset.name}, seed {node.seed}"
    )
    # A fresh CPU node trains eagerly while its compiled graphs build in the background; the bench
    # times steady rounds, so it waits for them (setting the switches the node runs with does) and
    # reports the wait as the cold compile's cost.
    began = time.perf_counter()
    node.backend.set_switches(node.backend.switches())
    waited = time.perf_counter() - began
    if waited > 1.0:
        print(f"compiled graphs built before the timed rounds: {waited:.1f} s (a node trains eagerly meanwhile; "
              "seconds once the cache holds them)")
    rows, outcome, compiled = [], None, set()  # compiled: rounds during which torch.compile built graphs
    reset_peak_rss()  # the rounds' peak, not the start's one-time model conversion
    with tempfile.TemporaryDirectory(prefix="swarmling-bench-states-") as states:
        largest = None  # (round, its training set, the policy and optimizer it was sampled with)
        for i in range(1, rounds + 1):
            before = Path(states) / f"round-{i}"
            before.mkdir()
            node.backend.save_state(before)
            graphs = graphs_compiled()
            outcome = run_round(i, node.backend, node.preset, node.curriculum, settings, RoundDraws(node.seed, i))
            if graphs_compiled() > graphs:
                compiled.add(i)
            node.curriculum = outcome.curriculum
            m = outcome.record
            rows.append(m)
            s = m.seconds
            cells = "  ".join(f"{p} {s.get(p, 0.0):6.2f}s" for p in PHASES)
            print(f"round {i}: {cells}  total {sum(s.values()):6.2f}s  gen {m.tokens_per_s:6.1f} tok/s "
                  f"({m.generated_tokens} tokens)" + ("  [compiled]" if i in compiled else ""))
            groups = outcome.trained or outcome.groups
            trained = training_samples(groups)
            if any(g.has_signal for g in groups) and (
                    largest is None or completion_tokens(trained) > completion_tokens(largest[1])):
                if largest is not None:
                    shutil.rmtree(largest[2], ignore_errors=True)
                largest = (i, trained, before)
            else:
                shutil.rmtree(before, ignore_errors=True)
        steady, note = steady_rounds(rows, compiled)
        print(f"\nsteady state, median over rounds {', '.join(str(r.round) for r in steady)}{note}:")
        for p in PHASES:
            print(f"  {p:<9} {statistics.median(r.seconds.get(p, 0.0) for r in steady):7.2f} s")
        total = statistics.median(sum(r.seconds.values()) for r in steady)
        print(f"  {'round':<9} {total:7.2f} s")
        handoff = statistics.median(r.seconds.get("hand-off", 0.0) for r in steady)
        print(f"  {'peak RSS':<9} {peak_rss_bytes() / 1e9:7.2f} GB")
        if compiled:
            print(cold_start_line(rows, compiled, steady))
        if largest is not None:
            _compare_training(node.backend, largest[1], f"round {largest[0]}'s", largest[2],
                              checkpointing_required=node.sizing.build.activation_checkpointing
                              and node.config.train.activation_checkpointing is None,
                              bf16_cpu=node.hardware.has_bf16_cpu,
                              on_gpu=backend_kind(node.sizing.build.kind).memory == "device")
        else:
            print("\n(no timed round had a learning signal: no training to compare)")

    report = generation_report(node, outcome, settings)
    if report is None:
        print("\n(no llama.cpp reference for this backend)")
        return 0
    print(report)
    print(f"adapter hand-off (convert + hot-swap)     {handoff:7.3f} s  (target < 1 s)")
    return 0


MIN_STEADY_ROUNDS = 3  # a median of fewer is one round's length, not the machine's rate


def steady_rounds(rows: Sequence, compiled: set[int]) -> tuple[list, str]:
    """The rounds that time the machine's steady state: not the first (one-time allocations and
    caches), none that compiled; and a note when too few are left to mean something."""
    steady = [r for r in rows[1:] if r.round not in compiled]
    if len(steady) >= MIN_STEADY_ROUNDS:
        return steady, ""
    if not steady:
        steady = [r for r in rows if r.round not in compiled] or list(rows)
    return steady, (f"; only {len(steady)} steady round{'s' if len(steady) != 1 else ''}: give --rounds "
                    f"{len(rows) + MIN_STEADY_ROUNDS - len(steady)} or more for a median that means something")


def cold_start_line(rows: Sequence, compiled: set[int], steady: Sequence) -> str:
    """What compiling cost: the compiled rounds' training beyond a steady round's, their sum."""
    train = statistics.median(r.seconds.get("train", 0.0) for r in steady)
    extra = sum(max(0.0, r.seconds.get("train", 0.0) - train) for r in rows if r.round in compiled)
    return (f"  {'compiling':<9} {extra:7.2f} s  once (training of round {', '.join(map(str, sorted(compiled)))} "
            f"beyond a steady round's; a warm compile cache makes it less)")


def peak_rss_bytes() -> int:
    """This process's peak resident memory since the start or the last `reset_peak_rss` (0 where
    the platform cannot say)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    try:
        import resource
    except ImportError:  # Windows
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux


def completion_tokens(samples: Sequence[TrainSample]) -> int:
    return sum(len(s.completion_ids) for s in samples)


def unique_tokens(samples: Sequence[TrainSample]) -> int:
    """What a trainer must at least compute: each distinct prompt once, every completion token."""
    return sum(len(p) for p in {tuple(s.prompt_ids) for s in samples}) + completion_tokens(samples)


def training_passes(backend: Backend, checkpointing_required: bool = False, bf16_cpu: bool = True) -> dict[str, TrainerSwitches]:
    """The switches of each timed pass: the node's own, without shared prefixes, and each switch
    the trainer offers flipped. Not checkpointing off where the memory limit required it: that
    pass could take more memory than the machine's owner allowed. bf16 is compared compiled
    only, and the eager pass runs fp32: a node never trains eager bf16 (app/sizing.cpu_bf16_choice);
    and not on a CPU without bf16 instructions that runs fp32 (torch emulates bf16 there: 14x
    slower, three minutes of bench for a figure no node there would choose)."""
    node = backend.switches()
    passes = {"node": node, "unshared": replace(node, shared_prefix=False)}
    if node.bf16_base is not None and node.compiled and (bf16_cpu or node.bf16_base):
        passes["bf16_base"] = replace(node, bf16_base=not node.bf16_base)
    if node.compiled is not None:
        eager = replace(node, compiled=False, bf16_base=None if node.bf16_base is None else False)
        passes["compiled"] = eager if node.compiled else replace(node, compiled=True)
    if node.activation_checkpointing is not None and not checkpointing_required:
        passes["activation_checkpointing"] = replace(node, activation_checkpointing=not node.activation_checkpointing)
    return passes


def _compare_training(backend: Backend, samples: list[TrainSample], which: str, start: Path,
                      checkpointing_required: bool = False, bf16_cpu: bool = True, on_gpu: bool = False) -> None:
    """Each pass a step on `samples` from the state in `start` (the policy that sampled them, so
    that the sampler/trainer gap is the node's own). The backend is left in that state, with the
    node's switches (a bench's node is thrown away after). `samples` have a learning signal."""
    passes = training_passes(backend, checkpointing_required, bf16_cpu)
    node_compiles = bool(passes["node"].compiled)
    peak = PeakMemory(on_gpu)
    runs = {}
    for name, switches in passes.items():
        backend.load_state(start)  # every pass from the same policy and optimizer state
        backend.set_switches(switches)
        if node_compiles and name != "node":
            # Compiled layers build their graphs for a new dtype or switch in the first pass:
            # that one-time cost is not the pass's.
            backend.train_step(samples)
            backend.load_state(start)
        peak.reset()
        began = time.perf_counter()
        stats = backend.train_step(samples)
        runs[name] = (time.perf_counter() - began, stats, peak.read())
    backend.load_state(start)
    backend.set_switches(passes["node"])  # as the node runs
    unique = unique_tokens(samples)
    print(f"\ntraining, same {len(samples)} samples, {which} ({runs['node'][1].tokens} completion tokens, {unique} unique tokens)")
    for name, label in (("node", "shared prefixes"), ("unshared", "each completion alone")):
        seconds, stats, peak_bytes = runs[name]
        computed = stats.computed_tokens
        print(f"  {label:<22} {seconds:7.2f} s  {stats.tokens / seconds:7.1f} completion tok/s  "
              f"{computed} tokens computed ({computed / unique:.2f}x unique){peak.label(peak_bytes)}")
    print(f"  shared is {runs['unshared'][0] / runs['node'][0]:.2f}x faster (target >= 3)")
    seconds, stats, _ = runs["node"]
    if stats.kl is not None:
        print(f"  KL anchor's reference forward {stats.reference_seconds:7.2f} s of the step's {seconds:.2f} s "
              f"({stats.reference_seconds / seconds:.0%}: one forward without gradient over the anchored groups' samples, in 2,048-token passes)")
    node = passes["node"]
    if "bf16_base" in runs:
        fp32, bf16 = (runs["node"], runs["bf16_base"])[:: -1 if node.bf16_base else 1]
        print(f"  bf16 base       {bf16[0]:7.2f} s vs fp32 {fp32[0]:.2f} s: {fp32[0] / bf16[0]:.2f}x "
              f"(the node runs {'bf16' if node.bf16_base else 'fp32'}); sampler/trainer logprob gap "
              f"{bf16[1].sampler_logprob_gap:.4f} vs {fp32[1].sampler_logprob_gap:.4f} nats, tokens outside "
              f"[0.8, 1.2] {bf16[1].sampler_ratio_outside:.1%} vs {fp32[1].sampler_ratio_outside:.1%}")
    elif node.bf16_base is not None and node.compiled:
        print("  bf16 base       not timed: this CPU has no bf16 instructions (AVX-512 BF16 or AMX), so its nodes train fp32")
    if "compiled" in runs:
        eager, compiled = (runs["node"], runs["compiled"])[:: -1 if node.compiled else 1]
        eager_precision = "bf16" if (passes["compiled"] if node.compiled else node).bf16_base else "fp32"
        print(f"  torch.compile   {compiled[0]:7.2f} s vs eager {eager_precision} {eager[0]:.2f} s: {eager[0] / compiled[0]:.2f}x "
              f"(the node runs {'compiled' if node.compiled else 'eager'}, {'bf16' if node.bf16_base else 'fp32'})")
    # The step before this version: fp32, no anchor (the same samples, its reference forward taken out).
    fp32 = runs.get("bf16_base") if node.bf16_base else runs["node"]
    if stats.kl is not None and fp32 is not None:
        before = fp32[0] - fp32[1].reference_seconds
        print(f"  the node's step {seconds:7.2f} s vs fp32 without the anchor {before:.2f} s: {seconds / before:.2f}x "
              "(target <= 1.3)")
    if "activation_checkpointing" in runs:
        off, on = (runs["node"], runs["activation_checkpointing"])[:: -1 if node.activation_checkpointing else 1]
        print(f"  activation checkpointing {on[0]:7.2f} s vs {off[0]:.2f} s without: {on[0] / off[0]:.2f}x the time"
              f"{f', {peak.name} {on[2] / 1e9:.2f} GB vs {off[2] / 1e9:.2f} GB' if on[2] and off[2] else ''} "
              f"(train.activation_checkpointing = {str(node.activation_checkpointing).lower()})")
    elif node.activation_checkpointing:
        print("  (not timed without activation checkpointing: the memory limit required it)")


class PeakMemory:
    """Each training pass's peak: the process's resident memory, or on a GPU the device's."""

    def __init__(self, on_gpu: bool) -> None:
        self.on_gpu = on_gpu
        self.name = "GPU peak" if on_gpu else "training peak"
        self.known = False

    def reset(self) -> None:
        if self.on_gpu:
            import torch

            torch.cuda.reset_peak_memory_stats()
            self.known = True
        else:
            self.known = reset_peak_rss()

    def read(self) -> int:
        """Bytes since `reset`; 0 where the platform cannot say."""
        if not self.known:
            return 0
        if self.on_gpu:
            import torch

            return int(torch.cuda.max_memory_allocated())
        return peak_rss_bytes()

    def label(self, peak_bytes: int) -> str:
        return f"  {self.name} {peak_bytes / 1e9:.2f} GB" if peak_bytes else ""


def reset_peak_rss() -> bool:
    """Start `peak_rss_bytes` afresh (Linux: /proc/self/clear_refs); False where it cannot."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def bench_arguments(p) -> None:
    p.add_argument("--rounds", type=positive, default=2, help="rounds to time (default 2; the first warms up)")
    add_config_flags(p)


def bench_main(c: Invocation) -> int:
    return bench(c.config, c.paths, c.args.rounds)
