"""Checkpoints are atomic and verified; the metrics log is reconciled with them."""

from __future__ import annotations

import json

from swarmling.app import metrics
from swarmling.app.node.checkpoint import latest_checkpoint, save_checkpoint


def files(payload):
    def write(folder):
        (folder / "adapter.bin").write_bytes(payload)

    return write


def test_save_and_load_latest(tmp_path):
    for r in (1, 2, 3, 4):
        save_checkpoint(tmp_path, r, {"round": r, "x": r * 10}, files(bytes([r]) * 100), keep=2)
    ck = latest_checkpoint(tmp_path)
    assert ck.round == 4 and ck.state["x"] == 40
    assert (ck.path / "adapter.bin").read_bytes() == bytes([4]) * 100
    assert sorted(p.name for p in tmp_path.iterdir()) == ["round-00000003", "round-00000004"]


def test_corrupt_latest_falls_back(tmp_path):
    save_checkpoint(tmp_path, 1, {"round": 1}, files(b"a" * 50))
    save_checkpoint(tmp_path, 2, {"round": 2}, files(b"b" * 50))
    (tmp_path / "round-00000002" / "adapter.bin").write_bytes(b"garbage")
    assert latest_checkpoint(tmp_path).round == 1


def test_half_written_checkpoint_is_ignored(tmp_path):
    save_checkpoint(tmp_path, 1, {"round": 1}, files(b"a"))
    # a crash mid-save leaves a temp folder, or a round folder without its manifest
    (tmp_path / ".round-00000002-abc").mkdir()
    (tmp_path / "round-00000003").mkdir()
    (tmp_path / "round-00000003" / "state.json").write_text(json.dumps({"round": 3}))
    assert latest_checkpoint(tmp_path).round == 1


def test_failed_write_leaves_previous_intact(tmp_path):
    save_checkpoint(tmp_path, 1, {"round": 1}, files(b"a"))

    def boom(folder):
        (folder / "partial").write_bytes(b"x")
        raise OSError(28, "No space left on device")

    try:
        save_checkpoint(tmp_path, 2, {"round": 2}, boom)
    except OSError:
        pass
    assert latest_checkpoint(tmp_path).round == 1
    assert [p.name for p in tmp_path.iterdir()] == ["round-00000001"]


def test_metrics_reconcile(tmp_path):
    log = tmp_path / "metrics.jsonl"
    for r in (1, 2, 3):
        metrics.append_record(log, {"round": r, "reward_mean": 0.1 * r})
    with log.open("a") as f:
        f.write('{"round": 4, "rew')  # killed mid-write
    metrics.reconcile(log, last_round=2, last_record={"round": 2, "reward_mean": 0.2})
    assert [r["round"] for r in metrics.read_records(log)] == [1, 2]
    # the checkpoint has round 3 but the log lost it: it comes back from the checkpoint
    metrics.reconcile(log, last_round=3, last_record={"round": 3, "reward_mean": 0.3})
    assert [r["round"] for r in metrics.read_records(log)] == [1, 2, 3]


def test_the_metrics_log_is_bounded_and_its_readers_still_see_the_history(tmp_path, monkeypatch):
    # issue 27: a record a round, ~1.3 KB each, grew without bound (~700 MB a year at a round a minute)
    monkeypatch.setattr(metrics, "LIVE_MAX_BYTES", 2000)
    monkeypatch.setattr(metrics, "KEEP_ARCHIVES", 3)
    log = tmp_path / "metrics.jsonl"
    pad = "x" * 150  # a record of ~200 bytes: the live file rolls every ~10 rounds
    for r in range(1, 81):
        metrics.append_record(log, {"round": r, "reward_mean": 0.01 * r, "pad": pad})
        assert log.stat().st_size <= 2000 + 250
    parts = metrics.archives(log)
    assert len(parts) == 3  # the oldest dropped
    kept = [rec["round"] for rec in metrics.read_records(log)]
    assert kept == list(range(kept[0], 81)) and kept[0] > 1  # the newest rounds, in order, none twice
    disk = sum(p.stat().st_size for p in parts) + log.stat().st_size
    assert disk < len(kept) * 200 / 2  # bounded, and the archives are compressed
    # start-up reconcile touches only the live file: a checkpoint of the last round keeps all of it
    metrics.reconcile(log, last_round=80, last_record={"round": 80, "reward_mean": 0.8, "pad": pad})
    assert [rec["round"] for rec in metrics.read_records(log)] == kept
    # a crash right after a roll, before the round's record was appended: it comes back once
    metrics.roll(log, max_bytes=0)  # (one more archive: the oldest goes)
    metrics.reconcile(log, last_round=80, last_record={"round": 80, "reward_mean": 0.8, "pad": pad})
    after = [rec["round"] for rec in metrics.read_records(log)]
    assert after == list(range(after[0], 81)) and not log.read_text()  # round 80 is in an archive, not twice
    metrics.reconcile(log, last_round=81, last_record={"round": 81, "reward_mean": 0.81, "pad": pad})
    assert [rec["round"] for rec in metrics.read_records(log)][-3:] == [79, 80, 81]
