"""Is it learning? Reward over rounds (own, and peers' groups as verified here), the held-out
accuracy, and per-task success with the curriculum's current level."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import DataTable
from textual_plotext import PlotextPlot

from ..view import NodeView


class RewardPlot(PlotextPlot):
    def show(self, view: NodeView) -> None:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title("reward and held-out accuracy per round")
        plt.ylim(0, 1)
        if view.history:
            rounds = [r for r, _, _ in view.history]
            step = max(1, (rounds[-1] - rounds[0]) // 4)
            plt.xticks(list(range(rounds[0], rounds[-1] + 1, step)))
            plt.plot(rounds, [own for _, own, _ in view.history], label="this node", marker="braille")
            peers = [(r, p) for r, _, p in view.history if p is not None]
            if peers:
                plt.plot([r for r, _ in peers], [p for _, p in peers], label="peers (verified here)", marker="braille")
        if view.evals:  # the curve that says whether the model got better: tasks it never trained on
            plt.plot([r for r, _ in view.evals], [a for _, a in view.evals], label="held-out accuracy", marker="dot")
        self.refresh()


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
        yield RewardPlot(id="reward-plot")
        yield TaskTable(id="task-table")

    def show(self, view: NodeView) -> None:
        self.query_one(RewardPlot).show(view)
        self.query_one(TaskTable).show(view)
