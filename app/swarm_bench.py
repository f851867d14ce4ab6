"""`swarmling bench-swarm`: what one node's network pays per round as the swarm grows, with no model.

Network-only nodes: the real `SwarmNetwork` (real py-libp2p hosts on 127.0.0.1, real GossipSub,
the announcement board and its topic validator, the bundle protocol, the fetch budget and
reputation, sharded announcement topics), fed synthetic bundles built with wire.py (real task
specs from the starter preset, made-up replies of a realistic size) instead of a model's. Several
nodes share a process (each host has its own trio thread; HOSTS_PER_PROCESS per process, so the
GIL and memory are shared by few). Each node dials `dial` random others (a random overlay of mean
degree ≈ 2 × dial, like nodes that met through helpers and remembered peers). In each round every
node, at a random moment in the first half of the round, plans its fetches from what it heard
(board.choose, within swarm.inbound_kib_per_round, ≤ 8 bundles) and announces its own bundle;
fetched bundles count as verified (so their authors become proven, as honest peers do). Warm-up
rounds (the shard level needs CONFIRM_ROUNDS + TRANSITION_ROUNDS rounds to settle) are not
measured. Per node and round: wire bytes in (after Noise and yamux), of which bundle payload,
announcements accepted, bundles fetched, the shard count in use.

Measured here (2 shared vCPUs, 8 groups × 8 replies of 400 characters a bundle ≈ 8 KiB
compressed, announcements ≈ 1.3 KiB, 3 measured rounds of 12 s): see README's swarm section for
the table. The model behind the extrapolation: per round a node receives its fetched bundles
(bounded by the budget: ≤ 8 bundles, ≤ 256 KiB) plus, for each announcer of its shard, the
announcement about once per mesh peer that forwards it (GossipSub degree 6) and the IHAVE/IWANT
gossip about it; the shard count keeps announcers per shard between MERGE_BELOW and SPLIT_ABOVE
(12..32; a change lands at ≤ 24), so the gossip part is bounded whatever the swarm's size. The
table's last line projects the measured per-announcement cost to 10,000 nodes.
"""

from __future__ import annotations

import hashlib
import json
import math
import multiprocessing
import random
import socket
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from statistics import fmean

SWARM = "bench"
MODEL = "synthetic"
HOSTS_PER_PROCESS = 16
SETTLE_S = 6.0  # after every host started: connections and gossip meshes form
WORDS = ("the", "sum", "of", "and", "is", "so", "we", "add", "first", "then", "carry", "digit", "answer", "step",
         "count", "letters", "in", "word", "legs", "each", "animal", "total", "days", "after", "base", "convert")


@dataclass(frozen=True)
class BenchOptions:
    counts: tuple[int, ...]
    rounds: int = 3  # measured rounds, after the warm-up
    warmup: int = 7
    round_s: float = 0.0  # 0: max(15, 0.75 s per node) — py-libp2p is CPU-bound: starved nodes fail fetches
    dial: int = 4
    groups: int = 8
    completions: int = 8
    chars: int = 400
    budget_kib: int = 256
    seed: int = 0
    directory: Path | None = None
    per_process: int = HOSTS_PER_PROCESS


@dataclass
class SwarmResult:
    nodes: int
    samples: list[dict] = field(default_factory=list)  # one per node and measured round
    shards_at_end: list[int] = field(default_factory=list)

    def column(self, key: str) -> list[float]:
        return [float(s[key]) for s in self.samples]


# ---- the synthetic bundle ------------------------------------------------------------------------
def synthetic_bundle(peer_id: str, round_no: int, opts: BenchOptions, rng: random.Random):
    from .swarm.wire import PROTOCOL_VERSION, Bundle, WireCompletion, WireGroup, WireSpec
    from .tasks import load_preset

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

    from .swarm.identity import load_or_create
    from .swarm.network import SwarmNetwork, SwarmSettings

    nodes = []
    for index, home, port, dial in specs:
        inbox = _CountingInbox()
        net = SwarmNetwork(SwarmSettings(SWARM, "127.0.0.1", port, (), dial, False, opts.budget_kib * 1024),
                           load_or_create(Path(home)), inbox, Path(home), MODEL)  # type: ignore[arg-type]
        nodes.append({"index": index, "net": net, "inbox": inbox, "rng": np.random.default_rng(opts.seed * 1000 + index),
                      "pyrng": random.Random(opts.seed * 1000 + index), "announcements": 0, "fetched": 0})
    return nodes


def _worker(conn, specs: list[Spec], opts: BenchOptions) -> None:
    import logging

    logging.getLogger("libp2p").setLevel(logging.CRITICAL)
    logging.getLogger("swarmling").setLevel(logging.ERROR)
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
                conn.send(("stats", [node_stats(node) for node in nodes]))
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
        "bytes_in": stats["bytes_in"],
        "bytes_out": stats["bytes_out"],
        "bundle_bytes_in": stats["bundle_bytes_in"],
        "announcements": stats["announcements_in"] - node["announcements"],
        "fetches": stats["bundles_fetched"] - node["fetched"],
        "peers": stats["peers"],
        "shards": stats["shards"],
        "topics": sorted(net.host.shards.take_topics()),
        "heard_from": sorted({h.origin for h in net.board.fresh() if h.received >= since}),
        "estimate": net.shard_level.estimate,
        "fetch_failures": stats["fetch_failures"][:3],
        "fetches_pending": stats["fetches_pending"],
    }
    node["announcements"], node["fetched"] = stats["announcements_in"], stats["bundles_fetched"]
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
    from .swarm.identity import new_identity

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
    return opts.round_s or max(15.0, 0.75 * n)


