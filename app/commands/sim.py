"""`swarmling sim --nodes N`: N real nodes on 127.0.0.1, one swarm, one command.

Each node is its own process (`swarmling run --headless`) with its own home (identity, state,
logs), real libp2p on a free loopback port and the shipped model; the converted model cache is
shared. Node 0 is every node's bootstrap peer and node i-1 is node i's static peer, so both ways
of joining are exercised; everything else (announcement addresses) is learnt from the swarm.
The sim prints each node's round as it lands and a swarm-wide line once every node has done that
round, and writes `summary.json` (per-node and per-round figures) for benchmarks.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean, median

import msgspec

from ..paths import Paths
from ..learning.round_record import RoundRecord
from ..metrics import read_records
from ..node.control import ControlError, send
from ..swarm.p2p.identity import new_identity
from .arguments import Invocation, add_config_flags, node_counts, positive

TINY = (("round.questions", 4), ("round.completions", 4), ("round.max_new_tokens", 12), ("round.external_groups", 2))
# Training memory grows with the tokens per microbatch (≈ 1.2 GB per node at 256, several GB at
# the 2048 a lone node on a 24 GB machine takes): N nodes on one machine share its memory.
SIM_MICROBATCH_TOKENS = 256
NODE_MEMORY_BYTES = int(1.25 * 2**30)


@dataclass(frozen=True)
class SimOptions:
    nodes: int
    rounds: int
    directory: Path | None
    tiny: bool
    timeout_s: int
    overrides: list[tuple[str, object]]
    started: str = time.strftime("%Y%m%d-%H%M%S")

    def summary_dir(self, paths: Paths) -> Path:
        return self.directory or paths.state_dir / "sim" / f"{self.started}-{self.nodes}-nodes"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _toml(value: object) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return str(value)


@dataclass
class _SimNode:
    index: int
    home: Path
    peer_id: str
    port: int
    process: subprocess.Popen | None = None
    seen_round: int = 0
    lingering: bool = False  # done with its rounds, paused, still in the swarm for the others

    @property
    def addr(self) -> str:
        return f"/ip4/127.0.0.1/tcp/{self.port}/p2p/{self.peer_id}"

    @property
    def metrics_file(self) -> Path:
        return self.home / "state" / "metrics.jsonl"

    def new_records(self) -> list[RoundRecord]:
        """Records of rounds not returned before (by round: the log is rolled now and then, metrics.py)."""
        out = []
        for rec in read_records(self.metrics_file):  # a line being written right now is skipped, read next time
            if rec["round"] > self.seen_round:
                try:
                    out.append(RoundRecord.from_dict(rec))
                except (ValueError, msgspec.ValidationError):
                    continue
        if out:
            self.seen_round = out[-1].round
        return out


def compare(runs: list[SimOptions], paths: Paths) -> int:
    """The swarm benchmark: the same tiny rounds with more and more nodes. Per-node inbound bundle
    bytes are bounded by the inbound budget and should stay flat as N grows."""
    rows = []
    for options in runs:
        code = simulate(options, paths)
        if code:
            return code
        rows.append((options.nodes, _steady(json.loads((options.summary_dir(paths) / "summary.json").read_text()))))
    print("\nswarm benchmark (rounds 2+, means per node per round; latencies are medians)")
    header = f"{'nodes':>5} {'in KiB':>8} {'out KiB':>8} {'bundles in KiB':>15} {'in KiB/s':>9} {'peers':>6} {'announce ms':>12} {'fetch ms':>9} {'round s':>8}"
    print(header)
    for nodes, r in rows:
        print(f"{nodes:>5} {r['bytes_in'] / 1024:>8.1f} {r['bytes_out'] / 1024:>8.1f} {r['bundle_bytes_in'] / 1024:>15.1f} "
              f"{r['bytes_in_per_s'] / 1024:>9.2f} {r['peers']:>6.1f} {_ms(r['announce_s']):>12} {_ms(r['fetch_s']):>9} {r['round_s']:>8.1f}")
    base_nodes, base = rows[0]
    for nodes, r in rows[1:]:
        print(f"{nodes} vs {base_nodes} nodes: inbound bytes per node per round x{_ratio(r['bytes_in'], base['bytes_in'])}, "
              f"bundle bytes x{_ratio(r['bundle_bytes_in'], base['bundle_bytes_in'])}, "
              f"inbound bytes per second x{_ratio(r['bytes_in_per_s'], base['bytes_in_per_s'])}")
    return 0


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}"


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "-"


def _steady(summary: dict) -> dict:
    rounds = [r for k, r in summary["rounds"].items() if int(k) >= 2] or list(summary["rounds"].values())

    def mean(key):
        values = [r[key] for r in rounds if r.get(key) is not None]
        return fmean(values) if values else None

    return {
        "bytes_in": mean("bytes_in_per_node"), "bytes_out": mean("bytes_out_per_node"),
        "bundle_bytes_in": mean("bundle_bytes_in_per_node"), "bytes_in_per_s": mean("bytes_in_per_node_per_s"),
        "peers": mean("peers"), "announce_s": mean("announce_latency_s_p50"), "fetch_s": mean("fetch_seconds_p50"),
        "round_s": mean("round_seconds"),
    }


def simulate(options: SimOptions, paths: Paths) -> int:
    import psutil

    from ..errors import NodeError

    available = psutil.virtual_memory().available
    if options.nodes * NODE_MEMORY_BYTES > available:
        raise NodeError(
            f"{options.nodes} nodes need about {options.nodes * NODE_MEMORY_BYTES / 2**30:.0f} GiB and this machine has "
            f"{available / 2**30:.1f} GiB available: run at most {max(1, available // NODE_MEMORY_BYTES)} nodes"
        )
    base = options.summary_dir(paths)
    base.mkdir(parents=True, exist_ok=True)
    swarm_name = f"sim-{os.getpid()}"
    nodes = []
    for i in range(options.nodes):
        home = base / f"node-{i}"
        identity = new_identity(home / "data")
        nodes.append(_SimNode(i, home, identity.peer_id, _free_port()))
    cores = os.cpu_count() or 1
    env = os.environ | {"SWARMLING_CACHE_DIR": str(paths.cache_dir), "PYTHONUNBUFFERED": "1"}
    env.pop("SWARMLING_HOME", None)
    overrides = [*(TINY if options.tiny else ()), *options.overrides]
    print(f"sim: {options.nodes} nodes, {options.rounds} rounds each, swarm {swarm_name!r}, state in {base}", flush=True)
    for node in nodes:
        settings = [
            ("swarm.enabled", True), ("swarm.name", swarm_name), ("swarm.listen_host", "127.0.0.1"),
            ("swarm.port", node.port), ("swarm.mdns", False), ("run.seed", 1000 + node.index),
            ("backend.threads", max(1, cores // options.nodes)),
            ("train.microbatch_tokens", SIM_MICROBATCH_TOKENS),
        ]
        if node.index > 0:
            settings.append(("swarm.bootstrap", (nodes[0].addr,)))
        if node.index > 1:
            settings.append(("swarm.peers", (nodes[node.index - 1].addr,)))
        settings += [(k, v) for k, v in overrides if k not in dict(settings)]
        # One round more than asked: a node that is done pauses instead of leaving (below), so the
        # slower ones still have peers in their last rounds. The extra round is dropped by the pause
        # (or, when it wins the race, recorded and left out of the sim's figures).
        argv = [sys.executable, "-m", "swarmling.app", "--home", str(node.home), "run", "--headless",
                "--rounds", str(options.rounds + 1)]
        for key, value in settings:
            argv += ["--set", f"{key}={_toml(value)}"]
        log = open(node.home / "node.log", "w", encoding="utf-8")
        node.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()
        print(f"sim: node-{node.index} {node.peer_id[:16]}… on port {node.port}", flush=True)

    by_round: dict[int, dict[int, RoundRecord]] = {}

    def on_term(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once is enough: the cleanup below must finish
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)  # a stopped sim stops its nodes too
    deadline = time.monotonic() + options.timeout_s
    interrupted = False
    try:
        while any(n.process.poll() is None and not n.lingering for n in nodes) and time.monotonic() < deadline:
            _collect(nodes, by_round, options.nodes, options.rounds)
            for node in nodes:
                if node.seen_round >= options.rounds and not node.lingering and node.process.poll() is None:
                    node.lingering = _linger(node)
            time.sleep(0.5)
    except KeyboardInterrupt:
        interrupted = True
        print("sim: stopping the nodes", flush=True)
    finally:
        for node in nodes:
            if node.process.poll() is None:
                os.killpg(node.process.pid, signal.SIGTERM)
        for node in nodes:
            try:
                node.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(node.process.pid, signal.SIGKILL)
                node.process.wait()
        signal.signal(signal.SIGTERM, previous)
    _collect(nodes, by_round, options.nodes, options.rounds)
    summary = _summarise(nodes, by_round)
    (base / "summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    failed = [n for n in nodes if n.process.returncode not in (0,)]
    for node in failed:
        tail = (node.home / "node.log").read_text(encoding="utf-8", errors="replace").splitlines()[-8:]
        print(f"sim: node-{node.index} exited with {node.process.returncode}; last lines of its log:", file=sys.stderr)
        for line in tail:
            print(f"  {line}", file=sys.stderr)
    print(f"sim: summary in {base / 'summary.json'}", flush=True)
    return 130 if interrupted else (1 if failed else 0)


def _linger(node: _SimNode) -> bool:
    """Pause a node that has done its rounds and keep it in the swarm, serving its bundles, until
    every node is done (the round it began after is dropped, or left out of the figures when it
    finished first); False when it cannot be reached."""
    try:
        send(node.home / "state", "pause")
    except ControlError:
        return False
    return True


def _collect(nodes: list[_SimNode], by_round: dict[int, dict[int, RoundRecord]], count: int, rounds: int) -> None:
    for node in nodes:
        for rec in node.new_records():
            r, net = rec.round, rec.swarm_stats
            if r > rounds:
                continue  # finished before the pause reached it: not one of the sim's rounds
            by_round.setdefault(r, {})[node.index] = rec
            print(
                f"  node-{node.index} round {r:>3}  reward {rec.reward_mean:.3f}  local {rec.local_groups} "
                f"external {rec.external_groups} (rejected {rec.external_rejected})  peers {net.peers}  "
                f"in {net.bytes_in / 1024:.0f} KiB out {net.bytes_out / 1024:.0f} KiB",
                flush=True,
            )
            if len(by_round[r]) == count:
                recs = by_round[r].values()
                print(
                    f"swarm round {r:>3}  reward {fmean(x.reward_mean for x in recs):.3f}  "
                    f"external groups used {sum(x.external_groups for x in recs)}  "
                    f"mean in {fmean(x.swarm_stats.bytes_in for x in recs) / 1024:.0f} KiB/node",
                    flush=True,
                )


def _summarise(nodes: list[_SimNode], by_round: dict[int, dict[int, RoundRecord]]) -> dict:
    def med(values):
        values = [v for v in values if v is not None]
        return median(values) if values else None

    rounds = {}
    for r, recs in sorted(by_round.items()):
        rs = list(recs.values())
        nets = [x.swarm_stats for x in rs]
        rounds[r] = {
            "nodes": len(rs),
            "reward_mean": fmean(x.reward_mean for x in rs),
            "external_groups": sum(x.external_groups for x in rs),
            "bytes_in_per_node": fmean(n.bytes_in for n in nets),
            "bytes_out_per_node": fmean(n.bytes_out for n in nets),
            "bundle_bytes_in_per_node": fmean(n.bundle_bytes_in for n in nets),
            "bytes_in_per_node_per_s": fmean(n.bytes_in / max(x.wall_seconds, 1e-3) for x, n in zip(rs, nets)),
            "round_seconds": fmean(x.wall_seconds for x in rs),
            "peers": fmean(n.peers for n in nets),
            "announce_latency_s_p50": med(n.announce_latency_s_p50 for n in nets),
            "fetch_seconds_p50": med(n.fetch_seconds_p50 for n in nets),
        }
    per_node = {}
    for node in nodes:
        recs = [by_round[r][node.index] for r in sorted(by_round) if node.index in by_round[r]]
        per_node[f"node-{node.index}"] = {
            "peer_id": node.peer_id,
            "exit_code": node.process.returncode if node.process else None,
            "rounds": len(recs),
            "reward": [x.reward_mean for x in recs],
            "external_groups": [x.external_groups for x in recs],
            "external_rejected": [x.external_rejected for x in recs],
            "external_blamed": [x.swarm_stats.groups_blamed for x in recs],
            "peers": [x.swarm_stats.peers for x in recs],
            "bytes_in": [x.swarm_stats.bytes_in for x in recs],
            "bytes_out": [x.swarm_stats.bytes_out for x in recs],
        }
    return {"rounds": rounds, "nodes": per_node}


def sim_arguments(p) -> None:
    p.add_argument("--nodes", type=node_counts, default=(3,), metavar="N[,N…]",
                   help="how many nodes (default 3); several counts, e.g. 8,16, run one swarm after the other "
                        "and compare their per-node traffic (the swarm benchmark)")
    p.add_argument("--rounds", type=positive, default=3, help="rounds per node (default 3)")
    p.add_argument("--dir", type=Path, help="where the nodes keep their state (default: a new folder under the state dir)")
    p.add_argument("--tiny", action="store_true", help="tiny rounds (4 questions x 4 completions, 12 tokens): for network experiments")
    p.add_argument("--timeout", type=positive, default=3600, help="stop every node after this many seconds (default 3600)")
    add_config_flags(p)


def sim_main(c: Invocation) -> int:
    a = c.args
    runs = [SimOptions(n, a.rounds, a.dir / f"{n}-nodes" if a.dir and len(a.nodes) > 1 else a.dir, a.tiny, a.timeout,
                       c.overrides) for n in a.nodes]
    return simulate(runs[0], c.paths) if len(runs) == 1 else compare(runs, c.paths)
