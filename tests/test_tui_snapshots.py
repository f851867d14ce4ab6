"""Every screen of the TUI, rendered from fixed events (tests/tui_data.py) and compared with the
stored SVGs. After a deliberate UI change: pytest tests/test_tui_snapshots.py --snapshot-update,
then look at the new SVGs (snapshot_report.html) before committing them."""

from __future__ import annotations

import pytest
from tui_data import ReplayControl, events

from swarmling.app.node.try_it import Answers
from swarmling.app.events import Preparing, StateChanged
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


class FixedAnswers:
    """The try-it screen's answers, fixed (the real ones: tests/test_ask.py)."""

    closed = False

    def __call__(self, question: str) -> Answers:
        return Answers(question, "<answer>42</answer>", "<answer>17 + 25 = 32\n\nThe answer is 32.", 57, 1.4)

    def close(self) -> None:
        FixedAnswers.closed = True


def test_try_it(snap_compare):
    queue = EventQueue()
    app = SwarmlingApp(ReplayControl(queue), queue, NodeView(clock=lambda: 0.0), make_asker=FixedAnswers)

    async def ask(pilot):
        await pilot.press("t")
        await pilot.pause()
        await pilot.press(*"What is 17 + 25?", "enter")
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()

    assert snap_compare(app, terminal_size=(80, 24), run_before=ask)


def test_first_minute(snap_compare):
    """A fresh node scoring the base model before its first round: what it does, and how far."""
    queue = EventQueue()
    starting = [events()[0], StateChanged("running"),
                Preparing("scoring the base model on held-out tasks: the mark its progress starts from",
                          96, 240)]
    app = SwarmlingApp(ReplayControl(queue, starting), queue, NodeView(clock=lambda: 0.0))
    assert snap_compare(app, terminal_size=(80, 24))
