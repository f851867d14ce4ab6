"""What this node gave the swarm: how often peers fetched its bundles, and how many peers did.

Folding@home and BOINC volunteers keep running for the figure that says their machine mattered
(rl-swarm's users asked for one: its issues #287 and #312). A fetch is counted when the whole
bundle was written to the peer (a request answered "no longer have it", or cut off by a deadline,
is not). Counted here, by this node, from what it served: no peer's word is taken for it.

Since the node started: a restart begins a new day's count (the figures are for viewers only,
never used for anything else, so nothing is persisted). Peers are peer identities: one machine
may hold several, so the count of peers is what it says, not of people.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

DAY_S = 24 * 3600
# Bounded memory under a flood of fetches: the oldest are forgotten first (the day's count then
# reads low, never high). At one bundle a round per peer, 20,000 is 80 peers at 250 rounds a day.
MAX_REMEMBERED = 20_000


@dataclass(frozen=True)
class GivenFigures:
    served: int  # bundles served since the node started
    served_day: int  # in the last 24 h
    peers_day: int  # distinct peers they went to in the last 24 h
    trained_day: int = 0  # groups peers said their updates trained on, in the last 24 h (host/thanks.py)
    trained_peers_day: int = 0  # how many peers said so


class GivenLog:
    """Thread-safe: the network thread counts, the round loop reads."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, max_remembered: int = MAX_REMEMBERED) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._events: deque[tuple[float, str]] = deque(maxlen=max_remembered)
        self._thanks: deque[tuple[float, str, int]] = deque(maxlen=max_remembered)
        self._served = 0

    def served(self, peer: str) -> None:
        with self._lock:
            self._events.append((self._clock(), peer))
            self._served += 1

    def thanked(self, peer: str, groups: int) -> None:
        """A peer says its update trained on `groups` of ours: counted as said, used for nothing else."""
        with self._lock:
            self._thanks.append((self._clock(), peer, groups))

    def figures(self) -> GivenFigures:
        with self._lock:
            since = self._clock() - DAY_S
            for events in (self._events, self._thanks):
                while events and events[0][0] < since:
                    events.popleft()
            return GivenFigures(self._served, len(self._events), len({e[1] for e in self._events}),
                                sum(e[2] for e in self._thanks), len({e[1] for e in self._thanks}))
