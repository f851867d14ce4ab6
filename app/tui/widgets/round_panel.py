"""The round in flight: one bar per phase, tokens/s while generating, the last round's figures."""

from __future__ import annotations

from rich.console import Group
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from ...events import PHASES
from ..view import NodeView

LABELS = {"tasks": "tasks", "generate": "generate", "score": "score", "share": "share",
          "sample": "sample", "train": "train", "hand-off": "hand-off"}


class RoundPanel(Static):
    _view: NodeView | None = None

    def on_resize(self) -> None:  # the bars take the width there is
        if self._view is not None:
            self.show(self._view)

    def show(self, view: NodeView) -> None:
        self._view = view
        if view.preparing is not None or (view.state == "starting" and not view.phase):
            self.update(self._getting_ready(view))
            return
        table = Table.grid(padding=(0, 1))
        table.add_column(width=8)
        table.add_column(width=max(10, min(72, self.size.width - 30)))
        table.add_column(width=16, justify="right")
        last_seconds = view.last_round.seconds if view.last_round is not None else {}
        for phase in PHASES:
            fraction = view.phase_fraction(phase)
            active = phase == view.phase
            style = "bold cyan" if active else ("" if phase in view.phases_done else "dim")
            if fraction is None:  # running, nothing countable: a half-lit bar, no animation
                bar = ProgressBar(total=1.0, completed=0.5, complete_style="cyan", pulse=False)
                detail = "…"
            else:
                bar = ProgressBar(total=1.0, completed=fraction, complete_style="cyan" if active else "green")
                detail = self._detail(view, phase, active, last_seconds)
            table.add_row(Text(LABELS[phase], style=style), bar, Text(detail, style=style or "dim"))
        self.update(Group(self._title(view), table, self._summary(view)))

    def _getting_ready(self, view: NodeView) -> Group:
        """The first minute: loading (and on a first run converting) the model, then scoring the
        weights it starts from; the rounds' bars would only say "Round -" meanwhile."""
        step = view.preparing
        what = step.what if step is not None else (view.state_detail or "loading the model")
        rows: list = [Text("Getting ready", style="bold"), Text(what, style="cyan")]
        if step is not None and step.total:
            bar = Table.grid(padding=(0, 1))
            bar.add_column(width=max(10, min(72, self.size.width - 22)))
            bar.add_column(width=16, justify="right")
            bar.add_row(ProgressBar(total=step.total, completed=step.done, complete_style="cyan"),
                        Text(f"{step.done}/{step.total} replies"))
            rows.append(bar)
        else:
            rows.append(ProgressBar(total=1.0, completed=0.5, complete_style="cyan", pulse=False,
                                    width=max(10, min(72, self.size.width - 22))))
        rows.append(Text("the first round starts once this is done" if view.last_round is None
                         else "rounds resume once this is done", style="dim"))
        return Group(*rows)

    @staticmethod
    def _title(view: NodeView) -> Text:
        title = Text()
        title.append(f"Round {view.round or '-'}", style="bold")
        if view.phase == "generate" and view.tokens_per_s:
            title.append(f"   {view.tokens_per_s:,.0f} tok/s", style="cyan")
        return title

    @staticmethod
    def _detail(view: NodeView, phase: str, active: bool, last_seconds: dict) -> str:
        if active and phase in view.progress:
            done, total = view.progress[phase]
            unit = "seq" if phase == "generate" else "tok"
            return f"{done}/{total} {unit}"
        if phase in last_seconds and not active:
            return f"{last_seconds[phase]:.1f}s last"
        return ""

    @staticmethod
    def _summary(view: NodeView) -> Text:
        m = view.last_round
        if m is None:
            return Text("no round finished yet", style="dim")
        text = Text()
        text.append(f"last: round {m.round}  ", style="bold")
        text.append(f"reward {m.reward_mean:.2f}  solved {m.solved}/{m.questions}  ")
        text.append(f"learnable {m.learnable_groups}/{m.questions}  {view.external_share}  {m.wall_seconds:.0f}s")
        if m.rescued_groups:  # peers' right replies gave own all-wrong groups a signal
            text.append(f"  {m.rescued_by}", style="green")
        if "train" not in m.seconds and m.min_signal_groups:  # the minimum batch is not full yet
            text.append(f"  waiting for learnable groups {m.signal_groups}/{m.min_signal_groups}", style="yellow")
        if m.eval_best_accuracy is not None:
            text.append(f"\nbest held-out {m.eval_best_accuracy:.0%} at round {m.eval_best_of_round}", style="green")
        return text
