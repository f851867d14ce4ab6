"""tests/lab_forward_flood.py at any forwarding budget (it runs only none and the default 64 KiB/s):
    python assets/results/network-xeon/flood_budget.py IDENTITIES EACH KIB_S   (from the repository root)"""

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))

from swarm_peers import forwarding_flood  # noqa: E402

identities, each, kib_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
with tempfile.TemporaryDirectory() as tmp:
    r = forwarding_flood(Path(tmp), identities, each, kib_s)
print(f"budget {kib_s:g} KiB/s: {r['offered']} offered, {r['accepted']} accepted, mesh {r['mesh_peers']}; "
      f"uploaded {r['upload_kib']:.0f} KiB in {r['seconds']:.1f} s, forwarded {r['forwarded_kib']:.0f} KiB, "
      f"withheld {r['withheld']}")
