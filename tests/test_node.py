"""The node as a user runs it: the real CLI, real model, tiny rounds; crashes and restarts."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from waiting import wait_until

pytestmark = pytest.mark.slow  # real nodes on the real model

TINY = ["--set", "round.questions=2", "--set", "round.completions=2", "--set", "round.max_new_tokens=6", "--set", "run.seed=1"]


def swarmling(home: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "swarmling.app", "--home", str(home), *args],
        capture_output=True, text=True, timeout=600, **kw,
    )


def start(home: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "swarmling.app", "--home", str(home), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def records(home: Path) -> list[dict]:
    path = home / "state" / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_headless_rounds_write_metrics_and_checkpoints(tmp_path):
    proc = swarmling(tmp_path, "run", "--headless", "--rounds", "2", *TINY)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("round")]
    assert len(lines) == 2 and "reward" in lines[0] and "tok/s" in lines[0] and "generate" in lines[0]
    recs = records(tmp_path)
    assert [r["round"] for r in recs] == [1, 2]
    assert all(isinstance(r["round"], int) and isinstance(r["reward_mean"], float) for r in recs)
    assert {"signal_share", "tag_rate", "seconds", "levels"} <= set(recs[0])
    checkpoints = sorted(p.name for p in (tmp_path / "state" / "checkpoints").iterdir())
    assert checkpoints == ["round-00000001", "round-00000002"]
    assert (tmp_path / "state" / "checkpoints" / "round-00000002" / "adapter_model.safetensors").exists()


def test_kill_9_then_resume(tmp_path):
    proc = start(tmp_path, "run", "--headless", "--rounds", "50", *TINY)
    try:
        assert wait_until(lambda: len(records(tmp_path)) >= 2, 300), "no rounds finished"
        # The worst moment: while a checkpoint is being written (its temporary folder exists);
        # if no poll catches one within a minute, whatever moment it is then.
        wait_until(lambda: any((tmp_path / "state" / "checkpoints").glob(".round-*")), 60, interval_s=0.002)
        proc.kill()
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    done = max(r["round"] for r in records(tmp_path))
    ckpt = sorted((tmp_path / "state" / "checkpoints").glob("round-*"))[-1]
    last_checkpointed = int(ckpt.name.split("-")[1])
    assert last_checkpointed >= done - 1  # at most the round in flight is lost
    again = swarmling(tmp_path, "run", "--headless", "--rounds", "1", *TINY)
    assert again.returncode == 0, again.stderr
    assert f"resuming after round {last_checkpointed}" in again.stderr
    rounds = [r["round"] for r in records(tmp_path)]
    assert rounds == list(range(1, last_checkpointed + 2)), rounds


def test_corrupt_checkpoint_falls_back_to_previous(tmp_path):
    assert swarmling(tmp_path, "run", "--headless", "--rounds", "2", *TINY).returncode == 0
    newest = tmp_path / "state" / "checkpoints" / "round-00000002"
    (newest / "adapter_model.safetensors").write_bytes(b"\0" * 100)
    proc = swarmling(tmp_path, "run", "--headless", "--rounds", "1", *TINY)
    assert proc.returncode == 0, proc.stderr
    assert "resuming after round 1" in proc.stderr
    assert [r["round"] for r in records(tmp_path)] == [1, 2]
    # round 2 was redone from round 1's state
    assert (tmp_path / "state" / "checkpoints" / "round-00000002" / "manifest.json").exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_cleanly_with_exit_0(tmp_path, sig):
    proc = start(tmp_path, "run", "--headless", *TINY)
    try:
        assert wait_until(lambda: len(records(tmp_path)) >= 1, 300)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "stopping" in err
    last = max(r["round"] for r in records(tmp_path))
    assert (tmp_path / "state" / "checkpoints" / f"round-{last:08d}").exists()


def test_other_model_than_the_checkpoints_is_refused(tmp_path, gguf_path):
    assert swarmling(tmp_path, "run", "--headless", "--rounds", "1", *TINY).returncode == 0
    copy = tmp_path / "other.gguf"
    shutil.copy(gguf_path, copy)
    proc = swarmling(tmp_path, "run", "--headless", "--rounds", "1", "--model", str(copy), *TINY)
    assert proc.returncode == 1
    assert "trained on model 'smollm2-135m'" in proc.stderr


def test_doctor(tmp_path):
    proc = swarmling(tmp_path, "doctor")
    assert proc.returncode == 0, proc.stderr
    for word in ("hardware", "backend", "cpu:", "smollm2-135m", "checkpoints", str(tmp_path)):
        assert word in proc.stdout


def test_second_node_on_the_same_home_is_refused(tmp_path):
    proc = start(tmp_path, "run", "--headless", *TINY)
    try:
        assert wait_until(lambda: (tmp_path / "state" / "node.lock").exists() and
                        (tmp_path / "state" / "node.lock").read_text().strip() == str(proc.pid), 120)
        second = swarmling(tmp_path, "run", "--headless", "--rounds", "1", *TINY)
        assert second.returncode == 1
        assert f"another swarmling node (pid {proc.pid})" in second.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            # SIGTERM finishes the round in flight (run.on_stop), and a fresh home's first round now
            # steps (a minimum batch of 1) and so compiles the trainer: on a busy 2-core machine the
            # clean-clone run here took over 60 s to stop
            proc.communicate(timeout=240)
        finally:
            if proc.poll() is None:
                proc.kill()
