"""One process of the oneDNN primitive cache A/B (issue 38's peak RSS): a node started as bench
starts one (bench_config, 2 threads, compiled graphs waited for), R rounds, each round's generate
and train seconds, resident memory after it, and the rounds' peak (VmHWM after a reset)."""
import os, sys, tempfile
from dataclasses import replace
from pathlib import Path
from swarmling.app.config import load_config
from swarmling.app.paths import resolve_paths
from swarmling.app.node.loop import Node
from swarmling.app.commands.bench import bench_config
from swarmling.app.learning.round import run_round
from swarmling.app.learning.draws import RoundDraws

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) / 1024

rounds = int(sys.argv[1])
cap = os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "default")
config = load_config(None, cli=[("backend.threads", 2)])
with tempfile.TemporaryDirectory() as tmp:
    node = Node(bench_config(config), replace(resolve_paths(tmp), cache_dir=Path("/root/.cache/swarmling")))
    node.start()
    node.backend.set_switches(node.backend.switches())
    settings = replace(node.round_settings(), min_signal_groups=0)
    open("/proc/self/clear_refs", "w").write("5")
    for i in range(1, rounds + 1):
        out = run_round(i, node.backend, node.preset, node.curriculum, settings, RoundDraws(node.seed, i))
        node.curriculum = out.curriculum
        s = out.record.seconds
        print(f"cap {cap} round {i}: generate {s.get('generate', 0):.2f} train {s.get('train', 0):.2f} s, "
              f"{out.record.generated_tokens} tokens, RSS {status('VmRSS:'):.0f} MiB", flush=True)
    print(f"cap {cap} peak {status('VmHWM:'):.0f} MiB", flush=True)
    node.close()
