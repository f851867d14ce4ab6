"""Forwarding others' announcements, and serving under the user's cap, stay within an upload budget
(app/swarm/host/forwarding.py)."""

from __future__ import annotations

import pytest
from swarm_peers import forwarding_flood

from swarmling.app.swarm.host.forwarding import BURST_S, FORWARD_KIB_S, UploadBudget, split_cap


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_message_costing_more_than_the_whole_burst_goes_when_the_bucket_is_full():
    clock = Clock()
    budget = UploadBudget(kib_s=1.0, clock=clock)  # a low cap: forwarding slows down, never stops
    assert budget.take(10 * int(BURST_S * 1024)) and not budget.take(1)
    clock.now = BURST_S
    assert budget.take(10 * int(BURST_S * 1024))


def test_the_budget_lets_a_burst_through_then_its_rate_and_counts_what_it_withholds():
    clock = Clock()
    budget = UploadBudget(kib_s=1.0, clock=clock)  # 1 KiB/s, a burst of BURST_S KiB
    burst = int(BURST_S * 1024)
    assert budget.take(burst) and not budget.take(1)
    assert budget.withheld == 1 and budget.spent_bytes == burst
    clock.now = 2.0
    assert budget.take(2048) and not budget.take(1)  # two seconds later: two seconds' worth
    budget.kib_s = 0.5  # a live change (resources.bandwidth_kib_s) takes effect at once
    clock.now = 4.0
    assert budget.take(1024) and not budget.take(1)


def test_the_users_cap_splits_the_upload_between_forwarding_and_serving():
    assert split_cap(None, FORWARD_KIB_S) == (FORWARD_KIB_S, float("inf"))
    assert split_cap(40, FORWARD_KIB_S) == (20, 20)
    assert split_cap(400, FORWARD_KIB_S) == (FORWARD_KIB_S, 200)  # forwarding never above its own budget
    unlimited = UploadBudget(float("inf"))
    assert all(unlimited.take(10**9) for _ in range(3)) and unlimited.withheld == 0



def test_serving_holds_the_cap_on_average_even_for_a_bundle_dearer_than_its_burst():
    clock = Clock()
    budget = UploadBudget(kib_s=1.0, clock=clock, average=True)  # serving's: the user's cap, on average
    burst = int(BURST_S * 1024)
    assert budget.take(10 * burst) and budget.spent_bytes == 10 * burst  # goes when full, charged in full
    clock.now = BURST_S
    assert not budget.take(1)  # ...and nothing more until that is paid back
    clock.now = 10 * BURST_S
    assert budget.take(1)

@pytest.mark.slow
def test_a_flood_through_a_node_costs_it_what_its_budget_allows(tmp_path):
    """12 identities in the node's mesh publish 240 announcements as fast as they can. Without the
    budget the node passes on every one its board accepts to each of its mesh peers; with 8 KiB/s
    it uploads its burst and its rate, plus the gossip protocol's own traffic."""
    kib_s = 8.0
    free = forwarding_flood(tmp_path / "free", identities=12, each=20, forward_kib_s=1e9)
    held = forwarding_flood(tmp_path / "held", identities=12, each=20, forward_kib_s=kib_s)
    assert free["withheld"] == 0 and held["withheld"] > 0
    assert free["upload_kib"] > 3 * held["upload_kib"], (free, held)
    # What it does not pass on, the node still reads and uses: every origin's burst (board.py: 5 at once)
    assert held["accepted"] >= 12 * 5, held
