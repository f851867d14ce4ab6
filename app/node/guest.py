"""Being a good guest: when the node may run on someone's machine (battery, idle, time windows).

The decision (`GuestPolicy.decide`) is pure: it takes OS readings and the time, so it is tested by
injecting readings. `read_os()` is the only part that asks the OS. The node polls both from a
small thread and suspends or resumes itself with the reason shown to the user.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime, time as dtime

import psutil

from ..config import ResourcesSection, parse_window

@dataclass(frozen=True)
class Readings:
    now: datetime  # local time
    on_battery: bool | None = None  # None: no battery, or the OS does not say
    idle_seconds: float | None = None  # since the user's last input; None: cannot tell here
    free_disk_bytes: int | None = None  # where checkpoints and logs go


@dataclass(frozen=True)
class GuestSettings:
    """The [resources] rules the policy applies; their defaults live in app/config/schema.py only."""

    pause_on_battery: bool
    resume_after_plugged_s: float  # hysteresis: mains must stay connected this long
    only_when_idle: bool
    idle_after_s: float
    windows: tuple[str, ...]  # "HH:MM-HH:MM", local time; may wrap past midnight
    min_free_disk_bytes: int

    @classmethod
    def from_config(cls, r: ResourcesSection) -> GuestSettings:
        return cls(
            pause_on_battery=r.pause_on_battery, resume_after_plugged_s=r.resume_after_plugged_s,
            only_when_idle=r.only_when_idle, idle_after_s=r.idle_after_s, windows=tuple(r.windows),
            min_free_disk_bytes=r.min_free_disk_mb * 2**20,
        )


def in_window(now: dtime, window: tuple[dtime, dtime]) -> bool:
    start, end = window
    return start <= now < end if start < end else (now >= start or now < end)


class GuestPolicy:
    def __init__(self, settings: GuestSettings) -> None:
        self.settings = settings
        self.windows = [parse_window(w) for w in settings.windows]
        self._plugged_since: datetime | None = None
        self._suspended_for_battery = False

    def decide(self, r: Readings) -> str | None:
        """Why the node should not run now, or None when it may."""
        s = self.settings
        if r.free_disk_bytes is not None and r.free_disk_bytes < s.min_free_disk_bytes:
            return (f"only {r.free_disk_bytes / 2**20:.0f} MB free on the disk for checkpoints and logs "
                    f"(resources.min_free_disk_mb = {s.min_free_disk_bytes // 2**20}); free some space")
        if s.pause_on_battery and r.on_battery is not None:
            reason = self._battery(r)
            if reason:
                return reason
        if self.windows and not any(in_window(r.now.time(), w) for w in self.windows):
            return f"outside the hours it may run ({', '.join(s.windows)})"
        if s.only_when_idle and r.idle_seconds is not None and r.idle_seconds < s.idle_after_s:
            return "the computer is in use (it runs after {:.0f} min without input)".format(s.idle_after_s / 60)
        return None

    def _battery(self, r: Readings) -> str | None:
        if r.on_battery:
            self._plugged_since = None
            self._suspended_for_battery = True
            return "on battery"
        if not self._suspended_for_battery:
            return None
        # Back on mains: wait until it has stayed plugged in a while (a laptop moved between
        # sockets, a flaky dock) before the CPU starts working again.
        if self._plugged_since is None:
            self._plugged_since = r.now
        waited = (r.now - self._plugged_since).total_seconds()
        if waited < self.settings.resume_after_plugged_s:
            return f"on mains again; resuming in {self.settings.resume_after_plugged_s - waited:.0f} s"
        self._suspended_for_battery = False
        return None


# ---- readings from the OS ----------------------------------------------------------------------

def read_os(disk_path=None) -> Readings:
    free = None
    if disk_path is not None:
        try:
            free = shutil.disk_usage(disk_path).free
        except OSError:
            free = None
    return Readings(now=datetime.now(), on_battery=_on_battery(), idle_seconds=_idle_seconds(), free_disk_bytes=free)


def _on_battery() -> bool | None:
    try:
        battery = psutil.sensors_battery()
    except (AttributeError, NotImplementedError, OSError):
        return None
    if battery is None or battery.power_plugged is None:
        return None
    return not battery.power_plugged


def _idle_seconds() -> float | None:
    """Seconds since the last keyboard/mouse input where the OS tells us; None elsewhere."""
    try:
        if sys.platform == "darwin":
            out = subprocess.run(["ioreg", "-c", "IOHIDSystem", "-d", "4"], capture_output=True, text=True, timeout=5).stdout
            m = re.search(r'"HIDIdleTime" = (\d+)', out)
            return int(m.group(1)) / 1e9 if m else None
        if shutil.which("xprintidle"):  # X11 sessions
            out = subprocess.run(["xprintidle"], capture_output=True, text=True, timeout=5)
            if out.returncode == 0 and out.stdout.strip().isdigit():
                return int(out.stdout.strip()) / 1000
    except (OSError, subprocess.SubprocessError):
        return None
    return None
