"""Admitted external question-groups waiting to be sampled: bounded, expiring, used at most once,
and offered only while fresh: SAPO trains on the swarm's current rollouts, and a group sampled by
a peer's policy many updates ago is off-policy for both of them (a CPU node's round is ~30 s, so
the 600 s memory bound alone let the average external group be ~10 rounds old).

A group is keyed by a digest of its spec and the replies as they travelled, so a replayed bundle
(or the same group relayed by several peers) is recognised — before any work is spent admitting
it again — and counted once. Keys are remembered for twice the TTL after the group is gone.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

from ...learning.rollout import EXTERNAL_MAX_AGE_ROUNDS, QuestionGroup
from ...learning.tasks import TaskSpec

MAX_AGE_ROUNDS = EXTERNAL_MAX_AGE_ROUNDS  # this round's arrivals and the previous round's


def group_key(spec: TaskSpec, replies: Iterable[str]) -> str:
    h = hashlib.sha256(repr(spec).encode())
    for text in sorted(replies):
        h.update(b"\0" + text.encode("utf-8", "replace"))
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

    def seen(self, key: str) -> bool:
        self._expire()
        return key in self._seen

    def add(self, key: str, group: QuestionGroup) -> str | None:
        """None when admitted, else why not ("replay", "full")."""
        if self.seen(key):
            return "replay"
        if len(self._groups) >= self.max_groups:
            return "full"
        now = self.clock()
        self._seen[key] = now
        self._groups[key] = (now, group)
        return None

    def available(self, round_no: int | None = None) -> list[QuestionGroup]:
        """Groups not yet used; with `round_no`, only those admitted at most MAX_AGE_ROUNDS before it."""
        self._expire()
        groups = [g for _, g in self._groups.values()]
        if round_no is None:
            return groups
        return [g for g in groups if g.fresh_at(round_no)]

    def mark_used(self, groups: Iterable[QuestionGroup]) -> None:
        """Used groups leave the pool for good (their keys stay seen)."""
        used = {id(g) for g in groups}
        for key in [k for k, (_, g) in self._groups.items() if id(g) in used]:
            del self._groups[key]

    def snapshot(self) -> dict:
        """The groups waiting and the keys seen, as JSON data (Inbox.snapshot)."""
        self._expire()
        return {"groups": [[key, group.to_state()] for key, (_, group) in self._groups.items()],
                "seen": list(self._seen)}

    def restore(self, state: dict) -> None:
        """A snapshot's groups and keys, their ages counted from now: what decides whether a group
        is still trainable is the round it arrived in (QuestionGroup.fresh_at), which it keeps."""
        now = self.clock()
        for key in state["seen"]:
            self._seen[key] = now
        for key, group in state["groups"]:
            self._groups[key] = (now, QuestionGroup.from_state(group))

    def __len__(self) -> int:
        self._expire()
        return len(self._groups)
