"""A swarm lab: network-only nodes on 127.0.0.1, for `swarmling bench-swarm` (swarm_bench.py) and
`swarmling soak` (soak.py).

Network-only nodes: the real `SwarmNetwork` (real py-libp2p hosts on 127.0.0.1, real GossipSub,
the announcement board and its topic validator, the bundle protocol, the fetch budget and
reputation, sharded announcement topics), fed synthetic bundles built with wire.py (real task
specs from the starter preset, made-up replies of a realistic size) instead of a model's. Several
nodes share a process (each host has its own trio thread; HOSTS_PER_PROCESS per process, so the
GIL and memory are shared by few). Each node dials `dial` random others (a random overlay of mean
degree ≈ 2 × dial, like nodes that met through helpers and remembered peers). In each round every
node, at a random moment in the first half of the round, plans its fetches from what it heard
(board.choose, within swarm.inbound_kib_per_round, ≤ 8 bundles) and announces its own bundle;
fetched bundles count as verified (so their authors become proven, as honest peers do). Nodes start
at the shard level their estimate settles on (`--cold`: at level 0, as a fresh swarm does; the level
then needs CONFIRM_ROUNDS + TRANSITION_ROUNDS rounds, tests/test_swarm_bench.py covers that path);
warm-up rounds (fetches ramp up while authors become proven) are not measured. Per node and round:
wire bytes in (after Noise and yamux), of which bundle payload, announcements accepted, bundles
fetched, the shard count in use, and (PubsubTally) where the pubsub bytes go.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import random
import socket
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from statistics import fmean


SWARM = "bench"
MODEL = "synthetic"
HOSTS_PER_PROCESS = 8
SETTLE_S = 6.0  # after every host started: connections and gossip meshes form
WORDS = ("the", "sum", "of", "and", "is", "so", "we", "add", "first", "then", "carry", "digit", "answer", "step",
         "count", "letters", "in", "word", "legs", "each", "animal", "total", "days", "after", "base", "convert")


@dataclass(frozen=True)
class BenchOptions:
    counts: tuple[int, ...]
    rounds: int = 3  # measured rounds, after the warm-up
    warmup: int = 3  # fetches ramp up as authors become proven (3 newcomer bundles a round at first)
    round_s: float = 0.0  # 0: max(15, 0.9 s per node) — py-libp2p is CPU-bound: starved nodes fail fetches
    dial: int = 4
    groups: int = 8
    completions: int = 8
    chars: int = 400
    budget_kib: int = 256
    seed: int = 0
    directory: Path | None = None
    per_process: int = HOSTS_PER_PROCESS
    cold: bool = False  # start every node at level 0 instead of where its estimate settles
    start_level: int = 0  # set per swarm size by run_swarm


@dataclass
class SwarmResult:
    nodes: int
    samples: list[dict] = field(default_factory=list)  # one per node and measured round
    shards_at_end: list[int] = field(default_factory=list)
    pubsub: list[dict] = field(default_factory=list)  # per measured round: PubsubTally's parts per node

    def column(self, key: str) -> list[float]:
        return [float(s[key]) for s in self.samples]


# ---- the synthetic bundle ------------------------------------------------------------------------
def synthetic_bundle(peer_id: str, round_no: int, opts: BenchOptions, rng: random.Random):
    from ..swarm.verification.wire import PROTOCOL_VERSION, Bundle, WireCompletion, WireGroup, WireSpec
    from ..learning.tasks import load_preset

    preset = load_preset("starter")
    groups = []
    for g in range(opts.groups):
        dataset = preset.datasets[(round_no + g) % len(preset.datasets)]
        spec = preset.spec(dataset, rng.randrange(3), rng.randrange(2**31), rng.randrange(1_000_000))
        completions = []
        for _ in range(opts.completions):
            words, size = [], 0
            while size < opts.chars:
                word = rng.choice(WORDS) if rng.random() < 0.8 else str(rng.randrange(10_000))
                words.append(word)
                size += len(word) + 1
            text = "<think>" + " ".join(words)[: opts.chars] + f"</think><answer>{rng.randrange(1000)}</answer>"
            completions.append(WireCompletion(text, len(words), -rng.uniform(1, 60)))
        question_hash = hashlib.md5(f"{spec}".encode()).hexdigest()
        groups.append(WireGroup(WireSpec(spec.preset, spec.dataset, spec.config, spec.seed, spec.index),
                                question_hash, completions))
    return Bundle(PROTOCOL_VERSION, SWARM, peer_id, MODEL, round_no, time.time(), groups)


class _CountingInbox:
    """Takes fetched bundles in place of the node's inbox: they count as verified."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._got: list[str] = []

    def offer(self, peer: str, data: bytes) -> bool:
        with self._lock:
            self._got.append(peer)
        return True

    def take(self) -> list[str]:
        with self._lock:
            got, self._got = self._got, []
        return got


