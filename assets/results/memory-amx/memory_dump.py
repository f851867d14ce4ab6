"""Anonymous memory of a CPU node, mapping by mapping, after start and after a round.

    python memory_dump.py            # waits for the compiled graphs (bf16 here), as bench does
    python memory_dump.py --eager    # its rounds train eager fp32 while the graphs build
"""
import sys, tempfile, re
from dataclasses import replace
from swarmling.app.config import load_config
from swarmling.app.paths import resolve_paths
from swarmling.app.node.loop import Node
from swarmling.app.commands.bench import bench_config
from swarmling.app.learning.round import run_round
from swarmling.app.learning.draws import RoundDraws

def dump(label):
    maps, cur = [], None
    for line in open("/proc/self/smaps"):
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            parts = line.split(); cur = {"name": parts[5] if len(parts) > 5 else "[anon]"}; maps.append(cur)
        elif line.startswith(("Rss:", "Anonymous:")):
            k, v = line.split()[:2]; cur[k[:-1]] = int(v)
    tot = sum(m.get("Rss", 0) for m in maps); anon = sum(m.get("Anonymous", 0) for m in maps)
    print(f"== {label}: Rss {tot/1024:.0f} MiB, anon {anon/1024:.0f} MiB")
    byname = {}
    for m in maps:
        n = m["name"] if m["name"] != "[anon]" else "[anon]"
        byname.setdefault(n, [0, 0]); byname[n][0] += m.get("Rss", 0); byname[n][1] += m.get("Anonymous", 0)
    for n, (r, a) in sorted(byname.items(), key=lambda x: -x[1][0])[:8]:
        print(f"   {r/1024:7.0f} MiB rss {a/1024:7.0f} anon  {n}")
    big = sorted((m.get("Anonymous", 0) for m in maps if m["name"] == "[anon]"), reverse=True)[:12]
    print("   largest anon mappings (MiB):", [round(b/1024) for b in big])
    sys.stdout.flush()

dump("imports")
config = load_config(None, cli=[("backend.threads", 2)])
with tempfile.TemporaryDirectory() as tmp:
    node = Node(bench_config(config), replace(resolve_paths(tmp), cache_dir=__import__("pathlib").Path("/root/.cache/swarmling")))
    node.start()
    dump("after start")
    if "--eager" not in sys.argv[1:]:
        import time; t=time.time(); node.backend.set_switches(node.backend.switches()); print("waited", time.time()-t)
        dump("compiled")
    settings = replace(node.round_settings(), min_signal_groups=0)
    for i in (1, 2):
        out = run_round(i, node.backend, node.preset, node.curriculum, settings, RoundDraws(node.seed, i))
        node.curriculum = out.curriculum
        dump(f"after round {i} (eager={not node.backend.switches().compiled if hasattr(node.backend.switches(),'compiled') else '?'})")
    import gc, torch
    seen, total, kinds = set(), 0, {}
    for o in gc.get_objects():
        try:
            if isinstance(o, torch.Tensor) and o.device.type == "cpu":
                st = o.untyped_storage(); key = st.data_ptr()
                if key in seen or key == 0: continue
                seen.add(key); total += st.nbytes()
                k = str(o.dtype); kinds[k] = kinds.get(k, 0) + st.nbytes()
        except Exception: pass
    print("tensor storages reachable by gc:", round(total/2**20), "MiB", {k: round(v/2**20) for k, v in kinds.items()})
    import tracemalloc
    if tracemalloc.is_tracing():
        snap = tracemalloc.take_snapshot()
        stats = snap.statistics("filename")
        print("tracemalloc total", round(sum(s.size for s in stats)/2**20), "MiB")
        for s in stats[:15]: print("  ", round(s.size/2**20, 1), "MiB", s.traceback)
    node.close()
