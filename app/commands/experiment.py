"""`swarmling experiment`: does sharing help? SAPO's table, reproduced on this stack.

A grid of configurations — local/external mixes (the paper's 8/0, 6/2, 4/4, 2/6, scaled to the
round's Q) × seeds — each run as N nodes in one process, in lockstep rounds (in a fresh random
order each round). Every node is a real `Node`: the same round code, checkpoints and held-out
evaluation; only the network is replaced by `InMemoryExchange`, which hands each node's shared
bundle (the same wire encoding) to every other node's inbox, where the usual verification runs
(decode, regenerate, re-score, zero-advantage filter, per-peer cap, freshness). Each node keeps
its own backend: nodes run one after another, so a node-round costs what a lone node's round
costs (measured in the same run), while memory grows with N (reported).

`swarmling sim` runs the same kind of swarm through real processes and real libp2p: use it to
test the network, and this to measure whether sharing helps.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from statistics import fmean, pstdev

import numpy as np
import psutil

from ...backends.base import Backend
from ...backends.factory import build_backend
from ...backends.settings import BackendSpec
from ..config import Config, load_config
from ..errors import NodeError
from ..events import Listener
from ..metrics import read_records
from ..paths import Paths, resolve_paths
from ..learning.rollout import QuestionGroup, ShareCallback
from ..learning.round_record import RoundRecord
from ..swarm.facade import OfflineSwarm, SwarmOpener
from ..swarm.verification.wire import bundle_from_groups, encode_bundle

PAPER_MIXES = ((8, 0), (6, 2), (4, 4), (2, 6))
TINY = (("round.questions", 4), ("round.completions", 4), ("round.max_new_tokens", 12))
BASE58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


@dataclass(frozen=True)
class Mix:
    local: int
    external: int

    @property
    def label(self) -> str:
        return f"{self.local}/{self.external}"

    def scaled(self, questions: int) -> tuple[int, int]:
        """(I, J) for a round of `questions` groups, in the paper's proportions (8 groups)."""
        external = round(questions * self.external / (self.local + self.external))
        return questions - external, external


def parse_mixes(text: str) -> tuple[Mix, ...]:
    mixes = []
    for part in text.split(","):
        try:
            local, external = (int(x) for x in part.strip().split("/"))
        except ValueError:
            raise NodeError(f"--mixes: {part.strip()!r} is not LOCAL/EXTERNAL, e.g. 8/0,4/4") from None
        if local < 1 or external < 0:
            raise NodeError(f"--mixes: {part.strip()!r} needs at least one local group and no negative count")
        mixes.append(Mix(local, external))
    return tuple(mixes)


@dataclass(frozen=True)
class ExperimentOptions:
    out: Path
    nodes: int = 4
    rounds: int = 20
    seeds: int = 3
    mixes: tuple[Mix, ...] = tuple(Mix(*m) for m in PAPER_MIXES)
    models: tuple[str, ...] = ()  # round-robin over the nodes; () = the configured model
    tiny: bool = False
    overrides: tuple[tuple[str, object], ...] = ()


# ---- the exchange ------------------------------------------------------------------------------

def peer_id(label: str) -> str:
    """A stable id in libp2p's base58 alphabet for a node of the experiment."""
    return "12D3KooW" + "".join(BASE58[b % 58] for b in hashlib.sha256(label.encode()).digest()[:36])


class InMemoryExchange:
    """The experiment's network: a node's shared groups go to every other node's inbox at once."""

    def __init__(self) -> None:
        self.members: list[ExchangeMember] = []
        self.bundles = 0

    def member(self, node_id: str, model: str) -> SwarmOpener:
        """The `connect` a Node is built with: its door to this exchange."""

        def connect(config: Config, paths: Paths, model_name: str, emit: Listener) -> OfflineSwarm:
            joined = ExchangeMember(emit, self, node_id, model)
            self.members.append(joined)
            return joined

        return connect

    def publish(self, sender: ExchangeMember, data: bytes) -> None:
        self.bundles += 1
        for other in self.members:
            if other is not sender:
                other.inbox.offer(sender.peer_id, data)


class ExchangeMember(OfflineSwarm):
    def __init__(self, emit: Listener, exchange: InMemoryExchange, node_id: str, model: str) -> None:
        super().__init__(emit)
        self.exchange, self.peer_id, self.model, self.name = exchange, node_id, model, "experiment"

    def sharer(self, round_no: int, prefill: str) -> ShareCallback:
        def share(groups: Sequence[QuestionGroup]) -> None:
            bundle = bundle_from_groups(groups, swarm=self.name, node_id=self.peer_id, model=self.model,
                                        round_no=round_no, timestamp=time.time(), prefill=prefill)
            self.exchange.publish(self, encode_bundle(bundle))

        return share


