"""Running an experiment's grid: every (arm, seed) is N real nodes in one process, in lockstep
rounds (a fresh order each round), with the network replaced by the in-memory exchange. Every node
is a real `Node` (the same round code, checkpoints and learning defaults); the experiment scores
each one itself on the design's held-out items after the scheduled rounds (the node's own
evaluation is off), and the base model once per model (near-greedy: the same for every node).

Everything is written as it happens (the nodes' checkpoints and metrics, one line per evaluation),
so a run stopped anywhere, or by `--minutes` (chunks for a machine lent by the quarter hour),
resumes where it stopped when the same command is run again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import psutil

from ....backends.atomic import write_atomic
from ....backends.base import Backend
from ....backends.registry import build_backend
from ....backends.settings import BackendSpec
from ...config import Config, load_config
from ...errors import NodeError
from ...learning.evaluation import at_level_tasks, score_tasks
from ...metrics import read_records
from ...paths import Paths, resolve_paths
from .designs import Arm, Design
from .exchange import InMemoryExchange, peer_id

TINY = (("round.questions", 4), ("round.completions", 4), ("round.max_new_tokens", 12))
EVALS_FILE = "evals.jsonl"
PLAN_FILE = "plan.json"  # what every invocation of a grid must agree on
INVOCATIONS_FILE = "invocations.jsonl"  # when each invocation started, on which code
RESUMES_FILE = "resumes.jsonl"  # a run resumed mid-way: its nodes' rounds then, its inboxes restored or not
# Each node-round's CPU seconds (the process's, all threads: the nodes take turns): the cost figure
# a frozen (SIGSTOP) or suspended grid cannot inflate, as it does wall seconds (another program
# on the same cores still can, a little: threads spin while they wait).
CPU_FILE = "cpu.jsonl"


@dataclass(frozen=True)
class ExperimentOptions:
    design: Design
    out: Path
    nodes: int
    rounds: int
    seeds: int
    seed_offset: int = 0  # seeds seed_offset .. seed_offset + seeds - 1: new ones were never tuned on
    models: tuple[str, ...] = ()  # round-robin over the nodes; () = the configured model
    tiny: bool = False
    threads: int = 2
    minutes: float | None = None  # stop, resumably, once this long has passed (at a round's end)
    overrides: tuple[tuple[str, object], ...] = ()
    archive: Path | None = None  # finished runs' results carried between machines (archive.py)
    arms: tuple[str, ...] = ()  # the design's arms this invocation runs; () = all of them

    def __post_init__(self) -> None:
        unknown = [name for name in self.arms if name not in {arm.name for arm in self.design.arms}]
        if unknown:
            raise NodeError(f"--arms: {', '.join(unknown)} not an arm of {self.design.name}; its arms: "
                            f"{', '.join(arm.name for arm in self.design.arms)}")

    @property
    def seed_values(self) -> range:
        return range(self.seed_offset, self.seed_offset + self.seeds)

    @property
    def arms_run(self) -> tuple[Arm, ...]:
        """The arms to run, in the design's order. Not part of the plan: like more seeds, another
        invocation may run the others into the same folder."""
        return tuple(a for a in self.design.arms if not self.arms or a.name in self.arms)

    def model_of(self, node: int) -> str | None:
        return self.models[node % len(self.models)] if self.models else None

    def run_dir(self, arm: Arm, seed: int) -> Path:
        return self.out / "runs" / arm.name / f"seed-{seed}"


def run_experiment(options: ExperimentOptions, paths: Paths, build: Callable[[BackendSpec], Backend] = build_backend,
                   progress: Callable[[str], None] = print, finished: Callable[[], None] = lambda: None) -> bool:
    """Run (or resume) the grid; False when `minutes` ran out first (run the same again to go on).
    `finished` is called after each (arm, seed) run that is complete."""
    options.out.mkdir(parents=True, exist_ok=True)
    _same_plan(options)
    with (options.out / INVOCATIONS_FILE).open("a", encoding="utf-8") as f:
        f.write(json.dumps({"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "revision": source_revision(),
                            "seeds": list(options.seed_values),
                            "arms": [arm.name for arm in options.arms_run]}) + "\n")
    chunk = Chunk(options.minutes)
    base_file = options.out / "base.json"
    base = json.loads(base_file.read_text()) if base_file.exists() else {}
    for seed in options.seed_values:  # seed-major: a stopped grid has whole pairs
        for arm in options.arms_run:
            started, rounds_before = time.monotonic(), chunk.rounds
            if not _run_config(options, arm, seed, paths, build, base, chunk, progress):
                return False
            if chunk.rounds > rounds_before:  # a run already complete took no time worth counting
                chunk.last_run_s = time.monotonic() - started
            write_atomic(base_file, json.dumps(base, indent=1))  # read back by a resumed grid: never torn
            finished()
    return True


def _run_config(options: ExperimentOptions, arm: Arm, seed: int, paths: Paths, build, base: dict,
                chunk: Chunk, progress: Callable[[str], None]) -> bool:
    from ...node.loop import Node

    design, run_dir = options.design, options.run_dir(arm, seed)
    logs = [EvalLog(run_dir / f"node-{k}" / EVALS_FILE) for k in range(options.nodes)]
    schedule = design.eval_rounds(options.rounds)
    if all(log.done(schedule) for log in logs):
        return True
    if chunk.no_time_for_a_run():
        progress(f"experiment: stopped before {arm.name}, seed {seed} (--minutes); run the same command again to go on")
        return False
    exchange, nodes = InMemoryExchange(), []
    for k in range(options.nodes):
        config = node_config(options, arm, seed, k)
        node_paths = replace(resolve_paths(run_dir / f"node-{k}"), cache_dir=paths.cache_dir)
        nodes.append(Node(config, node_paths, build=build, connect=exchange.member(peer_id(f"{run_dir}/{k}"),
                                                                                     config.model.name)))
    try:
        for node in nodes:
            node.start()
        folders = [run_dir / f"node-{k}" for k in range(options.nodes)]
        inboxes = exchange.restore(folders)
        if 0 < min(n.round for n in nodes) < options.rounds:
            # Weights and waiting groups resume exactly; the inboxes only after a stop at a round's
            # end (saved below), not after a kill: on record, and reported with the results.
            with (run_dir / RESUMES_FILE).open("a", encoding="utf-8") as f:
                f.write(json.dumps({"round": min(n.round for n in nodes), "nodes": [n.round for n in nodes],
                                    "inboxes": inboxes}) + "\n")
        _evaluate_due(nodes, logs, schedule, design, base)  # also what a kill between a round and its evaluation left
        while min(n.round for n in nodes) < options.rounds:
            if chunk.over():
                exchange.save(folders)
                progress(f"experiment: stopped at round {min(n.round for n in nodes)} of {arm.name}, seed {seed} "
                         "(--minutes); run the same command again to go on")
                return False
            round_no = min(n.round for n in nodes) + 1
            for k in np.random.default_rng([seed, round_no, 7]).permutation(len(nodes)):
                if nodes[k].round < round_no:  # lockstep: every node does this round before any the next
                    cpu, wall = time.process_time(), time.monotonic()
                    nodes[k].run(1)
                    with (folders[k] / CPU_FILE).open("a", encoding="utf-8") as f:
                        f.write(json.dumps({"round": round_no, "cpu_s": round(time.process_time() - cpu, 3),
                                            "wall_s": round(time.monotonic() - wall, 3)}) + "\n")
            _evaluate_due(nodes, logs, schedule, design, base)
            chunk.rounds += 1
            progress(f"experiment: {design.name} {arm.name} seed {seed}: round {round_no}/{options.rounds}")
        write_atomic(run_dir / "memory.json", json.dumps({"nodes": options.nodes,
                                                          "rss_bytes": psutil.Process().memory_info().rss}))
    finally:
        for node in nodes:
            node.close()
    return True


def _same_plan(options: ExperimentOptions) -> None:
    """The grid's plan is written by its first invocation and every later one must match it (more
    seeds may be added): a changed plan would leave runs that never complete, or mix two analyses."""
    design = options.design
    plan = json.loads(json.dumps({
        "design": design.name, "nodes": options.nodes, "rounds": options.rounds, "burn_in": design.burn_in,
        "eval_every": design.eval_every, "eval_items": design.eval_items, "models": options.models,
        "tiny": options.tiny, "overrides": options.overrides, "threads": options.threads}, default=list))
    path = options.out / PLAN_FILE
    if not path.exists():
        write_atomic(path, json.dumps(plan, indent=1))
        return
    saved = json.loads(path.read_text())
    # A key an older plan lacks (threads: from 2026-11-26) is not held against the grids it planned,
    # and is written in now, so that every later invocation is held to it.
    changed = sorted(k for k in plan.keys() | saved.keys() if k in saved and plan.get(k) != saved.get(k))
    if not changed and plan.keys() - saved.keys():
        write_atomic(path, json.dumps(saved | {k: plan[k] for k in plan.keys() - saved.keys()}, indent=1))
    if changed:
        raise NodeError(f"{options.out} holds a grid planned with other {', '.join(changed)} ({PLAN_FILE}): give the "
                        "flags it was started with, or another --out")


def source_revision() -> str | None:
    """The git commit of the code that runs, where it runs from a checkout (with '+' if changed)."""
    import subprocess

    root = Path(__file__).resolve().parents[3]
    try:
        top = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                             timeout=10)
        # A copy of the code inside another checkout (an older tree unpacked in a folder of a newer
        # one, as on a lent GPU) is not that checkout's HEAD: unknown rather than wrong.
        if top.returncode != 0 or Path(top.stdout.strip()).resolve() != root:
            return None
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return head.stdout.strip() + ("+" if dirty.stdout.strip() else "") if head.returncode == 0 else None


class Chunk:
    """`--minutes`: the grid stops at the end of a round once this long has passed, but only after
    this invocation has run a round; and it starts no new (arm, seed) run that the last one's
    length says would not finish in time. A run stopped mid-way goes on where it was on this
    machine (weights, waiting groups, inboxes); on a machine that starts bare it starts again."""

    def __init__(self, minutes: float | None) -> None:
        self.end = time.monotonic() + minutes * 60 if minutes is not None else None
        self.rounds = 0
        self.last_run_s = 0.0  # the last whole run in this invocation (0: none yet)

    def over(self) -> bool:
        return self.end is not None and self.rounds > 0 and time.monotonic() > self.end

    def no_time_for_a_run(self) -> bool:
        return self.over() or (self.end is not None and self.rounds > 0
                               and time.monotonic() + self.last_run_s > self.end)


def node_config(options: ExperimentOptions, arm: Arm, seed: int, k: int) -> Config:
    """Node k of (arm, seed): the arms of a pair share the seed (their draws), and differ in the mix
    and, in the specialists' uniform arm, in the datasets drawn."""
    extra = [*(TINY if options.tiny else ()), *options.overrides]
    questions = load_config(None, environ={}, cli=extra).round.questions or 8
    local, external = arm.scaled(questions)
    datasets, levels = options.design.focus(arm, k)
    cli = [*extra, ("round.questions", questions), ("round.local_groups", local), ("round.external_groups", external),
           ("round.peer_groups", arm.peer_groups), ("round.preset", options.design.preset),
           ("round.rescue", arm.rescue), ("round.common_questions", options.design.common_questions),
           ("round.common_window", "round"),
           ("round.datasets", datasets), ("round.levels", levels), ("run.seed", 1000 * seed + k),
           ("eval.every_rounds", 0), ("swarm.enabled", False), ("resources.nice", 0),
           ("resources.pause_on_battery", False), ("backend.threads", options.threads), ("checkpoint.keep", 1)]
    if options.models:
        cli.append(("model.name", options.model_of(k)))
    return load_config(None, environ={}, cli=cli)


