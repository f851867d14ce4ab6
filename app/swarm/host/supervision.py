"""What the node knows of its swarm host's health, and how soon a failed host is started again.

The host runs as a supervised service (host.py): whatever escapes py-libp2p's services is logged
with its cause, the host is torn down and started again after a backoff, and `HostHealth` says so
to the viewers (TUI, `swarmling status`) while the round loop carries on without the network.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace

from .backoff import Backoff

RESTART_FIRST_S, RESTART_MAX_S = 1.0, 60.0
STABLE_AFTER_S = 60.0  # a host that ran this long before failing starts again after the first delay


@dataclass(frozen=True)
class HostHealth:
    running: bool = False
    restarts: int = 0
    last_error: str = ""  # the root cause of the last failure, "" if none
    last_error_at: float | None = None  # wall clock


class HealthBoard:
    """`HostHealth`, written on the network thread and read from any other."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._health = HostHealth()

    def snapshot(self) -> HostHealth:
        with self._lock:
            return self._health

    def up(self) -> None:
        with self._lock:
            self._health = replace(self._health, running=True)

    def down(self, cause: str | None, *, restarting: bool) -> None:
        with self._lock:
            h = self._health
            if cause is not None:
                h = replace(h, last_error=cause, last_error_at=time.time())
            self._health = replace(h, running=False, restarts=h.restarts + restarting)


class RestartBackoff:
    """1 s, 2 s, 4 s … up to a minute; back to 1 s once a run lasted STABLE_AFTER_S."""

    def __init__(self) -> None:
        self._backoff = Backoff(RESTART_FIRST_S, RESTART_MAX_S)

    def next_delay(self, ran_s: float) -> float:
        if ran_s >= STABLE_AFTER_S:
            self._backoff.reset()
        return self._backoff.next_delay()


def root_cause(exc: BaseException) -> BaseException:
    """The innermost exception of nested exception groups and causes: what actually failed."""
    while True:
        if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]
        elif exc.__cause__ is not None:
            exc = exc.__cause__
        else:
            return exc


def describe(exc: BaseException) -> str:
    cause = root_cause(exc)
    return f"{type(cause).__module__}.{type(cause).__qualname__}: {cause}"[:300]
