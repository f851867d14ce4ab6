"""The host's one exponential backoff, and the numbers each of its users waits by: the dialer's
retries of a target, the cooldown of authors that could not be dialled, the host's restarts."""

from __future__ import annotations

from swarmling.app.swarm.host.backoff import Backoff, PeerBackoff
from swarmling.app.swarm.host.dialer import BACKOFF_FIRST_S, BACKOFF_MAX_S, NAMED_BACKOFF_MAX_S, DialCooldown
from swarmling.app.swarm.host.supervision import RestartBackoff


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def blocked_between(backoffs: PeerBackoff, clock: Clock, peer: str, low_s: float, high_s: float) -> bool:
    """Blocked until some moment between `low_s` and `high_s` from now (the clock ends past it)."""
    start = clock.now
    clock.now = start + low_s - 1e-6
    still = backoffs.blocked(peer)
    clock.now = start + high_s + 1e-6
    return still and not backoffs.blocked(peer)


def test_delays_double_up_to_the_cap_and_start_over_on_reset():
    backoff = Backoff(2.0, 15.0)
    assert [backoff.next_delay() for _ in range(6)] == [2.0, 4.0, 8.0, 15.0, 15.0, 15.0]
    backoff.reset()
    assert backoff.next_delay() == 2.0


def test_restarts_wait_one_second_doubling_to_a_minute_and_start_over_after_a_stable_run():
    restarts = RestartBackoff()
    assert [restarts.next_delay(0.0) for _ in range(8)] == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    assert restarts.next_delay(60.0) == 1.0 and restarts.next_delay(0.0) == 2.0


def test_an_author_that_could_not_be_dialled_cools_down_30_s_doubling_to_10_min():
    clock = Clock()
    cooldown = DialCooldown(clock=clock)
    assert not cooldown.blocked("a")
    for delay in (30.0, 60.0, 120.0, 240.0, 480.0, 600.0, 600.0):
        cooldown.failed("a")
        assert blocked_between(cooldown, clock, "a", delay, delay)
    cooldown.failed("a")
    cooldown.succeeded("a")
    assert not cooldown.blocked("a")


def test_dial_targets_back_off_with_jitter_named_ones_at_most_15_s():
    clock = Clock()
    retry = PeerBackoff(BACKOFF_FIRST_S, BACKOFF_MAX_S, jitter=0.2, clock=clock)
    for delay in (2.0, 4.0, 8.0, 15.0, 15.0):
        retry.failed("named", NAMED_BACKOFF_MAX_S)
        assert blocked_between(retry, clock, "named", 0.8 * delay, 1.2 * delay)
    for delay in (2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 300.0, 300.0):
        retry.failed("found")
        assert blocked_between(retry, clock, "found", 0.8 * delay, 1.2 * delay)


def test_the_oldest_failure_is_forgotten_first_beyond_max_peers():
    clock = Clock()
    cooldown = PeerBackoff(30.0, 600.0, max_peers=2, clock=clock)
    for peer in ("a", "b", "a", "c"):  # a failed again after b: b's is now the oldest
        cooldown.failed(peer)
    assert cooldown.blocked("a") and cooldown.blocked("c") and not cooldown.blocked("b")
