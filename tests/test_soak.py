"""`swarmling soak`, short: three network-only nodes on 127.0.0.1 (real py-libp2p, one process
each) for a few tiny rounds, sampled; and the summary's rules catch what grows."""

from __future__ import annotations

import json

from swarmling.app.commands.soak import COUNTS, MEASURES, SoakOptions, slope_per_100, soak, summarize


def test_a_short_soak_samples_every_node_and_reports_slopes(tmp_path):
    said: list[str] = []
    summary = soak(SoakOptions(nodes=3, rounds=12, round_s=0.5, every=3, warmup=3, directory=tmp_path), say=said.append)
    samples = [json.loads(line) for line in (tmp_path / "soak.jsonl").read_text().splitlines()]
    assert {(s["round"], s["node"]) for s in samples} == {(r, n) for r in (3, 6, 9, 12) for n in range(3)}
    last = [s for s in samples if s["round"] == 12]
    assert all(s["connections"] >= 2 and s["streams"] >= 2 and s["board"] >= 2 for s in last), last  # a swarm, trading
    assert all(s["rss_mb"] > 50 and s["fds"] > 5 and s["threads"] >= 2 for s in last), last
    assert {(r["node"], r["measure"]) for r in summary["rows"]} == {(n, m) for n in range(3) for m in MEASURES}
    assert json.loads((tmp_path / "soak.json").read_text())["rows"] == summary["rows"]
    assert (tmp_path / "soak.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "per 100 rounds" in said[-2] or any("per 100 rounds" in line for line in said)


def test_the_summary_flags_growth_and_passes_a_flat_run():
    opts = SoakOptions(rounds=1000, warmup=100)

    def run(rss_per_round: float, fds_per_round: float) -> dict:
        rows = [{"round": r, "node": 0, **{m: 10.0 for m in MEASURES}, "rss_mb": 200 + rss_per_round * r,
                 "fds": 20 + fds_per_round * r} for r in range(10, 1001, 10)]
        return summarize(rows, opts)

    assert run(0.0, 0.0)["within_bounds"]
    assert run(0.01, 0.0)["within_bounds"]  # 10 MB per 1,000 rounds
    leaking = run(0.03, 0.0)  # 30 MB per 1,000 rounds
    assert not leaking["within_bounds"]
    assert [r["holds"] for r in leaking["rows"] if r["measure"] == "rss_mb"] == [False]
    assert not run(0.0, 0.01)["within_bounds"] and "fds" in COUNTS  # 8 more descriptors by the end
    assert abs(slope_per_100([(100, 1.0), (200, 3.0), (300, 5.0)]) - 2.0) < 1e-9
