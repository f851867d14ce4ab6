"""Pure logic behind the TUI: folding events into the view, and the bounded event queue."""

from __future__ import annotations

import pytest
from tui_data import ME, PEER_A, events

from swarmling.app.events import Notice, PhaseChanged, Progress, StateChanged
from swarmling.app.tui.view import EventQueue, NodeView


def test_view_folds_a_run():
    view = NodeView(clock=lambda: 0.0)
    view.apply_all(events(rounds=5))
    assert (view.model, view.peer_id, view.swarm, view.state) == ("smollm2-135m", ME, "main", "running")
    assert view.round == 6 and view.phase == "generate"
    assert view.phase_fraction("tasks") == 1.0  # done this round
    assert view.phase_fraction("generate") == pytest.approx(40 / 64)
    assert view.phase_fraction("train") == 0.0
    assert [r for r, _, _ in view.history] == [1, 2, 3, 4, 5]
    assert [r for r, _ in view.evals] == [0, 4]  # the held-out score of the start, then of round 4
    assert view.swarm_share == pytest.approx(0.3)
    assert view.history[0][2] is None and view.history[-1][2] is not None  # peers' reward once they sent any
    assert view.last_round.round == 5
    assert view.tasks["chain_sum"].level == 5 // 4 + 1 and len(view.tasks["chain_sum"].recent) == 5
    assert len(view.rollouts) == 15 and view.rollouts[0].round == 5 and view.rollouts[0].source == PEER_A
    assert view.peers[0].peer_id == PEER_A and view.bytes_in == 1_234_567
    assert [line.level for line in view.take_new_log()] == ["info", "info", "warning"]
    assert view.take_new_log() == []


def test_a_phase_without_countable_work_has_no_fraction_and_a_new_round_resets_bars():
    view = NodeView()
    view.apply(PhaseChanged(1, "generate"))
    view.apply(Progress(1, "generate", 8, 8, 100.0))
    view.apply(PhaseChanged(1, "score"))
    assert view.phase_fraction("generate") == 1.0 and view.phase_fraction("score") is None
    view.apply(PhaseChanged(2, "tasks"))
    assert view.phase_fraction("generate") == 0.0 and view.tokens_per_s == 0.0


def test_errors_and_states_reach_the_header():
    view = NodeView()
    before = view.versions["header"]
    view.apply(Notice("error", "disk full"))
    view.apply(StateChanged("failed", "disk full"))
    assert view.last_error == "disk full" and view.state == "failed" and view.versions["header"] > before


def test_event_queue_is_bounded_and_drains_in_order():
    queue = EventQueue(maxlen=3)
    for i in range(5):
        queue(Notice("info", str(i)))
    assert [e.text for e in queue.drain()] == ["2", "3", "4"]
    assert queue.drain() == []


def test_the_reward_axis_fits_the_data_and_labels_every_tick():
    from swarmling.app.tui.widgets.learning import tick_label, y_axis

    assert y_axis([0.05, 0.22, 0.27]) == (0.3, [0.0, 0.1, 0.2, 0.3])  # 0-0.3 fills the plot, not its bottom third
    assert y_axis([0.45]) == (0.6, [0.0, 0.2, 0.4, 0.6])
    assert y_axis([0.5, 0.9]) == (1.0, [0.0, 0.25, 0.5, 0.75, 1.0])
    assert y_axis([]) == (0.1, [0.0, 0.025, 0.05, 0.075, 0.1])
    assert [tick_label(t) for t in (0.0, 0.25, 0.5, 1.0)] == ["0", "0.25", "0.5", "1"]


def test_the_first_minute_is_shown_as_preparing_until_the_first_round():
    from swarmling.app.events import PhaseChanged, Preparing

    view = NodeView()
    view.apply(Preparing("scoring the base model", 96, 240))
    assert (view.preparing.done, view.preparing.total) == (96, 240)
    view.apply(PhaseChanged(1, "tasks"))
    assert view.preparing is None and view.round == 1
