"""Exponential backoff, the one way the host waits longer after each failure: the dialer's retries
of a target, the cooldown of bundle authors that could not be dialled (dialer.py), the host's
restarts (supervision.py). The numbers are each caller's.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable


class Backoff:
    """first_s, 2 × first_s, 4 × first_s … up to max_s; `reset()` starts over."""

    def __init__(self, first_s: float, max_s: float) -> None:
        self.first_s, self.max_s = first_s, max_s
        self._next = first_s

    def next_delay(self) -> float:
        """The delay to wait now; the next one is twice as long (at most max_s)."""
        delay = self._next
        self._next = min(self.max_s, delay * 2)
        return delay

    def reset(self) -> None:
        self._next = self.first_s


class PeerBackoff:
    """A `Backoff` per peer: `failed()` blocks the peer for its next delay (times a random factor
    within ±jitter), `succeeded()` forgets it. Safe from any thread; at most `max_peers` are
    remembered (the one whose last failure is oldest is forgotten first)."""

    def __init__(self, first_s: float, max_s: float, *, jitter: float = 0.0, max_peers: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.first_s, self.max_s, self._jitter, self._max_peers, self._clock = first_s, max_s, jitter, max_peers, clock
        self._lock = threading.Lock()
        self._until: dict[str, tuple[float, Backoff]] = {}  # peer -> (blocked until, its backoff)

    def failed(self, peer: str, max_s: float | None = None) -> None:
        """Another failure: blocked for the next delay (`max_s`, if given, caps a new peer's delays)."""
        with self._lock:
            _, backoff = self._until.pop(peer, (0.0, None))
            if backoff is None:
                backoff = Backoff(self.first_s, self.max_s if max_s is None else max_s)
            delay = backoff.next_delay()
            if self._jitter:
                delay *= random.uniform(1 - self._jitter, 1 + self._jitter)
            self._until[peer] = (self._clock() + delay, backoff)
            while self._max_peers is not None and len(self._until) > self._max_peers:
                self._until.pop(next(iter(self._until)))

    def succeeded(self, peer: str) -> None:
        with self._lock:
            self._until.pop(peer, None)

    def blocked(self, peer: str) -> bool:
        with self._lock:
            entry = self._until.get(peer)
            return entry is not None and self._clock() < entry[0]
