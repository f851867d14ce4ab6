"""One question-group, whole: the question and every completion with its reward."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from ...events import GroupView


class RolloutScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,enter", "dismiss", "close")]

    def __init__(self, group: GroupView) -> None:
        super().__init__()
        self.group = group

    def compose(self) -> ComposeResult:
        g = self.group
        source = "this node" if g.source == "local" else f"peer {g.source}"
        head = Text()
        head.append(f"round {g.round} · {g.dataset} level {g.level} · from {source}", style="bold")
        head.append(f" · {'trained on' if g.trained else 'not trained on'}\n\n", style="dim")
        head.append(g.question)
        with VerticalScroll(id="rollout-body", classes="dialog"):
            yield Static(head, id="rollout-question")
            for i, c in enumerate(sorted(g.completions, key=lambda c: -c.reward), start=1):
                body = Text()
                style = "green" if c.strict >= 0.999 else ("yellow" if c.strict > 0 else "red")
                body.append(f"#{i}  score {c.strict:.2f}  reward {c.reward:.2f}\n", style=f"bold {style}")
                body.append(c.text or "(empty)")
                yield Static(body, classes="completion")
