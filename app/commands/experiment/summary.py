"""What an experiment's `summary.json` holds, typed: report.py builds it from the grid's files and
renders the table and the plot from it. Field names are the file's keys (`to_json`)."""

from __future__ import annotations

import json

import msgspec


class Paired(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A paired difference (arm - other arm) over the seeds both finished (statistics.py)."""

    pairs: int
    mean: float | None
    sd: float | None  # None (null in the file) for a single pair: no spread
    low: float | None  # 95% confidence interval of the mean
    high: float | None
    detectable: float | None  # the smallest true difference this many pairs find 80% of the time
    seeds: list[str]


class Comparison(Paired, kw_only=True, omit_defaults=True):
    """The primary metric's paired difference, and the further endpoints where there are any."""

    final: Paired | None = None  # the last round's accuracy
    without_shortcuts: Paired | None = None  # leaving out specialities a fixed answer scores on
    by_model: dict[str, Paired] | None = None  # a heterogeneous swarm: each model's nodes apart
    without_shortcuts_by_model: dict[str, Paired] | None = None
    arm: str | None = None  # a contrast between two arms neither of which is the baseline
    against: str | None = None


class RunSummary(msgspec.Struct, kw_only=True):
    """One (arm, seed): its nodes' figures."""

    primary: float  # the primary metric, mean over the counted evaluations and the nodes
    final: float  # the second endpoint: the last round's
    primary_without_shortcuts: float | None
    curve: list[tuple[int, float]]  # (round, the nodes' mean) at each evaluation
    primary_by_model: dict[str, float | None]
    without_shortcuts_by_model: dict[str, float | None]
    final_by_node: list[dict[str, float]]  # each node's per-speciality accuracy at the last round
    per_dataset_final: dict[str, float]
    node_round_seconds: float | None  # wall, round 1 left out (warm-up)
    node_round_cpu_seconds: float | None
    external_advantage_share: float | None
    rescued_per_node_round: float | None = None  # rescue's mechanism (learning/rescue.py)
    backends: list[str]
    rss_bytes: int | None
    resumed_at: list[int] = []  # rounds a sharing run resumed at after a kill, without its inbox


class ArmSummary(msgspec.Struct, kw_only=True):
    seeds: dict[str, RunSummary]
    primary_mean: float | None
    primary_by_model: dict[str, float | None]
    external_advantage_share: float | None  # what the mix became: peers' share of the advantage
    rescued_per_node_round: float | None
    primary_se: float | None
    node_round_seconds: float | None
    node_round_cpu_seconds: float | None


class FixedAnswer(msgspec.Struct):
    answer: str
    accuracy: float


class Summary(msgspec.Struct, kw_only=True):
    revisions: list[str]
    backends: list[str]
    design: str
    metric: str
    baseline: str
    nodes: int
    rounds: int
    seeds: list[int]
    burn_in: int
    eval_rounds: list[int]
    models: list[str]
    specialities: list[tuple[str, int]]
    arms: dict[str, ArmSummary]
    comparisons: dict[str, Comparison]
    contrasts: dict[str, Comparison]
    eval_items: int
    fixed_answers: dict[str, FixedAnswer]
    shortcuts: list[str]

    def to_json(self) -> str:
        return json.dumps(msgspec.to_builtins(self), indent=1)

    @classmethod
    def from_dict(cls, data: dict) -> Summary:
        """A summary read back (summary.json, or one edited in a test)."""
        return msgspec.convert(data, cls)
