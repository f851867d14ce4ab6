"""Admitted external question-groups waiting to be sampled: bounded, expiring, used at most once.

A group is keyed by a digest of its spec and completion texts, so a replayed bundle (or the same
group relayed by several peers) is recognised and counted once. Keys are remembered for twice the
TTL after the group itself is gone.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

from ..rollout import QuestionGroup


def group_key(group: QuestionGroup) -> str:
    h = hashlib.sha256(repr(group.task.spec).encode())
    for c in sorted(c.text for c in group.completions):
        h.update(b"\0" + c.encode("utf-8", "replace"))
    return h.hexdigest()


class GroupPool:
    def __init__(self, ttl_s: float = 600.0, max_groups: int = 512, clock: Callable[[], float] = time.monotonic):
        self.ttl_s, self.max_groups, self.clock = ttl_s, max_groups, clock
        self._groups: OrderedDict[str, tuple[float, QuestionGroup]] = OrderedDict()
        self._seen: OrderedDict[str, float] = OrderedDict()  # key -> when first seen

    def _expire(self) -> None:
        now = self.clock()
        while self._groups and now - next(iter(self._groups.values()))[0] > self.ttl_s:
            self._groups.popitem(last=False)
        while self._seen and now - next(iter(self._seen.values())) > 2 * self.ttl_s:
            self._seen.popitem(last=False)

    def add(self, group: QuestionGroup) -> str | None:
        """None when admitted, else why not ("replay", "full")."""
        self._expire()
        key = group_key(group)
        if key in self._seen:
            return "replay"
        if len(self._groups) >= self.max_groups:
            return "full"
        now = self.clock()
        self._seen[key] = now
        self._groups[key] = (now, group)
        return None

    def available(self) -> list[QuestionGroup]:
        self._expire()
        return [g for _, g in self._groups.values()]

    def mark_used(self, groups: Iterable[QuestionGroup]) -> None:
        """Used groups leave the pool for good (their keys stay seen)."""
        used = {id(g) for g in groups}
        for key in [k for k, (_, g) in self._groups.items() if id(g) in used]:
            del self._groups[key]

    def __len__(self) -> int:
        self._expire()
        return len(self._groups)
