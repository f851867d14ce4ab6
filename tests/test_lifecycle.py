"""The node's run / pause / stop intent and guest suspensions, as a state machine."""

from __future__ import annotations

import threading
import time

from waiting import wait_until

from swarmling.app.node.lifecycle import Intent, Lifecycle


def test_pausing_now_outranks_pausing_after_the_round_and_resume_undoes_either():
    lc = Lifecycle()
    lc.pause(finish_round=True)
    assert lc.intent is Intent.PAUSE_AFTER_ROUND and lc.paused and lc.held and not lc.drops_round(True)
    lc.pause(finish_round=False)
    assert lc.intent is Intent.PAUSE_NOW and lc.drops_round(False)
    lc.pause(finish_round=True)  # asking to finish first does not bring a dropped round back
    assert lc.intent is Intent.PAUSE_NOW
    assert lc.resume() is Intent.PAUSE_NOW and lc.intent is Intent.RUN and not lc.held


def test_a_stop_outranks_any_pause_and_is_never_resumed():
    lc = Lifecycle()
    lc.pause(finish_round=False)
    lc.stop(finish_round=True)
    assert lc.intent is Intent.STOP_AFTER_ROUND and lc.stopping and not lc.drops_round(False)
    lc.pause(finish_round=False)
    assert lc.resume() is Intent.STOP_AFTER_ROUND and lc.stopping
    lc.stop(finish_round=False)
    assert lc.intent is Intent.STOP_NOW and lc.drops_round(False)
    lc.stop(finish_round=True)  # a stop "now" is not softened
    assert lc.intent is Intent.STOP_NOW


def test_a_suspension_holds_rounds_and_drops_the_one_in_flight_only_when_configured():
    lc = Lifecycle()
    lc.suspend("on battery")
    assert lc.held and not lc.paused and lc.suspended_for == "on battery"
    assert lc.drops_round(abandon_on_suspend=True) and not lc.drops_round(abandon_on_suspend=False)
    lc.unsuspend()
    assert not lc.held and lc.suspended_for is None


def test_a_change_wakes_a_waiting_loop():
    lc = Lifecycle()
    lc.pause(finish_round=False)
    woke = []

    def loop():
        started = time.monotonic()
        while lc.held:
            lc.wait(30)
        woke.append(time.monotonic() - started)

    waiter = threading.Thread(target=loop)
    waiter.start()
    assert wait_until(lambda: lc._changed._waiters, 5, interval_s=0.01)  # blocked in lc.wait(30)
    lc.resume()
    waiter.join(5)
    assert woke and woke[0] < 5
