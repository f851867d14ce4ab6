"""Pure logic behind the TUI: folding events into the view, the bounded queue, the settings form,
and editing the user's config file (a real file, comments kept, bad values refused)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from tui_data import ME, PEER_A, events

from swarmling.app.config import ConfigError
from swarmling.app.config_file import update_config_file
from swarmling.app.events import Notice, PhaseChanged, Progress, StateChanged
from swarmling.app.tui.screens.settings import SettingsError, changes_from_form
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
    assert view.history[0][2] is None and view.history[-1][2] is not None  # peers' reward once they sent any
    assert view.last_round["round"] == 5
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


FORM = {"questions": "", "external_groups": "4", "threads": "", "preset": "starter", "on_stop": "abandon",
        "max_memory_gb": "", "pause_on_battery": "yes", "windows": ""}


def test_settings_form_maps_blank_to_auto():
    changes = changes_from_form(FORM, resolved_questions=8)
    assert changes == {"round.questions": None, "round.external_groups": 4, "round.preset": "starter",
                       "backend.threads": None, "run.on_stop": "abandon", "resources.max_memory_gb": None,
                       "resources.pause_on_battery": True, "resources.windows": []}
    nights = changes_from_form(FORM | {"windows": "22:00-07:00, 12:00-13:00", "max_memory_gb": "3.5",
                                       "pause_on_battery": "no"}, resolved_questions=8)
    assert nights["resources.windows"] == ["22:00-07:00", "12:00-13:00"]
    assert nights["resources.max_memory_gb"] == 3.5 and nights["resources.pause_on_battery"] is False


@pytest.mark.parametrize("field,value,message", [
    ("external_groups", "8", "must be below"),
    ("external_groups", "", "whole number"),
    ("questions", "four", "not a whole number"),
    ("threads", "1.5", "not a whole number"),
    ("max_memory_gb", "lots", "not a number of GB"),
    ("max_memory_gb", "-1", "positive"),
    ("windows", "nights", "not a time window"),
])
def test_settings_form_refuses(field, value, message):
    with pytest.raises(SettingsError, match=message):
        changes_from_form(FORM | {field: value}, resolved_questions=8)


def test_config_file_edit_keeps_comments_and_applies_precedence(tmp_path, monkeypatch):
    file = tmp_path / "config.toml"
    file.write_text("# my node\n[round]\n# more questions on my desktop\nquestions = 16\npreset = \"starter\"\n")
    monkeypatch.setenv("SWARMLING_ROUND__EXTERNAL_GROUPS", "3")
    config, overridden = update_config_file(file, {"round.questions": None, "round.external_groups": 2,
                                                   "backend.threads": 2})
    text = file.read_text()
    assert "# my node" in text and "# more questions on my desktop" in text
    assert "questions = 16" not in text and "external_groups = 2" in text and "threads = 2" in text
    assert config.round.questions is None and config.backend.threads == 2
    assert config.round.external_groups == 3 and overridden == ["round.external_groups"]  # the env still wins


def test_config_file_edit_refuses_bad_values_and_leaves_the_file(tmp_path):
    file = tmp_path / "config.toml"
    file.write_text("[round]\nquestions = 4\n")
    with pytest.raises(ConfigError, match=r"round.questions.*config.toml"):
        update_config_file(file, {"round.questions": 0})
    with pytest.raises(ConfigError, match="not a config key"):
        update_config_file(file, {"nope.key": 1})
    assert file.read_text() == "[round]\nquestions = 4\n"
    assert [p.name for p in tmp_path.iterdir()] == ["config.toml"]  # no temp file left behind


def test_headless_never_imports_textual():
    code = ("import sys; from swarmling.app import cli, headless, node, runner; "
            "sys.exit(1 if any(m.startswith('textual') for m in sys.modules) else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
