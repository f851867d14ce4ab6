"""Across home NATs, for real: a helper on the simulated internet, nodes behind two routers.

Network-only peers (tests/lab_peer.py: the real SwarmNetwork and helper, real py-libp2p, real
task groups, no model) in the namespace lab (tests/netlab.py). What issue 14 measured failing
before: A and C behind two NATs never got each other's groups (every fetch dialled a LAN address).
Here they find each other through the helper alone, say they are relayed, fetch each other's
bundles through it, carry on when it dies and come back when it returns; a node with a port
forward learns it is reachable directly and is fetched from without the relay.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from lab_peer import ask
from netlab import Lab, lab  # noqa: F401 — `lab` is the fixture
from waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

PEER = str(Path(__file__).with_name("lab_peer.py"))
PORT = 4001
CIRCUIT_OVERHEAD = 24 * 1024  # per relayed fetch: Noise, yamux, identify and gossip hello on a fresh circuit (measured ~6 KiB)


def until(proc, cmd: str, ok, timeout: float, every: float = 1.0) -> dict:
    """Ask `cmd` until `ok(answer)` (bounded by `timeout`); the last answer either way."""
    last: dict = {}

    def answered() -> bool:
        last.update(answer=ask(proc, cmd))
        return ok(last["answer"])

    wait_until(answered, timeout_s=timeout, interval_s=every)
    return last["answer"]


def start_helper(lab: Lab, home: Path):
    proc = lab.spawn("pub", [sys.executable, PEER, "helper", str(home), str(PORT)], lifetime_s=220)
    ready = json.loads(proc.expect('"ready"', timeout=90))
    return proc, f"/ip4/{lab.addr('pub')}/tcp/{PORT}/p2p/{ready['peer_id']}"


def start_node(lab: Lab, role: str, home: Path, helper_addr: str):
    proc = lab.spawn(role, [sys.executable, PEER, "node", str(home), str(PORT), helper_addr], lifetime_s=220)
    proc.peer_id = json.loads(proc.expect('"ready"', timeout=90))["peer_id"]
    return proc


def trade(nodes: dict, round_no: int, fetched_before: int) -> dict:
    """Each node shares a bundle, then fetches what it heard; their states once both fetched one more."""
    for proc in nodes.values():
        assert ask(proc, f"share {round_no}")["size"] > 0
    for proc in nodes.values():  # the announcement reaches the other through the helper's gossip
        until(proc, "state", lambda s: s["heard"] >= 1, timeout=20)
        ask(proc, "fetch")
    return {role: until(proc, "state", lambda s: s["fetched"] > fetched_before, timeout=30)
            for role, proc in nodes.items()}


def test_nodes_behind_two_nats_trade_through_the_helper_and_outlive_it(lab, tmp_path):
    helper, helper_addr = start_helper(lab, tmp_path / "helper")
    nodes = {role: start_node(lab, role, tmp_path / role, helper_addr) for role in ("h1", "h2")}

    # 1. each learns it cannot be dialled, takes a slot on the helper and announces it first
    for role, proc in nodes.items():
        state = until(proc, "state", lambda s: s["state"] == "relayed", timeout=60)
        assert state["state"] == "relayed", state
        assert state["describe"].startswith("through relay"), state
        assert state["announce"][0] == f"{helper_addr}/p2p-circuit/p2p/{proc.peer_id}", state

    # 2. they know only the helper, yet fetch each other's bundles (through its relay)
    states = trade(nodes, 1, 0)
    for role, state in states.items():
        assert state["fetched"] == 1 and not state["failures"], json.dumps([role, state])
    figures = ask(helper, "state")
    fetched_bytes = sum(s["bundle_bytes_in"] for s in states.values())
    assert figures["reservations"] == 2 and figures["dialbacks"] >= 2, figures
    # what the helper relayed is what was fetched, plus each circuit's handshakes
    assert fetched_bytes <= figures["relayed_bytes"] <= fetched_bytes + 2 * CIRCUIT_OVERHEAD, (figures, fetched_bytes)

    # 3. the helper dies: nodes carry on (they answer, share) and say nobody can tell them
    helper.kill()
    for proc in nodes.values():
        state = until(proc, "state", lambda s: s["state"] == "unknown", timeout=20)
        assert state["state"] == "unknown", state
        assert ask(proc, "share 2")["size"] > 0

    # 4. it comes back (same identity and port): nodes redial it, take their slots again, trade again
    helper, _ = start_helper(lab, tmp_path / "helper")
    for proc in nodes.values():
        assert until(proc, "state", lambda s: s["state"] == "relayed", timeout=60)["state"] == "relayed"
    states = trade(nodes, 3, 1)
    assert all(s["fetched"] == 2 for s in states.values()), states


def doctor(lab: Lab, role: str, home: Path, helper_addr: str) -> str:
    result = lab.run(role, [sys.executable, "-m", "swarmling.app", "--home", str(home), "doctor", "--swarm", "test",
                            "--port", str(PORT), "--set", "swarm.enabled=true", "--set", f'swarm.bootstrap=["{helper_addr}"]'], timeout=90)
    assert result.returncode == 0, result.stdout + result.stderr
    return next(line for line in result.stdout.splitlines() if line.startswith("  reachability: ") and "asking" not in line)


def test_a_port_forward_makes_a_node_reachable_directly(lab, tmp_path):
    lab.forward_port("r1", PORT, "h1")
    helper, helper_addr = start_helper(lab, tmp_path / "helper")
    # `swarmling doctor` checks it before any node runs (on the node's port: the one forwarded)
    assert doctor(lab, "h1", tmp_path / "h1", helper_addr) == f"  reachability: reachable directly at /ip4/{lab.wan('h1')}/tcp/{PORT}"
    assert doctor(lab, "h2", tmp_path / "h2", helper_addr).startswith("  reachability: through relay")
    nodes = {role: start_node(lab, role, tmp_path / role, helper_addr) for role in ("h1", "h2")}
    h1 = until(nodes["h1"], "state", lambda s: s["state"] == "direct", timeout=60)
    assert h1["state"] == "direct", h1
    assert h1["announce"][0] == f"/ip4/{lab.wan('h1')}/tcp/{PORT}/p2p/{nodes['h1'].peer_id}", h1
    assert h1["describe"] == f"reachable directly at /ip4/{lab.wan('h1')}/tcp/{PORT}"
    assert until(nodes["h2"], "state", lambda s: s["state"] == "relayed", timeout=60)["state"] == "relayed"

    states = trade(nodes, 1, 0)
    assert all(s["fetched"] == 1 and not s["failures"] for s in states.values()), states
    # h2 dialled h1 directly; only h1's fetch from h2 crossed the relay, and fetching through a
    # helper takes no slot there: only h2 (relayed) holds one
    # (doctor's probes held slots too, under their own identity: freed once they left, ≤ 30 s)
    figures = until(helper, "state", lambda f: f["reservations"] == 1, timeout=45)
    assert figures["reservations"] == 1, figures
    relayed = figures["relayed_bytes"]
    assert states["h1"]["bundle_bytes_in"] <= relayed <= states["h1"]["bundle_bytes_in"] + CIRCUIT_OVERHEAD, relayed
