"""Joining is one line: `swarmling invite` prints an invite, `swarmling join INVITE` turns it into config.

An invite is a swarm's name and the addresses of helpers (public nodes: `swarmling relay`, or any
libp2p peer) that a new node bootstraps through:

    swarmling:1:<base64url, unpadded, of JSON {"swarm": …, "helpers": […]} + a 4-byte checksum>

- `swarmling:` says what it is, `1` the format's version (a newer one is refused by name);
- base64url and `:` only: nothing a shell, a chat app or a URL field would quote, split or change,
  so `swarmling join swarmling:1:…` needs no quotes;
- the checksum (the first 4 bytes of SHA-256 over the version and the JSON) refuses an invite cut
  short or changed in copying, instead of joining a half address. It is not a signature: whoever
  hands out the invite chooses the helpers. What authenticates a helper is its peer ID inside
  the address (Noise checks it at every dial), so a changed IP fails to dial, it cannot be spoofed;
- bounded: at most MAX_HELPERS addresses and MAX_INVITE_CHARS characters, checked before decoding;
  every field is checked with the config's own rules (swarm.name, swarm.bootstrap) and each
  address must parse as a multiaddr, so a decoded invite is always a valid config.

`join` edits the config file like the settings screen does (config_file.py: tomlkit keeps comments
and the other keys; validated before the atomic rename, so a bad invite or a full disk leaves the
file as it was). It sets swarm.name and adds the helpers to swarm.bootstrap (already-listed ones
are not added twice, so running it twice changes nothing the second time). No swarm key is live
(config.LIVE_KEYS): a running node picks the change up when it restarts.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import ipaddress
import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec
from pydantic import ValidationError

from ..config import PEER_ADDR, Config, ConfigError, SwarmSection
from .p2p.addresses import host_addr

SCHEME = "swarmling"
VERSION = 1
MAX_HELPERS = 8
MAX_ADDR_CHARS = 300  # /dns4/<a 253-character name>/tcp/<port>/p2p/<id> fits
MAX_INVITE_CHARS = 2048
CHECK_BYTES = 4
_BASE64URL = re.compile(r"^[A-Za-z0-9_-]+$")


class InviteError(ValueError):
    """An invite that cannot be used, and what to do about it."""


@dataclass(frozen=True)
class Invite:
    swarm: str
    helpers: tuple[str, ...]


class _Payload(msgspec.Struct, forbid_unknown_fields=True):
    swarm: str
    helpers: list[str]


def _check(body: bytes) -> bytes:
    return hashlib.sha256(f"{SCHEME}:{VERSION}:".encode() + body).digest()[:CHECK_BYTES]


def _validate(invite: Invite) -> Invite:
    helpers = tuple(dict.fromkeys(invite.helpers))
    if not helpers:
        raise InviteError("an invite names at least one helper address")
    if len(helpers) > MAX_HELPERS:
        raise InviteError(f"{len(helpers)} helper addresses; an invite holds at most {MAX_HELPERS}")
    for addr in helpers:
        if len(addr) > MAX_ADDR_CHARS:
            raise InviteError(f"helper address {addr[:60]!r}… is over {MAX_ADDR_CHARS} characters")
        if not PEER_ADDR.match(addr):
            raise InviteError(f"{addr!r} is not a helper address; expected /ip4|ip6|dns|dns4|dns6/<host>/tcp/<port>/p2p/<peer id>")
        try:
            import multiaddr

            multiaddr.Multiaddr(addr)
        except Exception as exc:  # noqa: BLE001 — multiaddr raises several unrelated types
            reason = str(exc).split(" (string: ")[0].rsplit("': ", 1)[-1]
            raise InviteError(f"{addr!r} is not a valid address: {reason}") from None
    try:
        SwarmSection(name=invite.swarm, bootstrap=helpers)
    except ValidationError as exc:
        raise InviteError(f"swarm name {invite.swarm!r}: {exc.errors()[0]['msg']}") from None
    return Invite(invite.swarm, helpers)


def encode_invite(invite: Invite) -> str:
    """The one-line invite; InviteError when it would not be a valid one (or too long)."""
    invite = _validate(invite)
    body = msgspec.json.encode(_Payload(invite.swarm, list(invite.helpers)))
    data = base64.urlsafe_b64encode(body + _check(body)).rstrip(b"=").decode("ascii")
    text = f"{SCHEME}:{VERSION}:{data}"
    if len(text) > MAX_INVITE_CHARS:
        raise InviteError(f"the invite would be {len(text)} characters (at most {MAX_INVITE_CHARS}): "
                          "give fewer or shorter helper addresses")
    return text


def decode_invite(text: str) -> Invite:
    """The invite in `text`, checked; InviteError saying what is wrong with it otherwise."""
    text = text.strip()
    if len(text) > MAX_INVITE_CHARS:
        raise InviteError(f"this is {len(text)} characters; an invite has at most {MAX_INVITE_CHARS}: "
                          "it is not one `swarmling invite` made")
    scheme, _, rest = text.partition(":")
    version, _, data = rest.partition(":")
    if scheme != SCHEME or not version:
        raise InviteError(f"not a swarmling invite: one starts with '{SCHEME}:{VERSION}:' "
                          "(copy the whole line `swarmling invite` printed)")
    if version != str(VERSION):
        if version.isdigit() and int(version) > VERSION:
            raise InviteError(f"this invite is version {version}, made by a newer swarmling; this one reads "
                              f"version {VERSION}: update swarmling")
        raise InviteError(f"this invite's version {version[:10]!r} is not one swarmling knows: it was changed in copying")
    if not data:
        raise InviteError("the invite is cut short: nothing follows its version; copy the whole line")
    if not _BASE64URL.match(data):
        bad = sorted({c for c in data if not _BASE64URL.match(c)})
        raise InviteError(f"the invite holds characters an invite never has ({''.join(bad)[:10]!r}): it was "
                          "changed in copying (a line break, quotes, a chat app's formatting?); copy it again")
    try:
        raw = base64.urlsafe_b64decode(data + "=" * (-len(data) % 4))
    except (binascii.Error, ValueError):
        raise InviteError("the invite is cut short or damaged (it does not decode); copy the whole line again") from None
    body, check = raw[:-CHECK_BYTES], raw[-CHECK_BYTES:]
    if len(raw) <= CHECK_BYTES or _check(body) != check:
        raise InviteError("the invite is cut short or damaged (its checksum does not match); copy the whole line again")
    try:
        payload = msgspec.json.decode(body, type=_Payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:  # a checksummed body: made by something else
        raise InviteError(f"the invite's contents are not a version-{VERSION} invite: {exc}") from None
    return _validate(Invite(payload.swarm, tuple(payload.helpers)))


# ---- making one ------------------------------------------------------------------------------


def own_hosts(listen_host: str, public_host: str = "") -> list[str]:
    """Hosts this node can be dialled at from the internet: `public_host` if given, else the
    machine's own global (public) IP addresses. None on a machine behind a home router: its LAN
    addresses mean nothing to a volunteer elsewhere (and say more about the LAN than needed)."""
    if public_host:
        return [public_host]
    from .p2p.addresses import interface_hosts

    candidates = interface_hosts() if listen_host in ("0.0.0.0", "") else [listen_host]
    out = []
    for host in candidates:
        try:
            if ipaddress.ip_address(host).is_global:
                out.append(host)
        except ValueError:
            continue
    return out


def make_invite(config: Config, data_dir: Path, helpers: Sequence[str] = (), public_host: str = "") -> tuple[str, Invite, list[str]]:
    """The invite for `config`'s swarm: this node first when it is publicly dialable (its own
    global IP, or `public_host`), then the config's swarm.bootstrap, then `helpers`.

    Returns the invite, what it holds, and notes for the user (what was left out and why)."""
    sw = config.swarm
    notes: list[str] = []
    own: list[str] = []
    hosts = own_hosts(sw.listen_host, public_host)
    if hosts and sw.port == 0:
        notes.append("this node is left out: swarm.port is 0 (a new port at every start); set a fixed port to invite to it")
    elif hosts:
        from .p2p.identity import IdentityError, load_or_create

        try:
            peer_id = load_or_create(data_dir).peer_id
        except IdentityError as exc:
            raise InviteError(str(exc)) from None
        own = [host_addr(h, sw.port, peer_id) for h in hosts]
    else:
        notes.append("this node is left out: it has no public address (give --public-host if a port is forwarded to it)")
    wanted = list(dict.fromkeys([*own, *sw.bootstrap, *helpers]))
    if not wanted:
        raise InviteError("no helper to invite to: run `swarmling invite` on a public helper (`swarmling relay`), "
                          "or name helpers with --helper ADDRESS or in swarm.bootstrap")
    if len(wanted) > MAX_HELPERS:
        notes.append(f"{len(wanted) - MAX_HELPERS} of {len(wanted)} addresses left out: an invite holds {MAX_HELPERS}")
        wanted = wanted[:MAX_HELPERS]
    invite = Invite(sw.name, tuple(wanted))
    return encode_invite(invite), _validate(invite), notes


# ---- joining -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Joined:
    changes: tuple[str, ...]  # what changed in the file, one line each; empty: it already said so
    overridden: tuple[str, ...]  # changed keys an environment variable still overrides


def join(file: Path, invite: Invite, *, replace: bool = False) -> Joined:
    """Set swarm.name and add the invite's helpers to swarm.bootstrap in `file` (created if missing).

    Only the file's own values count (not the environment's or flags'): those are what gets
    written. Nothing is written when nothing changes; ConfigError when the file cannot be read or
    the result would not be valid, and then the file is as it was."""
    from ..config_file import update_config_file

    try:
        data = tomllib.loads(file.read_text(encoding="utf-8")) if file.exists() else {}
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {file}: {exc}; it is unchanged") from None
    swarm = data.get("swarm", {})
    listed = swarm.get("bootstrap", []) if isinstance(swarm, dict) else None
    if not isinstance(listed, list) or not all(isinstance(a, str) for a in listed):
        raise ConfigError(f"{file}: swarm.bootstrap is not a list of addresses; fix it first (the file is unchanged)")
    old_name, old_bootstrap = swarm.get("name", SwarmSection().name), list(listed)
    kept = [] if replace else old_bootstrap
    bootstrap = list(dict.fromkeys([*kept, *invite.helpers]))
    changes: dict[str, object] = {}
    lines = []
    if old_name != invite.swarm or "name" not in swarm:
        changes["swarm.name"] = invite.swarm
        lines.append(f"swarm.name = {invite.swarm!r}" + (f" (was {old_name!r})" if old_name != invite.swarm else ""))
    if bootstrap != old_bootstrap:
        import tomlkit

        array = tomlkit.array()
        array.extend(bootstrap)
        changes["swarm.bootstrap"] = array.multiline(True)
        added = [a for a in bootstrap if a not in old_bootstrap]
        dropped = [a for a in old_bootstrap if a not in bootstrap]
        lines += [f"swarm.bootstrap + {a}" for a in added] + [f"swarm.bootstrap - {a}" for a in dropped]
    if not changes:
        return Joined((), ())
    _, overridden = update_config_file(file, changes)
    return Joined(tuple(lines), tuple(overridden))
