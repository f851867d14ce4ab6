"""The per-round metrics log: JSON Lines, one record per finished round.

Other tools read it (at least the integer `round` and float `reward_mean`). The checkpoint is the
source of truth: each checkpoint carries its round's record, and on start the log is reconciled
with it — a torn last line (killed mid-write) is cut, records of rounds that never reached a
checkpoint are dropped, and a record missing after a crash is re-appended.

Bounded (issue 27): a record is 1.4-2.1 KB (mean 1.9 in assets/results/volunteer-500), so a node
that runs for a year at a round a minute would write ~1 GB. Once `metrics.jsonl` passes
LIVE_MAX_BYTES (~1,100 rounds) it is rolled, before the next round's record is appended, into
`metrics.jsonl.r<first>-<last>.gz` next to it (gzip: 8x smaller); the newest KEEP_ARCHIVES are kept
(~36,000 rounds, about three weeks of minute-long rounds), the oldest dropped: at most ~10 MB
whatever the run's length. Only checkpointed rounds are ever rolled (a checkpoint is written before
its round's record), so reconciling touches the live file alone; `read_records` reads the history
(archives, then the live file).
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

from ..backends.atomic import write_atomic

from .learning.round_record import RoundRecord


LIVE_MAX_BYTES = 2 << 20
KEEP_ARCHIVES = 32


def read_records(path: Path) -> list[dict]:
    """Every record still kept, oldest first: the rolled archives', then the live file's."""
    by_round = {r["round"]: r for archive in archives(path) for r in _parse(_read_gzip(archive))}
    by_round.update((r["round"], r) for r in _read_live(path))  # a round run again after a resume: its last run
    return [by_round[k] for k in sorted(by_round)]


def archives(path: Path) -> list[Path]:
    """The rolled parts of the log at `path`, oldest first (their names sort by round)."""
    return sorted(path.parent.glob(path.name + ".r*.gz"))


def _read_live(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return _parse(path.read_text(encoding="utf-8", errors="replace"))


def _read_gzip(path: Path) -> str:
    try:
        return gzip.decompress(path.read_bytes()).decode("utf-8", errors="replace")
    except (OSError, EOFError):  # a damaged archive costs its own rounds only
        return ""


def _parse(text: str) -> list[dict]:
    records = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn line from a crash
        if isinstance(rec, dict) and isinstance(rec.get("round"), int):
            records.append(rec)
    return records


def append_record(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    roll(path)
    line = _line(record)
    with path.open("a", encoding="utf-8") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


def roll(path: Path, max_bytes: int | None = None, keep: int | None = None) -> Path | None:
    """Past `max_bytes` (LIVE_MAX_BYTES), move the live file's records into a gzip archive (and drop
    the oldest archives beyond `keep`, KEEP_ARCHIVES); the archive written, or None."""
    max_bytes = LIVE_MAX_BYTES if max_bytes is None else max_bytes
    keep = KEEP_ARCHIVES if keep is None else keep
    try:
        if path.stat().st_size <= max_bytes:
            return None
    except OSError:
        return None
    records = _read_live(path)
    if not records:
        return None
    rounds = [r["round"] for r in records]
    archive = path.with_name(f"{path.name}.r{min(rounds):07d}-{max(rounds):07d}.gz")
    write_atomic(archive, gzip.compress("".join(_line(r) for r in records).encode("utf-8"), mtime=0), fsync=True)
    write_atomic(path, "", fsync=True)
    for old in archives(path)[:-keep] if keep > 0 else []:
        old.unlink(missing_ok=True)
    return archive


def reconcile(path: Path, last_round: int, last_record: dict | None) -> None:
    """Make the log hold exactly one record per round up to the checkpointed `last_round` (the live
    file only: archives hold checkpointed rounds alone)."""
    records = _read_live(path)
    rolled = max((r["round"] for r in _parse(_read_gzip(archives(path)[-1]))), default=-1) if archives(path) else -1
    seen: dict[int, dict] = {}
    for rec in records:
        if rec["round"] <= last_round:
            seen[rec["round"]] = rec
    if last_record is not None and last_round not in seen and last_round > rolled:
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
        train = f"train waiting for learnable groups {m.signal_groups}/{m.min_signal_groups} "
    else:
        train = "train skipped (nothing learnable) "
    return (
        f"round {m.round:>4}  reward {m.reward_mean:.3f} (shaped {m.shaped_reward_mean:.3f})  "
        f"solved {m.solved}/{m.questions}  learnable {m.learnable_groups}/{m.questions}  "
        + (f"{m.rescued_by}  " if m.rescued_groups else "")
        + f"tags {m.tag_rate:.0%}  |  "
        f"generate {s.get('generate', 0):.1f}s score {s.get('score', 0):.2f}s {train}"
        f"hand-off {s.get('hand-off', 0):.2f}s  |  {m.tokens_per_s:.0f} tok/s"
        + (f"  |  held-out {m.eval_accuracy:.0%} (round {m.eval_of_round})" if m.eval_accuracy is not None else "")
        + (f", best {m.eval_best_accuracy:.0%} at round {m.eval_best_of_round}"
           if m.eval_accuracy is not None and m.eval_best_accuracy is not None else "")
        + (f"  |  {m.swarm.given}" if m.swarm is not None and m.swarm.given else "")
    )
