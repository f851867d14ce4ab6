"""Peers for swarm tests on 127.0.0.1: honest nodes (the real `SwarmNetwork`) and a `Hostile`
host that publishes, serves and sends raw bytes however the test makes it."""

from __future__ import annotations

import dataclasses
import struct
import time
from types import SimpleNamespace

import trio
from libp2p.peer.id import ID
from libp2p.utils.varint import encode_varint_prefixed

from swarmling.app.swarm.host.host import GOSSIPSUB_PROTOCOL, HostSettings, SwarmHost
from swarmling.app.swarm.network import SwarmNetwork, SwarmSettings
from swarmling.app.swarm.p2p.identity import load_or_create, new_identity
from swarmling.app.swarm.p2p.streams import reset_quietly
from swarmling.app.swarm.verification.inbox import Inbox
from swarmling.app.swarm.verification.pool import GroupPool
from swarmling.app.swarm.verification.wire import (
    PROTOCOL_VERSION,
    AnnouncedGroup,
    Announcement,
    Bundle,
    WireCompletion,
    WireGroup,
    WireSpec,
    digest,
    encode_announcement,
    encode_bundle,
)
from swarmling.app.config import Config
from swarmling.app.learning.tasks import load_preset, regenerate

SWARM = "test"


def honest(tmp_path, name: str, dial: tuple[str, ...] = (), *, port: int = 0, **host_settings) -> SwarmNetwork:
    """A node named `name` (the same identity each time the test starts it), started."""
    identity = load_or_create(tmp_path / name)
    swarm = SwarmNetwork(
        SwarmSettings(SWARM, "127.0.0.1", port, dial, (), False, 256 * 1024),
        identity, Inbox(GroupPool()), tmp_path / name, "smollm2-135m",
    )
    if host_settings:  # before start: the host reads its settings when it starts
        swarm.host.settings = dataclasses.replace(swarm.host.settings, **host_settings)
    swarm.start()
    return swarm


def on_network_thread(host: SwarmHost, read):
    """Run `read()` on the host's trio thread: py-libp2p's state belongs to it."""
    return trio.from_thread.run_sync(read, trio_token=host._trio._token)


def run_on_network_thread(host: SwarmHost, afn, *args):
    """Await `afn(*args)` on the host's trio thread."""
    return trio.from_thread.run(afn, *args, trio_token=host._trio._token)


def connected_now(host: SwarmHost, peer: str) -> bool:
    """py-libp2p holds a connection between `host` and `peer` this moment (`connected_peers()` is
    the dialer's view, refreshed once a second)."""
    return on_network_thread(host, lambda: ID.from_base58(peer) in host._host.get_connected_peers())


def identified(host: SwarmHost, peer: str) -> bool:
    """identify has told `host` about `peer` (its protocols are in the peerstore, stored right after
    its addresses)."""

    def known() -> bool:
        try:
            return bool(host._host.get_peerstore().get_protocols(ID.from_base58(peer)))
        except Exception:  # noqa: BLE001 — not in the peerstore yet
            return False

    return on_network_thread(host, known)


def meshed(sender: SwarmHost, receiver: str) -> bool:
    """`receiver` is in `sender`'s gossip mesh: what `sender` publishes or relays now reaches it."""
    router = sender._pubsub.router
    return on_network_thread(sender, lambda: ID.from_base58(receiver) in router.mesh.get(sender.settings.topic, ()))


def ignores(node: SwarmHost, forwarder: str) -> bool:
    """`node` drops what `forwarder` sends before validating it: its score is under the publish threshold."""
    scorer = node._pubsub.router.scorer
    return on_network_thread(node, lambda: not scorer.allow_publish(ID.from_base58(forwarder), [node.settings.topic]))


