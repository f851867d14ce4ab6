"""A network-namespace lab: a small simulated internet with home routers doing NAT, on one machine.

Each node gets its own Linux network stack (`ip netns`), so a test can run real swarm code
between a public helper and volunteers behind two home NATs. Topology (defaults; every name gets a
per-run prefix, so parallel or aborted runs never clash):

            "net" namespace: the internet. Bridge br0 (198.18.0.1/15), forwarding on, and a
            blackhole default route: packets for addresses the internet does not route (the
            homes' 100.64.x.x, anything else) vanish, as they do on the real internet.
           /                         |                              \\
    pub  198.18.0.10/15        r1  wan 198.18.1.1/15          r2  wan 198.18.2.1/15
    (pub2 198.18.0.11, ...)        lan 100.64.1.1/24              lan 100.64.2.1/24
                                    |                              |
                               h1  100.64.1.2/24              h2  100.64.2.2/24
                               (h1b 100.64.1.3, ...)          (h2b 100.64.2.3, ...)

- Public namespaces and routers have a default route via 198.18.0.1; hosts via their router.
- Each router masquerades what leaves its wan (Linux conntrack NAT: it keeps the source port when
  free, and lets in only replies from the exact address and port a LAN host sent to: a
  port-restricted cone), forwards LAN -> wan and established/related back, and drops everything
  else arriving on its wan (a home router's firewall: unsolicited connections time out rather
  than being refused). `Lab.forward_port` adds a port forward (DNAT) when a test wants a
  reachable home node. `unroutable="reject"` makes the internet answer ICMP unreachable instead
  of dropping (dials to private addresses then fail at once). `nat="random"` makes the routers
  pick a random external port for every mapping (`masquerade random`): the NATs that defeat
  hole punching by port prediction (symmetric NATs, many carrier-grade NATs) behave like that.

Use it as a context manager (`with netlab() as lab:`) or through the `lab` fixture (import it
into the test module: `from netlab import lab`). Everything the lab starts dies at teardown, also
when the body raises: the processes it spawned (each also bounded by its own `lifetime_s`), then
any process left inside its namespaces, then the namespaces (their veths and bridges go with
them). Where namespaces cannot be made (not root, no `ip`, no nft/iptables, a kernel without NAT)
tests skip with the reason; with SWARMLING_NETLAB=require (set by .ci/run) they fail instead.

Running code in a namespace: `lab.run("h1", [...])`, `lab.python("h1", "print(1)")` (this
interpreter, i.e. the venv's python, with this environment), and `lab.spawn("pub", code)` for
long-running processes whose output lines a test can wait for (`proc.expect("listening")`).
"""

from __future__ import annotations

import functools
import os
import queue
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

NETNS_DIR = Path("/run/netns")
PREFIX = "swl"  # every lab namespace is named swl-<pid>-<random>-<role>
INTERNET = "198.18.0.0/15"  # RFC 2544 benchmarking range: the simulated internet
INTERNET_GW = "198.18.0.1"
PUBLIC_BASE = 10  # pub = 198.18.0.10, pub2 = .11, ...
CMD_TIMEOUT_S = 10.0  # one `ip`/`nft` command while building or tearing down


class LabError(RuntimeError):
    """Building the lab failed after the probe said namespaces work: a bug, not a skip."""


# ---- can this machine build it? ------------------------------------------------------------------
def _cmd(argv: Sequence[str], timeout: float = CMD_TIMEOUT_S, input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, input=input)


def _firewall() -> str | None:
    if shutil.which("nft"):
        return "nft"
    if shutil.which("iptables"):
        return "iptables"
    return None


