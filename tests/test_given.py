"""What a node gave the swarm (swarm/given.py): its bundles that peers fetched whole."""

from __future__ import annotations

from swarmling.app.learning.round_record import SwarmRoundStats
from swarmling.app.swarm.given import DAY_S, GivenFigures, GivenLog


def test_a_day_of_fetches_counts_them_and_the_peers_they_went_to():
    now = [0.0]
    log = GivenLog(clock=lambda: now[0])
    assert log.figures() == GivenFigures(0, 0, 0)
    for peer in ("a", "b", "a"):
        log.served(peer)
    now[0] = DAY_S / 2
    log.served("c")
    assert log.figures() == GivenFigures(4, 4, 3)
    now[0] = DAY_S + 1  # the first three are older than a day: only the total keeps them
    assert log.figures() == GivenFigures(4, 1, 1)


def test_a_flood_of_fetches_is_bounded_and_reads_low_never_high():
    log = GivenLog(clock=lambda: 0.0, max_remembered=3)
    for i in range(10):
        log.served(f"peer-{i}")
    assert log.figures() == GivenFigures(10, 3, 3)


def test_the_line_viewers_show():
    assert SwarmRoundStats().given == ""
    assert SwarmRoundStats(bundles_served=40, bundles_served_day=37, served_peers_day=5).given == \
        "your rollouts: fetched 37x by 5 peers in 24 h"


def test_what_peers_say_is_counted_for_a_day_bounded():
    now = [0.0]
    log = GivenLog(clock=lambda: now[0], max_remembered=4)
    for peer in ("p", "q", "p", "r", "s"):  # five reports, four remembered: the count reads low, never high
        log.thanked(peer, 2)
    assert log.figures() == GivenFigures(0, 0, 0, 8, 4)
    now[0] = DAY_S + 1
    assert log.figures() == GivenFigures(0, 0, 0, 0, 0)


def test_the_line_says_it_is_the_peers_word():
    stats = SwarmRoundStats(bundles_served=9, bundles_served_day=9, served_peers_day=3, trained_on_day=5,
                            trained_by_peers_day=2)
    assert stats.given == "your rollouts: fetched 9x by 3 peers, trained on 5x (as 2 said) in 24 h"
