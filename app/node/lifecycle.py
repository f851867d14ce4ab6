"""What the node has been asked to do between rounds: run, pause or stop, now or after the round
in flight, and whether a guest rule holds it (battery, hours, idle, disk).

One intent and one suspension reason behind one condition variable: any thread may change them
(the TUI, the control socket, a signal handler, the guest monitor) and the round loop both polls
them (between decode steps, between microbatches) and sleeps on them while held.
"""

from __future__ import annotations

import enum
import threading


class Intent(enum.Enum):
    RUN = "run"
    PAUSE_AFTER_ROUND = "pause after the round"  # finish the round in flight, then wait
    PAUSE_NOW = "pause now"  # drop the round in flight, then wait
    STOP_AFTER_ROUND = "stop after the round"  # finish the round in flight, then stop
    STOP_NOW = "stop now"  # drop the round in flight and stop


PAUSING = (Intent.PAUSE_AFTER_ROUND, Intent.PAUSE_NOW)
STOPPING = (Intent.STOP_AFTER_ROUND, Intent.STOP_NOW)


class Lifecycle:
    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._intent = Intent.RUN
        self._suspended_for: str | None = None

    # ---- requests (any thread) -------------------------------------------------------------------
    def stop(self, finish_round: bool) -> None:
        """Stopping outranks pausing; a stop "now" outranks a stop after the round."""
        with self._changed:
            if self._intent is not Intent.STOP_NOW:
                self._intent = Intent.STOP_AFTER_ROUND if finish_round else Intent.STOP_NOW
            self._changed.notify_all()

    def pause(self, finish_round: bool) -> None:
        """Pausing now outranks pausing after the round; a stop is never turned into a pause."""
        with self._changed:
            if self._intent is Intent.RUN or (self._intent is Intent.PAUSE_AFTER_ROUND and not finish_round):
                self._intent = Intent.PAUSE_AFTER_ROUND if finish_round else Intent.PAUSE_NOW
            self._changed.notify_all()

    def resume(self) -> Intent:
        """Undo a pause (not a stop); returns the intent it replaced."""
        with self._changed:
            before = self._intent
            if before in PAUSING:
                self._intent = Intent.RUN
            self._changed.notify_all()
            return before

    def suspend(self, reason: str) -> None:
        with self._changed:
            self._suspended_for = reason
            self._changed.notify_all()

    def unsuspend(self) -> None:
        with self._changed:
            self._suspended_for = None
            self._changed.notify_all()

    # ---- what the loop reads -------------------------------------------------------------------
    @property
    def intent(self) -> Intent:
        return self._intent

    @property
    def suspended_for(self) -> str | None:
        return self._suspended_for

    @property
    def stopping(self) -> bool:
        return self._intent in STOPPING

    @property
    def paused(self) -> bool:
        return self._intent in PAUSING

    @property
    def held(self) -> bool:
        """Rounds may not start: paused by the user or suspended by a guest rule."""
        return self.paused or self._suspended_for is not None

    def drops_round(self, abandon_on_suspend: bool) -> bool:
        """The round in flight is to be dropped (checked between decode steps and microbatches)."""
        if self._intent in (Intent.STOP_NOW, Intent.PAUSE_NOW):
            return True
        return self._suspended_for is not None and abandon_on_suspend

    def wait(self, timeout_s: float) -> None:
        """Sleep until something changes or `timeout_s` passes."""
        with self._changed:
            self._changed.wait(timeout_s)