@functools.cache
def unavailable_reason() -> str | None:
    """Why the lab cannot be built here, or None. Probes a throwaway namespace with a NAT rule."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux (this is {sys.platform})"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed"
    fw = _firewall()
    if fw is None:
        return "neither `nft` nor `iptables` is installed (Debian: apt-get install nftables)"
    probe = f"{PREFIX}-{os.getpid()}-{secrets.token_hex(3)}-probe"
    try:
        made = _cmd(["ip", "netns", "add", probe])
        if made.returncode != 0:
            return f"`ip netns add` failed (root or CAP_SYS_ADMIN needed): {made.stderr.strip()}"
        if fw == "nft":
            rules = "table ip probe {\n chain c { type nat hook postrouting priority srcnat; masquerade; }\n}\n"
            nat = _cmd(["ip", "netns", "exec", probe, "nft", "-f", "-"], input=rules)
        else:
            nat = _cmd(["ip", "netns", "exec", probe, "iptables", "-t", "nat", "-A", "POSTROUTING", "-j", "MASQUERADE"])
        if nat.returncode != 0:
            return f"NAT rules cannot be loaded in a namespace ({fw}): {nat.stderr.strip()}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"probing network namespaces failed: {exc}"
    finally:
        _cmd(["ip", "netns", "del", probe])
    return None


def skip_unless_available() -> None:
    reason = unavailable_reason()
    if reason is None:
        return
    if os.environ.get("SWARMLING_NETLAB") == "require":
        pytest.fail(f"SWARMLING_NETLAB=require but the namespace lab is unavailable: {reason}")
    pytest.skip(f"namespace lab unavailable: {reason}")


def sweep_stale() -> list[str]:
    """Delete lab namespaces left by runs that were killed before their teardown.

    Only ones whose creating process is gone and that hold no process: a live run's lab is never
    touched (pid reuse can only make a stale one wait for a later sweep).
    """
    removed = []
    try:
        names = [p.name for p in NETNS_DIR.iterdir()]
    except OSError:
        return removed
    for name in names:
        parts = name.split("-")
        if len(parts) < 4 or parts[0] != PREFIX or not parts[1].isdigit():
            continue
        if Path(f"/proc/{parts[1]}").exists():
            continue
        pids = _cmd(["ip", "netns", "pids", name])
        if pids.returncode == 0 and not pids.stdout.strip():
            _cmd(["ip", "netns", "del", name])
            removed.append(name)
    return removed


# ---- processes inside a namespace ----------------------------------------------------------------
class LabProcess:
    """A process running in a lab namespace: its output lines collected as they come."""

    def __init__(self, role: str, argv: list[str], env: dict[str, str], cwd: str | None) -> None:
        self.role = role
        self.argv = argv
        self.lines: list[str] = []  # stdout and stderr, interleaved, without newlines
        self._new: queue.Queue[str | None] = queue.Queue()
        self.popen = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, bufsize=1, env=env, cwd=cwd, start_new_session=True)
        self._reader = threading.Thread(target=self._read, name=f"netlab-{role}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            line = line.rstrip("\n")
            self.lines.append(line)
            self._new.put(line)
        self._new.put(None)

    def expect(self, text: str, timeout: float = 10.0) -> str:
        """The first line (already seen or still to come) that contains `text`; fails after `timeout`."""
        for line in list(self.lines):
            if text in line:
                return line
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._new.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                self._new.put(None)  # keep the end visible to later calls
                break
            if text in line:
                return line
        raise AssertionError(f"{self.role}: no line containing {text!r} within {timeout:.1f} s "
                             f"(exit {self.popen.poll()}); output:\n" + "\n".join(self.lines[-40:]))

    def send(self, line: str) -> None:
        """Write one line to the process's stdin."""
        assert self.popen.stdin is not None
        self.popen.stdin.write(line + "\n")
        self.popen.stdin.flush()

    def wait(self, timeout: float) -> int:
        rc = self.popen.wait(timeout)
        self._reader.join(2.0)
        return rc

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def kill(self) -> None:
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)  # its own session: `ip netns exec`, timeout, python
            except ProcessLookupError:
                pass
        try:
            self.popen.wait(5.0)
        except subprocess.TimeoutExpired:
            pass
        for stream in (self.popen.stdin, self.popen.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass


# ---- the lab ---------------------------------------------------------------------------------------
@dataclass
class Lab:
    prefix: str
    homes: int
    hosts_per_home: int
    publics: int
    unroutable: str
    nat: str
    firewall: str
    roles: list[str] = field(default_factory=list)  # in creation order: net, pubs, routers, hosts
    addrs: dict[str, str] = field(default_factory=dict)  # role -> its address (routers: the wan)
    lan_addrs: dict[str, str] = field(default_factory=dict)  # router -> its LAN address
    router_of: dict[str, str] = field(default_factory=dict)  # host -> its router
    procs: list[LabProcess] = field(default_factory=list)

    # names and addresses
    def ns(self, role: str) -> str:
        if role not in self.roles:
            raise KeyError(f"no {role!r} in this lab (it has {', '.join(self.roles)})")
        return f"{self.prefix}-{role}"

    def addr(self, role: str) -> str:
        """A public node's or host's own address; a router's WAN address."""
        return self.addrs[role]

    def wan(self, host: str) -> str:
        """The address a host's traffic seems to come from on the internet (its router's WAN)."""
        return self.addrs[self.router_of[host]]

    @property
    def public(self) -> list[str]:
        return [r for r in self.roles if r.startswith("pub")]

    @property
    def hosts(self) -> list[str]:
        return [r for r in self.roles if r.startswith("h")]

    # running things in a namespace
    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {**os.environ, "PYTHONUNBUFFERED": "1", **(extra or {})}

    def run(self, role: str, argv: Sequence[str], timeout: float = 20.0, check: bool = False,
            input: str | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """Run a command in `role`'s namespace and wait for it (at most `timeout`, then it is killed)."""
        result = subprocess.run(["ip", "netns", "exec", self.ns(role), *argv], capture_output=True, text=True,
                                timeout=timeout, input=input, env=self.env(env))
        if check and result.returncode != 0:
            raise LabError(f"{role}: {' '.join(argv)} -> {result.returncode}: {result.stderr.strip()}")
        return result

    def python(self, role: str, code: str, *args: str, timeout: float = 20.0,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """`python -c code args...` in `role`'s namespace, with this interpreter and environment."""
        return self.run(role, [sys.executable, "-c", code, *args], timeout=timeout, env=env)

    def spawn(self, role: str, argv: Sequence[str] | str, lifetime_s: float = 60.0,
              env: dict[str, str] | None = None, cwd: str | None = None) -> LabProcess:
        """Start a long-running process in `role`'s namespace: a python code string, or an argv.

        It is killed after `lifetime_s` whatever happens to the test (coreutils `timeout` inside
        the namespace, SIGKILL 2 s after SIGTERM), and at the lab's teardown.
        """
        command = [sys.executable, "-c", argv] if isinstance(argv, str) else list(argv)
        full = ["ip", "netns", "exec", self.ns(role), "timeout", "-k", "2", f"{lifetime_s:g}", *command]
        proc = LabProcess(role, full, self.env(env), cwd)
        self.procs.append(proc)
        return proc

    def forward_port(self, router: str, port: int, host: str, host_port: int | None = None, proto: str = "tcp") -> None:
        """A port forward on `router`'s WAN `port` to `host` (a home node made publicly reachable)."""
        target, to_port = self.addrs[host], host_port or port
        if self.firewall == "nft":
            self.run(router, ["nft", "add", "rule", "ip", "lab", "nat_in", "iifname", "wan", proto, "dport", str(port),
                              "dnat", "to", f"{target}:{to_port}"], check=True)
        else:
            self.run(router, ["iptables", "-t", "nat", "-A", "PREROUTING", "-i", "wan", "-p", proto, "--dport", str(port),
                              "-j", "DNAT", "--to-destination", f"{target}:{to_port}"], check=True)

    def ruleset(self, router: str) -> str:
        """The router's NAT/filter rules, for a failing test's message."""
        argv = ["nft", "list", "ruleset"] if self.firewall == "nft" else ["iptables-save"]
        return self.run(router, argv).stdout


def _ip(ns: str, *args: str) -> None:
    result = _cmd(["ip", "-n", ns, *args])
    if result.returncode != 0:
        raise LabError(f"ip -n {ns} {' '.join(args)}: {result.stderr.strip()}")


def _in_ns(ns: str, argv: Sequence[str], input: str | None = None) -> None:
    result = _cmd(["ip", "netns", "exec", ns, *argv], input=input)
    if result.returncode != 0:
        raise LabError(f"{ns}: {' '.join(argv)}: {result.stderr.strip()}")


def _sysctl(ns: str, key: str, value: str) -> None:
    _in_ns(ns, ["sh", "-c", f"echo {value} > /proc/sys/{key.replace('.', '/')}"])


# A home router: masquerade out of wan, forward LAN -> wan and replies back (and port forwards),
# drop anything else that arrives on wan.
NFT_ROUTER = """
table ip lab {
  chain nat_in { type nat hook prerouting priority dstnat; policy accept; }
  chain nat_out { type nat hook postrouting priority srcnat; policy accept; oifname "wan" MASQUERADE; }  # or: masquerade random
  chain through { type filter hook forward priority filter; policy drop;
    ct state established,related accept; ct status dnat accept; iifname "lan" oifname "wan" accept; }
  chain to_router { type filter hook input priority filter; policy accept;
    iifname "wan" ct state established,related accept; iifname "wan" drop; }
}
"""
IPTABLES_ROUTER = [  # after the masquerade rule
    ["-P", "FORWARD", "DROP"],
    ["-A", "FORWARD", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"],
    ["-A", "FORWARD", "-m", "conntrack", "--ctstate", "DNAT", "-j", "ACCEPT"],
    ["-A", "FORWARD", "-i", "lan", "-o", "wan", "-j", "ACCEPT"],
    ["-A", "INPUT", "-i", "wan", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"],
    ["-A", "INPUT", "-i", "wan", "-j", "DROP"],
]


def _build(lab: Lab) -> None:
    net = lab.ns("net")
    for role in lab.roles:
        made = _cmd(["ip", "netns", "add", lab.ns(role)])
        if made.returncode != 0:
            raise LabError(f"ip netns add {lab.ns(role)}: {made.stderr.strip()}")
        _ip(lab.ns(role), "link", "set", "lo", "up")
    # the internet: one switch, forwarding to nowhere
    _ip(net, "link", "add", "br0", "type", "bridge")
    _ip(net, "addr", "add", f"{INTERNET_GW}/15", "dev", "br0")
    _ip(net, "link", "set", "br0", "up")
    _sysctl(net, "net.ipv4.ip_forward", "1")
    _ip(net, "route", "add", "blackhole" if lab.unroutable == "drop" else "unreachable", "default")
    for i, role in enumerate([*lab.public, *[r for r in lab.roles if r.startswith("r")]]):
        port = f"p{i}"  # the switch port; names are per namespace, so nothing global can clash
        _ip(net, "link", "add", port, "type", "veth", "peer", "name", "wan", "netns", lab.ns(role))
        _ip(net, "link", "set", port, "master", "br0", "up")
        _ip(lab.ns(role), "addr", "add", f"{lab.addrs[role]}/15", "dev", "wan")
        _ip(lab.ns(role), "link", "set", "wan", "up")
        _ip(lab.ns(role), "route", "add", "default", "via", INTERNET_GW)
    # the homes
    for router, lan_addr in lab.lan_addrs.items():
        rns = lab.ns(router)
        _ip(rns, "link", "add", "lan", "type", "bridge")
        _ip(rns, "addr", "add", f"{lan_addr}/24", "dev", "lan")
        _ip(rns, "link", "set", "lan", "up")
        _sysctl(rns, "net.ipv4.ip_forward", "1")
        if lab.firewall == "nft":
            masquerade = "masquerade random" if lab.nat == "random" else "masquerade"
            _in_ns(rns, ["nft", "-f", "-"], input=NFT_ROUTER.replace("MASQUERADE", masquerade))
        else:
            masquerade = ["-t", "nat", "-A", "POSTROUTING", "-o", "wan", "-j", "MASQUERADE"]
            for rule in [masquerade + (["--random"] if lab.nat == "random" else []), *IPTABLES_ROUTER]:
                _in_ns(rns, ["iptables", *rule])
        for k, host in enumerate(h for h, r in lab.router_of.items() if r == router):
            hns = lab.ns(host)
            _ip(rns, "link", "add", f"l{k}", "type", "veth", "peer", "name", "eth0", "netns", hns)
            _ip(rns, "link", "set", f"l{k}", "master", "lan", "up")
            _ip(hns, "addr", "add", f"{lab.addrs[host]}/24", "dev", "eth0")
            _ip(hns, "link", "set", "eth0", "up")
            _ip(hns, "route", "add", "default", "via", lan_addr)


def _teardown(lab: Lab) -> None:
    for proc in lab.procs:
        proc.kill()
    for role in reversed(lab.roles):
        name = f"{lab.prefix}-{role}"
        if not (NETNS_DIR / name).exists():
            continue
        # anything still inside runs in our namespace, so it is ours: end it, one pid at a time
        pids = _cmd(["ip", "netns", "pids", name]).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        _cmd(["ip", "netns", "del", name])


@contextmanager
def netlab(homes: int = 2, hosts_per_home: int = 1, publics: int = 1, unroutable: str = "drop",
           nat: str = "cone") -> Iterator[Lab]:
    """Build the lab (skipping the test when this machine cannot), yield it, always tear it down."""
    if not 1 <= homes <= 250 or not 1 <= hosts_per_home <= 26 or not 1 <= publics <= 200:
        raise ValueError("homes 1-250, hosts_per_home 1-26, publics 1-200")
    if unroutable not in ("drop", "reject"):
        raise ValueError("unroutable is 'drop' or 'reject'")
    if nat not in ("cone", "random"):
        raise ValueError("nat is 'cone' (port-preserving masquerade) or 'random' (a random port per mapping)")
    skip_unless_available()
    sweep_stale()
    lab = Lab(prefix=f"{PREFIX}-{os.getpid()}-{secrets.token_hex(3)}", homes=homes, hosts_per_home=hosts_per_home,
              publics=publics, unroutable=unroutable, nat=nat, firewall=_firewall() or "")
    lab.roles.append("net")
    for p in range(publics):
        role = "pub" if p == 0 else f"pub{p + 1}"
        lab.roles.append(role)
        lab.addrs[role] = f"198.18.0.{PUBLIC_BASE + p}"
    for i in range(1, homes + 1):
        lab.roles.append(f"r{i}")
        lab.addrs[f"r{i}"] = f"198.18.{i}.1"
        lab.lan_addrs[f"r{i}"] = f"100.64.{i}.1"
    for i in range(1, homes + 1):
        for k in range(hosts_per_home):
            host = f"h{i}" if k == 0 else f"h{i}{chr(ord('a') + k)}"
            lab.roles.append(host)
            lab.addrs[host] = f"100.64.{i}.{2 + k}"
            lab.router_of[host] = f"r{i}"
    try:
        _build(lab)
        yield lab
    finally:
        _teardown(lab)


@pytest.fixture
def lab() -> Iterator[Lab]:
    """The default lab: pub, r1/h1, r2/h2."""
    with netlab() as built:
        yield built


def lab_namespaces(prefix: str | None = None) -> list[str]:
    """Lab namespaces that exist now (this run's, when `prefix` is given)."""
    try:
        names = [p.name for p in NETNS_DIR.iterdir()]
    except OSError:
        return []
    return sorted(n for n in names if n.startswith(f"{prefix or PREFIX}-"))


if __name__ == "__main__":  # python tests/netlab.py: delete namespaces that killed runs left behind
    print("\n".join(sweep_stale()) or "nothing stale")
