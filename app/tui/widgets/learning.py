"""Is it learning? Reward over rounds (own, and peers' groups as verified here), the held-out
accuracy, and per-task success with the curriculum's current level."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Static
from textual_plotext import PlotextPlot

from ..view import NodeView

# One colour per curve, in the plot and in the legend above it (plotext draws its own legend
# inside the plot, over the curves).
CURVES = (("this node", "cyan"), ("peers", "magenta"), ("held-out", "green"))  # peers: as verified here
# Tops for the y-axis: the smallest that holds the data with a little headroom, so that rewards
# near 0-0.3 fill the plot instead of its bottom third.
TOPS = ((0.1, 0.025), (0.2, 0.05), (0.3, 0.1), (0.4, 0.1), (0.6, 0.2), (0.8, 0.2), (1.0, 0.25))


def y_axis(values: list[float]) -> tuple[float, list[float]]:
    """The y-axis' top and its ticks (every tick labelled, 0 included) for values in 0..1."""
    highest = max(values, default=0.0) * 1.05
    top, step = next(((t, s) for t, s in TOPS if highest <= t), TOPS[-1])
    return top, [round(i * step, 3) for i in range(int(round(top / step)) + 1)]


def tick_label(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".") or "0"


class RewardPlot(PlotextPlot):
    def show(self, view: NodeView) -> None:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        shown: list[float] = []
        if view.history:
            rounds = [r for r, _, _ in view.history]
            step = max(1, (rounds[-1] - rounds[0]) // 4)
            plt.xticks(list(range(rounds[0], rounds[-1] + 1, step)))
            own = [own for _, own, _ in view.history]
            plt.plot(rounds, own, color=CURVES[0][1], marker="braille")
            peers = [(r, p) for r, _, p in view.history if p is not None]
            if peers:
                plt.plot([r for r, _ in peers], [p for _, p in peers], color=CURVES[1][1], marker="braille")
            shown += own + [p for _, p in peers]
        if view.evals:  # the curve that says whether the model got better: tasks it never trained on
            plt.plot([r for r, _ in view.evals], [a for _, a in view.evals], color=CURVES[2][1], marker="dot")
            shown += [a for _, a in view.evals]
        top, ticks = y_axis(shown)
        plt.ylim(0, top)
        plt.yticks(ticks, [tick_label(t) for t in ticks])
        self.refresh()


def legend(view: NodeView) -> Text:
    present = (bool(view.history), any(p is not None for _, _, p in view.history), bool(view.evals))
    text = Text()
    for (label, colour), shown in zip(CURVES, present):
        if shown:
            text.append("━ " if colour != "green" else "• ", style=colour)
            text.append(f"{label}  ")
    return text or Text("reward and held-out accuracy per round", style="dim")


class TaskTable(DataTable):
    def on_mount(self) -> None:
        self.cursor_type = "none"
        self.zebra_stripes = True
        self.add_columns("task", "lvl", "last", "avg10")

    def show(self, view: NodeView) -> None:
        self.clear()
        for row in sorted(view.tasks.values(), key=lambda r: r.dataset):
            self.add_row(row.dataset, str(row.level), f"{row.last:.0%}", f"{row.recent_mean:.0%}")


class LearningPanel(Horizontal):
    def compose(self) -> ComposeResult:
        with Vertical(id="reward-column"):
            yield Static(id="reward-legend")
            yield RewardPlot(id="reward-plot")
        yield TaskTable(id="task-table")

    def show(self, view: NodeView) -> None:
        self.query_one("#reward-legend", Static).update(legend(view))
        self.query_one(RewardPlot).show(view)
        self.query_one(TaskTable).show(view)
