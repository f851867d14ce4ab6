"""The addresses a node can be dialled at, and that listing them never loads py-libp2p."""

from __future__ import annotations

import subprocess
import sys

from swarmling.app.swarm.p2p.addresses import dialable_addrs, interface_hosts

PEER = "12D3KooWExamplePeer"


def test_wildcard_listen_addresses_expand_to_every_interface_but_loopback_with_the_peer_id():
    hosts = interface_hosts()
    loopback = [h.startswith("127.") for h in hosts]
    assert hosts and loopback == sorted(loopback)  # LAN addresses first: the ones a friend can dial
    addrs = dialable_addrs(["/ip4/0.0.0.0/tcp/38433", f"/ip4/127.0.0.1/tcp/38433/p2p/{PEER}"], PEER)
    lan = [h for h in hosts if not h.startswith("127.")]
    # a peer on another machine that dialled 127.0.0.1 or 0.0.0.0 would reach itself
    assert addrs == [f"/ip4/{h}/tcp/38433/p2p/{PEER}" for h in lan] or not lan
    assert dialable_addrs(["/ip4/127.0.0.1/tcp/5"], PEER) == [f"/ip4/127.0.0.1/tcp/5/p2p/{PEER}"]  # all there is
    assert dialable_addrs(["/ip6/::/tcp/5", "/ip4/127.0.0.1/tcp/5"], PEER) == [f"/ip4/127.0.0.1/tcp/5/p2p/{PEER}"]


def test_listing_this_nodes_addresses_does_not_import_libp2p():
    # What `swarmling id` runs to list them: py-libp2p costs about a second and 70 MB to import.
    code = (
        "import sys\n"
        "from swarmling.app import cli\nfrom swarmling.app.commands import swarm as swarm_cli\n"
        "assert swarm_cli.listen_hosts('0.0.0.0')\n"
        "print(sorted(m for m in sys.modules if m == 'libp2p' or m.startswith('libp2p.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
