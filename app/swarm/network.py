"""The swarm's network side: share this round's groups, fetch what the sampler wants, count.

Flow per round (all calls return at once; the network works in its own thread):
1. `plan_fetches()` at the start of a round picks announced bundles within the inbound budget
   and asks the host to fetch them while the node generates;
2. `share()` after scoring keeps the encoded bundle for peers to fetch and gossips a small
   announcement of it;
3. fetched bundles are checked against the announced digest and dropped into the inbox, which
   the round drains (decode, regenerate, re-score) when it builds its training set;
4. `record_intake()` / `penalize()` after the round: what each peer's groups were worth, the
   reputation (reputation.py) that orders whom the next rounds fetch from and keep connected;
5. `round_stats()` reports peers and bytes for the round's metrics record; `health()` whether
   the host runs and how often it had to be restarted.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ...backends.atomic import write_atomic

from ..events import PeerView
from ..learning.rollout import QuestionGroup
from ..learning.round_record import SwarmRoundStats
from .given import GivenLog
from .host.bundle_protocol import FetchOutcome
from .host.forwarding import split_cap
from .host.host import HostHealth, HostSettings, SwarmHost, parse_peer_addr
from .nat.reachability import Reachability
from .nat.relay import is_circuit
from .p2p.identity import Identity
from .verification.board import Board
from .verification.inbox import Inbox
from .verification.reputation import Reputation
from .verification.shards import ShardLevel, shard_mates_to_dial
from .verification.wire import (
    PROTOCOL_VERSION,
    Bundle,
    WireError,
    announce,
    bundle_from_groups,
    digest,
    encode_announcement,
    encode_bundle,
)

log = logging.getLogger("swarmling.swarm")

KNOWN_PEERS_FILE = "known_peers.json"
MAX_KNOWN_PEERS = 64
OWN_BUNDLES_KEPT = 4  # peers fetch a bundle within a round or two of its announcement
STRIKES_TO_IGNORE = 5  # refused groups before a peer's announcements are no longer fetched
STRIKE_SCORE = -5.0  # GossipSub application score per refused group: only verified faults cost gossip standing


@dataclass(frozen=True)
class SwarmSettings:
    name: str
    listen_host: str
    port: int
    bootstrap: tuple[str, ...]
    peers: tuple[str, ...]
    mdns: bool
    inbound_budget_bytes: int


class SwarmNetwork:
    def __init__(self, settings: SwarmSettings, identity: Identity, inbox: Inbox, data_dir: Path, model: str) -> None:
        self.settings = settings
        self.identity = identity
        self.peer_id = identity.peer_id
        self.inbox = inbox
        self.model = model
        self.known_peers_file = data_dir / KNOWN_PEERS_FILE
        self.board = Board(settings.name, self.peer_id)
        self._own: OrderedDict[str, bytes] = OrderedDict()  # digest -> body we serve
        self._own_lock = threading.Lock()
        self.reputation = Reputation()
        self.shard_level = ShardLevel(self.peer_id)  # which announcement topics: shards.py
        self._shard_rng = random.Random()
        self._fetch_failures: deque[str] = deque(maxlen=50)
        self._fetched = 0
        self.given = GivenLog()  # peers' fetches of our bundles (given.py)
        self._bundle_bytes_in = 0  # payload only: the part the inbound budget bounds
        self._pending_lock = threading.Lock()
        self._fetches_pending = 0  # asked of the host, outcome not back yet
        self._last_counters = (0, 0)
        for addr in (*settings.bootstrap, *settings.peers):
            parse_peer_addr(addr)  # a typo is the user's to fix now, not a silent dial failure later
        dial = tuple(dict.fromkeys((*settings.bootstrap, *settings.peers, *self._load_known())))
        self.host = SwarmHost(
            HostSettings(settings.name, PROTOCOL_VERSION, settings.listen_host, settings.port, dial,
                         named=len(set(settings.bootstrap) | set(settings.peers)), mdns=settings.mdns),
            identity.key_pair,
            gossip_validator=self.board.offer,
            serve_bundle=self._serve,
            on_fetched=self._on_fetched,
            on_served=self.given.served,
            on_thanked=self.given.thanked,
            app_score=self._gossip_score,
            keeps_peer=self.reputation.proven,
            peer_rank=lambda peer: (self.board.heard_from(peer), self.reputation.score(peer)),
        )

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self.host.start()

    def stop(self) -> None:
        """Stop the host; fetches still pending get their outcome (a failure: the node stopped)
        first, so a `round_stats()` after this counts them."""
        self._save_known()
        self.host.stop()

    def health(self) -> HostHealth:
        """Whether the swarm host runs now, its restarts so far, and the last failure's cause."""
        return self.host.health()

    @property
    def listen_addrs(self) -> list[str]:
        return list(self.host.listen_addrs)

    def announce_addrs(self) -> list[str]:
        """Where peers should dial us, best first (a confirmed public address, else relay slots)."""
        return self.host.announce_addrs()

    def reachability(self) -> Reachability:
        """Whether peers can dial us: directly, through a helper's relay, or not (reachability.py)."""
        return self.host.reachability()

    # ---- per round ---------------------------------------------------------------------------
    def plan_fetches(self, rng: np.random.Generator, budget_bytes: int | None = None) -> int:
        newest = self._newest_addrs()
        self._follow_shards(newest)
        budget = self.settings.inbound_budget_bytes if budget_bytes is None else min(budget_bytes, self.settings.inbound_budget_bytes)
        chosen = self.board.choose(budget, rng, avoid=self._not_now, score=self._delivered)
        for heard in chosen:
            ann = heard.announcement
            # An older announcement's addresses may be stale (made while its author's helper was
            # away: its LAN's only); its author's newest, signed like it, are tried first.
            addrs = tuple(dict.fromkeys([*newest.get(heard.origin, ()), *ann.addrs]))
            if self.host.fetch(heard.origin, ann.digest, ann.size, addrs):
                with self._pending_lock:
                    self._fetches_pending += 1
        return len(chosen)

    def _newest_addrs(self) -> dict[str, tuple[str, ...]]:
        """Each author heard lately (in the order first heard), with its addresses as its latest
        announcement (its highest round) gives them."""
        newest: dict[str, tuple[tuple[int, float], tuple[str, ...]]] = {}
        for h in self.board.fresh():
            order = (h.announcement.round, h.received)
            if h.origin not in newest or order > newest[h.origin][0]:
                newest[h.origin] = (order, tuple(h.announcement.addrs))
        return {origin: addrs for origin, (_, addrs) in newest.items()}

    def _follow_shards(self, addrs: dict[str, tuple[str, ...]]) -> None:
        """Once a round: the swarm's size as heard from our shard (`addrs`: each author heard
        lately, _newest_addrs) sets our announcement topics."""
        level = self.shard_level.update(set(addrs), self.host.shards.neighbour_levels())
        self.host.shards.set_level(level, self.shard_level.previous)
        order = list(addrs)
        self._shard_rng.shuffle(order)
        # an announcer behind NAT (it announces relay slots) cannot be dialled to hold a connection
        order = [origin for origin in order if not any(is_circuit(a) for a in addrs[origin])]
        for origin in shard_mates_to_dial(self.peer_id, level, self.host.connected_peers(), order):
            for addr in addrs[origin]:
                if addr.endswith(f"/p2p/{origin}") and not is_circuit(addr):
                    try:
                        self.host.meet(addr)
                        break
                    except ValueError:
                        continue

    def _not_now(self, peer: str) -> bool:
        """Not worth a fetch this round: refused too often, failing lately, or not dialable lately."""
        standing = self.reputation.standing(peer)
        return ((standing is not None and standing.refused >= STRIKES_TO_IGNORE)
                or self.reputation.cooling_down(peer) or self.host.cooldown.blocked(peer))

    def _delivered(self, peer: str) -> float | None:
        standing = self.reputation.standing(peer)
        return None if standing is None else standing.score

    def share(self, groups: Sequence[QuestionGroup], round_no: int, prefill: str) -> int:
        """Offer this round's groups to the swarm; returns the bundle's size (0 if nothing shared)."""
        if not groups:
            return 0
        bundle = bundle_from_groups(
            groups, swarm=self.settings.name, node_id=self.peer_id, model=self.model, round_no=round_no,
            timestamp=time.time(), prefill=prefill,
        )
        return self.share_bundle(bundle, [g.strict_mean for g in groups])

    def share_bundle(self, bundle: Bundle, rewards: Sequence[float]) -> int:
        """Keep an encoded bundle for peers to fetch and gossip its announcement (`swarmling
        bench-swarm` shares synthetic ones this way); the bundle's size, 0 if not shared."""
        try:
            body = encode_bundle(bundle)
            ann = encode_announcement(announce(bundle, body, self.announce_addrs(), rewards))
        except WireError as exc:
            log.warning("not sharing round %s: %s", bundle.round, exc)
            return 0
        with self._own_lock:
            self._own[digest(body)] = body
            while len(self._own) > OWN_BUNDLES_KEPT:
                self._own.popitem(last=False)
        self.host.publish(ann)
        return len(body)

    def penalize(self, peer: str, count: int = 1) -> None:
        """The peer sent groups that failed verification (or a bundle that did not match its digest)."""
        self.reputation.refused(peer, count)

    def record_intake(self, admitted_by_peer: dict[str, int], used: Sequence[QuestionGroup]) -> None:
        """A round's verified groups per peer and the ones its update trained on."""
        for peer, count in admitted_by_peer.items():
            self.reputation.admitted(peer, count)
        used_by_peer: dict[str, int] = {}
        for group in used:
            if group.source != "local":
                used_by_peer[group.source] = used_by_peer.get(group.source, 0) + 1
        for peer, count in used_by_peer.items():
            self.reputation.used(peer, count)
            self.host.thank(peer, count)  # the author sees its rollouts taught someone (host/thanks.py)

    def _gossip_score(self, peer: str) -> float:
        standing = self.reputation.standing(peer)
        return 0.0 if standing is None else STRIKE_SCORE * standing.refused

    def peer_views(self) -> tuple[PeerView, ...]:
        """Connected peers first, then the ones that sent groups, busiest first."""
        addrs = {a.rsplit("/p2p/", 1)[-1]: a for a in self.host.connected_addrs()}
        connected = set(self.host.connected_peers())
        ledger = self.reputation.snapshot()
        views = []
        for peer in connected | set(ledger):
            standing = ledger.get(peer)
            views.append(PeerView(
                peer_id=peer,
                address=addrs.get(peer, ""),
                connected=peer in connected,
                fetch_seconds=standing.fetch_seconds if standing else None,
                received=standing.admitted if standing else 0,
                used=standing.used if standing else 0,
                rejected=standing.refused if standing else 0,
                score=standing.score if standing else 0.0,
            ))
        views.sort(key=lambda v: (not v.connected, -v.received, v.peer_id))
        return tuple(views)

    def totals(self) -> tuple[int, int]:
        """Wire bytes in and out since the node started."""
        return self.host.counters.snapshot()

    def round_stats(self) -> SwarmRoundStats:
        self._save_known()  # each round, not only at a clean stop: a killed node rejoins too
        bytes_in, bytes_out = self.host.counters.snapshot()
        last_in, last_out = self._last_counters
        self._last_counters = (bytes_in, bytes_out)
        failures = list(self._fetch_failures)
        self._fetch_failures.clear()
        fetch_s = list(self.host.fetch_latency_s)
        announce_s = self.board.take_latencies()
        bundle_bytes, self._bundle_bytes_in = self._bundle_bytes_in, 0
        given = self.given.figures()
        return SwarmRoundStats(
            peers=len(self.host.connected_peers()),
            peers_heard=self.board.peers_heard(),
            bytes_in=bytes_in - last_in,
            bytes_out=bytes_out - last_out,
            announcements_in=self.board.received,
            announcements_refused=dict(self.board.refused),
            bundles_fetched=self._fetched,
            bundle_bytes_in=bundle_bytes,
            bundles_served=given.served,
            bundles_served_day=given.served_day,
            served_peers_day=given.peers_day,
            trained_on_day=given.trained_day,
            trained_by_peers_day=given.trained_peers_day,
            fetch_failures=failures[:5],
            fetch_seconds_p50=round(float(np.median(fetch_s)), 4) if fetch_s else None,
            announce_latency_s_p50=round(float(np.median(announce_s)), 4) if announce_s else None,
            fetches_pending=self._fetches_pending,
            host_restarts=self.host.health().restarts,
            reachability=self.host.reachability().state,
            **asdict(self.host.gossip_figures()),
            connections_held=self.host.connection_figures(),
            shards=self.shard_level.shards,
        )

    def cap_upload(self, kib_s: float | None) -> None:
        """Upload within `kib_s` (resources.bandwidth_kib_s; None: no cap): half for forwarding
        others' announcements (or the host's own budget, if lower), half for serving our bundles
        (host/forwarding.py)."""
        forwarding, serving = split_cap(kib_s, self.host.settings.forward_kib_s)
        if self.host.forwarding is not None:
            self.host.forwarding.kib_s = forwarding
        self.host.serving.kib_s = serving

    # ---- network-thread callbacks --------------------------------------------------------------
    def _serve(self, wanted: str) -> bytes | None:
        with self._own_lock:
            return self._own.get(wanted)

    def _on_fetched(self, peer: str, wanted: str, body: bytes | None, outcome: FetchOutcome, why: str,
                    seconds: float) -> None:
        with self._pending_lock:
            self._fetches_pending = max(0, self._fetches_pending - 1)
        if body is None:
            self._fetch_failures.append(f"{peer[:16]}: {why}")
            if outcome.blames_peer:
                self.reputation.fetch_failed(peer)
            return
        if digest(body) != wanted:
            self._fetch_failures.append(f"{peer[:16]}: bundle does not match its announced digest")
            self.penalize(peer)
            self.reputation.fetch_failed(peer)
            return
        self._fetched += 1
        self._bundle_bytes_in += len(body)
        self.reputation.fetch_succeeded(peer, seconds)
        self.inbox.offer(peer, body)

    # ---- known peers ---------------------------------------------------------------------------
    def _load_known(self) -> list[str]:
        try:
            data = json.loads(self.known_peers_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return []
        out = []
        for text in data.get("peers", [])[:MAX_KNOWN_PEERS] if isinstance(data, dict) else []:
            try:
                if isinstance(text, str) and parse_peer_addr(text).peer_id.to_base58() != self.peer_id:
                    out.append(text)
            except ValueError:
                continue
        return out

    def _save_known(self) -> None:
        """Peers we were connected to, so a restart rejoins without a bootstrap node."""
        addrs = self.host.connected_addrs()
        if not addrs:
            return
        known = self._load_known()
        merged = list(dict.fromkeys([*addrs, *known]))[:MAX_KNOWN_PEERS]
        if merged == known:
            return  # nothing new: no write
        try:
            write_atomic(self.known_peers_file, json.dumps({"peers": merged}, indent=1), fsync=False)
        except OSError as exc:
            log.info("could not remember peers: %s", exc)
