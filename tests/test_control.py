"""The control channel: requests handled (pure), and the CLI against a really running node on the
shipped model (pause, resume, finish, status over the Unix socket)."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from waiting import wait_until
from swarmling.app.events import SwarmHealth
from swarmling.app.node.control import ControlError, handle, send, socket_path
from swarmling.app.node.status import BestScore, LastRound, NodeStatus


class Recorder:
    def __init__(self):
        self.calls = []

    def status(self):
        return NodeStatus.from_dict({"state": "running"})

    def pause(self, finish_round=False):
        self.calls.append("finish" if finish_round else "pause")

    def resume(self):
        self.calls.append("resume")


def test_requests_map_to_controls_and_bad_ones_are_refused():
    node = Recorder()
    for cmd in ("pause", "finish", "resume", "status"):
        assert handle(node, json.dumps({"cmd": cmd}).encode())["ok"]
    assert node.calls == ["pause", "finish", "resume"]
    for raw in (b"\xff", b"[]", b'{"cmd": "rm -rf"}', b"{}"):
        reply = handle(node, raw)
        assert not reply["ok"] and reply["error"]


def test_the_status_crosses_the_socket_whole_and_an_older_nodes_reads_with_defaults():
    status = NodeStatus(state="running", detail="", round=3, phase="train", suspended_for=None, pid=7,
                        model="smollm2-135m", backend="cpu", peers=2,
                        swarm_host=SwarmHealth(True, 0, None, "public", "dialled back", 0), swarm_share=0.25,
                        given="your rollouts: fetched 3x by 2 peers in 24 h",
                        last_round=LastRound(3, 0.4, 2, 8, 12.0, 30.0, 5, ""), best=BestScore(0.2, 2))
    assert NodeStatus.from_dict(json.loads(json.dumps(status.to_dict()))) == status
    older = status.to_dict()
    del older["last_round"]["learnable_groups"], older["swarm_share"], older["swarm_host"]["cut_off_rounds"]
    older["a_later_field"] = 1
    read = NodeStatus.from_dict(older)
    assert read.last_round.learnable_groups is None and read.swarm_share is None and read.best == status.best
    assert read.swarm_host.cut_off_rounds == 0 and read.swarm_host.reachability_text == "dialled back"
    del older["best"]["round"]  # one it cannot show without: left out, the rest still shown
    assert NodeStatus.from_dict(older).best is None and NodeStatus.from_dict(older).round == 3


def test_no_node_running_is_a_clear_error(tmp_path):
    with pytest.raises(ControlError, match="no swarmling node is running"):
        send(tmp_path, "status")


TINY = ["--set", "round.questions=2", "--set", "round.completions=2", "--set", "round.max_new_tokens=6",
        "--set", "run.seed=1"]


def cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "swarmling.app", "--home", str(home), *args],
                          capture_output=True, text=True, timeout=120)


def status(home: Path) -> dict:
    out = cli(home, "status", "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def wait(predicate, timeout: float, what: str) -> None:
    assert wait_until(predicate, timeout, interval_s=0.5), f"timed out waiting for {what}"


@pytest.mark.slow
def test_controls_against_a_running_node(tmp_path):
    node = subprocess.Popen([sys.executable, "-m", "swarmling.app", "--home", str(tmp_path), "run", "--headless", *TINY],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        sock = socket_path(tmp_path / "state")
        wait(sock.exists, 180, "the control socket")
        assert stat.S_IMODE(sock.stat().st_mode) == 0o600 and stat.S_IMODE(sock.parent.stat().st_mode) == 0o700
        wait(lambda: status(tmp_path)["last_round"], 300, "a finished round")

        out = cli(tmp_path, "pause")
        assert out.returncode == 0 and "paus" in out.stdout
        wait(lambda: status(tmp_path)["state"] == "paused", 120, "paused")
        held = status(tmp_path)["round"]
        assert not wait_until(lambda: status(tmp_path)["round"] != held, 3, interval_s=0.5)  # paused: no round runs

        assert cli(tmp_path, "resume").returncode == 0
        wait(lambda: status(tmp_path)["round"] > held, 300, "a round after resuming")

        assert cli(tmp_path, "finish").returncode == 0
        wait(lambda: status(tmp_path)["state"] == "paused", 300, "paused after finishing the round")
        human = cli(tmp_path, "status")
        assert human.returncode == 0 and "paused" in human.stdout and "round" in human.stdout
    finally:
        node.terminate()
        out, err = node.communicate(timeout=120)
    assert node.returncode == 0, err[-2000:]
    assert not socket_path(tmp_path / "state").exists()  # removed on a clean stop
    assert "no swarmling node is running" in cli(tmp_path, "status").stderr
