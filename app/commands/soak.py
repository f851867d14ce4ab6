"""`swarmling soak`: days of a swarm compressed into an hour, to see what grows (issue 27).

Network-only nodes on 127.0.0.1, as `bench-swarm` runs them (the real `SwarmNetwork`: py-libp2p
hosts, GossipSub, the board, the bundle protocol, reputation; synthetic bundles of a realistic
size instead of a model's), each in its own process so that its memory, descriptors and threads
are its own. Rounds are tiny and fast (ROUND_S): a thousand of them cover what a volunteer's node
does in a day or more of minute-long rounds, minus the model. A round lasts until every node has
shared and reported (each shares within the first half of `round_s`), not `round_s` itself: on a
2-core Xeon a default round took ~0.4 s (assets/results/network-xeon/).

Every `every` rounds each node reports a sample: RSS, open file descriptors, threads, libp2p
connections and streams, and the sizes of what it keeps (announcement board, reputation ledger,
GossipSub's seen-message and validation caches, connections held for fetches), and the bytes
under its folder. The table gives, per node and measure, the first and last sample, the slope per
100 rounds (least squares over the samples after the warm-up) and the last 200 rounds' mean
against the first 200's (after the warm-up): issue 27 asks RSS to grow < 20 MB per 1,000 rounds
and the counts to show no upward trend (the last 200's mean at most the first 200's + 2).
Samples go to `soak.jsonl`, the table and slopes to `soak.json`, a plot of every measure over the
rounds (one line per node, the warm-up shaded) to `soak.png`, in the soak's folder.
"""

from __future__ import annotations

import json
import multiprocessing
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean

from .swarm_lab import BenchOptions, make_nodes, node_specs, node_stats, play_round
from .arguments import Invocation, positive

ROUND_S = 1.0
MEASURES = ("rss_mb", "fds", "threads", "connections", "streams", "board", "reputation", "seen_cache",
            "validation_cache", "held_for_fetches", "disk_kb")
COUNTS = ("fds", "threads", "connections", "streams")  # issue 27: no upward trend
RSS_MB_PER_1000 = 20.0  # issue 27: RSS grows less than this per 1,000 rounds
TREND_SLACK = 2.0  # the last 200 rounds' mean at most the first 200's + this


@dataclass(frozen=True)
class SoakOptions:
    nodes: int = 3
    rounds: int = 1000
    round_s: float = ROUND_S
    every: int = 10  # rounds between samples
    warmup: int = 100  # rounds not measured (connections, meshes and reputations settle)
    directory: Path | None = None
    seed: int = 0


def _bench_options(opts: SoakOptions) -> BenchOptions:
    # tiny bundles (4 groups of 4 replies of 200 characters, ~4 KB), every node dialling the others
    return BenchOptions((opts.nodes,), round_s=opts.round_s, dial=opts.nodes - 1, groups=4, completions=4, chars=200,
                        seed=opts.seed, per_process=1)


# ---- a node's process -----------------------------------------------------------------------------
def _worker(conn, spec, bench: BenchOptions) -> None:
    import logging

    logging.getLogger("libp2p").setLevel(logging.CRITICAL)
    logging.getLogger("swarmling").setLevel(logging.ERROR)
    (node,) = make_nodes([spec], bench)
    try:
        node["net"].start()
        conn.send(("ready", node["net"].peer_id))
        while True:
            msg = conn.recv()
            if msg[0] == "round":
                play_round([node], msg[1], bench)
                node_stats(node)  # what a round's end does: intake recorded, the round's figures taken
                conn.send(("done",))
            elif msg[0] == "sample":
                conn.send(("sample", sample(node, Path(spec[1]))))
            else:
                break
    finally:
        node["net"].stop()
        conn.send(("stopped",))