# ---- running the grid ----------------------------------------------------------------------------

def run_experiment(options: ExperimentOptions, paths: Paths, build: Callable[[BackendSpec], Backend] = build_backend,
                   show_progress: bool = True) -> dict:
    from ..node.loop import Node

    options.out.mkdir(parents=True, exist_ok=True)
    configs = [(mix, seed) for mix in options.mixes for seed in range(options.seeds)]
    total = len(configs) * options.nodes * options.rounds
    base_evals: dict = {}  # the base model's held-out score, measured once per model (greedy: the same for all)
    with _Progress(total, show_progress) as progress:
        for mix, seed in configs:
            run_dir = options.out / "runs" / f"{mix.local}-{mix.external}" / f"seed-{seed}"
            exchange = InMemoryExchange()
            nodes = []
            for k in range(options.nodes):
                model = options.models[k % len(options.models)] if options.models else None
                config = _node_config(options, mix, seed, k, model)
                node_paths = replace(resolve_paths(run_dir / f"node-{k}"), cache_dir=paths.cache_dir)
                node_id = peer_id(f"{run_dir}/{k}")
                nodes.append(Node(config, node_paths, build=build, connect=exchange.member(node_id, config.model.name),
                                  base_evals=base_evals))
            try:
                for node in nodes:
                    node.start()
                progress.advance(sum(min(n.round, options.rounds) for n in nodes))  # resumed work
                rng = np.random.default_rng([seed, 7])
                while min(n.round for n in nodes) < options.rounds:
                    for k in rng.permutation(len(nodes)):
                        if nodes[k].round < options.rounds:
                            nodes[k].run(1)
                            progress.advance(1)
                rss = psutil.Process().memory_info().rss
            finally:
                for node in nodes:
                    node.close()
            (run_dir / "memory.json").write_text(json.dumps({"nodes": options.nodes, "rss_bytes": rss}))
    summary = summarise(options)
    (options.out / "summary.json").write_text(json.dumps(summary, indent=1))
    (options.out / "table.md").write_text(table(summary))
    plot(summary, options.out)
    return summary


