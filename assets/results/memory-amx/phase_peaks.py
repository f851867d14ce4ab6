"""Peak resident memory of a CPU node by phase of its round (issue 38's 2 GB), the node started as
bench starts one (bench_config, 2 threads, compiled graphs waited for). Each wrapped call resets
the kernel's high-water mark (/proc/self/clear_refs) before it and reads VmHWM after it."""
import sys, time, tempfile, functools
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
def reset():
    open("/proc/self/clear_refs", "w").write("5")

peaks = {}
def wrap(obj, name, label):
    inner = getattr(obj, name)
    @functools.wraps(inner)
    def probe(*a, **k):
        before = status("VmRSS:"); reset()
        try:
            return inner(*a, **k)
        finally:
            hwm, after = status("VmHWM:"), status("VmRSS:")
            peaks.setdefault(label, []).append((round(before), round(hwm), round(after)))
            reset()
    setattr(obj, name, probe)

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
config = load_config(None, cli=[("backend.threads", 2)])
with tempfile.TemporaryDirectory() as tmp:
    node = Node(bench_config(config), replace(resolve_paths(tmp), cache_dir=Path("/root/.cache/swarmling")))
    node.start()
    node.backend.set_switches(node.backend.switches())
    b = node.backend; t = b.trainer
    print("trainer:", b.info().trainer[:200])
    wrap(b, "generate", "generate"); wrap(b, "hand_off", "hand_off")
    wrap(t, "_anchor_references", "train: anchor reference pass")
    wrap(t, "_logprobs", "train: microbatch forward (grad)")
    wrap(t, "token_logprobs", "token_logprobs (no grad)")
    wrap(t.optimizer, "step", "train: optimizer step")
    import torch
    real_backward = torch.Tensor.backward
    def backward(self, *a, **k):
        before = status("VmRSS:"); reset()
        try: return real_backward(self, *a, **k)
        finally: peaks.setdefault("train: backward", []).append((round(before), round(status("VmHWM:")), round(status("VmRSS:")))); reset()
    torch.Tensor.backward = backward
    wrap(b, "train_step", "train_step (whole)")
    settings = replace(node.round_settings(), min_signal_groups=0)
    reset()
    for i in range(1, rounds + 1):
        out = run_round(i, b, node.preset, node.curriculum, settings, RoundDraws(node.seed, i))
        node.curriculum = out.curriculum
        line = f"round {i}: RSS {status('VmRSS:'):.0f} MiB, {out.record.generated_tokens} tokens generated"
        if "--trim" in sys.argv:
            import ctypes; t0 = time.perf_counter(); ctypes.CDLL("libc.so.6").malloc_trim(0)
            line += f"; after malloc_trim(0) {status('VmRSS:'):.0f} MiB ({(time.perf_counter()-t0)*1e3:.0f} ms)"
        print(line, flush=True)
    for label, rows in peaks.items():
        print(f"{label:38s} calls {len(rows):3d}  peak {max(r[1] for r in rows):5d} MiB  "
              f"(max rise over its start {max(r[1]-r[0] for r in rows):4d}; left after {max(r[2]-r[0] for r in rows):4d})")
    node.close()
