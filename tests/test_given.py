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
