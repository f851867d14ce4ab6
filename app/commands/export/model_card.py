"""The exported folder's README.md: what the model is, how it was grown, how well it does, and
how to use it. Its figures come from the metrics log of the home the checkpoint came from, cut
at the checkpoint's round (the log of a node that went on, or of a best checkpoint, holds later
rounds that are not in these weights); without that log, from the checkpoint's own record."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean

from ...learning.curriculum import Curriculum
from ...learning.evaluation import EVAL_ITEMS, EVAL_TEMPERATURE
from ...learning.prompt import PromptFormat
from ...learning.tasks import load_preset
from ...metrics import read_records
from ...node.checkpoint_choice import TakenCheckpoint


@dataclass(frozen=True)
class CardFacts:
    model_name: str
    model_description: str
    licence: str | None
    taken: TakenCheckpoint
    format: str
    form: PromptFormat  # how the node asked: its system prompt and any pre-started answer
    usage: str  # Markdown: the format's own instructions


def records_up_to(taken: TakenCheckpoint) -> tuple[list[dict], bool]:
    """The checkpoint's rounds' records, and whether they came from its home's log."""
    records = [r for r in read_records(taken.metrics_file) if r["round"] <= taken.round]
    if records:
        return records, True
    own = taken.state.metrics
    return ([own] if own else []), False


def model_card(facts: CardFacts) -> str:
    taken = facts.taken
    records, from_log = records_up_to(taken)
    preset_name = (records[-1].get("preset") if records else None) or (taken.state.curriculum or {}).get("preset")
    lines = [
        f"# {facts.model_name}, grown by swarmling to round {taken.round}",
        "",
        f"A LoRA post-training of **{facts.model_name}** ({facts.model_description}) by a "
        "swarmling node: GRPO on verifiable reasoning-gym tasks, sharing rollouts with a "
        f"swarm (SAPO). Exported {time.strftime('%Y-%m-%d')} from `{taken.source}` as `{facts.format}`.",
        "",
        "## Base model and licence",
        "",
        f"- base: {facts.model_name} ({facts.model_description})",
        f"- licence: **{facts.licence or 'see the base model'}**: these weights are a derivative of the base model "
        "and its licence applies to them",
        "",
        "## Training",
        "",
        f"- rounds trained: {taken.round} (seed {taken.state.seed})",
        *_datasets(preset_name, taken),
        "",
        "## Held-out accuracy",
        "",
        *_held_out(records, from_log, taken),
        "",
        "## Learning from peers",
        "",
        *_peers(records, from_log),
        "",
        "## How it is asked",
        "",
        f"System prompt: `{facts.form.system}`. "
        + (f"The reply is pre-started with `{facts.form.prefill}` and ends at its closing tag; "
           if facts.form.prefill else "The reply is free text; ")
        + "the model learnt under exactly this prompt and does best with it.",
        "",
        "## Use it",
        "",
        facts.usage,
        "",
    ]
    return "\n".join(lines)


def _datasets(preset_name: str | None, taken: TakenCheckpoint) -> list[str]:
    if not preset_name:
        return ["- task preset: unknown (the checkpoint records none)"]
    try:
        preset = load_preset(preset_name)
    except Exception:  # noqa: BLE001 - a preset this version no longer ships: name it, without levels
        return [f"- task preset: {preset_name}"]
    levels = Curriculum.from_dict(preset, taken.state.curriculum).levels()
    rows = [f"| {d} | {levels.get(d, 0)} of {len(preset.levels[d])} |" for d in preset.datasets]
    return [f"- task preset: {preset_name}; the curriculum's level per dataset at round {taken.round} (levels "
            "start at 0):", "", "| dataset | level |", "|---|---|", *rows]


def _held_out(records: list[dict], from_log: bool, taken: TakenCheckpoint) -> list[str]:
    points: dict[int, dict] = {}
    for r in records:
        if r.get("eval_accuracy") is not None and r.get("eval_of_round") is not None:
            points[int(r["eval_of_round"])] = r
    if not points:
        return ["No held-out evaluation is recorded up to this round (`swarmling eval --checkpoint DIR` measures it)."]
    note = "" if from_log else " (the metrics log of its home was not found: only the checkpoint's own record)"
    lines = [f"The node's fixed held-out set ({EVAL_ITEMS} items from seeds no round draws, the preset's first two "
             f"levels, decoded at temperature {EVAL_TEMPERATURE}, right or wrong){note}:", "",
             "| weights of round | accuracy |", "|---|---|"]
    lines += [f"| {'base model' if k == 0 else k} | {r['eval_accuracy']:.1%} |" for k, r in sorted(points.items())]
    last = points[max(points)]
    base = points.get(0)
    per = last.get("eval_per_dataset") or {}
    if per:
        lines += ["", f"Per dataset at round {max(points)}" + (", beside the base model's:" if base and max(points) else ":"),
                  "", "| dataset | accuracy | base model |", "|---|---|---|"]
        base_per = (base or {}).get("eval_per_dataset") or {}
        lines += [f"| {d} | {a:.1%} | {base_per[d]:.1%} |" if d in base_per else f"| {d} | {a:.1%} | |"
                  for d, a in sorted(per.items())]
    if max(points) != taken.round:
        lines += ["", f"(The last evaluation before these weights was at round {max(points)}.)"]
    return lines


def _peers(records: list[dict], from_log: bool) -> list[str]:
    shares = [r["external_advantage_share"] for r in records if r.get("external_advantage_share") is not None]
    peers = {p for r in records for p in (r.get("external_groups_by_peer") or {})}
    external = sum(int(r.get("external_groups") or 0) for r in records)
    local = sum(int(r.get("local_groups") or 0) for r in records)
    if not records or not from_log:
        return ["Not known: the metrics log of the checkpoint's home was not found."]
    if not external:
        return [f"None: all {local} question-groups it trained on were its own (no peers' groups used)."]
    return [f"- {external} of {external + local} question-groups trained on came from {len(peers)} "
            f"peer{'s' if len(peers) != 1 else ''}",
            f"- the swarm's share of the update (advantage-weighted, per round, mean): {fmean(shares):.0%}"
            if shares else "- the swarm's share of the update: not recorded"]


def provenance(facts: CardFacts, files: dict[str, int]) -> str:
    """swarmling-export.json: what was exported from where, for scripts."""
    return json.dumps({"model": facts.model_name, "round": facts.taken.round, "format": facts.format,
                       "source": str(facts.taken.source), "seed": facts.taken.state.seed,
                       "files": files}, indent=1)
