"""Progress within a round's phases, thinned out for the viewers: they redraw a few times a
second at most, while a backend reports every finished sequence or microbatch."""

from __future__ import annotations

import time

from ..events import Listener, Progress

PROGRESS_INTERVAL_S = 0.25


class ProgressReporter:
    """The round's `on_progress` callback: (phase, done, total, tokens) → `Progress` events."""

    def __init__(self, round_no: int, emit: Listener, interval_s: float = PROGRESS_INTERVAL_S) -> None:
        self.round_no, self.emit, self.interval_s = round_no, emit, interval_s
        self._phase = ""
        self._phase_started = time.perf_counter()
        self._last_sent = 0.0

    def __call__(self, phase: str, done: int, total: int, tokens: int) -> None:
        now = time.perf_counter()
        if phase != self._phase:
            self._phase, self._phase_started = phase, now
        elif now - self._last_sent < self.interval_s and done < total:
            return  # the last update of a phase always goes out
        self._last_sent = now
        elapsed = now - self._phase_started
        rate = tokens / elapsed if phase == "generate" and elapsed > 0 else 0.0
        self.emit(Progress(self.round_no, phase, done, total, rate))
