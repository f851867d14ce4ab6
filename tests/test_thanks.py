"""A node tells the authors whose groups it trained on (app/swarm/host/thanks.py), and an author
counts what peers say, as their word. Real hosts on 127.0.0.1."""

from __future__ import annotations

import dataclasses

import pytest
from swarm_peers import Hostile, honest, on_network_thread
from waiting import wait_until

from swarmling.app.learning.rollout import QuestionGroup

pytestmark = pytest.mark.slow


def trained_on(author: str, n: int) -> list[QuestionGroup]:
    """`n` groups of `author`'s that an update trained on (only their source matters here)."""
    return [_group(author) for _ in range(n)]


def _group(author: str) -> QuestionGroup:
    from fakes import SETTINGS, FakeBackend

    from swarmling.app.learning.curriculum import Curriculum
    from swarmling.app.learning.draws import RoundDraws
    from swarmling.app.learning.round import run_round
    from swarmling.app.learning.tasks import load_preset

    preset = load_preset("starter")
    group = run_round(1, FakeBackend(), preset, Curriculum(preset), SETTINGS, RoundDraws(0, 1)).groups[0]
    return dataclasses.replace(group, source=author)


def test_an_author_hears_how_many_of_its_groups_a_peer_trained_on(tmp_path):
    a = honest(tmp_path, "a")
    b = honest(tmp_path, "b", dial=(a.listen_addrs[0],))
    try:
        assert wait_until(lambda: a.host.connected_peers() and b.host.connected_peers())
        b.record_intake({a.peer_id: 3}, trained_on(a.peer_id, 3) + [_group("local")])
        assert wait_until(lambda: a.given.figures().trained_day == 3, timeout_s=10)
        stats = a.round_stats()
        assert (stats.trained_on_day, stats.trained_by_peers_day) == (3, 1)
        assert wait_until(lambda: b.host.thanks.in_flight == 0, timeout_s=10)  # the first send is over
        b.record_intake({}, trained_on(a.peer_id, 2))  # within MIN_GAP_S of the first: dropped by a
        assert wait_until(lambda: a.host.thanks.dropped == 1, timeout_s=10)
        assert a.given.figures().trained_day == 3 and b.host.thanks.attempted == 2 and b.host.thanks.refused == 0
    finally:
        b.stop()
        a.stop()


def test_a_node_of_an_earlier_release_refuses_the_protocol_and_nobody_is_blamed(tmp_path):
    """An earlier release registers no handler for it: the stream is refused at negotiation."""
    b = honest(tmp_path, "b")
    old = Hostile(tmp_path, dial=(b.listen_addrs[0],), name="old")
    old.start()
    try:
        assert wait_until(lambda: old.peer_id in b.host.connected_peers())
        on_network_thread(old, lambda: old._host.remove_stream_handler(old.settings.thanks_protocol))
        b.record_intake({}, trained_on(old.peer_id, 2))
        assert wait_until(lambda: b.host.thanks.refused == 1, timeout_s=10)  # sent, and refused at negotiation
        assert b.host.connected_peers() == [old.peer_id]
        standing = b.reputation.standing(old.peer_id)
        assert standing is None or standing.refused == 0  # no blame, and the connection stays
        assert b.host.health().restarts == 0
    finally:
        old.stop()
        b.stop()