# ---- a worker process: some of the nodes ------------------------------------------------------------
Spec = tuple[int, str, int, tuple[str, ...]]  # node index, home folder, port, addresses it dials


def make_nodes(specs: list[Spec], opts: BenchOptions) -> list[dict]:
    """Network-only nodes (not started): a real SwarmNetwork each, and what the bench keeps of it."""
    import numpy as np

    from ..swarm.p2p.identity import load_or_create
    from ..swarm.network import SwarmNetwork, SwarmSettings
    from ..swarm.verification.shards import ShardLevel

    nodes = []
    for index, home, port, dial in specs:
        inbox = _CountingInbox()
        net = SwarmNetwork(SwarmSettings(SWARM, "127.0.0.1", port, (), dial, False, opts.budget_kib * 1024),
                           load_or_create(Path(home)), inbox, Path(home), MODEL)  # type: ignore[arg-type]
        if opts.start_level:  # where a cold start settles after CONFIRM_ROUNDS + TRANSITION_ROUNDS rounds
            net.shard_level = ShardLevel(net.peer_id, opts.start_level)
            net.host.shards.set_level(opts.start_level)
        nodes.append({"index": index, "net": net, "inbox": inbox, "rng": np.random.default_rng(opts.seed * 1000 + index),
                      "pyrng": random.Random(opts.seed * 1000 + index), "announcements": 0, "fetched": 0})
    return nodes


