"""The node's persistent identity: private, stable, and a cloned one is caught."""

from __future__ import annotations

import stat
import subprocess
import sys

import pytest

from swarmling.app.swarm.p2p.identity import IdentityError, load_or_create, new_identity


def test_identity_is_private_and_stable(tmp_path):
    first = load_or_create(tmp_path, fingerprint="machine-a")
    assert first.created and first.peer_id.startswith("12D3KooW")
    for name in ("identity.key", "identity.json"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600
    again = load_or_create(tmp_path, fingerprint="machine-a")
    assert not again.created and again.peer_id == first.peer_id


def test_a_cloned_identity_is_refused_with_the_way_out(tmp_path):
    original = load_or_create(tmp_path, fingerprint="machine-a")
    with pytest.raises(IdentityError, match="swarmling id --new"):
        load_or_create(tmp_path, fingerprint="machine-b")
    adopted = load_or_create(tmp_path, fingerprint="machine-b", adopt=True)
    assert adopted.peer_id == original.peer_id
    assert load_or_create(tmp_path, fingerprint="machine-b").peer_id == original.peer_id  # adopted for good
    fresh = new_identity(tmp_path, fingerprint="machine-b")
    assert fresh.peer_id != original.peer_id


def test_a_corrupt_key_is_a_clear_error(tmp_path):
    (tmp_path / "identity.key").write_bytes(b"not a key")
    with pytest.raises(IdentityError, match="not a usable identity key"):
        load_or_create(tmp_path)


def test_id_command_prints_peer_id_and_dialable_addresses(tmp_path):
    run = [sys.executable, "-m", "swarmling.app", "--home", str(tmp_path), "id", "--port", "4100"]
    out = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    peer_id = out.stdout.split()[2]
    assert f"/ip4/127.0.0.1/tcp/4100/p2p/{peer_id}" in out.stdout
    again = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert again.stdout.split()[2] == peer_id
    new = subprocess.run([*run, "--new"], capture_output=True, text=True, timeout=120)
    assert new.stdout.split()[2] != peer_id
