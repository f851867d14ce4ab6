"""swarm/'s layers: each subpackage imports only those below it, and verification never pulls in
py-libp2p (a node checks peers' groups the same way with or without a network).

    verification/   no libp2p                              imports nothing else of swarm/
    p2p/            libp2p's parts: threads, streams, …    imports nothing else of swarm/
    nat/            dial-back, relay slots                 p2p/
    host/           the host and the swarm's protocols     nat/, p2p/, verification/
    facade, network, given, helper, invite                 any of them
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SWARM = Path(__file__).resolve().parents[1] / "app" / "swarm"
BELOW = {"verification": set(), "p2p": set(), "nat": {"p2p"}, "host": {"nat", "p2p", "verification"}}


@pytest.mark.parametrize("package", sorted(BELOW))
def test_a_layer_imports_only_the_layers_below_it(package, module_imports):
    for path in sorted((SWARM / package).glob("*.py")):
        used = {n.removeprefix("swarmling.app.swarm.").split(".")[0] for n in module_imports(path)
                if n.startswith("swarmling.app.swarm.")}
        assert used <= BELOW[package] | {package}, (path.name, used - BELOW[package] - {package})


def test_every_module_of_swarm_is_in_a_layer_or_at_the_top():
    top = {p.stem for p in SWARM.glob("*.py")}
    assert top == {"__init__", "facade", "network", "given", "helper", "invite"}
    assert {p.name for p in SWARM.iterdir() if p.is_dir() and p.name != "__pycache__"} == set(BELOW)


def test_verification_runs_without_libp2p():
    modules = sorted(f"swarmling.app.swarm.verification.{p.stem}" for p in (SWARM / "verification").glob("*.py"))
    code = "import importlib, sys\n" + "".join(f"importlib.import_module({m!r})\n" for m in modules) + \
        "print(sorted(m for m in sys.modules if m == 'libp2p' or m.startswith('libp2p.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
