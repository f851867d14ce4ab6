"""What each peer has delivered: the ledger behind every budget the node spends on peers.

Budgets follow what peers *delivered* (groups that passed this node's own verification, and the
ones its updates trained on), never what they *claimed* in an announcement: anyone can announce,
and throw-away identities cost nothing. A peer's standing:

    score = ADMITTED_POINTS × admitted + USED_POINTS × used − REFUSED_POINTS × refused
            − FAILED_POINTS × failed fetches

A peer with a positive score is *proven*: its bundles are fetched first (board.py), its connection
is kept when slots run short (admission.py). Others (newcomers, and peers with nothing good on
record) share a few fetches a round, so a newcomer can still earn a standing. A failed fetch also
puts the peer on a cooldown that doubles with each failure in a row (30 s … 30 min), so a peer
that answers "missing" or trickles is not asked again round after round.

Written from the network thread (fetch outcomes) and the round loop (intake), read from both.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace

ADMITTED_POINTS, USED_POINTS, REFUSED_POINTS, FAILED_POINTS = 1.0, 1.0, 3.0, 2.0
COOLDOWN_FIRST_S, COOLDOWN_MAX_S = 30.0, 1800.0
MAX_PEERS = 512  # as many origins as the board tracks; the least recently active are forgotten


@dataclass(frozen=True)
class Standing:
    admitted: int = 0  # groups that passed verification
    used: int = 0  # groups an update trained on
    refused: int = 0  # groups (or bundles) that failed verification
    fetched: int = 0  # bundles fetched whole
    failed: int = 0  # fetches that failed on the peer's side
    failed_in_row: int = 0
    cooldown_until: float = 0.0  # monotonic clock
    fetch_seconds: float | None = None  # the last successful fetch's duration

    @property
    def score(self) -> float:
        return (ADMITTED_POINTS * self.admitted + USED_POINTS * self.used
                - REFUSED_POINTS * self.refused - FAILED_POINTS * self.failed)


class Reputation:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._peers: OrderedDict[str, Standing] = OrderedDict()

    # ---- outcomes ------------------------------------------------------------------------------
    def admitted(self, peer: str, groups: int) -> None:
        self._update(peer, lambda s: replace(s, admitted=s.admitted + groups))

    def used(self, peer: str, groups: int) -> None:
        self._update(peer, lambda s: replace(s, used=s.used + groups))

    def refused(self, peer: str, groups: int) -> None:
        self._update(peer, lambda s: replace(s, refused=s.refused + groups))

    def fetch_succeeded(self, peer: str, seconds: float) -> None:
        self._update(peer, lambda s: replace(s, fetched=s.fetched + 1, failed_in_row=0, cooldown_until=0.0,
                                             fetch_seconds=round(seconds, 3)))

    def fetch_failed(self, peer: str) -> None:
        def fail(s: Standing) -> Standing:
            delay = min(COOLDOWN_MAX_S, COOLDOWN_FIRST_S * 2 ** s.failed_in_row)
            return replace(s, failed=s.failed + 1, failed_in_row=s.failed_in_row + 1,
                           cooldown_until=self._clock() + delay)

        self._update(peer, fail)

    # ---- reading -------------------------------------------------------------------------------
    def standing(self, peer: str) -> Standing | None:
        """None for a peer with nothing on record (a newcomer)."""
        with self._lock:
            return self._peers.get(peer)

    def score(self, peer: str) -> float:
        standing = self.standing(peer)
        return standing.score if standing else 0.0

    def proven(self, peer: str) -> bool:
        return self.score(peer) > 0

    def cooling_down(self, peer: str) -> bool:
        standing = self.standing(peer)
        return standing is not None and self._clock() < standing.cooldown_until

    def snapshot(self) -> dict[str, Standing]:
        with self._lock:
            return dict(self._peers)

    def _update(self, peer: str, change: Callable[[Standing], Standing]) -> None:
        with self._lock:
            self._peers[peer] = change(self._peers.pop(peer, Standing()))
            while len(self._peers) > MAX_PEERS:
                self._peers.popitem(last=False)