def sample(node: dict, home: Path) -> dict:
    """What one node holds now (called in its own process)."""
    import psutil
    import trio

    net = node["net"]
    host = net.host
    proc = psutil.Process()

    def libp2p() -> dict:  # py-libp2p's state belongs to the host's trio thread
        conns = [c for cs in host._host.get_network().connections.values() for c in (cs if isinstance(cs, list) else [cs])]
        pubsub = host._pubsub
        return {"connections": len(conns), "streams": sum(len(c.get_streams()) for c in conns),
                "seen_cache": len(pubsub.seen_messages.cache), "validation_cache": len(pubsub.validation_cache.cache)}

    try:
        inside = trio.from_thread.run_sync(libp2p, trio_token=host._trio._token)
    except Exception:  # noqa: BLE001 — the host restarting: counted as nothing this time
        inside = {"connections": 0, "streams": 0, "seen_cache": 0, "validation_cache": 0}
    held = host.connection_figures()
    return {
        "rss_mb": round(proc.memory_info().rss / 2**20, 1),
        "fds": proc.num_fds(),
        "threads": proc.num_threads(),
        **inside,
        "board": sum(len(q) for q in list(net.board._heard.values())),
        "reputation": len(net.reputation.snapshot()),
        "held_for_fetches": held.get("fetch", 0),
        "disk_kb": round(sum(f.stat().st_size for f in home.rglob("*") if f.is_file()) / 1024, 1),
    }


