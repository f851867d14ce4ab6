"""The seam between the network and the round loop.

The network side (any thread) only drops raw bytes in with `offer()`: it never blocks and never
waits for the round. The round loop calls `drain()` before sampling: bundles are decoded,
their groups re-verified against locally regenerated tasks (`intake.py`) and pooled. Every
refusal is counted and its reason kept for the log; nothing a peer sends can raise out of here.
"""

from __future__ import annotations

import base64
import queue
from dataclasses import dataclass, field

from .intake import IntakeContext, Rejected, admit_group
from .pool import GroupPool, group_key
from .wire import WireError, decode_bundle

MAX_QUEUED_BUNDLES = 256  # beyond this, offers are dropped (and counted) until the round drains


@dataclass
class DrainReport:
    bundles: int = 0
    admitted: int = 0
    rejected: int = 0
    reasons: list[str] = field(default_factory=list)
    by_peer: dict[str, int] = field(default_factory=dict)  # refusals that count against a peer
    admitted_by_peer: dict[str, int] = field(default_factory=dict)

    def refuse(self, peer: str, reason: str, blame: bool = True) -> None:
        self.rejected += 1
        if blame and peer != "inbox":
            self.by_peer[peer] = self.by_peer.get(peer, 0) + 1
        if len(self.reasons) < 20:
            self.reasons.append(f"{peer[:16]}: {reason}")


class Inbox:
    def __init__(self, pool: GroupPool) -> None:
        self.pool = pool
        self._queue: queue.Queue[tuple[str, bytes]] = queue.Queue(maxsize=MAX_QUEUED_BUNDLES)
        self._overflow = 0

    def offer(self, peer: str, data: bytes) -> bool:
        """Thread-safe and non-blocking; False when the queue is full (the bundle is dropped)."""
        try:
            self._queue.put_nowait((peer, bytes(data)))
            return True
        except queue.Full:
            self._overflow += 1
            return False

    def snapshot(self) -> dict:
        """What it holds, as JSON data: bundles not yet verified and the pool (GroupPool.snapshot).
        For a process that stops and must go on exactly where it was (the experiment's chunks)."""
        pending = []
        while True:
            try:
                pending.append(self._queue.get_nowait())
            except queue.Empty:
                break
        for item in pending:
            self._queue.put_nowait(item)  # left as it was
        return {"pending": [[peer, base64.b64encode(data).decode()] for peer, data in pending], **self.pool.snapshot()}

    def restore(self, state: dict) -> None:
        for peer, data in state["pending"]:
            self.offer(peer, base64.b64decode(data))
        self.pool.restore(state)

    def drain(self, ctx: IntakeContext, round_no: int = 0) -> DrainReport:
        """Verify everything that arrived; admitted groups are dated `round_no` (this node's round)."""
        report = DrainReport()
        if self._overflow:
            report.refuse("inbox", f"{self._overflow} bundles dropped: more arrived than a round can take")
            self._overflow = 0
        while True:
            try:
                peer, data = self._queue.get_nowait()
            except queue.Empty:
                return report
            report.bundles += 1
            try:
                bundle = decode_bundle(data)
            except WireError as exc:
                report.refuse(peer, str(exc))
                continue
            if bundle.node_id != peer:
                report.refuse(peer, f"bundle claims to come from {bundle.node_id[:16]}")
                continue
            for wire_group in bundle.groups:
                key = group_key(wire_group.spec.task_spec(), (c.text for c in wire_group.completions))
                if self.pool.seen(key):  # refused before regenerating, re-tokenising and scoring it
                    report.refuse(peer, "replay", blame=False)  # honest relays and resends happen
                    continue
                result = admit_group(wire_group, peer, ctx, sender_model=bundle.model)
                if isinstance(result, Rejected):
                    report.refuse(peer, result.reason, result.blame)
                    continue
                result.received_round = round_no
                why = self.pool.add(key, result)
                if why:
                    report.refuse(peer, why, blame=False)
                else:
                    report.admitted += 1
                    report.admitted_by_peer[peer] = report.admitted_by_peer.get(peer, 0) + 1
