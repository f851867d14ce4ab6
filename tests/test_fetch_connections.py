"""Connections a node opens for fetches are closed once idle, also when the peer falls silent.

Real hosts on 127.0.0.1. A silent peer is a real one whose network thread stops (a frozen
process, a NAT mapping gone without a word): the kernel still holds its TCP connection open, but
nothing answers on it, so closing the connection politely cannot finish.
"""

from __future__ import annotations

import secrets
import threading
import time

import numpy as np
from swarm_peers import Hostile, bundle_and_announcement, connected_now, honest, real_groups
from waiting import wait_until

from swarmling.app.swarm.host import bundle_protocol, dialer
from swarmling.app.swarm.verification.wire import digest


# a bundle of ~40 KB (bundles are compressed: random text) whose uploads dwarf each stream's setup
LONG = ("<answer>4</answer>" + secrets.token_hex(30000), "<answer>5</answer>")


def silence(host) -> threading.Event:
    """Stop `host`'s network thread until the returned event is set."""
    thaw = threading.Event()
    host._trio._token.run_sync_soon(thaw.wait, 60.0)
    return thaw


def test_a_fetch_connection_to_a_peer_that_fell_silent_is_closed_once_idle(tmp_path, monkeypatch):
    monkeypatch.setattr(bundle_protocol, "IDLE_CLOSE_S", 1.0)
    b = honest(tmp_path, "b")
    h = Hostile(tmp_path)
    h.start()
    thaw = threading.Event()
    try:
        body, ann = bundle_and_announcement(h.peer_id, real_groups(1), addrs=h.listen_addrs)
        h.bodies[digest(body)] = body
        assert b.board.offer(h.peer_id, ann)  # as gossip would bring it
        assert b.plan_fetches(np.random.default_rng(0)) == 1
        assert wait_until(lambda: b.inbox._queue.qsize() == 1, timeout_s=15)
        assert connected_now(b.host, h.peer_id)
        thaw = silence(h)
        closed_within = (bundle_protocol.IDLE_CLOSE_S + 2 * bundle_protocol.IDLE_CHECK_S
                         + bundle_protocol.CLOSE_TIMEOUT_S + dialer.LOOP_INTERVAL_S + 2.0)
        assert wait_until(lambda: not connected_now(b.host, h.peer_id), timeout_s=closed_within)
    finally:
        thaw.set()
        h.stop()
        b.stop()




def test_peers_that_fall_silent_mid_fetch_neither_hold_fetch_slots_nor_their_connections(tmp_path, monkeypatch):
    # issue 27: after 30 throw-away identities fell silent, a node still held the connections its
    # own fetches had opened to them at the end of a 40 s silence. Each fetch waited its whole
    # timeout (20 s) for a stream the silent peer never opened, holding one of the four fetch slots,
    # and its connection was marked for closing only after that: 30 silent authors kept their
    # connections for minutes.
    monkeypatch.setattr(bundle_protocol, "IDLE_CLOSE_S", 1.0)
    b = honest(tmp_path, "b")
    crowd = {h.peer_id: h for h in (Hostile(tmp_path, name=f"h{i}") for i in range(8))}
    thaws: list[threading.Event] = []
    dial = b.host._bundles._dial_author

    async def dial_then_silence(peer, pid, addrs):  # each falls silent once it is connected
        failed = await dial(peer, pid, addrs)
        thaws.append(silence(crowd[peer]))
        return failed

    b.host._bundles._dial_author = dial_then_silence
    try:
        for h in crowd.values():
            h.start()
            body, ann = bundle_and_announcement(h.peer_id, real_groups(1), addrs=h.listen_addrs)
            h.bodies[digest(body)] = body
            assert b.board.offer(h.peer_id, ann)
        started = time.monotonic()
        rng = np.random.default_rng(0)
        assert wait_until(lambda: b.plan_fetches(rng) == 0 and len(thaws) == len(crowd), timeout_s=30)
        assert b.host.connection_figures().get("fetch", 0) >= 1  # the figures say why they are held
        waves = -(-len(crowd) // bundle_protocol.MAX_FETCHING)
        bound = (waves * bundle_protocol.FIRST_BYTE_S + bundle_protocol.IDLE_CLOSE_S + 2 * bundle_protocol.IDLE_CHECK_S
                 + bundle_protocol.CLOSE_TIMEOUT_S + dialer.LOOP_INTERVAL_S + 4.0)
        assert wait_until(lambda: not any(connected_now(b.host, p) for p in crowd), timeout_s=bound), \
            (time.monotonic() - started, [p[-6:] for p in crowd if connected_now(b.host, p)])
        stats = b.round_stats()
        assert b.inbox._queue.qsize() == 0 and stats.fetch_failures, stats
        assert "fetch" not in stats.connections_held, stats.connections_held
    finally:
        for thaw in thaws:
            thaw.set()
        for h in crowd.values():
            h.stop()
        b.stop()


def test_a_fetch_tries_its_authors_newest_addresses_before_the_announcements_own(tmp_path, monkeypatch):
    # Two NATed nodes and a helper that restarted (test_netlab_relay.py): an announcement made while
    # the helper was away names only the author's LAN; fetched later, by those addresses alone, it
    # failed ("no route") though the author's newer announcement named its relay slot.
    b = honest(tmp_path, "b")
    try:
        author = "12D3KooWENbBm4epqp94Ci12iLK2Pu2MxHQhbF5XkawyaT94xpys"
        lan = f"/ip4/100.64.2.2/tcp/4001/p2p/{author}"
        relayed = f"/ip4/198.18.0.10/tcp/4001/p2p/12D3KooWB8Vberbh68SzxiVrhRTRkmXdEKXBz2Qkvm6L51gxpB8M/p2p-circuit/p2p/{author}"
        older = bundle_and_announcement(author, real_groups(1), round_no=2, addrs=[lan])[1]
        newer = bundle_and_announcement(author, real_groups(1), round_no=3, addrs=[relayed, lan])[1]
        assert b.board.offer(author, older) and b.board.offer(author, newer)
        asked = []
        monkeypatch.setattr(b.host, "fetch", lambda peer, wanted, size, addrs: asked.append(addrs) or True)
        # the board may choose either (one bundle per author a round): here, the older
        monkeypatch.setattr(b.board, "choose", lambda *args, **kwargs: [
            h for h in b.board.fresh() if h.announcement.round == 2])
        assert b.plan_fetches(np.random.default_rng(0)) == 1
        assert asked == [(relayed, lan)]  # the older announcement's bundle, by the author's newest addresses
    finally:
        b.stop()
