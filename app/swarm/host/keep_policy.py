"""Which peers the host holds on to, one named rule per meaning:

- `valued`: a peer we dial (bootstrap, static, remembered) or one with a proven record. It is
  pruned from the gossip mesh last (mesh.py) and keeps a connection a fetch opened past its idle
  grace (bundle_protocol.py). Being in our mesh is not enough: a fetch's connection joins the
  mesh by itself, so that would keep every connection fetches ever made.
- `never_dropped`: what the connection keeper (admission.py) never disconnects: valued peers, a
  helper's nodes that hold a relay slot while they gossip (a slot alone protects nothing:
  identities are free), and peers reached only through a helper's relay (made for fetches, which
  close them once idle; they never join gossip, so the keeper must not call them silent).
- `reason`: the first reason a connection is held, for the figures."""

from __future__ import annotations

from collections.abc import Callable

from libp2p.peer.id import ID

from ..nat.relay import relayed_only
from .dialer import Dialer

# The host's parts of its current life, any of them None while it is down: (host, pubsub, relay).
HostParts = Callable[[], tuple[object, object, object]]


class KeepPolicy:
    def __init__(self, dialer: Dialer, proven: Callable[[str], bool], parts: HostParts) -> None:
        self._dialer, self._proven, self._parts = dialer, proven, parts

    def valued(self, peer: str) -> bool:
        return self._dialer.is_target(peer) or self._proven(peer)

    def never_dropped(self, peer: str) -> bool:
        return self.valued(peer) or self.holds_slot(peer) or self.relayed_only(peer)

    def holds_slot(self, peer: str) -> bool:
        _host, pubsub, relay = self._parts()
        if relay is None or not relay.holds_slot(peer):
            return False
        topics = getattr(pubsub, "peer_topics", {})
        return any(ID.from_base58(peer) in peers for peers in list(topics.values()))

    def relayed_only(self, peer: str) -> bool:
        host = self._parts()[0]
        return host is not None and relayed_only(host, ID.from_base58(peer))

    def reason(self, peer: str, bundles) -> str:
        """"dialled" (a target the user named, or remembered), "relay slot" (a helper's node),
        "proven" (a positive record), "fetch" (made for a fetch, closed once idle), "relayed" (a
        circuit through a helper), "gossip" (any other: kept while it gossips)."""
        if self._dialer.is_target(peer):
            return "dialled"
        if self.holds_slot(peer):
            return "relay slot"
        if self._proven(peer):
            return "proven"
        if bundles is not None and bundles.fetching_over(peer):
            return "fetch"
        if self.relayed_only(peer):
            return "relayed"
        return "gossip"
