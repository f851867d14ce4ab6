"""Where a compiled bf16 training step's time goes (issue 38: bf16 vs fp32, the non-matmul work):
a node started as bench starts one (bench_config, 2 threads, compiled graphs waited for), rounds
1-3 on bench's draws, torch.profiler around the train steps of rounds 2 and 3."""
import sys, tempfile, time
from dataclasses import replace
from pathlib import Path
import torch
from torch.profiler import profile, ProfilerActivity
from swarmling.app.config import load_config
from swarmling.app.paths import resolve_paths
from swarmling.app.node.loop import Node
from swarmling.app.commands.bench import bench_config
from swarmling.app.learning.round import run_round
from swarmling.app.learning.draws import RoundDraws

config = load_config(None, cli=[("backend.threads", 2)])
with tempfile.TemporaryDirectory() as tmp:
    node = Node(bench_config(config), replace(resolve_paths(tmp), cache_dir=Path("/root/.cache/swarmling")))
    node.start()
    node.backend.set_switches(node.backend.switches())
    settings = replace(node.round_settings(), min_signal_groups=0)
    inner = node.backend.train_step
    prof_on = {"on": False}
    steps = []
    def probed(samples, *a, **k):
        if not prof_on["on"]:
            return inner(samples, *a, **k)
        print("STEP-BEGIN", flush=True)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as p:
            t = time.perf_counter(); out = inner(samples, *a, **k); s = time.perf_counter() - t
        print("STEP-END", flush=True)
        steps.append((s, p))
        return out
    node.backend.train_step = probed
    for i in range(1, 4):
        prof_on["on"] = i >= 2
        out = run_round(i, node.backend, node.preset, node.curriculum, settings, RoundDraws(node.seed, i))
        node.curriculum = out.curriculum
        print(f"round {i}: train {out.record.seconds.get('train', 0):.2f} s", flush=True)
    for s, p in steps:
        print(f"\n=== step {s:.2f} s")
        print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=60))
        classes = {}
        for e in p.key_averages(group_by_input_shape=True):
            if e.key not in ("aten::mm", "aten::addmm", "aten::bmm"):
                continue
            shapes = str(e.input_shapes)
            kind = "head (49152)" if "49152" in shapes else "LoRA (rank 16)" if ", 16]" in shapes or "[16," in shapes else "base layers"
            c = classes.setdefault(kind, [0.0, 0, set()])
            c[0] += e.self_cpu_time_total / 1e6; c[1] += e.count
            if len(c[2]) < 4: c[2].add(shapes[:90])
        for kind, (sec, n, ex) in classes.items():
            print(f"mm {kind}: {sec:.2f} s in {n} calls; e.g. {sorted(ex)}")
    node.close()
