"""What one relayed fetch costs the helper beyond the bundle, and how long a fresh circuit takes to
open, in the namespace lab (tests/netlab.py, needs root): a helper on the simulated internet and
PAIRS nodes behind each of two home NATs (tests/lab_peer.py: the real SwarmNetwork, no model).

    python assets/results/network-xeon/relay_circuit.py [PAIRS]     (from the repository root; default 3)

Node a_k (home 1) shares a bundle, node b_k (home 2) fetches everything it heard: each fetch is
from an author it never connected to, so through a fresh circuit. The helper's relayed bytes minus
the bundle bytes b_k received, per fetch: the circuits' handshakes. And the seconds from b_k's
`fetch` to its fetched count rising (state polled every 0.05 s): dial, circuit, handshakes and the
bundle, an upper bound on opening the circuit. (lab_peer.py's `dial` command, which times a
circuit's opening alone, failed at 71f3f89, when this ran: the dialling had moved to dialer.py.
Mended since.)
"""

import json
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[3] / "tests"
sys.path.insert(0, str(TESTS))

from lab_peer import ask  # noqa: E402
from netlab import netlab  # noqa: E402
from waiting import wait_until  # noqa: E402

PEER = str(TESTS / "lab_peer.py")
PORT = 4001


def main(pairs: int = 3) -> None:
    with tempfile.TemporaryDirectory() as tmp, netlab(hosts_per_home=pairs) as lab:
        home = Path(tmp)
        helper = lab.spawn("pub", [sys.executable, PEER, "helper", str(home / "helper"), str(PORT)], lifetime_s=900)
        helper_id = json.loads(helper.expect('"ready"', timeout=90))["peer_id"]
        helper_addr = f"/ip4/{lab.addr('pub')}/tcp/{PORT}/p2p/{helper_id}"
        a = [h for h in lab.hosts if lab.router_of[h] == "r1"][:pairs]
        b = [h for h in lab.hosts if lab.router_of[h] == "r2"][:pairs]
        nodes = {role: lab.spawn(role, [sys.executable, PEER, "node", str(home / role), str(PORT), helper_addr],
                                 lifetime_s=900) for role in a + b}
        for proc in nodes.values():
            proc.expect('"ready"', timeout=120)
        assert wait_until(lambda: all(ask(p, "state")["state"] == "relayed" for p in nodes.values()), 180, 2.0)
        print(f"{2 * pairs} nodes behind 2 NATs, all relayed through the helper", flush=True)

        for k in range(pairs):
            before_relayed = ask(helper, "state")["relayed_bytes"]
            before = ask(nodes[b[k]], "state")
            ask(nodes[a[k]], f"share {k + 1}")
            assert wait_until(lambda: ask(nodes[b[k]], "state")["heard"] >= k + 1, 30, 0.5)
            asked = time.monotonic()
            ask(nodes[b[k]], "fetch")
            assert wait_until(lambda: ask(nodes[b[k]], "state")["fetched"] >= k + 1, 60, 0.05)
            took = time.monotonic() - asked
            time.sleep(2.0)
            after = ask(nodes[b[k]], "state")
            relayed = ask(helper, "state")["relayed_bytes"] - before_relayed
            fetches = after["fetched"] - before["fetched"]
            bundle = after["bundle_bytes_in"] - before["bundle_bytes_in"]  # lab_peer sums them since its start
            print(f"fetch by {b[k]}: {fetches} bundle(s), {bundle} bytes; helper relayed {relayed} bytes: "
                  f"{(relayed - bundle) / max(fetches, 1) / 1024:.1f} KiB a fetch beyond the bundle; all fetched within {took:.2f} s", flush=True)


if __name__ == "__main__":
    main(*(int(x) for x in sys.argv[1:2]))