def run_swarm(n: int, opts: BenchOptions, directory: Path, say=print) -> SwarmResult:
    """N network-only nodes on 127.0.0.1 for warm-up + measured rounds; per-node samples."""
    opts = replace(opts, round_s=round_seconds(n, opts))
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
            samples = []
            for _, conn in workers:
                conn.send(("stats",))
            for _, conn in workers:
                samples.extend(conn.recv()[1])
            heard = [s["announcements"] for s in samples]
            say(f"  {n} nodes, round {r}/{total}{' (warm-up)' if r <= opts.warmup else ''}: "
                f"{fmean(s['bytes_in'] for s in samples) / 1024:.0f} KiB in per node, "
                f"heard {fmean(heard):.1f} (min {min(heard)}), shards {sorted({s['shards'] for s in samples})}")
            if r > opts.warmup:
                result.samples.extend({**s, "round": r} for s in samples)
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


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)] if ordered else 0.0


def table(results: list[SwarmResult]) -> list[str]:
    lines = [f"{'nodes':>5}  {'in KiB/node/round':>17}  {'p90':>6}  {'bundles KiB':>11}  {'gossip KiB':>10}  "
             f"{'heard/node/round':>16}  {'min':>4}  {'fetches':>7}  {'shards':>7}  {'peers':>5}"]
    for res in results:
        kib = [b / 1024 for b in res.column("bytes_in")]
        bundles = [b / 1024 for b in res.column("bundle_bytes_in")]
        heard = res.column("announcements")
        shards = sorted(set(res.shards_at_end))
        lines.append(f"{res.nodes:>5}  {fmean(kib):>17.1f}  {_p90(kib):>6.1f}  {fmean(bundles):>11.1f}  "
                     f"{fmean(kib) - fmean(bundles):>10.1f}  {fmean(heard):>16.1f}  {min(heard):>4.0f}  "
                     f"{fmean(res.column('fetches')):>7.2f}  {'/'.join(map(str, shards)):>7}  "
                     f"{fmean(res.column('peers')):>5.1f}")
    return lines


def projection(results: list[SwarmResult], nodes: int = 10_000) -> str:
    """The measured cost of one heard announcement (gossip KiB / heard), carried to `nodes`."""
    from .swarm.shards import landing_level

    sharded = [r for r in results if fmean(r.column("announcements")) > 0]
    if not sharded:
        return ""
    big = max(sharded, key=lambda r: r.nodes)
    kib, bundles, heard = (fmean(big.column(k)) for k in ("bytes_in", "bundle_bytes_in", "announcements"))
    per_announcement = (kib - bundles) / 1024 / heard
    level = landing_level(nodes)
    per_shard = nodes / (1 << level)
    worst = 32
    return (f"projection to {nodes:,} nodes (measured at {big.nodes}: {per_announcement:.2f} KiB of gossip per heard "
            f"announcement, {bundles / 1024:.0f} KiB of bundles): {1 << level} shards of ≈{per_shard:.0f}, "
            f"≈{bundles / 1024 + (per_shard - 1) * per_announcement:.0f} KiB/node/round "
            f"(at most ≈{bundles / 1024 + (worst - 1) * per_announcement:.0f} with {worst} per shard, the band's top)")


def bench_swarm(opts: BenchOptions, say=print) -> int:
    base = opts.directory or Path(tempfile.mkdtemp(prefix="swarmling-bench-swarm-"))
    results = []
    for n in opts.counts:
        say(f"{n} network-only nodes on 127.0.0.1 ({opts.warmup} warm-up + {opts.rounds} measured rounds of "
            f"{round_seconds(n, opts):.0f} s, each dialling {min(opts.dial, n - 1)} random others)")
        results.append(run_swarm(n, opts, base / f"{n}-nodes", say))
    say("\nper node per round, measured rounds (wire bytes after Noise/yamux; gossip = all but bundle payload)")
    for line in table(results):
        say(line)
    means = {r.nodes: fmean(r.column("bytes_in")) for r in results}
    if 16 in means and len(means) > 1:
        top = max(means)
        say(f"inbound per node, {top} vs 16 nodes: ×{means[top] / means[16]:.2f} (issue 14 asks ≤ 1.5×)")
    line = projection(results)
    if line:
        say(line)
    summary = base / "bench-swarm.json"
    summary.write_text(json.dumps({"options": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(opts).items()},
                                   "results": [asdict(r) for r in results]}, indent=1))
    say(f"per-node samples: {summary}")
    return 0
