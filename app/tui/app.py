"""The Textual app: a view and remote control of the node running on its own thread.

`create_app()` builds it around a real node (the CLI and the pilot tests use it);
`SwarmlingApp(control, events)` takes any control with the `NodeControl` methods, which is how the
snapshot tests feed it fixed events. The UI never waits for the node: it drains the event queue
on a timer and redraws only the sections that changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from importlib import resources
from pathlib import Path
from collections.abc import Callable
from typing import Any, Protocol

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widgets import Footer, TabbedContent, TabPane

from ..config import Config
from ..events import Notice
from ..paths import Paths
from .screens.help import HelpScreen
from .screens.rollout import RolloutScreen
from .screens.settings import SettingsScreen
from .screens.try_it import Asker, TryItScreen
from .view import EventQueue, NodeView
from .widgets.header import NodeHeader
from .widgets.learning import LearningPanel
from .widgets.log_pane import LogPane
from .widgets.rollout_feed import RolloutFeed
from .widgets.round_panel import RoundPanel
from .widgets.swarm_panel import SwarmPanel

REFRESH_S = 0.25  # redraws at most 4 times a second, whatever the node sends
TABS = ("overview", "swarm", "rollouts", "log")


class NodeControl(Protocol):
    """What the app asks of the node; every call returns at once."""

    config: Config

    def start(self) -> None: ...
    def pause(self) -> None: ...
    def finish_then_pause(self) -> None: ...
    def resume(self) -> None: ...
    def stop(self) -> None: ...
    @property
    def paused(self) -> bool: ...
    @property
    def alive(self) -> bool: ...
    def save_settings(self, changes: dict[str, Any]) -> tuple[list[str], list[str]]: ...


class _ToEvents(logging.Handler):
    """The node's log records, into the Log tab (stderr would tear the screen)."""

    def __init__(self, events: EventQueue) -> None:
        super().__init__(logging.INFO)
        self.events = events

    def emit(self, record: logging.LogRecord) -> None:
        level = "error" if record.levelno >= logging.ERROR else "warning" if record.levelno >= logging.WARNING else "info"
        self.events(Notice(level, record.getMessage()))


