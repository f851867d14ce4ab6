"""`t`: try the model. The volunteer types a question; the trained model (the newest checkpoint)
and the base model answer side by side, as `swarmling ask` does (node/try_it.py): a small
llama.cpp copy on one thread of its own, loaded when the first question is asked and freed when
the screen closes, so the running node's round and its memory stay as they were."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from ...node.try_it import Answers


class Asker(Protocol):
    """What the screen needs: answers to a question (called on a worker thread), and a close."""

    def __call__(self, question: str) -> Answers: ...
    def close(self) -> None: ...


class TryItScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape", "dismiss", "close")]

    def __init__(self, make_asker: Callable[[], Asker]) -> None:
        super().__init__()
        self._make_asker = make_asker
        self._asker: Asker | None = None

    def compose(self) -> ComposeResult:
        with Vertical(id="try-body", classes="dialog"):
            yield Static(Text("Try it: ask the model a question", style="bold"), id="try-title")
            yield Input(placeholder="e.g. What is 17 + 25?  (Enter asks, Esc closes)", id="try-question")
            with Horizontal(id="try-answers"):
                yield Static(self._pane("trained", "…"), id="try-trained", classes="try-answer")
                yield Static(self._pane("base model", "…"), id="try-base", classes="try-answer")
            yield Static(Text("Both are asked as the node asks (its prompt, near-greedy decoding), on one thread "
                              "beside it.", style="dim"), id="try-status")

    @staticmethod
    def _pane(title: str, body: str) -> Text:
        text = Text()
        text.append(f"{title}\n", style="bold")
        text.append(body)
        return text

    def on_input_submitted(self, event: Input.Submitted) -> None:
        question = event.value.strip()
        if question:
            self.query_one("#try-status", Static).update(Text("asking both models…", style="cyan"))
            self._ask(question)

    @work(thread=True, exclusive=True)
    def _ask(self, question: str) -> None:
        try:
            if self._asker is None:
                self._asker = self._make_asker()
            answers = self._asker(question)
        except Exception as exc:  # noqa: BLE001 - said on the screen; the node is not concerned
            self.app.call_from_thread(self._show_error, str(exc))
            return
        self.app.call_from_thread(self.show, answers)

    def show(self, a: Answers) -> None:
        trained = f"trained, round {a.trained_round}" if a.trained_round is not None else "trained (no checkpoint yet)"
        self.query_one("#try-trained", Static).update(self._pane(trained, a.trained))
        self.query_one("#try-base", Static).update(self._pane("base model", a.base))
        self.query_one("#try-status", Static).update(
            Text(f"{a.question!r}: answered in {a.seconds:.1f} s", style="dim"))

    def _show_error(self, text: str) -> None:
        self.query_one("#try-status", Static).update(Text(text, style="red"))

    def on_unmount(self) -> None:
        if self._asker is not None:
            self._asker.close()  # the copy's memory goes back while the screen is closed
