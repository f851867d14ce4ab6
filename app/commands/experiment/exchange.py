"""The experiment's network: a node's shared groups go to every other node's inbox at once, in the
same wire encoding the swarm uses, where the usual verification runs (decode, regenerate, re-score,
zero-advantage filter, per-peer cap, freshness). What the inboxes hold is saved when a run stops
at a round's end and restored when it goes on, so a run in chunks trains on what it would have."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from pathlib import Path

from ....backends.atomic import write_atomic
from ...config import Config
from ...events import Listener
from ...learning.rollout import QuestionGroup, ShareCallback
from ...paths import Paths
from ...swarm.facade import OfflineSwarm, SwarmOpener
from ...swarm.verification.wire import bundle_from_groups, encode_bundle

INBOX_FILE = "inbox.json"  # a stopped run's inbox, in the node's folder
BASE58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def peer_id(label: str) -> str:
    """A stable id in libp2p's base58 alphabet for a node of the experiment."""
    return "12D3KooW" + "".join(BASE58[b % 58] for b in hashlib.sha256(label.encode()).digest()[:36])


class InMemoryExchange:
    def __init__(self) -> None:
        self.members: list[ExchangeMember] = []
        self.bundles = 0

    def member(self, node_id: str, model: str) -> SwarmOpener:
        """The `connect` a Node is built with: its door to this exchange."""

        def connect(config: Config, paths: Paths, model_name: str, emit: Listener) -> OfflineSwarm:
            joined = ExchangeMember(emit, self, node_id, model)
            self.members.append(joined)
            return joined

        return connect

    def save(self, folders: Sequence[Path]) -> None:
        """Each member's inbox (in joining order, one folder per member), written atomically."""
        for member, folder in zip(self.members, folders, strict=True):
            write_atomic(folder / INBOX_FILE, json.dumps(member.inbox.snapshot()))

    def restore(self, folders: Sequence[Path]) -> bool:
        """Give each member the inbox saved in its folder, consumed (a second resume from the same
        file would offer used groups again); True when every member had one."""
        restored = 0
        for member, folder in zip(self.members, folders, strict=True):
            path = folder / INBOX_FILE
            if path.exists():
                member.inbox.restore(json.loads(path.read_text()))
                path.unlink()
                restored += 1
        return restored == len(self.members)

    def publish(self, sender: ExchangeMember, data: bytes) -> None:
        self.bundles += 1
        for other in self.members:
            if other is not sender:
                other.inbox.offer(sender.peer_id, data)


class ExchangeMember(OfflineSwarm):
    def __init__(self, emit: Listener, exchange: InMemoryExchange, node_id: str, model: str) -> None:
        super().__init__(emit)
        self.exchange, self.peer_id, self.model, self.name = exchange, node_id, model, "experiment"

    def sharer(self, round_no: int, prefill: str) -> ShareCallback:
        def share(groups: Sequence[QuestionGroup]) -> None:
            bundle = bundle_from_groups(groups, swarm=self.name, node_id=self.peer_id, model=self.model,
                                        round_no=round_no, timestamp=time.time(), prefill=prefill)
            self.exchange.publish(self, encode_bundle(bundle))

        return share