# ---- the driver -----------------------------------------------------------------------------------
def soak(opts: SoakOptions, say=print) -> dict:
    """Run the soak; its summary (also written to soak.json)."""
    base = opts.directory or Path(tempfile.mkdtemp(prefix="swarmling-soak-"))
    base.mkdir(parents=True, exist_ok=True)
    bench = _bench_options(opts)
    specs = node_specs(opts.nodes, bench, base)
    ctx = multiprocessing.get_context("spawn")
    pipes, procs = [], []
    for spec in specs:
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(child, spec, bench), daemon=True)
        proc.start()
        pipes.append(parent)
        procs.append(proc)
    samples: list[dict] = []
    started = time.monotonic()
    try:
        for pipe in pipes:
            _expect(pipe, "ready", 120)
        time.sleep(3.0)  # connections and gossip meshes form
        with (base / "soak.jsonl").open("w", encoding="utf-8") as out:
            for round_no in range(1, opts.rounds + 1):
                for pipe in pipes:
                    pipe.send(("round", round_no))
                for pipe in pipes:
                    _expect(pipe, "done", 60 + 2 * opts.round_s)
                if round_no % opts.every == 0 or round_no == opts.rounds:
                    for i, pipe in enumerate(pipes):
                        pipe.send(("sample",))
                        row = {"round": round_no, "node": i, **_expect(pipe, "sample", 60)[1]}
                        samples.append(row)
                        out.write(json.dumps(row) + "\n")
                    out.flush()
                if round_no % max(opts.every * 10, 1) == 0:
                    say(f"round {round_no}/{opts.rounds}: " + "  ".join(
                        f"node {s['node']} RSS {s['rss_mb']:.0f} MB fds {s['fds']} conns {s['connections']}"
                        for s in samples[-opts.nodes:]))
    finally:
        for pipe in pipes:
            try:
                pipe.send(("stop",))
            except OSError:
                pass
        for proc in procs:
            proc.join(15)
            if proc.is_alive():
                proc.kill()
    summary = summarize(samples, opts)
    summary["seconds"] = round(time.monotonic() - started, 1)
    (base / "soak.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    plot(samples, opts, base / "soak.png")
    say(table(summary))
    say(f"samples: {base / 'soak.jsonl'}, summary: {base / 'soak.json'}, plot: {base / 'soak.png'}")
    return summary


def _expect(pipe, kind: str, timeout_s: float):
    if not pipe.poll(timeout_s):
        raise RuntimeError(f"a soak node did not answer {kind!r} within {timeout_s:.0f} s")
    msg = pipe.recv()
    if msg[0] != kind:
        raise RuntimeError(f"a soak node answered {msg[0]!r} instead of {kind!r}")
    return msg


def slope_per_100(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of (round, value), per 100 rounds (0 with fewer than two rounds)."""
    if len({r for r, _ in points}) < 2:
        return 0.0
    mx, my = fmean(r for r, _ in points), fmean(v for _, v in points)
    sxx = sum((r - mx) ** 2 for r, _ in points)
    return 100.0 * sum((r - mx) * (v - my) for r, v in points) / sxx


def summarize(samples: list[dict], opts: SoakOptions) -> dict:
    """Per node and measure: first, last, slope per 100 rounds after the warm-up, and the first and
    last 200 measured rounds' means; whether issue 27's bounds hold."""
    rows = []
    ok = True
    for node in sorted({s["node"] for s in samples}):
        mine = [s for s in samples if s["node"] == node]
        measured = [s for s in mine if s["round"] > opts.warmup] or mine
        end = measured[-1]["round"]
        first200 = [s for s in measured if s["round"] <= measured[0]["round"] + 200]
        last200 = [s for s in measured if s["round"] > end - 200]
        for key in MEASURES:
            slope = slope_per_100([(s["round"], s[key]) for s in measured])
            early, late = fmean(s[key] for s in first200), fmean(s[key] for s in last200)
            holds = True
            if key == "rss_mb":
                holds = slope * 10 < RSS_MB_PER_1000
            elif key in COUNTS:
                holds = late <= early + TREND_SLACK
            ok = ok and holds
            rows.append({"node": node, "measure": key, "first": mine[0][key], "last": mine[-1][key],
                         "slope_per_100_rounds": round(slope, 3), "first_200_mean": round(early, 2),
                         "last_200_mean": round(late, 2), "holds": holds})
    return {"nodes": opts.nodes, "rounds": opts.rounds, "round_s": opts.round_s, "warmup": opts.warmup,
            "within_bounds": ok, "rows": rows}


def table(summary: dict) -> str:
    lines = [f"soak: {summary['nodes']} nodes, {summary['rounds']} rounds of {summary['round_s']:g} s "
             f"(slopes after a {summary['warmup']}-round warm-up)",
             f"{'node':>4}  {'measure':<17}{'first':>10}{'last':>10}{'per 100 rounds':>16}{'first 200':>11}"
             f"{'last 200':>10}  ok"]
    for r in summary["rows"]:
        lines.append(f"{r['node']:>4}  {r['measure']:<17}{r['first']:>10}{r['last']:>10}"
                     f"{r['slope_per_100_rounds']:>16.3f}{r['first_200_mean']:>11}{r['last_200_mean']:>10}  "
                     f"{'yes' if r['holds'] else 'NO'}")
    lines.append("within issue 27's bounds" if summary["within_bounds"] else "OUTSIDE issue 27's bounds")
    return "\n".join(lines)


def plot(samples: list[dict], opts: SoakOptions, out: Path) -> None:
    """Every measure over the rounds, one line per node, the warm-up shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = 4
    fig, axes = plt.subplots((len(MEASURES) + columns - 1) // columns, columns, figsize=(14, 8), sharex=True,
                             constrained_layout=True)
    for ax, key in zip(axes.flat, MEASURES):
        for node in sorted({s["node"] for s in samples}):
            mine = [s for s in samples if s["node"] == node]
            ax.plot([s["round"] for s in mine], [s[key] for s in mine], lw=1, label=f"node {node}")
        ax.axvspan(0, opts.warmup, color="0.9")
        ax.set_title(key.replace("_", " "), fontsize=10)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(MEASURES):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(f"soak: {opts.nodes} network-only nodes, {opts.rounds} rounds of {opts.round_s:g} s "
                 f"(warm-up of {opts.warmup} shaded)")
    fig.savefig(out)
    plt.close(fig)


def soak_command(opts: SoakOptions) -> int:
    summary = soak(opts)
    return 0 if summary["within_bounds"] else 1


def soak_arguments(p) -> None:
    p.add_argument("--nodes", type=positive, default=3, help="nodes, one process each (default 3)")
    p.add_argument("--rounds", type=positive, default=1000, help="rounds (default 1000)")
    p.add_argument("--round-seconds", type=float, default=1.0,
                   help="each node shares at a random moment in the first half of this (default 1 s); the next round "
                        "starts once every node is done, so a round is often shorter")
    p.add_argument("--every", type=positive, default=10, help="rounds between samples (default 10)")
    p.add_argument("--warmup", type=int, default=100, help="rounds left out of the slopes (default 100)")
    p.add_argument("--dir", type=Path, help="where the nodes and the results go (default: a temp folder)")


def soak_main(c: Invocation) -> int:
    a = c.args
    return soak_command(SoakOptions(a.nodes, a.rounds, a.round_seconds, a.every, a.warmup, a.dir))
