"""When the node may run: battery (with hysteresis), idle, time windows — decided from injected
OS readings (the readings are the input; the decision is what is tested)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

import pytest
from waiting import wait_until

from swarmling.app.config import ResourcesSection, parse_window
from swarmling.app.node.guest import GuestPolicy, GuestSettings, Readings, read_os


def rules(**changes) -> GuestSettings:
    """The default [resources] rules with some changed."""
    return replace(GuestSettings.from_config(ResourcesSection()), **changes)

T0 = datetime(2026, 11, 23, 14, 0, 0)


def at(seconds: float, **kw) -> Readings:
    return Readings(now=T0 + timedelta(seconds=seconds), **kw)


def test_battery_suspends_and_resumes_only_after_mains_stays():
    policy = GuestPolicy(rules(resume_after_plugged_s=60))
    assert policy.decide(at(0, on_battery=False)) is None
    assert policy.decide(at(10, on_battery=True)) == "on battery"
    assert "resuming in" in policy.decide(at(20, on_battery=False))
    assert policy.decide(at(40, on_battery=True)) == "on battery"  # unplugged again: the wait restarts
    assert "resuming in" in policy.decide(at(50, on_battery=False))
    assert "resuming in" in policy.decide(at(100, on_battery=False))
    assert policy.decide(at(111, on_battery=False)) is None


def test_battery_rule_off_or_no_battery():
    assert GuestPolicy(rules(pause_on_battery=False)).decide(at(0, on_battery=True)) is None
    assert GuestPolicy(rules()).decide(at(0, on_battery=None)) is None  # a desktop, a Pi


def test_idle_only_when_asked_and_when_the_os_tells():
    policy = GuestPolicy(rules(only_when_idle=True, idle_after_s=300))
    assert "in use" in policy.decide(at(0, idle_seconds=12))
    assert policy.decide(at(0, idle_seconds=301)) is None
    assert policy.decide(at(0, idle_seconds=None)) is None  # cannot tell here: not held against the user
    assert GuestPolicy(rules()).decide(at(0, idle_seconds=1)) is None


@pytest.mark.parametrize("hour,minute,runs", [(23, 0, True), (3, 30, True), (7, 0, False), (14, 0, False), (22, 0, True)])
def test_windows_wrap_past_midnight(hour, minute, runs):
    policy = GuestPolicy(rules(windows=("22:00-07:00",)))
    now = T0.replace(hour=hour, minute=minute)
    assert (policy.decide(Readings(now=now)) is None) is runs


def test_several_windows_and_bad_ones():
    policy = GuestPolicy(rules(windows=("12:00-13:00", "18:30-19:00")))
    assert policy.decide(Readings(now=T0.replace(hour=12, minute=59))) is None
    assert "outside the hours" in policy.decide(Readings(now=T0.replace(hour=18, minute=0)))
    for bad in ("25:00-01:00", "9-17", "10:00-10:00"):
        with pytest.raises(ValueError):
            parse_window(bad)


def test_reading_this_machine_reports_what_the_os_says(tmp_path):
    import shutil
    import sys

    import psutil

    r = read_os(tmp_path)
    battery = psutil.sensors_battery()
    assert r.on_battery == (None if battery is None or battery.power_plugged is None else not battery.power_plugged)
    assert abs(r.free_disk_bytes - shutil.disk_usage(tmp_path).free) < 256 * 2**20
    assert abs((datetime.now() - r.now).total_seconds()) < 5
    if sys.platform != "darwin" and not shutil.which("xprintidle"):
        assert r.idle_seconds is None  # nothing here can tell: never a made-up figure
    else:
        assert r.idle_seconds is None or r.idle_seconds >= 0


# ---- the rules on a real node (shipped model, real rounds), readings injected ------------------

@pytest.mark.slow
def test_a_node_suspends_on_battery_and_resumes_after_mains_stays(tmp_path):
    import threading

    from swarmling.app.config import load_config
    from swarmling.app.node.loop import Node
    from swarmling.app.paths import resolve_paths

    cli = [("round.questions", 2), ("round.completions", 2), ("round.max_new_tokens", 6), ("run.seed", 1),
           ("resources.resume_after_plugged_s", 2), ("resources.check_every_s", 3600), ("resources.nice", 0),
           ("resources.release_memory_after_s", 1)]
    events = []
    node = Node(load_config(None, cli=cli), resolve_paths(tmp_path), listener=events.append)
    node.start()
    runner = threading.Thread(target=node.run, daemon=True)
    try:
        node.guest.check(Readings(now=datetime.now(), on_battery=True))  # unplugged before the first round
        runner.start()
        assert wait_until(lambda: node.state == "suspended", 60)
        assert node.state == "suspended" and node.suspended_for == "on battery" and node.round == 0

        # suspended longer than release_memory_after_s (1 s): the model is freed
        def texts():
            return [e.text for e in list(events) if hasattr(e, "text")]

        assert wait_until(lambda: any("released the model's memory" in t for t in texts()), 60)
        plugged = datetime.now()
        node.guest.check(Readings(now=plugged, on_battery=False))
        assert node.suspended_for.startswith("on mains again")  # hysteresis: not yet
        # the policy goes by the readings' clock: mains has stayed connected resume_after_plugged_s (2 s)
        node.guest.check(Readings(now=plugged + timedelta(seconds=2.1), on_battery=False))
        assert node.suspended_for is None
        assert wait_until(lambda: node.round >= 1, 300)
        assert node.round >= 1 and node.status().last_round.round >= 1
        # ... and reloaded to resume
        assert any("released the model's memory" in t for t in texts())
        assert node.backend is not None
        # disk nearly full: suspended with what to do, whatever the battery says
        node.guest.check(Readings(now=datetime.now(), on_battery=False, free_disk_bytes=10 * 2**20))
        assert "free some space" in node.suspended_for
    finally:
        node.request_stop()
        runner.join(120)
        node.close()


@pytest.mark.slow
def test_a_memory_ceiling_too_small_is_refused_clearly(tmp_path):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "swarmling.app", "--home", str(tmp_path), "run", "--headless",
                          "--rounds", "1", "--set", "resources.max_memory_gb=0.5"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and "max_memory_gb" in out.stderr and "Traceback" not in out.stderr