class PubsubTally:
    """Where received pubsub bytes go (this process's hosts together): announcement data, message
    envelopes (topics, signature, key), the signed peer record py-libp2p puts on every RPC, control
    (IHAVE/IWANT/GRAFT/PRUNE/IDONTWANT), subscriptions. Installed by wrapping the frame reader."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.parts: dict[str, int] = {}

    def install(self) -> None:
        import libp2p.pubsub.pubsub as pubsub_module
        from libp2p.pubsub.pb import rpc_pb2

        read = pubsub_module.read_varint_prefixed_bytes_limited

        async def counted(stream, limit):
            data = await read(stream, limit)
            rpc = rpc_pb2.RPC()
            try:
                rpc.ParseFromString(data)
            except Exception:  # noqa: BLE001 — the library refuses it next
                return data
            parts = {"rpc": len(data), "peer record": len(rpc.senderRecord),
                     "data": sum(len(m.data) for m in rpc.publish),
                     "envelope": sum(m.ByteSize() - len(m.data) for m in rpc.publish),
                     "subscriptions": sum(x.ByteSize() for x in rpc.subscriptions),
                     "control": rpc.control.ByteSize() if rpc.HasField("control") else 0,
                     "messages": len(rpc.publish)}
            with self._lock:
                for key, value in parts.items():
                    self.parts[key] = self.parts.get(key, 0) + value
            return data

        pubsub_module.read_varint_prefixed_bytes_limited = counted

    def take(self) -> dict[str, int]:
        with self._lock:
            parts, self.parts = self.parts, {}
        return parts


def _worker(conn, specs: list[Spec], opts: BenchOptions) -> None:
    import logging

    logging.getLogger("libp2p").setLevel(logging.CRITICAL)
    logging.getLogger("swarmling").setLevel(logging.ERROR)
    tally = PubsubTally()
    tally.install()
    nodes = make_nodes(specs, opts)
    try:
        for node in nodes:
            node["net"].start()
        conn.send(("ready", [n["net"].peer_id for n in nodes]))
        while True:
            msg = conn.recv()
            if msg[0] == "round":
                play_round(nodes, msg[1], opts)
                conn.send(("done",))
            elif msg[0] == "stats":
                conn.send(("stats", [node_stats(node) for node in nodes], tally.take()))
            else:
                break
    finally:
        for node in nodes:
            node["net"].stop()
        conn.send(("stopped",))


def play_round(nodes: list[dict], round_no: int, opts: BenchOptions) -> None:
    start = time.monotonic()
    offsets = sorted((n["pyrng"].uniform(0, 0.5 * opts.round_s), n["index"], n) for n in nodes)
    for offset, _, node in offsets:
        wait = start + offset - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        net = node["net"]
        net.plan_fetches(node["rng"])
        bundle = synthetic_bundle(net.peer_id, round_no, opts, node["pyrng"])
        net.share_bundle(bundle, [node["pyrng"].random() for _ in bundle.groups])


def node_stats(node: dict) -> dict:
    net = node["net"]
    fetched_from = node["inbox"].take()
    counts: dict[str, int] = {}
    for peer in fetched_from:
        counts[peer] = counts.get(peer, 0) + 1
    net.record_intake(counts, [])  # what an honest peer's bundle earns: its groups verified
    stats = net.round_stats()
    since, node["since"] = node.get("since", 0.0), time.time()
    out = {
        "node": node["index"],
        "bytes_in": stats.bytes_in,
        "bytes_out": stats.bytes_out,
        "bundle_bytes_in": stats.bundle_bytes_in,
        "announcements": stats.announcements_in - node["announcements"],
        "fetches": stats.bundles_fetched - node["fetched"],
        "peers": stats.peers,
        "shards": stats.shards,
        "topics": sorted(net.host.shards.take_topics()),
        "heard_from": sorted({h.origin for h in net.board.fresh() if h.received >= since}),
        "estimate": net.shard_level.estimate,
        "fetch_failures": stats.fetch_failures[:3],
        "fetches_pending": stats.fetches_pending,
    }
    node["announcements"], node["fetched"] = stats.announcements_in, stats.bundles_fetched
    return out


# ---- the driver ------------------------------------------------------------------------------------
def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def node_specs(n: int, opts: BenchOptions, directory: Path) -> list[Spec]:
    """Identities, free ports and a random overlay: each node dials `opts.dial` random others."""
    from ..swarm.p2p.identity import new_identity

    rng = random.Random(opts.seed + n)
    homes = [directory / f"node-{i}" for i in range(n)]
    ids = [new_identity(home).peer_id for home in homes]
    ports = _free_ports(n)
    addrs = [f"/ip4/127.0.0.1/tcp/{port}/p2p/{pid}" for port, pid in zip(ports, ids)]
    specs = []
    for i in range(n):
        others = [j for j in range(n) if j != i]
        dial = tuple(addrs[j] for j in rng.sample(others, min(opts.dial, len(others))))
        specs.append((i, str(homes[i]), ports[i], dial))
    return specs


def round_seconds(n: int, opts: BenchOptions) -> float:
    return opts.round_s or max(15.0, 0.9 * n)


def run_swarm(n: int, opts: BenchOptions, directory: Path, say=print) -> SwarmResult:
    """N network-only nodes on 127.0.0.1 for warm-up + measured rounds; per-node samples."""
    from ..swarm.verification.shards import landing_level

    opts = replace(opts, round_s=round_seconds(n, opts), start_level=0 if opts.cold else landing_level(n))
    specs = node_specs(n, opts, directory)
    ctx = multiprocessing.get_context("spawn")
    chunks = [specs[k:k + opts.per_process] for k in range(0, n, opts.per_process)]
    workers = []
    for chunk in chunks:
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(child, chunk, opts), daemon=True)
        proc.start()
        workers.append((proc, parent))
    result = SwarmResult(n)
    try:
        for proc, conn in workers:
            if not conn.poll(120):
                raise RuntimeError("a bench worker did not start within 120 s")
            conn.recv()
        time.sleep(SETTLE_S)
        total = opts.warmup + opts.rounds
        for r in range(1, total + 1):
            started = time.monotonic()
            for _, conn in workers:
                conn.send(("round", r))
            for _, conn in workers:
                conn.recv()
            time.sleep(max(0.0, opts.round_s - (time.monotonic() - started)))
            samples, parts = [], {}
            for _, conn in workers:
                conn.send(("stats",))
            for _, conn in workers:
                _, got, tally = conn.recv()
                samples.extend(got)
                for key, value in tally.items():
                    parts[key] = parts.get(key, 0) + value
            heard = [s["announcements"] for s in samples]
            say(f"  {n} nodes, round {r}/{total}{' (warm-up)' if r <= opts.warmup else ''}: "
                f"{fmean(s['bytes_in'] for s in samples) / 1024:.0f} KiB in per node, "
                f"heard {fmean(heard):.1f} (min {min(heard)}), shards {sorted({s['shards'] for s in samples})}")
            if r > opts.warmup:
                result.samples.extend({**s, "round": r} for s in samples)
                result.pubsub.append({key: value / n for key, value in parts.items()})  # per node
            result.shards_at_end = [s["shards"] for s in samples]
    finally:
        for _, conn in workers:
            try:
                conn.send(("stop",))
            except (BrokenPipeError, OSError):
                pass
        for proc, conn in workers:
            if conn.poll(30):
                try:
                    conn.recv()
                except EOFError:
                    pass
            proc.join(10)
            if proc.is_alive():
                proc.kill()
    return result
