"""Every screen of the TUI, rendered from fixed events (tests/tui_data.py) and compared with the
stored SVGs. After a deliberate UI change: pytest tests/test_tui_snapshots.py --snapshot-update,
then look at the new SVGs (snapshot_report.html) before committing them."""

from __future__ import annotations

import pytest
from tui_data import ReplayControl

from swarmling.app.tui.app import SwarmlingApp
from swarmling.app.tui.view import EventQueue, NodeView


def make_app() -> SwarmlingApp:
    queue = EventQueue()
    return SwarmlingApp(ReplayControl(queue), queue, NodeView(clock=lambda: 0.0))


@pytest.mark.parametrize("size", [(80, 24), (200, 50)], ids=["80x24", "200x50"])
def test_overview(snap_compare, size):
    assert snap_compare(make_app(), terminal_size=size)


@pytest.mark.parametrize("tab", ["2", "3", "4"], ids=["swarm", "rollouts", "log"])
def test_tabs(snap_compare, tab):
    assert snap_compare(make_app(), terminal_size=(80, 24), press=[tab])


def test_rollout_detail(snap_compare):
    assert snap_compare(make_app(), terminal_size=(80, 24), press=["3", "down", "enter"])


def test_settings(snap_compare):
    assert snap_compare(make_app(), terminal_size=(80, 24), press=["s"])


def test_settings_refuses_a_bad_mix(snap_compare):
    async def type_bad_mix(pilot):
        await pilot.press("s")
        await pilot.pause()
        pilot.app.screen.query_one("#external_groups").value = "9"
        await pilot.press("ctrl+s")
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=type_bad_mix)


def test_help(snap_compare):
    assert snap_compare(make_app(), terminal_size=(80, 24), press=["question_mark"])
