"""`s`: the settings a volunteer changes most, checked and saved to the config file.

The round mix applies from the next round; the rest is saved for the next start (the screen says
which). A value the schema refuses, or a write that fails, leaves the file as it was.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, Static

from ...config import Config, ConfigError, mix_problem
from ...learning.tasks import preset_names


class SettingsError(ValueError):
    pass


def _whole(text: str, what: str, *, blank_ok: bool) -> int | None:
    text = text.strip()
    if not text:
        if blank_ok:
            return None
        raise SettingsError(f"{what}: enter a whole number")
    try:
        return int(text)
    except ValueError:
        raise SettingsError(f"{what}: {text!r} is not a whole number") from None


def _gigabytes(text: str) -> float | None:
    text = text.strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise SettingsError(f"memory ceiling: {text!r} is not a number of GB") from None
    if value <= 0:
        raise SettingsError("memory ceiling: give a positive number of GB, or leave it empty for automatic")
    return value


def _windows(text: str) -> list[str]:
    from ...config import parse_window

    windows = [w.strip() for w in text.split(",") if w.strip()]
    for window in windows:
        try:
            parse_window(window)
        except ValueError as exc:
            raise SettingsError(f"run only between: {exc}") from None
    return windows


def changes_from_form(values: dict[str, str], resolved_questions: int) -> dict[str, object]:
    """The form's text fields → config changes (None: back to auto). Pure, so it is unit-tested."""
    questions = _whole(values["questions"], "questions per round (Q)", blank_ok=True)
    external = _whole(values["external_groups"], "external groups (J)", blank_ok=False)
    threads = _whole(values["threads"], "threads", blank_ok=True)
    q = questions or resolved_questions
    problem = mix_problem(q, external) if external is not None and q else None
    if problem:
        raise SettingsError(problem)
    return {
        "round.questions": questions,
        "round.external_groups": external,
        "round.preset": values["preset"],
        "backend.threads": threads,
        "run.on_stop": values["on_stop"],
        "resources.max_memory_gb": _gigabytes(values.get("max_memory_gb", "")),
        "resources.pause_on_battery": values.get("pause_on_battery", "yes") == "yes",
        "resources.windows": _windows(values.get("windows", "")),
    }


class SettingsScreen(ModalScreen[str | None]):
    """Dismisses with a summary of what was saved, or None when cancelled."""

    BINDINGS = [Binding("escape", "cancel", "cancel"), Binding("ctrl+s", "save", "save")]

    def __init__(self, config: Config, resolved_questions: int, save) -> None:
        super().__init__()
        self.config = config
        self.resolved_questions = resolved_questions
        self.save = save  # changes -> (restart keys, overridden keys); raises ConfigError

    def compose(self) -> ComposeResult:
        c = self.config
        with VerticalScroll(id="settings-body", classes="dialog"):
            yield Static("Settings  [dim](saved to your config file)[/]", id="settings-title")
            with Grid(id="settings-grid"):
                yield Label("Questions per round (Q)")
                yield Input(str(c.round.questions or ""), placeholder=f"auto ({self.resolved_questions})",
                            id="questions", type="integer", compact=True)
                yield Label("External groups (J)")
                yield Input(str(c.round.external_groups), id="external_groups", type="integer", compact=True)
                yield Label("Task preset")
                yield Select([(name, name) for name in preset_names()], value=c.round.preset,
                             allow_blank=False, id="preset", compact=True)
                yield Label("CPU threads")
                yield Input(str(c.backend.threads or ""), placeholder="auto (all cores but one)",
                            id="threads", type="integer", compact=True)
                yield Label("On quit")
                yield Select([("drop the round in flight", "abandon"), ("finish it first", "finish")],
                             value=c.run.on_stop, allow_blank=False, id="on_stop", compact=True)
                yield Label("Memory ceiling (GB)")
                yield Input(f"{c.resources.max_memory_gb:g}" if c.resources.max_memory_gb else "",
                            placeholder="auto (from the machine's memory)", id="max_memory_gb", compact=True)
                yield Label("Pause on battery")
                yield Select([("yes", "yes"), ("no", "no")], value="yes" if c.resources.pause_on_battery else "no",
                             allow_blank=False, id="pause_on_battery", compact=True)
                yield Label("Run only between")
                yield Input(", ".join(c.resources.windows), placeholder="always (or e.g. 22:00-07:00)",
                            id="windows", compact=True)
            yield Static("Q, J, battery and hours apply from the next round; preset, threads and memory at the next start.",
                         id="settings-hint")
            yield Static("", id="settings-error")
            with Horizontal(id="settings-buttons"):
                yield Button("Save", variant="primary", id="save", compact=True)
                yield Button("Cancel", id="cancel", compact=True)

    def _form(self) -> dict[str, str]:
        return {
            "questions": self.query_one("#questions", Input).value,
            "external_groups": self.query_one("#external_groups", Input).value,
            "threads": self.query_one("#threads", Input).value,
            "preset": str(self.query_one("#preset", Select).value),
            "on_stop": str(self.query_one("#on_stop", Select).value),
            "max_memory_gb": self.query_one("#max_memory_gb", Input).value,
            "pause_on_battery": str(self.query_one("#pause_on_battery", Select).value),
            "windows": self.query_one("#windows", Input).value,
        }

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "save":
            self.action_save()
        else:
            self.action_cancel()

    def action_cancel(self) -> None:
        self.dismiss(None)

    def action_save(self) -> None:
        error = self.query_one("#settings-error", Static)
        try:
            changes = changes_from_form(self._form(), self.resolved_questions)
            restart, overridden = self.save(changes)
        except (SettingsError, ConfigError) as exc:
            error.update(Text.assemble(("Not saved: ", "bold red"), str(exc)))  # no markup: values may hold [ ]
            return
        summary = "Settings saved."
        if restart:
            summary += f" At the next start: {', '.join(restart)}."
        if overridden:
            summary += f" Still overridden by a flag or environment variable: {', '.join(overridden)}."
        self.dismiss(summary)
