"""The TUI driving a real node: the shipped model, real llama.cpp and torch, tiny rounds.

Keys are pressed through Textual's pilot and widget state is read back; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from waiting import wait_until_async
from swarmling.app.config import load_config
from swarmling.app.paths import resolve_paths
from swarmling.app.tui.app import create_app
from swarmling.app.tui.widgets.learning import TaskTable
from swarmling.app.tui.widgets.rollout_feed import RolloutFeed
from swarmling.app.tui.widgets.round_panel import RoundPanel

pytestmark = pytest.mark.slow

TINY = [("round.questions", 2), ("round.completions", 2), ("round.max_new_tokens", 6), ("run.seed", 1),
        ("round.external_groups", 1)]


def tiny_app(home, *extra):
    paths = resolve_paths(home)
    cli = [*TINY, *extra]
    config = load_config(paths.config_file, cli=cli)
    return create_app(config, paths, config_file=paths.config_file, cli=cli, refresh_s=0.1), paths


async def until(pilot, predicate, timeout: float, what: str) -> None:
    assert await wait_until_async(predicate, pilot.pause, timeout), f"timed out after {timeout:.0f}s waiting for {what}"


def rounds_done(app) -> int:
    return app.view.last_round.round if app.view.last_round is not None else 0


def test_keys_drive_a_real_node(tmp_path):
    app, paths = tiny_app(tmp_path)

    async def scenario():
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: rounds_done(app) >= 1, 300, "the first round")
            # The round ran on the node's own thread, never on the UI's.
            assert app.control._thread is not threading.current_thread()
            assert app.view.model == "smollm2-135m" and app.view.backend == "cpu"
            assert "Round" in str(app.query_one(RoundPanel).render())
            assert app.query_one(TaskTable).row_count >= 1
            feed = app.query_one(RolloutFeed)
            assert feed.row_count >= 2  # the round's two local groups

            # p: pause now; the node stops taking rounds
            await pilot.press("p")
            await until(pilot, lambda: app.view.state == "paused", 120, "paused")
            held = rounds_done(app)
            await pilot.pause(2.0)
            assert rounds_done(app) == held and app.view.state == "paused"
            # p again: resume, and rounds continue
            await pilot.press("p")
            await until(pilot, lambda: rounds_done(app) > held, 300, "a round after resuming")

            # f: finish the round in flight, then pause
            await pilot.press("f")
            await until(pilot, lambda: app.view.state == "paused", 300, "pause after the round")
            finished = rounds_done(app)
            assert finished > held

            # rollout detail: Enter on the feed opens the whole group
            await pilot.press("3")
            await pilot.press("enter")
            await until(pilot, lambda: type(app.screen).__name__ == "RolloutScreen", 10, "the group's screen")
            await pilot.press("escape")

            # s: change the mix; it is validated and saved to the config file
            await pilot.press("s")
            await until(pilot, lambda: type(app.screen).__name__ == "SettingsScreen", 10, "the settings screen")
            app.screen.query_one("#questions").value = "3"
            app.screen.query_one("#external_groups").value = "2"
            await pilot.press("ctrl+s")
            await until(pilot, lambda: type(app.screen).__name__ == "Screen", 10, "the settings saved and closed")
            text = paths.config_file.read_text()
            assert "questions = 3" in text and "external_groups = 2" in text
            assert app.control.node.sizing.shape.local_groups == 1

            # q: stop; the app exits once the node has closed
            await pilot.press("q")
            await until(pilot, lambda: not app.control.alive, 120, "the node to stop")
            await until(pilot, lambda: not app.is_running, 10, "the app to exit")
            return finished

    finished = asyncio.run(scenario())
    assert app.return_code == 0 and not app.forced
    records = [json.loads(x) for x in paths.metrics_file.read_text().splitlines()]
    assert [r["round"] for r in records] == list(range(1, finished + 1))
    assert (paths.checkpoints / f"round-{finished:08d}").is_dir()


def test_a_failing_node_shows_what_to_do_and_the_app_stays(tmp_path):
    # A model path that does not exist: the node fails on its thread; the app reports it and stays up.
    app, _ = tiny_app(tmp_path, ("model.name", str(tmp_path / "missing.gguf")))

    async def scenario():
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.view.state == "failed", 120, "the failure")
            assert "missing.gguf" in app.view.last_error
            assert any("missing.gguf" in line.text for line in app.view.log)
            assert app.is_running
            await pilot.press("p")  # nothing to pause: a notice, not a crash
            await until(pilot, lambda: any("not running" in n.message for n in app._notifications), 10, "the notice")
            assert app.is_running
            await pilot.press("q")
            await until(pilot, lambda: not app.is_running, 10, "the app to exit")

    asyncio.run(scenario())
    assert app.return_code == 0