class SwarmlingApp(App[int]):
    CSS_PATH = str(resources.files("swarmling.assets") / "swarmling.tcss")
    TITLE = "swarmling"
    BINDINGS = [
        Binding("p", "pause", "pause/resume"),
        Binding("f", "finish", "finish round"),
        Binding("s", "settings", "settings"),
        Binding("t", "try_it", "try it"),
        Binding("question_mark", "help", "help", key_display="?"),
        Binding("q", "quit_node", "quit"),
        Binding("ctrl+c", "quit_node", "quit", show=False, priority=True),
        *(Binding(str(i), f"show_tab('{tab}')", tab, show=False) for i, tab in enumerate(TABS, start=1)),
    ]

    def __init__(self, control: NodeControl, events: EventQueue, view: NodeView | None = None,
                 refresh_s: float = REFRESH_S, make_asker: Callable[[], Asker] | None = None) -> None:
        super().__init__()
        self.make_asker = make_asker
        self.control = control
        self.events = events
        self.view = view or NodeView()
        self.refresh_s = refresh_s
        self.quit_requested = False
        self.forced = False
        self._shown: dict[str, int] = {}
        self._errors_shown = ""
        self._log_handler = _ToEvents(events)

    def compose(self) -> ComposeResult:
        yield NodeHeader(id="header")
        with TabbedContent(initial="overview"):
            with TabPane("Overview", id="overview"):
                yield RoundPanel(id="round-panel")
                yield LearningPanel(id="learning")
            with TabPane("Swarm", id="swarm"):
                yield SwarmPanel(id="swarm-panel")
            with TabPane("Rollouts", id="rollouts"):
                yield RolloutFeed(id="feed")
            with TabPane("Log", id="log"):
                yield LogPane(id="log-pane", wrap=True, markup=False, max_lines=2000)
        yield Footer()

    def on_mount(self) -> None:
        logging.getLogger("swarmling").addHandler(self._log_handler)
        # A service manager's SIGTERM, or the terminal going away: there may be no screen left to
        # draw on, so the UI leaves at once and the CLI waits for the node to stop cleanly.
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGHUP):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, self.leave)
        self.control.start()
        self.refresh_view()
        self.set_interval(self.refresh_s, self.refresh_view)

    def on_unmount(self) -> None:
        logging.getLogger("swarmling").removeHandler(self._log_handler)

    # ---- the view --------------------------------------------------------------------------
    def refresh_view(self) -> None:
        self.view.apply_all(self.events.drain())
        view = self.view
        if self._changed("header"):
            self.query_one(NodeHeader).show(view)
        if self._changed("round"):
            self.query_one(RoundPanel).show(view)
        if self._changed("learning"):
            self.query_one(LearningPanel).show(view)
        if self._changed("swarm"):
            self.query_one(SwarmPanel).show(view)
        if self._changed("rollouts"):
            self.query_one(RolloutFeed).show(view)
        if self._changed("log"):
            self.query_one(LogPane).write_lines(view.take_new_log())
        if view.last_error and view.last_error != self._errors_shown:
            self._errors_shown = view.last_error
            self.notify(view.last_error, title="The node needs you", severity="error", timeout=30)
        if self.quit_requested and not self.control.alive:
            self.exit(0)

    def _changed(self, section: str) -> bool:
        version = self.view.versions[section]
        if self._shown.get(section) == version:
            return False
        self._shown[section] = version
        return True

    # ---- keys ------------------------------------------------------------------------------
    def action_pause(self) -> None:
        if not self.control.alive:
            self.notify("The node is not running.", severity="warning")
        elif self.control.paused:
            self.control.resume()
        else:
            self.control.pause()

    def action_finish(self) -> None:
        if not self.control.alive:
            self.notify("The node is not running.", severity="warning")
        elif self.control.paused:
            self.notify("Already pausing: press p to resume.")
        else:
            self.control.finish_then_pause()

    def action_settings(self) -> None:
        questions = self.view.shape.questions if self.view.shape is not None else 0

        def saved(summary: str | None) -> None:
            if summary:
                self.notify(summary, title="Settings", timeout=8)

        self.push_screen(SettingsScreen(self.control.config, questions, self.control.save_settings), saved)

    def action_try_it(self) -> None:
        if self.make_asker is None:
            self.notify("Nothing to ask here.", severity="warning")
        else:
            self.push_screen(TryItScreen(self.make_asker))

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_show_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        # Keys go to the tab's table at once (Enter opens a rollout without a click first).
        target = {"swarm": "#peer-table", "rollouts": "#feed", "log": "#log-pane"}.get(event.pane.id or "")
        if target:
            self.query_one(target).focus()

    def action_quit_node(self) -> None:
        if not self.control.alive:
            self.exit(0)
        elif self.quit_requested:
            self.forced = True  # the CLI ends the process without waiting for the node's thread
            self.exit(130)
        else:
            self.quit_requested = True
            self.control.stop()
            self.notify("Stopping; the last checkpoint is kept. Press q again to quit at once.", timeout=10)

    def leave(self) -> None:
        """Stop the node and close the UI without waiting (the caller joins the node's thread)."""
        self.quit_requested = True
        self.control.stop()
        self.exit(0)

    def on_data_table_row_selected(self, event: RolloutFeed.RowSelected) -> None:
        if isinstance(event.data_table, RolloutFeed):
            group = self.view.rollout(event.cursor_row)
            if group is not None:
                self.push_screen(RolloutScreen(group))


def create_app(config: Config, paths: Paths, *, rounds: int | None = None, config_file: Path | None = None,
               cli: list[tuple[str, Any]] | None = None, refresh_s: float = REFRESH_S) -> SwarmlingApp:
    """The app around a real node (loaded on the node's thread once the app is up)."""
    from ..node.runner import NodeRunner

    from ..node.try_it import NodeAsker

    events = EventQueue()
    runner = NodeRunner(config, paths, events, rounds=rounds, config_file=config_file, cli=cli)
    return SwarmlingApp(runner, events, refresh_s=refresh_s, make_asker=lambda: NodeAsker(config, paths))
