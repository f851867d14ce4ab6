"""Issue 14's acceptance, for real: `swarmling relay` on the simulated internet, two volunteers'
nodes (`swarmling run --headless`, the shipped model, tiny rounds) behind two home NATs, each
told only the helper's address.

They find each other through the helper alone, report themselves relayed, train on each other's
groups (fetched through the helper's relay: it relays what they fetched plus the circuits'
handshakes), and when the helper is killed mid-run neither crashes nor stalls: rounds go on,
alone, and once the helper is back they are relayed and trade again.

Waits are bounded in time, sized for a loaded 2-core machine (a tiny round takes ~10 s on a quiet
one and up to a minute when other work shares the cores); the whole test takes ~5 minutes quiet.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import psutil
import pytest

from netlab import Lab, lab  # noqa: F401 — `lab` is the fixture
from waiting import wait_until

from swarmling.app.metrics import read_records

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

PORT = 4001
SWARM = "lab"
CIRCUIT_OVERHEAD = 24 * 1024  # per relayed fetch (test_netlab_relay.py measures ~6 KiB)
TINY = {"round.questions": 4, "round.completions": 4, "round.max_new_tokens": 12, "round.external_groups": 2,
        "backend.threads": 1, "train.microbatch_tokens": 256, "swarm.mdns": False, "swarm.port": PORT,
        "swarm.name": SWARM, "swarm.enabled": True}


def records(home: Path) -> list[dict]:
    return read_records(home / "state" / "metrics.jsonl")  # a line being written is skipped


def figures(home: Path) -> dict:
    try:
        return json.loads((home / "data" / "relay.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def start_helper(lab: Lab, home: Path):
    proc = lab.spawn("pub", [sys.executable, "-m", "swarmling.app", "--home", str(home), "relay", "--port", str(PORT),
                             "--swarm", SWARM, "--every", "2", "--public-host", lab.addr("pub")], lifetime_s=1780)
    line = proc.expect("helper for swarm", timeout=60)
    peer_id = line.split("peer ")[1].split(",")[0]
    return proc, f"/ip4/{lab.addr('pub')}/tcp/{PORT}/p2p/{peer_id}"


def start_node(lab: Lab, role: str, home: Path, helper_addr: str, seed: int):
    settings = {**TINY, "run.seed": seed, "swarm.bootstrap": f'["{helper_addr}"]'}
    argv = [sys.executable, "-m", "swarmling.app", "--home", str(home), "run", "--headless", "--rounds", "200"]
    for key, value in settings.items():
        argv += ["--set", f"{key}={str(value).lower() if isinstance(value, bool) else value}"]
    return lab.spawn(role, argv, lifetime_s=1780)


def trained_on(recs: list[dict], peer: str) -> bool:
    return any(r.get("external_groups_by_peer", {}).get(peer, 0) > 0 for r in recs)


def test_two_volunteers_behind_nats_train_on_each_other_through_a_helper(lab, tmp_path):
    helper, helper_addr = start_helper(lab, tmp_path / "helper")
    homes = {role: tmp_path / role for role in ("h1", "h2")}
    procs = {role: start_node(lab, role, home, helper_addr, seed=i) for i, (role, home) in enumerate(homes.items())}
    ids = {}
    for role, proc in procs.items():
        ids[role] = proc.expect("swarm 'lab': peer ", timeout=240).split("peer ")[1].split(",")[0]
    other = {"h1": ids["h2"], "h2": ids["h1"]}

    # 1. each trains on the other's groups, knowing only the helper, and says it is relayed
    def traded() -> bool:
        return all(trained_on(records(home), other[role]) for role, home in homes.items())

    assert wait_until(traded, 600, 2.0), {role: [(r["round"], r.get("reachability"), r.get("external_groups_by_peer"),
                                                  r.get("fetch_failures")) for r in records(home)][-8:]
                                          for role, home in homes.items()}
    for role, home in homes.items():
        assert records(home)[-1]["reachability"] == "relayed", records(home)[-1]

    # 2. what the helper relayed is what they fetched, plus each circuit's handshakes
    def relayed_matches() -> bool:
        fetched = sum(r.get("bundle_bytes_in", 0) for home in homes.values() for r in records(home))
        bundles = sum(records(home)[-1].get("bundles_fetched", 0) for home in homes.values())
        relayed = figures(tmp_path / "helper").get("relayed_bytes", 0)
        return fetched > 0 and fetched <= relayed <= fetched + bundles * CIRCUIT_OVERHEAD

    assert wait_until(relayed_matches, 60, 0.5), figures(tmp_path / "helper")

    # 3. the helper is killed mid-run: the nodes neither crash nor stall, and say so
    helper.kill()
    rounds_then = {role: len(records(home)) for role, home in homes.items()}
    assert wait_until(lambda: all(len(records(h)) >= rounds_then[r] + 3 and records(h)[-1]["reachability"] == "unknown"
                                  for r, h in homes.items()), 400, 2.0), {r: records(h)[-1] for r, h in homes.items()}
    assert all(proc.popen.poll() is None for proc in procs.values())

    # 4. it returns (same identity, same port): both take their relay slots again and trade again.
    # (They used to go deaf here: the burst of announcements queued during the gap was rate-limited
    # by the helper and counted against them, until it forwarded them nothing: board.py.)
    helper, _ = start_helper(lab, tmp_path / "helper")
    rounds_back = {role: len(records(home)) for role, home in homes.items()}

    def relayed_and_trading_again() -> bool:
        return all(any(r.get("reachability") == "relayed" for r in records(home)[rounds_back[role]:])
                   and trained_on(records(home)[rounds_back[role]:], other[role]) for role, home in homes.items())

    assert wait_until(relayed_and_trading_again, 400, 2.0), {
        r: [(x["round"], x.get("reachability"), x.get("announcements_in"), x.get("lowest_gossip_score"),
             x.get("external_groups_by_peer")) for x in records(h)[-4:]] for r, h in homes.items()}

    # 5. a clean stop
    for proc in procs.values():  # to the node itself: the lab's `timeout` wrapper would answer 124/143
        for child in psutil.Process(proc.popen.pid).children(recursive=True):
            child.send_signal(signal.SIGTERM)
    for role, proc in procs.items():
        assert proc.wait(60) == 0, proc.output[-3000:]
        assert "Traceback" not in proc.output, proc.output[-3000:]