def _node_config(options: ExperimentOptions, mix: Mix, seed: int, k: int, model: str | None) -> Config:
    base = load_config(None, environ={}, cli=[*(TINY if options.tiny else ()), *options.overrides])
    questions = base.round.questions or 8
    local, external = mix.scaled(questions)
    cli = [*(TINY if options.tiny else ()), *options.overrides,
           ("round.questions", questions), ("round.local_groups", local), ("round.external_groups", external),
           ("run.seed", 1000 * seed + k), ("swarm.enabled", False), ("resources.nice", 0),
           ("resources.pause_on_battery", False)]
    if not any(key == "eval.every_rounds" for key, _ in options.overrides):
        cli.append(("eval.every_rounds", max(1, options.rounds // 5)))  # five points on the held-out curve
    if model:
        cli.append(("model.name", model))
    return load_config(None, environ={}, cli=cli)


class _Progress:
    """A progress bar with the time left (rich), or nothing when not asked for."""

    def __init__(self, total: int, show: bool) -> None:
        self.total, self.show = total, show
        self._bar = None

    def __enter__(self) -> _Progress:
        if self.show:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

            self._bar = Progress("node-rounds", BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
            self._bar.start()
            self._task = self._bar.add_task("experiment", total=self.total)
        return self

    def advance(self, count: int) -> None:
        if self._bar is not None:
            self._bar.update(self._task, advance=count)

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()


# ---- what came out -------------------------------------------------------------------------------

def _records(node_dir: Path) -> list[RoundRecord]:
    return [RoundRecord.from_dict(r) for r in read_records(node_dir / "state" / "metrics.jsonl")]


def summarise(options: ExperimentOptions) -> dict:
    mixes = {}
    for mix in options.mixes:
        per_seed = []
        for seed in range(options.seeds):
            run_dir = options.out / "runs" / f"{mix.local}-{mix.external}" / f"seed-{seed}"
            nodes = [_records(run_dir / f"node-{k}") for k in range(options.nodes)]
            per_seed.append({
                "seed": seed,
                # the paper's measure: strict reward summed over nodes and rounds
                "cumulative_reward": sum(r.reward_mean for recs in nodes for r in recs),
                "reward_by_round": [fmean(recs[i].reward_mean for recs in nodes if len(recs) > i)
                                    for i in range(max(map(len, nodes), default=0))],
                "eval_by_round": _eval_curve(nodes),
                "per_node_reward": [[r.reward_mean for r in recs] for recs in nodes],
                "external_advantage_share": _mean([r.external_advantage_share for recs in nodes for r in recs]),
                "node_round_seconds": _mean([r.wall_seconds for recs in nodes for r in recs[1:]]),
                "rss_bytes": json.loads((run_dir / "memory.json").read_text())["rss_bytes"]
                if (run_dir / "memory.json").exists() else None,
            })
        cumulative = [s["cumulative_reward"] for s in per_seed]
        finals = [s["eval_by_round"][-1][1] for s in per_seed if s["eval_by_round"]]
        mixes[mix.label] = {
            "seeds": per_seed,
            "cumulative_reward_mean": fmean(cumulative) if cumulative else None,
            "cumulative_reward_std": pstdev(cumulative) if len(cumulative) > 1 else 0.0,
            "final_eval_mean": fmean(finals) if finals else None,
            "final_eval_std": pstdev(finals) if len(finals) > 1 else 0.0,
        }
    return {"nodes": options.nodes, "rounds": options.rounds, "seeds": options.seeds, "tiny": options.tiny,
            "models": list(options.models), "mixes": mixes}


def _eval_curve(nodes: list[list[RoundRecord]]) -> list[tuple[int, float]]:
    """Held-out accuracy over rounds, the mean of the nodes that measured it at that round."""
    by_round: dict[int, list[float]] = {}
    for recs in nodes:
        for r in recs:
            if r.eval_accuracy is not None:
                by_round.setdefault(r.eval_of_round, []).append(r.eval_accuracy)
    return [(rnd, fmean(v)) for rnd, v in sorted(by_round.items())]


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return fmean(present) if present else None


def table(summary: dict) -> str:
    mixes = summary["mixes"]
    first = next(iter(mixes.values()), None)
    alone = first["cumulative_reward_mean"] if first else None
    reference_s = _mean([s["node_round_seconds"] for s in first["seeds"]]) if first else None
    lines = [f"{summary['nodes']} nodes x {summary['rounds']} rounds x {summary['seeds']} seeds"
             + (" (tiny rounds)" if summary["tiny"] else ""), "",
             "| local/external | cumulative strict reward (mean ± sd over seeds) | vs first mix | "
             "held-out accuracy at the end | swarm's share of learning | s per node-round (vs first mix) |",
             "|---|---|---|---|---|---|"]
    for label, m in mixes.items():
        cum = m["cumulative_reward_mean"]
        rel = f"{(cum / alone - 1):+.0%}" if alone and cum is not None else "-"
        final = f"{m['final_eval_mean']:.1%} ± {m['final_eval_std']:.1%}" if m["final_eval_mean"] is not None else "-"
        share = _mean([s["external_advantage_share"] for s in m["seeds"]])
        seconds = _mean([s["node_round_seconds"] for s in m["seeds"]])
        cost = f"{seconds:.1f} ({seconds / reference_s:.2f}x)" if seconds and reference_s else "-"
        lines.append(f"| {label} | {cum:.2f} ± {m['cumulative_reward_std']:.2f} | {rel} | {final} | "
                     f"{f'{share:.0%}' if share is not None else '-'} | {cost} |")
    return "\n".join(lines) + "\n"


def plot(summary: dict, out: Path) -> None:
    """Reward and held-out accuracy over rounds per configuration (like the paper's Figure 2)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (reward_ax, eval_ax) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    for label, m in summary["mixes"].items():
        curves = [s["reward_by_round"] for s in m["seeds"] if s["reward_by_round"]]
        if curves:
            length = min(map(len, curves))
            mean = np.mean([c[:length] for c in curves], axis=0)
            reward_ax.plot(range(1, length + 1), mean, label=f"{label} local/external")
        evals = [dict(s["eval_by_round"]) for s in m["seeds"] if s["eval_by_round"]]
        if evals:
            rounds = sorted(set.intersection(*(set(e) for e in evals)))
            eval_ax.plot(rounds, [fmean(e[r] for e in evals) for r in rounds], marker="o", label=f"{label}")
    reward_ax.set(title="training reward (strict), mean over nodes and seeds", xlabel="round", ylabel="reward")
    eval_ax.set(title="held-out accuracy", xlabel="round (weights after it)", ylabel="accuracy")
    for ax in (reward_ax, eval_ax):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for suffix in ("png", "svg"):
        fig.savefig(out / f"experiment.{suffix}")
    plt.close(fig)


def experiment_command(options: ExperimentOptions, paths: Paths) -> int:
    nice = load_config(None, environ={}).resources.nice
    if nice:
        os.nice(nice)  # once for the whole process (each node's own nice is set to 0)
    summary = run_experiment(options, paths)
    print(table(summary))
    print(f"experiment: summary.json, table.md and experiment.png / .svg in {options.out}")
    return 0
