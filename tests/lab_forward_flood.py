"""What a node uploads while a flood of announcements passes through it, with and without the
forwarding budget (app/swarm/host/forwarding.py). Real hosts on 127.0.0.1; about a minute.

    python tests/lab_forward_flood.py [IDENTITIES] [EACH]     # default 30 x 20 = 600 announcements
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from swarm_peers import forwarding_flood  # noqa: E402

from swarmling.app.swarm.host.forwarding import FORWARD_KIB_S  # noqa: E402

UNBOUNDED = 1e9


def main(identities: int = 30, each: int = 20) -> None:
    for label, kib_s in (("without a budget", UNBOUNDED), (f"budget {FORWARD_KIB_S:.0f} KiB/s", FORWARD_KIB_S)):
        with tempfile.TemporaryDirectory() as tmp:
            r = forwarding_flood(Path(tmp), identities, each, kib_s)
        print(f"{label}: {r['offered']} offered, {r['accepted']} accepted, mesh {r['mesh_peers']}; "
              f"uploaded {r['upload_kib']:.0f} KiB in {r['seconds']:.1f} s, forwarded {r['forwarded_kib']:.0f} KiB, "
              f"withheld {r['withheld']}")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
