"""The namespace lab is a real network: NAT happens, homes are closed to the internet and to each
other, teardown leaves nothing behind; and on it, py-libp2p shows issue 14's failure as measured.

Plain sockets first (each test ~1 s), then minimal py-libp2p hosts built as app/swarm/host/host.py
builds them (Noise only), one per namespace.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from netlab import Lab, lab, lab_namespaces, netlab  # noqa: F401 — `lab` is the fixture
from waiting import wait_until

PORT = 7000

# One TCP listener: prints "listening", then one line per accepted connection with its peer address.
SERVE = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen()
print("listening", flush=True)
while True:
    c, (ip, port) = s.accept()
    print("accepted", ip, port, flush=True)
    c.close()
"""

# One TCP dial: a JSON line {"ok", "local", "error", "s"}.
CONNECT = """
import json, socket, sys, time
t = time.monotonic()
try:
    c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))
    out = {"ok": True, "local": c.getsockname()[0]}
    c.close()
except OSError as exc:
    out = {"ok": False, "error": type(exc).__name__ + ": " + str(exc)}
out["s"] = round(time.monotonic() - t, 3)
print(json.dumps(out))
"""


def connect(lab: Lab, role: str, host: str, port: int = PORT, timeout: float = 1.5) -> dict:
    result = lab.python(role, CONNECT, host, str(port), str(timeout), timeout=timeout + 10)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def serve(lab: Lab, role: str, port: int = PORT):
    proc = lab.spawn(role, [sys.executable, "-c", SERVE, "0.0.0.0", str(port)], lifetime_s=60)
    proc.expect("listening", timeout=10)
    return proc


@pytest.mark.timeout(60)
def test_a_home_host_reaches_the_public_node_and_arrives_from_its_routers_wan(lab):
    server = serve(lab, "pub")
    out = connect(lab, "h1", lab.addr("pub"))
    assert out["ok"], out
    assert out["local"] == lab.addr("h1") == "100.64.1.2"  # h1 only knows its private address
    seen = server.expect("accepted", timeout=5).split()
    assert seen[1] == lab.wan("h1") == "198.18.1.1", f"no NAT happened:\n{lab.ruleset('r1')}"  # masqueraded
    # and from the other home, its own router's address
    assert connect(lab, "h2", lab.addr("pub"))["ok"]
    assert [line.split()[1] for line in server.lines if line.startswith("accepted")] == ["198.18.1.1", "198.18.2.1"]


@pytest.mark.timeout(60)
def test_the_public_node_cannot_connect_into_a_home(lab):
    serve(lab, "h1")
    assert connect(lab, "r1", lab.addr("h1"))["ok"]  # the listener is there: its LAN reaches it
    private = connect(lab, "pub", lab.addr("h1"))
    assert not private["ok"] and "timed out" in private["error"], private  # the internet drops private addresses
    wan = connect(lab, "pub", lab.wan("h1"))
    assert not wan["ok"] and "timed out" in wan["error"], wan  # the router drops unsolicited connections


@pytest.mark.timeout(60)
def test_two_homes_cannot_reach_each_other(lab):
    serve(lab, "h2")
    assert connect(lab, "r2", lab.addr("h2"))["ok"]
    for target in (lab.addr("h2"), lab.wan("h2")):
        out = connect(lab, "h1", target)
        assert not out["ok"] and "timed out" in out["error"], (target, out)


@pytest.mark.timeout(60)
def test_a_port_forward_makes_a_home_host_reachable(lab):
    server = serve(lab, "h1", 7001)
    lab.forward_port("r1", 7001, "h1")
    assert connect(lab, "pub", lab.wan("h1"), 7001)["ok"]
    assert server.expect("accepted", timeout=5).split()[1] == lab.addr("pub")  # DNAT only: the source is kept
    assert not connect(lab, "pub", lab.wan("h1"), PORT)["ok"]  # other ports stay closed


# Connections from fixed source ports: one JSON list of the local ports used.
CONNECT_FROM = """
import json, socket, sys
ports = []
for port in map(int, sys.argv[3:]):
    c = socket.socket()
    c.bind(("0.0.0.0", port))
    c.settimeout(3)
    c.connect((sys.argv[1], int(sys.argv[2])))
    ports.append(c.getsockname()[1])
    c.close()
print(json.dumps(ports))
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("nat", ["cone", "random"])
def test_cone_nat_keeps_source_ports_and_random_nat_does_not(nat):
    # What TCP hole punching by port prediction (py-libp2p's DCUtR) depends on.
    with netlab(nat=nat) as lab:
        server = serve(lab, "pub")
        ports = [41001, 41002, 41003]
        result = lab.python("h1", CONNECT_FROM, lab.addr("pub"), str(PORT), *map(str, ports))
        assert json.loads(result.stdout) == ports, result.stderr
        wait_until(lambda: len([line for line in server.lines if line.startswith("accepted")]) >= 3, timeout_s=5, interval_s=0.05)
        seen = [line.split() for line in server.lines if line.startswith("accepted")]
        assert [ip for _, ip, _ in seen] == [lab.wan("h1")] * 3
        mapped = [int(port) for _, _, port in seen]
        if nat == "cone":
            assert mapped == ports
        else:
            assert mapped != ports  # each mapping gets a random port (all three kept: about 1 in 2^48)


@pytest.mark.timeout(60)
def test_rejecting_internet_makes_dials_to_private_addresses_fail_at_once():
    with netlab(unroutable="reject") as lab:
        out = connect(lab, "h1", lab.addr("h2"), timeout=5)
        assert not out["ok"] and "timed out" not in out["error"] and out["s"] < 2, out


@pytest.mark.timeout(60)
def test_teardown_removes_the_namespaces_and_their_processes_even_when_the_body_raises():
    with netlab() as lab:
        prefix = lab.prefix
        assert len(lab_namespaces(prefix)) == 6  # net, pub, r1, r2, h1, h2
    assert lab_namespaces(prefix) == []

    with pytest.raises(RuntimeError, match="the body failed"):
        with netlab(homes=1, hosts_per_home=2) as lab:
            prefix = lab.prefix
            assert sorted(lab.hosts) == ["h1", "h1b"] and lab.addr("h1b") == "100.64.1.3"
            sleeper = lab.spawn("h1b", "import time; print('up', flush=True); time.sleep(300)", lifetime_s=300)
            sleeper.expect("up")
            # a process the lab did not spawn itself, still inside its namespace
            stray = subprocess.Popen(["ip", "netns", "exec", lab.ns("pub"), "sleep", "300"])
            raise RuntimeError("the body failed")
    assert lab_namespaces(prefix) == []
    assert sleeper.popen.poll() is not None
    assert stray.wait(5) != 0  # killed by the teardown


# ---- py-libp2p on the lab ---------------------------------------------------------------------------
# A minimal host built as app/swarm/host/host.py builds it (Noise only, TCP, yamux), with an echo protocol,
# steered over stdin: `stream <peer id>` opens an echo stream, `dial <multiaddr> <seconds>` connects.
# Every event is a JSON line on stdout.
PEER = r"""
import json, sys, time
import multiaddr, trio
from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE, Transport as Noise

