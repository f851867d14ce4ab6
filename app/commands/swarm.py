"""The swarm's commands: `swarmling invite`, `join`, `id` and `relay` (the helper). Each prints for
the user and returns the exit status; `cli.py` parses their arguments and calls them. Listing this
machine's addresses imports no py-libp2p (a second and 70 MB); the peer identity does."""

from __future__ import annotations

import sys
from pathlib import Path

from ..config import Config, ConfigError
from .arguments import Invocation, add_config_flags, positive


def invite_command(config: Config, paths, helpers: list[str], public_host: str) -> int:
    from ..swarm.invite import InviteError, make_invite

    try:
        text, invite, notes = make_invite(config, paths.data_dir, helpers, public_host)
    except InviteError as exc:
        print(f"swarmling: {exc}", file=sys.stderr)
        return 1
    print(text)  # alone on stdout: `swarmling invite > invite.txt` holds just the invite
    print(f"swarm {invite.swarm!r} through {len(invite.helpers)} helper(s):", file=sys.stderr)
    for addr in invite.helpers:
        print(f"  {addr}", file=sys.stderr)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    print("a volunteer joins with: swarmling join <the line above>", file=sys.stderr)
    return 0


def join_command(paths, config_file: Path, text: str, replace: bool) -> int:
    from ..node.control import ControlError, send
    from ..swarm.invite import InviteError, decode_invite, join

    try:
        invite = decode_invite(text)
        joined = join(config_file, invite, replace=replace)
    except InviteError as exc:
        print(f"swarmling: not joining: {exc}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"swarmling: not joining: {exc}", file=sys.stderr)
        return 1
    if not joined.changes:
        print(f"already in swarm {invite.swarm!r} with these helpers: {config_file} is unchanged")
        return 0
    print(f"joined swarm {invite.swarm!r}; {config_file}:")
    for line in joined.changes:
        print(f"  {line}")
    for key in joined.overridden:
        print(f"note: {key} is still overridden by an environment variable (SWARMLING_{key.upper().replace('.', '__')})")
    try:
        send(paths.state_dir, "status", timeout_s=2.0)
        print("the running node keeps its swarm until it restarts: stop it and start it again to join")
    except ControlError:
        pass
    return 0


def identity_command(config: Config, paths, *, new: bool, adopt: bool) -> int:
    from ..swarm.p2p.identity import IdentityError, load_or_create, new_identity

    paths.ensure()
    try:
        identity = new_identity(paths.data_dir) if new else load_or_create(paths.data_dir, adopt=adopt)
    except IdentityError as exc:
        print(f"swarmling: {exc}", file=sys.stderr)
        return 1
    sw = config.swarm
    print(f"peer id  {identity.peer_id}{'  (new)' if identity.created else ''}")
    print(f"swarm    {sw.name}{'' if sw.enabled else ' (disabled in config)'}")
    print("dial me at (give one of these to a friend's --peer):")
    for host in listen_hosts(sw.listen_host):
        port = sw.port if sw.port else "<port chosen at start>"
        print(f"  /ip4/{host}/tcp/{port}/p2p/{identity.peer_id}")
    return 0


def relay_command(config: Config, paths, public_host: str, every_s: float) -> int:
    from ..swarm.helper import Helper, HelperSettings
    from ..swarm.host.host import SwarmError
    from ..swarm.p2p.identity import IdentityError, load_or_create

    paths.ensure()
    sw = config.swarm
    try:
        helper = Helper(HelperSettings(sw.name, sw.listen_host, sw.port, (*sw.bootstrap, *sw.peers), public_host),
                        load_or_create(paths.data_dir), paths.data_dir)
        helper.start()
    except (IdentityError, SwarmError, ValueError) as exc:
        print(f"swarmling: {exc}", file=sys.stderr)
        return 1
    from ..swarm.invite import InviteError, make_invite

    print(f"helper for swarm {sw.name!r}: peer {helper.identity.peer_id}, listening on {', '.join(helper.host.listen_addrs)}")
    try:
        invite, _, _ = make_invite(config, paths.data_dir, helpers=helper.addresses() if public_host else (),
                                   public_host=public_host)
        print(f"volunteers join with:  swarmling join {invite}")
    except InviteError:
        print("no public address found on this machine: pass --public-host (the IP or name peers dial), then "
              "`swarmling invite --public-host ...` prints the line volunteers join with")
    print(f"figures every {every_s:.0f} s below and in {helper.figures_file}")
    sys.stdout.flush()
    try:
        helper.run_until_stopped(every_s, say=lambda line: print(line, flush=True))
    finally:
        helper.stop()
    return 0


def listen_hosts(listen_host: str) -> list[str]:
    from ..swarm.p2p.addresses import interface_hosts

    return interface_hosts() if listen_host in ("0.0.0.0", "") else [listen_host]


def identity_arguments(p) -> None:
    who = p.add_mutually_exclusive_group()
    who.add_argument("--new", action="store_true", help="replace the identity with a fresh one (a cloned machine, a leaked key)")
    who.add_argument("--adopt", action="store_true", help="keep the identity on this machine after moving the node here")
    add_config_flags(p)


def identity_main(c: Invocation) -> int:
    return identity_command(c.config, c.paths, new=c.args.new, adopt=c.args.adopt)


def invite_arguments(p) -> None:
    p.add_argument("--helper", dest="helpers", action="append", default=[], metavar="MULTIADDR",
                   help="also invite through this helper, /ip4|dns4/…/tcp/…/p2p/<peer id> (repeatable)")
    p.add_argument("--public-host", default="", metavar="IP|NAME",
                   help="this machine's public IP or DNS name, when it is not on one of its interfaces "
                        "(a forwarded port, a cloud VM)")
    add_config_flags(p)


def invite_main(c: Invocation) -> int:
    return invite_command(c.config, c.paths, c.args.helpers, c.args.public_host)


def join_arguments(p) -> None:
    p.add_argument("invite", help="the line `swarmling invite` printed (swarmling:1:…)")
    p.add_argument("--replace", action="store_true", help="drop the helpers listed before instead of keeping them")


def join_main(c: Invocation) -> int:
    return join_command(c.paths, c.config_file, c.args.invite, c.args.replace)


def relay_arguments(p) -> None:
    p.add_argument("--public-host", default="", metavar="IP",
                   help="the address peers dial when it is not this machine's (a forwarded port on a home router)")
    p.add_argument("--every", type=positive, default=60, metavar="S", help="print figures every S seconds (default 60)")
    add_config_flags(p)


def relay_main(c: Invocation) -> int:
    return relay_command(c.config, c.paths, c.args.public_host, c.args.every)
