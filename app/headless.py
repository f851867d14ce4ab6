"""Headless mode: one concise line per round on stdout, notices on stderr. No Textual here."""

from __future__ import annotations

import sys
from typing import TextIO

from .events import Event, NodeStarted, Notice, RoundFinished
from .metrics import format_round


class HeadlessPrinter:
    def __init__(self, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> None:
        self.out, self.err = out, err

    def __call__(self, event: Event) -> None:
        if isinstance(event, RoundFinished):
            print(format_round(event.record), file=self.out, flush=True)
        elif isinstance(event, NodeStarted):
            start = f"resuming after round {event.resumed_round}" if event.resumed_round else "fresh start"
            st = event.shape
            print(
                f"swarmling: {event.model} on {event.backend} ({event.device}), preset {event.preset}, {start}; "
                f"{st.questions} questions x {st.completions} completions, {st.max_new_tokens} new tokens max\n"
                f"  backend choice: {event.reason}",
                file=self.err,
                flush=True,
            )
        elif isinstance(event, Notice):
            print(f"swarmling: {event.level}: {event.text}", file=self.err, flush=True)
