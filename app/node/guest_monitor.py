"""The guest rules applied while the node runs: a small thread reads the machine's state every
`resources.check_every_s` and suspends or resumes the node through its lifecycle, telling the
viewers why. The decision itself is `GuestPolicy`'s (pure, tested with injected readings)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from ..config import ResourcesSection
from ..events import Listener, Notice, StateChanged
from .guest import GuestPolicy, GuestSettings, Readings, read_os
from .lifecycle import Lifecycle

log = logging.getLogger("swarmling.rounds")


class GuestMonitor:
    def __init__(self, resources: ResourcesSection, lifecycle: Lifecycle, emit: Listener, disk_path: Path) -> None:
        self.resources = resources
        self.policy = GuestPolicy(GuestSettings.from_config(resources))
        self.lifecycle = lifecycle
        self.emit = emit
        self.disk_path = disk_path
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="swarmling-guest", daemon=True)

    def start(self) -> None:
        readings = read_os(self.disk_path)
        if self.resources.only_when_idle and readings.idle_seconds is None:
            self.emit(Notice("warning", "resources.only_when_idle is on, but this system does not say how long it has "
                                        "been idle (macOS, or X11 with xprintidle, do): the rule is not applied"))
        self.check(readings)  # before the first round, not 15 s into it
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def update(self, resources: ResourcesSection) -> None:
        """New settings from the settings screen: they apply at the next check."""
        self.resources = resources
        self.policy = GuestPolicy(GuestSettings.from_config(resources))

    def check(self, readings: Readings) -> None:
        """Suspend or resume by the guest rules (any thread; readings injected in tests)."""
        reason = self.policy.decide(readings)
        suspended_for = self.lifecycle.suspended_for
        if reason and reason != suspended_for:
            self.lifecycle.suspend(reason)
            if suspended_for is None:
                what = "the round in flight finishes first" if self.resources.on_suspend == "finish" else ""
                self.emit(Notice("info", f"suspended: {reason}" + (f" ({what})" if what else "")))
            self.emit(StateChanged("suspended", reason))
        elif reason is None and suspended_for is not None:
            self.lifecycle.unsuspend()
            self.emit(Notice("info", "resuming: nothing holds the node back any more"))

    def _loop(self) -> None:
        while not self._stop.wait(self.resources.check_every_s):
            try:
                self.check(read_os(self.disk_path))
            except Exception as exc:  # noqa: BLE001 — a sensor hiccup must not stop the node
                log.warning("could not read the machine's state: %s", exc)
