"""The per-round metrics log: JSON Lines, one record per finished round.

Other tools read it (at least the integer `round` and float `reward_mean`). The checkpoint is the
source of truth: each checkpoint carries its round's record, and on start the log is reconciled
with it — a torn last line (killed mid-write) is cut, records of rounds that never reached a
checkpoint are dropped, and a record missing after a crash is re-appended.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..backends.atomic import write_atomic

from .learning.round_record import RoundRecord


def read_records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    records = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn line from a crash
        if isinstance(rec, dict) and isinstance(rec.get("round"), int):
            records.append(rec)
    return records


def append_record(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    line = _line(record)
    with path.open("a", encoding="utf-8") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


def reconcile(path: Path, last_round: int, last_record: dict | None) -> None:
    """Make the log hold exactly one record per round up to the checkpointed `last_round`."""
    records = read_records(path)
    seen: dict[int, dict] = {}
    for rec in records:
        if rec["round"] <= last_round:
            seen[rec["round"]] = rec
    if last_record is not None and last_round not in seen:
        seen[last_round] = last_record
    write_records(path, [seen[k] for k in sorted(seen)])


def write_records(path: Path, records: list[dict]) -> None:
    """The log holds exactly these records (atomically; nothing is written when it already does)."""
    text = "".join(_line(r) for r in records)
    if path.exists() and path.read_text(encoding="utf-8", errors="replace") == text:
        return
    write_atomic(path, text, fsync=True)


def _line(record: dict) -> str:
    return json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n"


def format_round(m: RoundRecord) -> str:
    """The one line per round that headless mode prints and the log file keeps."""
    s = m.seconds
    if "train" in s:
        train = f"train {s['train']:.1f}s "
    elif m.min_signal_groups:
        train = f"train waiting for signal {m.signal_groups}/{m.min_signal_groups} "
    else:
        train = "train skipped (no signal) "
    return (
        f"round {m.round:>4}  reward {m.reward_mean:.3f} (shaped {m.shaped_reward_mean:.3f})  "
        f"solved {m.solved}/{m.questions}  signal {m.signal_share:.0%}  tags {m.tag_rate:.0%}  |  "
        f"generate {s.get('generate', 0):.1f}s score {s.get('score', 0):.2f}s {train}"
        f"hand-off {s.get('hand-off', 0):.2f}s  |  {m.tokens_per_s:.0f} tok/s"
        + (f"  |  held-out {m.eval_accuracy:.0%} (round {m.eval_of_round})" if m.eval_accuracy is not None else "")
        + (f", best {m.eval_best_accuracy:.0%} at round {m.eval_best_of_round}"
           if m.eval_accuracy is not None and m.eval_best_accuracy is not None else "")
    )
