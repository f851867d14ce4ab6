"""Recent question-groups, local and peers', newest first; Enter opens one whole."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from ...events import GroupView
from ..view import NodeView
from .header import short_id

QUESTION_CHARS = 60


def one_line(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def best_completion(group: GroupView) -> str:
    if not group.completions:
        return ""
    return max(group.completions, key=lambda c: c.reward).text


class RolloutFeed(DataTable):
    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = True
        self.add_columns("rnd", "from", "task", "reward", "train", "question", "best reply")
        self._shown = 0

    def show(self, view: NodeView) -> None:
        # The feed only grows at the top: rebuild (cheap, at most MAX_ROLLOUTS rows) and keep the cursor.
        row = self.cursor_row
        self.clear()
        for index, g in enumerate(view.rollouts):
            self.add_row(
                str(g.round),
                "local" if g.source == "local" else short_id(g.source),
                f"{g.dataset} L{g.level}",
                Text(f"{g.reward_mean:.2f}", style="green" if g.reward_mean >= 0.999 else ""),
                "✓" if g.trained else "",
                one_line(g.question, QUESTION_CHARS),
                one_line(best_completion(g), 40),
                key=str(index),
            )
        if view.rollouts:
            self.move_cursor(row=min(row, len(view.rollouts) - 1))
