"""py-libp2p's Pubsub with our checks in front of it: no message from a peer can stop the service.

py-libp2p 0.8.1 runs each received message through `push_msg`, a task of the Pubsub service; any
exception there cancels the whole service (and with it our libp2p host). One such exception is
reachable by any peer: a message whose `from_id` is a sha2-256 peer id (no key inside) and whose
`key` field does not parse makes `signature_validator` call `deserialize_public_key(msg.key)`,
which raises protobuf's `DecodeError` (validators.py re-raises it on purpose).

Upstream issue we would file (libp2p/py-libp2p): "pubsub: malformed `key` in a received message
raises DecodeError out of `signature_validator` and stops the Pubsub service. Repro: RPC with one
message, from_id = 0x1220 + 32 bytes, key = ff ff ff ff, any signature, a subscribed topic.
Expected: the message is rejected (and the forwarder penalised); `push_msg` should never let an
exception out, as one peer can otherwise take the service down."

Our swarm signs with Ed25519 only, whose peer ids embed the key: a message whose key cannot be
read from its `from_id` (or whose `key` field disagrees with it) is dropped here, before the
library sees it, and counts as an invalid message against the forwarder (P4). Anything else the
library raises on one message or one stream is logged and dropped with that message or stream.

py-libp2p's validators answer only yes (relay) or no (drop and count it against the forwarder);
libp2p's third answer, "ignore" (drop, blame nobody), is `IgnoredMessage` raised by a sync
validator: py-libp2p lets it out of `push_msg` before scoring, and it is dropped here.
"""

from __future__ import annotations

import logging

from libp2p.crypto.serialization import deserialize_public_key
from libp2p.peer.id import ID
from libp2p.pubsub.pubsub import Pubsub

from ..nat.relay import relayed_only
from ..p2p.streams import reset_quietly

log = logging.getLogger("swarmling.swarm")


class IgnoredMessage(Exception):
    """Raised by a topic validator: drop the message without counting it against the forwarder."""


MAX_SEQNO_BYTES = 32  # libp2p uses 8
MAX_SIGNATURE_BYTES = 128  # Ed25519's is 64


def malformed(msg) -> str | None:
    """Why a received pubsub message cannot be one of our swarm's signed messages; None if it can be."""
    try:
        key = ID(msg.from_id).extract_public_key()  # None unless the id embeds its key
    except Exception:  # noqa: BLE001 — arbitrary bytes
        key = None
    if key is None:
        return "from_id does not embed a public key"
    if msg.key:
        try:
            if deserialize_public_key(msg.key) != key:
                return "key field differs from the key in from_id"
        except Exception:  # noqa: BLE001 — protobuf DecodeError and friends
            return "key field does not parse"
    if not msg.signature or len(msg.signature) > MAX_SIGNATURE_BYTES:
        return "no signature, or an oversized one"
    if len(msg.seqno) > MAX_SEQNO_BYTES:
        return "oversized seqno"
    return None


class GuardedPubsub(Pubsub):
    """Pubsub whose per-message and per-stream work can fail only for that message or stream."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.dropped_malformed = 0
        self.library_faults = 0  # exceptions py-libp2p raised on one message or stream, survived
        self.ignored = 0  # messages our validator dropped without blaming the forwarder

    async def push_msg(self, msg_forwarder: ID, msg) -> None:
        if msg_forwarder != self.my_id and (why := malformed(msg)) is not None:
            self.dropped_malformed += 1
            log.debug("dropped a pubsub message from %s: %s", msg_forwarder, why)
            self._count_invalid(msg_forwarder, msg)
            return
        try:
            await super().push_msg(msg_forwarder, msg)
        except IgnoredMessage:
            self.ignored += 1
        except Exception as exc:  # noqa: BLE001 — one message must never stop the service
            self.library_faults += 1
            log.warning("py-libp2p failed on a message from %s (dropped): %r", msg_forwarder, exc)
            self._count_invalid(msg_forwarder, msg)

    async def _handle_new_peer(self, peer_id: ID) -> None:
        # Gossip never rides a helper's relay: a circuit is made for one fetch, and announcements
        # copied over it would cross the helper twice (and keep the circuit busy).
        if relayed_only(self.host, peer_id):
            return
        await super()._handle_new_peer(peer_id)

    async def stream_handler(self, stream) -> None:
        if relayed_only(self.host, stream.muxed_conn.peer_id):
            await reset_quietly(stream)
            return
        try:
            await super().stream_handler(stream)
        except Exception as exc:  # noqa: BLE001 — e.g. the router choking on a control message
            self.library_faults += 1
            peer_id = stream.muxed_conn.peer_id
            log.warning("py-libp2p failed reading pubsub from %s (stream dropped): %r", peer_id, exc)
            try:
                await stream.reset()
            except Exception:  # noqa: BLE001 — already gone
                pass
            self._handle_dead_peer(peer_id)

    def _count_invalid(self, forwarder: ID, msg) -> None:
        scorer = getattr(self.router, "scorer", None)
        if scorer is None:
            return
        for topic in msg.topicIDs:
            try:
                scorer.on_invalid_message(forwarder, topic)
            except Exception:  # noqa: BLE001 — scoring is best effort
                pass