ECHO = TProtocol("/netlab/echo/1.0.0")

def say(event, **kw):
    print(json.dumps({"event": event, **kw}), flush=True)

async def echo(stream):
    data = await stream.read(64)
    await stream.write(data)
    await stream.close()

async def main(ip, port, bootstrap):
    kp = create_new_key_pair()
    listen = multiaddr.Multiaddr(f"/ip4/{ip}/tcp/{port}")
    host = new_host(key_pair=kp, sec_opt={NOISE: Noise(kp, noise_privkey=create_x25519_key_pair().private_key)},
                    listen_addrs=[listen])
    async with host.run(listen_addrs=[listen]):
        host.set_stream_handler(ECHO, echo)
        say("ready", id=host.get_id().to_base58(), addrs=[str(a) for a in host.get_addrs()])
        if bootstrap:
            t = time.monotonic()
            await host.connect(info_from_p2p_addr(multiaddr.Multiaddr(bootstrap)))
            say("connected", s=round(time.monotonic() - t, 3))
        while True:
            line = await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
            if not line:
                return
            cmd, *args = line.split()
            t = time.monotonic()
            try:
                if cmd == "stream":
                    peer = ID.from_base58(args[0])
                    with trio.fail_after(10):
                        stream = await host.new_stream(peer, [ECHO])
                        await stream.write(b"ping")
                        reply = await stream.read(64)
                    say("stream", ok=reply == b"ping", s=round(time.monotonic() - t, 3))
                elif cmd == "dial":
                    with trio.fail_after(float(args[1])):
                        await host.connect(info_from_p2p_addr(multiaddr.Multiaddr(args[0])))
                    say("dial", ok=True, s=round(time.monotonic() - t, 3))
            except BaseException as exc:
                if not isinstance(exc, Exception):
                    raise
                say(cmd, ok=False, error=f"{type(exc).__name__}: {exc}", s=round(time.monotonic() - t, 3))

trio.run(main, sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "")
"""


def event(proc, name: str, timeout: float) -> dict:
    return json.loads(proc.expect(f'"event": "{name}"', timeout=timeout))


def events(proc, name: str) -> list[dict]:
    return [json.loads(line) for line in proc.lines if line.startswith("{") and f'"event": "{name}"' in line]


@pytest.mark.timeout(120)
def test_libp2p_hosts_behind_two_nats_reach_the_public_host_but_not_each_other(lab):
    started = time.monotonic()
    pub = lab.spawn("pub", [sys.executable, "-c", PEER, lab.addr("pub"), "4001"], lifetime_s=100)
    pub_id = event(pub, "ready", timeout=40)["id"]
    bootstrap = f"/ip4/{lab.addr('pub')}/tcp/4001/p2p/{pub_id}"
    homes = {h: lab.spawn(h, [sys.executable, "-c", PEER, lab.addr(h), "4001", bootstrap], lifetime_s=100)
             for h in ("h1", "h2")}
    ready = {h: event(p, "ready", timeout=40) for h, p in homes.items()}
    for h, p in homes.items():
        assert event(p, "connected", timeout=20)
        # what the node announces today: its LAN address, which nobody outside its home can dial
        assert ready[h]["addrs"] == [f"/ip4/{lab.addr(h)}/tcp/4001/p2p/{ready[h]['id']}"]

    # the public host opens streams to both over the connections they opened (today's fetches from NATed authors)
    for h in ("h1", "h2"):
        pub.send(f"stream {ready[h]['id']}")
    wait_until(lambda: len(events(pub, "stream")) >= 2, timeout_s=25)
    assert [e["ok"] for e in events(pub, "stream")] == [True, True], pub.output

    # h1 dials what h2 announced: nothing answers (the reproduction), and we stop waiting at 5 s
    homes["h1"].send(f"dial {ready['h2']['addrs'][0]} 5")
    dial = event(homes["h1"], "dial", timeout=20)
    assert not dial["ok"] and dial["s"] < 6, dial
    print(f"libp2p lab: {time.monotonic() - started:.1f} s; h1 -> h2 LAN dial: {dial}")