class Hostile(SwarmHost):
    """A peer that publishes anything and serves whatever `bodies` holds (or misbehaves)."""

    def __init__(self, tmp_path, dial: tuple[str, ...] = (), *, misbehave: str | None = None, name: str = "hostile"):
        identity = new_identity(tmp_path / name)
        self.bodies: dict[str, bytes] = {}
        self.misbehave = misbehave
        self.asked = 0  # bundle requests that reached it
        super().__init__(
            HostSettings(SWARM, PROTOCOL_VERSION, "127.0.0.1", 0, dial, publish_interval_s=0.0),
            identity.key_pair,
            gossip_validator=lambda origin, data: True,
            serve_bundle=self.bodies.get,
            on_fetched=lambda *a: None,
        )

    async def _serve_stream(self, stream) -> None:
        self.asked += 1
        if self.misbehave is None:
            return await super()._serve_stream(stream)
        if self.misbehave == "never answers":
            await trio.sleep(3600)
        body = self.bodies.get((await stream.read(65)).strip().decode(), b"")
        if self.misbehave == "lies about the size":
            await stream.write(struct.pack(">I", 100_000) + body)
        elif self.misbehave == "trickles":  # the right header, then a byte every 2 s
            await stream.write(struct.pack(">I", len(body)))
            for byte in body:
                await stream.write(bytes([byte]))
                await trio.sleep(2.0)
        else:  # "disconnects mid-transfer": the right header, a third of the body, then a reset
            await stream.write(struct.pack(">I", len(body)) + body[: len(body) // 3])
        await stream.reset()

    def offer(self, groups: list[WireGroup]) -> str:
        """Announce a bundle of `groups` and serve it (or misbehave when asked for it); its digest."""
        body, ann = bundle_and_announcement(self.peer_id, groups, addrs=self.listen_addrs)
        self.bodies[digest(body)] = body
        self.publish(ann)
        return digest(body)

    # ---- raw bytes on the victim's protocols ----------------------------------------------------
    def send_raw(self, peer: str, protocol: str, data: bytes, *, read_s: float = 0.0) -> bytes:
        """Open a stream to `peer` on `protocol`, write `data`, read for up to `read_s`; what came back."""

        async def go() -> bytes:
            stream = await self._host.new_stream(ID.from_base58(peer), [protocol])
            got = b""
            try:
                if data:
                    await stream.write(data)
                with trio.move_on_after(read_s):
                    while read_s and len(got) < 1 << 20:
                        chunk = await stream.read(65536)
                        if not chunk:
                            break
                        got += chunk
            except Exception:  # noqa: BLE001 — the victim hanging up is an answer too
                pass
            finally:
                await reset_quietly(stream)
            return got

        return run_on_network_thread(self, go)

    def send_rpc(self, peer: str, rpc: bytes) -> None:
        """One gossipsub RPC frame (varint length + protobuf), as a peer's router would send it."""
        self.send_raw(peer, GOSSIPSUB_PROTOCOL, encode_varint_prefixed(rpc), read_s=0.5)  # a reset may overtake it


def real_groups(n: int = 2, completions=("<answer>4</answer>", "<answer>5</answer>")) -> list[WireGroup]:
    preset = load_preset(Config().round.preset)  # what a node of this release trains on
    groups = []
    for i in range(n):
        spec = preset.spec(preset.datasets[0], 0, 7, i)
        task = regenerate(spec)
        wire_spec = WireSpec(spec.preset, spec.dataset, spec.config, spec.seed, spec.index)
        groups.append(WireGroup(wire_spec, task.question_hash, [WireCompletion(t, 3, -2.0) for t in completions]))
    return groups


def bundle_and_announcement(peer: str, groups: list[WireGroup], round_no: int = 1, addrs=()) -> tuple[bytes, bytes]:
    bundle = Bundle(PROTOCOL_VERSION, SWARM, peer, "smollm2-135m", round_no, time.time(), groups)
    body = encode_bundle(bundle)
    ann = Announcement(PROTOCOL_VERSION, SWARM, peer, "smollm2-135m", round_no, time.time(), digest(body), len(body),
                       list(addrs), [AnnouncedGroup(g.spec, 0.5) for g in groups])
    return body, encode_announcement(ann)


def connected_pair(tmp_path, **hostile):
    """An honest node B and a hostile peer H dialling it, meshed; the caller stops both."""
    from waiting import wait_until

    b = honest(tmp_path, "b")
    h = Hostile(tmp_path, dial=(b.listen_addrs[0],), **hostile)
    h.start()
    assert wait_until(lambda: b.host.connected_peers() and h.connected_peers())
    assert wait_until(lambda: meshed(h, b.peer_id))  # a heartbeat or two: the gossip mesh forms
    return b, h


def hold_idle_streams(host: SwarmHost, peer: str, protocol: str, n: int, hold_s: float) -> SimpleNamespace:
    """Open `n` streams to `peer` that never send a byte, held `hold_s` (in the background); its
    `tried` counts the streams asked for so far (opened, or refused by the victim)."""
    held = SimpleNamespace(tried=0)

    async def hold() -> None:
        streams = []
        try:
            with trio.move_on_after(hold_s):
                for _ in range(n):
                    try:
                        streams.append(await host._host.new_stream(ID.from_base58(peer), [protocol]))
                    except Exception:  # noqa: BLE001 — refused by the victim: fine
                        pass
                    held.tried += 1
                await trio.sleep(hold_s)
        finally:
            for stream in streams:
                await reset_quietly(stream)

    on_network_thread(host, lambda: trio.lowlevel.spawn_system_task(hold))
    return held


class SilentCrowd:
    """`n` bare libp2p hosts (fresh identities, no pubsub) that connect to a node and say nothing."""

    def __init__(self, n: int) -> None:
        from swarmling.app.swarm.p2p.trio_bridge import TrioThread

        self.n = n
        self.connected = 0
        self._thread = TrioThread("silent-crowd", self._main)

    def start(self, target: str) -> None:
        self._target = target
        assert self._thread.start(30)

    def stop(self) -> None:
        self._thread.stop(20)

    async def _main(self) -> None:
        import multiaddr
        from libp2p import new_host
        from libp2p.crypto.ed25519 import create_new_key_pair
        from libp2p.crypto.x25519 import create_new_key_pair as x25519
        from libp2p.security.noise.transport import PROTOCOL_ID, Transport

        from swarmling.app.swarm.host.dialer import parse_peer_addr

        info = parse_peer_addr(self._target)
        self._thread.ready()
        async with trio.open_nursery() as nursery:
            for _ in range(self.n):
                nursery.start_soon(self._one, new_host, create_new_key_pair, x25519, PROTOCOL_ID, Transport,
                                   multiaddr, info)
            await self._thread.until_stopped()
            nursery.cancel_scope.cancel()

    async def _one(self, new_host, keys, x25519, protocol_id, transport, multiaddr, info) -> None:
        key_pair = keys()
        host = new_host(key_pair=key_pair, sec_opt={protocol_id: transport(key_pair, noise_privkey=x25519().private_key)})
        async with host.run(listen_addrs=[multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
            try:
                with trio.move_on_after(10):
                    await host.connect(info)
                    self.connected += 1
            except Exception:  # noqa: BLE001 — refused: the victim is full, as the attack wants
                pass
            await trio.sleep_forever()


def churn_connections(target: str, n: int) -> int:
    """`n` fresh identities, one after another, each connecting to `target` and hanging up
    properly; how many got in. Runs its own trio loop on the calling thread."""
    import multiaddr
    from libp2p import new_host
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.crypto.x25519 import create_new_key_pair as x25519
    from libp2p.security.noise.transport import PROTOCOL_ID, Transport

    from swarmling.app.swarm.host.dialer import parse_peer_addr

    info = parse_peer_addr(target)

    async def main() -> int:
        got_in = 0
        for _ in range(n):
            key_pair = create_new_key_pair()
            host = new_host(key_pair=key_pair, sec_opt={PROTOCOL_ID: Transport(key_pair, noise_privkey=x25519().private_key)})
            async with host.run(listen_addrs=[multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
                with trio.move_on_after(5):
                    try:
                        await host.connect(info)
                        got_in += 1
                        await host.disconnect(info.peer_id)
                    except Exception:  # noqa: BLE001 — refused: what the test looks for
                        pass
        return got_in

    return trio.run(main)


def forwarding_flood(tmp_path, identities: int, each: int, forward_kib_s: float, settle_s: float = 4.0) -> dict:
    """An honest node B in a crowd of `identities` hostile peers, each in B's gossip mesh, that
    publish `each` announcements as fast as they can. What B uploads while it passes them on,
    with its forwarding budget at `forward_kib_s` (host/forwarding.py). Returns B's figures."""
    from waiting import wait_until

    b = honest(tmp_path, "b")
    b.host.forwarding.kib_s = forward_kib_s  # as a round sets it from resources.bandwidth_kib_s
    crowd = [Hostile(tmp_path, dial=(b.listen_addrs[0],), name=f"flood-{i}") for i in range(identities)]
    try:
        for h in crowd:
            h.start()
        assert wait_until(lambda: len(b.host.connected_peers()) == identities, timeout_s=60)
        assert wait_until(lambda: b.host.gossip_figures().mesh_peers >= min(identities, 6), timeout_s=30)
        time.sleep(settle_s)  # joins, subscriptions and grafts settle before the measured window
        _, out_before = b.host.counters.snapshot()
        received_before, started = b.board.received, time.monotonic()
        for r in range(each):
            for h in crowd:
                h.publish(bundle_and_announcement(h.peer_id, real_groups(8), round_no=r + 1)[1])
        offered = identities * each
        wait_until(lambda: b.board.received + sum(b.board.refused.values()) >= offered, timeout_s=60)
        time.sleep(2.0)  # what B forwards, it forwards at once: let the last copies leave
        _, out_after = b.host.counters.snapshot()
        seconds = time.monotonic() - started
        return {"offered": offered, "accepted": b.board.received - received_before,
                "upload_kib": (out_after - out_before) / 1024, "seconds": seconds,
                "withheld": b.host.forwarding.withheld, "forwarded_kib": b.host.forwarding.spent_bytes / 1024,
                "mesh_peers": b.host.gossip_figures().mesh_peers}
    finally:
        for h in crowd:
            h.stop()
        b.stop()