def _evaluate_due(nodes, logs: list[EvalLog], schedule: list[int], design: Design, base: dict) -> None:
    """Score every node whose weights are those after a scheduled round not yet logged (the base
    model, round 0, once per model and shared)."""
    for node, log in zip(nodes, logs, strict=True):
        if node.round not in schedule or log.has(node.round):
            continue
        if node.round == 0:
            base[node.model.name] = base.get(node.model.name) or _evaluate(node, design)
            log.add(0, base[node.model.name])
        else:
            log.add(node.round, _evaluate(node, design))


def _evaluate(node, design: Design) -> dict[str, float]:
    """The node's near-greedy held-out accuracy per speciality, on its current weights."""
    tasks = [t for d, level in design.specialities for t in at_level_tasks(node.preset.name, d, level, design.eval_items)]
    result = score_tasks(node.backend, tasks, node.config.reward.prefill_answer, node.sizing.shape.max_new_tokens)
    return result.per_dataset


class EvalLog:
    """A node's evaluations in the experiment: one JSON line per evaluated round."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> dict[int, dict[str, float]]:
        return {r["round"]: r["per_dataset"] for r in read_records(self.path)}

    def has(self, round_no: int) -> bool:
        return round_no in self.read()

    def done(self, schedule: list[int]) -> bool:
        return set(schedule) <= set(self.read())

    def add(self, round_no: int, per_dataset: dict[str, float]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"round": round_no, "per_dataset": per_dataset}) + "\n")
