"""The node's persistent libp2p identity: an Ed25519 key in the data dir (mode 0600).

Beside the key, a small stamp records a fingerprint of the machine that made it. A data dir
copied to a second machine (a cloned disk image, a restored backup) would give two nodes one
peer ID, and they would keep knocking each other off the swarm: the stamp catches that, and
the user is offered a fresh identity instead of a silent clash.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from pathlib import Path

from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.serialization import deserialize_private_key
from libp2p.peer.id import ID

from ....backends.atomic import write_atomic

KEY_FILE = "identity.key"
STAMP_FILE = "identity.json"


class IdentityError(RuntimeError):
    """The identity cannot be used as it is; the message says what to run."""


@dataclass(frozen=True)
class Identity:
    key_pair: KeyPair
    peer_id: str
    created: bool  # made just now


def machine_fingerprint() -> str:
    """A stable, non-reversible id of this machine (never sent anywhere)."""
    raw = ""
    for candidate in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
        try:
            raw = Path(candidate).read_text(encoding="ascii").strip()
            break
        except OSError:
            continue
    if not raw:
        raw = f"mac:{uuid.getnode():012x}"
    return hashlib.sha256(f"swarmling:{raw}".encode()).hexdigest()[:32]


def _write_private(path: Path, data: bytes) -> None:
    """Atomic, and never readable by others, not even for an instant."""
    write_atomic(path, data, fsync=True, mode=0o600)


def peer_id_of(key_pair: KeyPair) -> str:
    return ID.from_pubkey(key_pair.public_key).to_base58()


def load_or_create(data_dir: Path, *, fingerprint: str | None = None, adopt: bool = False) -> Identity:
    data_dir.mkdir(parents=True, exist_ok=True)
    key_path, stamp_path = data_dir / KEY_FILE, data_dir / STAMP_FILE
    here = fingerprint or machine_fingerprint()
    if not key_path.exists():
        return new_identity(data_dir, fingerprint=here)
    try:
        key_pair = KeyPair(private_key := deserialize_private_key(key_path.read_bytes()), private_key.get_public_key())
    except Exception as exc:  # noqa: BLE001 — a truncated or foreign file
        raise IdentityError(
            f"{key_path} is not a usable identity key ({exc}); move it away and a new one is made at start"
        ) from None
    peer_id = peer_id_of(key_pair)
    try:
        stamp = json.loads(stamp_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        stamp = {}
    if stamp.get("machine") not in (None, here) and not adopt:
        raise IdentityError(
            f"the swarm identity in {data_dir} ({peer_id[:20]}…) was created on another machine — a copied "
            "data dir or disk image? Two nodes sharing one peer ID knock each other off the swarm. Run "
            "`swarmling id --new` for a fresh identity, or `swarmling id --adopt` if this node moved here for good"
        )
    if stamp.get("machine") != here or stamp.get("peer_id") != peer_id:
        _write_stamp(stamp_path, peer_id, here)
    return Identity(key_pair, peer_id, created=False)


def new_identity(data_dir: Path, *, fingerprint: str | None = None) -> Identity:
    data_dir.mkdir(parents=True, exist_ok=True)
    key_pair = create_new_key_pair()
    _write_private(data_dir / KEY_FILE, key_pair.private_key.serialize())
    peer_id = peer_id_of(key_pair)
    _write_stamp(data_dir / STAMP_FILE, peer_id, fingerprint or machine_fingerprint())
    return Identity(key_pair, peer_id, created=True)


def _write_stamp(path: Path, peer_id: str, machine: str) -> None:
    _write_private(path, json.dumps({"peer_id": peer_id, "machine": machine}).encode())
