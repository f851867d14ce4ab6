"""When the node may run: battery (with hysteresis), idle, time windows — decided from injected
OS readings (the readings are the input; the decision is what is tested)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from swarmling.app.guest import GuestPolicy, GuestSettings, Readings, parse_window, read_os

T0 = datetime(2026, 11, 23, 14, 0, 0)


def at(seconds: float, **kw) -> Readings:
    return Readings(now=T0 + timedelta(seconds=seconds), **kw)


def test_battery_suspends_and_resumes_only_after_mains_stays():
    policy = GuestPolicy(GuestSettings(resume_after_plugged_s=60))
    assert policy.decide(at(0, on_battery=False)) is None
    assert policy.decide(at(10, on_battery=True)) == "on battery"
    assert "resuming in" in policy.decide(at(20, on_battery=False))
    assert policy.decide(at(40, on_battery=True)) == "on battery"  # unplugged again: the wait restarts
    assert "resuming in" in policy.decide(at(50, on_battery=False))
    assert "resuming in" in policy.decide(at(100, on_battery=False))
    assert policy.decide(at(111, on_battery=False)) is None


def test_battery_rule_off_or_no_battery():
    assert GuestPolicy(GuestSettings(pause_on_battery=False)).decide(at(0, on_battery=True)) is None
    assert GuestPolicy(GuestSettings()).decide(at(0, on_battery=None)) is None  # a desktop, a Pi


def test_idle_only_when_asked_and_when_the_os_tells():
    policy = GuestPolicy(GuestSettings(only_when_idle=True, idle_after_s=300))
    assert "in use" in policy.decide(at(0, idle_seconds=12))
    assert policy.decide(at(0, idle_seconds=301)) is None
    assert policy.decide(at(0, idle_seconds=None)) is None  # cannot tell here: not held against the user
    assert GuestPolicy(GuestSettings()).decide(at(0, idle_seconds=1)) is None


@pytest.mark.parametrize("hour,minute,runs", [(23, 0, True), (3, 30, True), (7, 0, False), (14, 0, False), (22, 0, True)])
def test_windows_wrap_past_midnight(hour, minute, runs):
    policy = GuestPolicy(GuestSettings(windows=("22:00-07:00",)))
    now = T0.replace(hour=hour, minute=minute)
    assert (policy.decide(Readings(now=now)) is None) is runs


def test_several_windows_and_bad_ones():
    policy = GuestPolicy(GuestSettings(windows=("12:00-13:00", "18:30-19:00")))
    assert policy.decide(Readings(now=T0.replace(hour=12, minute=59))) is None
    assert "outside the hours" in policy.decide(Readings(now=T0.replace(hour=18, minute=0)))
    for bad in ("25:00-01:00", "9-17", "10:00-10:00"):
        with pytest.raises(ValueError):
            parse_window(bad)


def test_reading_this_machine_does_not_fail():
    r = read_os()
    assert r.on_battery in (None, True, False) and (r.idle_seconds is None or r.idle_seconds >= 0)
