"""Joining is one line: invites made and refused, `join` editing the config file, and the
addresses an invite may hold dialled for real (DNS names, peers remembered across restarts)."""

from __future__ import annotations

import base64

import pytest
import trio
from swarm_peers import honest
from waiting import wait_until

from swarmling.app.cli import main
from swarmling.app.config import Config, SwarmSection, load_config
from swarmling.app.swarm.host.dialer import resolve
from swarmling.app.swarm.invite import (
    MAX_HELPERS,
    MAX_INVITE_CHARS,
    Invite,
    InviteError,
    decode_invite,
    encode_invite,
    join,
    make_invite,
)

PID = "12D3KooWNbvaAJTvYPg1DKRCXjsqjZFvgAer24bFLPraNPLbjja1"
HELPER = f"/ip4/203.0.113.7/tcp/38433/p2p/{PID}"
NAMED = f"/dns4/helper.example.org/tcp/38433/p2p/{PID}"
INVITE = Invite("physics-club", (HELPER, NAMED))


# ---- the format ----------------------------------------------------------------------------------

def test_an_invite_round_trips_and_needs_no_quoting():
    text = encode_invite(INVITE)
    assert decode_invite(text) == INVITE
    assert decode_invite(f"  {text}\n") == INVITE  # pasted with a newline
    assert text.startswith("swarmling:1:") and len(text) < 400
    assert all(c.isalnum() or c in ":_-" for c in text)  # nothing a shell quotes or splits


def _damaged(text: str) -> list[str]:
    data = text.split(":", 2)[2]
    flipped = data[:20] + ("A" if data[20] != "A" else "B") + data[21:]
    return [text[:-1], text[:-6], text[: len(text) // 2], f"swarmling:1:{flipped}", text + "A", "swarmling:1:"]


def test_a_truncated_or_changed_invite_is_refused_saying_so():
    for bad in _damaged(encode_invite(INVITE)):
        with pytest.raises(InviteError, match="cut short|damaged"):
            decode_invite(bad)


@pytest.mark.parametrize("text, reason", [
    ("", "not a swarmling invite"),
    ("/ip4/1.2.3.4/tcp/1/p2p/x", "not a swarmling invite"),
    ("swarmling:2:eyJ9", "newer swarmling"),
    ("swarmling:one:eyJ9", "not one swarmling knows"),
    ("swarmling:1:eyJz d2Fy", "characters an invite never has"),
    ("swarmling:1:" + "A" * MAX_INVITE_CHARS, f"at most {MAX_INVITE_CHARS}"),
])
def test_what_is_not_an_invite_is_refused_before_decoding(text, reason):
    with pytest.raises(InviteError, match=reason):
        decode_invite(text)


def _forged(payload: bytes) -> str:
    """An invite with a valid checksum around any contents: what another program might make."""
    from swarmling.app.swarm.invite import _check

    return "swarmling:1:" + base64.urlsafe_b64encode(payload + _check(payload)).rstrip(b"=").decode()


@pytest.mark.parametrize("payload, reason", [
    (b'{"swarm": "main"}', "not a version-1 invite"),
    (b'{"swarm": "main", "helpers": [], "extra": 1}', "not a version-1 invite"),
    (b'{"swarm": "main", "helpers": []}', "at least one helper"),
    (b'{"swarm": "Main Swarm", "helpers": ["' + HELPER.encode() + b'"]}', "swarm name"),
    (b'{"swarm": "main", "helpers": ["/ip4/1.2.3.4/tcp/1"]}', "not a helper address"),
    (b'{"swarm": "main", "helpers": ["' + HELPER[:-3].encode() + b'"]}', "not a valid address"),
    (b'{"swarm": "main", "helpers": [' + b",".join(f'"/ip4/10.0.0.{i}/tcp/1/p2p/{PID}"'.encode()
                                                     for i in range(MAX_HELPERS + 1)) + b"]}", f"at most {MAX_HELPERS}"),
])
def test_an_intact_invite_with_bad_contents_is_refused(payload, reason):
    with pytest.raises(InviteError, match=reason):
        decode_invite(_forged(payload))


def test_an_invite_too_long_to_paste_is_not_made():
    long_names = tuple(f"/dns4/h{i}{'a' * 55}.{'b' * 60}.example.org/tcp/38433/p2p/{PID}" for i in range(MAX_HELPERS))
    with pytest.raises(InviteError, match="fewer or shorter"):
        encode_invite(Invite("main", long_names))


def test_make_invite_lists_this_public_node_then_the_configs_helpers(tmp_path):
    config = Config(swarm=SwarmSection(name="club", bootstrap=(HELPER,)))
    text, invite, notes = make_invite(config, tmp_path, helpers=[NAMED, HELPER], public_host="helper.example.net")
    assert invite.swarm == "club" and decode_invite(text) == invite
    own, *rest = invite.helpers
    assert own.startswith("/dns/helper.example.net/tcp/38433/p2p/12D3Koo") and rest == [HELPER, NAMED]
    assert (tmp_path / "identity.key").exists() and not notes
    # public IPs become /ip4 addresses; a port chosen at start cannot be invited to
    _, invite, _ = make_invite(config, tmp_path, public_host="198.51.100.9")
    assert invite.helpers[0].startswith("/ip4/198.51.100.9/tcp/38433/")
    _, invite, notes = make_invite(Config(swarm=SwarmSection(port=0, bootstrap=(HELPER,))), tmp_path,
                                   public_host="198.51.100.9")
    assert invite.helpers == (HELPER,) and "swarm.port is 0" in notes[0]


def test_a_node_behind_a_router_invites_only_through_helpers(tmp_path, monkeypatch):
    monkeypatch.setattr("swarmling.app.swarm.p2p.addresses.interface_hosts", lambda: ["192.168.1.20", "127.0.0.1"])
    _, invite, notes = make_invite(Config(swarm=SwarmSection(bootstrap=(HELPER,))), tmp_path)
    assert invite.helpers == (HELPER,) and "no public address" in notes[0]
    with pytest.raises(InviteError, match="no helper to invite to"):
        make_invite(Config(), tmp_path)


# ---- joining: the config file -------------------------------------------------------------------

CONFIG = """# my laptop
[round]
questions = 4  # small rounds

[swarm]
# a friend's node
bootstrap = ["/ip4/192.0.2.5/tcp/38433/p2p/12D3KooWKSueRyxksBJXpYhkrtxGMqrPG3rSaZVFYwr6iP6hBNAZ"]
"""


def test_join_sets_the_swarm_adds_helpers_keeps_the_rest_and_is_idempotent(tmp_path):
    file = tmp_path / "config.toml"
    file.write_text(CONFIG)
    joined = join(file, INVITE)
    assert joined.changes == ("swarm.name = 'physics-club' (was 'main')", f"swarm.bootstrap + {HELPER}",
                              f"swarm.bootstrap + {NAMED}")
    text = file.read_text()
    assert "# my laptop" in text and "# small rounds" in text and "# a friend's node" in text
    config = load_config(file, environ={})
    assert config.round.questions == 4 and config.swarm.name == "physics-club"
    assert config.swarm.bootstrap == ("/ip4/192.0.2.5/tcp/38433/p2p/12D3KooWKSueRyxksBJXpYhkrtxGMqrPG3rSaZVFYwr6iP6hBNAZ",
                                      HELPER, NAMED)
    mtime = file.stat().st_mtime_ns
    assert join(file, INVITE).changes == () and file.read_text() == text and file.stat().st_mtime_ns == mtime
    # --replace: the invite's helpers only
    assert join(file, INVITE, replace=True).changes[0].startswith("swarm.bootstrap - /ip4/192.0.2.5/")
    assert load_config(file, environ={}).swarm.bootstrap == (HELPER, NAMED)


def test_join_creates_a_missing_config_file(tmp_path):
    file = tmp_path / "conf" / "config.toml"
    assert join(file, INVITE).changes[0] == "swarm.name = 'physics-club' (was 'main')"
    assert load_config(file, environ={}).swarm.bootstrap == INVITE.helpers


def test_join_leaves_a_file_it_cannot_use_untouched(tmp_path):
    from swarmling.app.config import ConfigError

    file = tmp_path / "config.toml"
    for broken in ("[swarm\nname = ", "[swarm]\nbootstrap = 'not a list'\n"):
        file.write_text(broken)
        with pytest.raises(ConfigError):
            join(file, INVITE)
        assert file.read_text() == broken
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.toml"]  # no temp file left


# ---- the commands ---------------------------------------------------------------------------------

def test_invite_and_join_from_the_command_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("SWARMLING_CONFIG", raising=False)
    helper_home, home = str(tmp_path / "helper"), str(tmp_path / "volunteer")
    assert main(["--home", helper_home, "invite", "--swarm", "club", "--public-host", "198.51.100.9",
                 "--helper", HELPER]) == 0
    out = capsys.readouterr()
    text = out.out.strip()
    assert "\n" not in text and decode_invite(text).swarm == "club" and "swarmling join" in out.err
    file = tmp_path / "volunteer" / "config" / "config.toml"
    assert main(["--home", home, "join", text]) == 0
    assert "joined swarm 'club'" in capsys.readouterr().out
    before = file.read_text()
    assert main(["--home", home, "join", text]) == 0
    assert "unchanged" in capsys.readouterr().out and file.read_text() == before
    assert main(["--home", home, "join", text[:-4]]) == 2
    assert "not joining: the invite is cut short" in capsys.readouterr().err and file.read_text() == before
    assert main(["--home", home, "config"]) == 0
    assert "name = 'club'" in capsys.readouterr().out
    # a node with nothing to invite through says so
    monkeypatch.setattr("swarmling.app.swarm.p2p.addresses.interface_hosts", lambda: ["192.168.1.20"])
    assert main(["--home", str(tmp_path / "lonely"), "invite"]) == 1
    assert "no helper to invite to" in capsys.readouterr().err


def test_join_says_a_running_node_needs_a_restart(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("swarmling.app.node.control.send", lambda state_dir, cmd, timeout_s=10.0: {"state": "running"})
    assert main(["--home", str(tmp_path), "join", encode_invite(INVITE)]) == 0
    assert "until it restarts" in capsys.readouterr().out


# ---- the addresses, dialled for real ---------------------------------------------------------------

def test_dns_addresses_resolve_through_the_system_resolver():
    async def go():
        assert await resolve(f"/dns4/localhost/tcp/1/p2p/{PID}") == [f"/ip4/127.0.0.1/tcp/1/p2p/{PID}"]
        assert await resolve(HELPER) == [HELPER]
        both = await resolve("/dns/localhost/tcp/1")
        assert both[0] == "/ip4/127.0.0.1/tcp/1" and all(a.endswith("/tcp/1") for a in both)

    trio.run(go)


@pytest.mark.parametrize("proto", ["dns4", "dns"])
def test_a_helper_named_by_dns_is_joined_and_remembered_across_restarts(tmp_path, proto):
    helper = honest(tmp_path, "helper")
    node = None
    try:
        named = helper.listen_addrs[0].replace("/ip4/127.0.0.1/", f"/{proto}/localhost/")
        node = honest(tmp_path, "node", dial=(named,))
        assert wait_until(lambda: helper.peer_id in node.host.connected_peers())
        node.stop()
        assert named in (tmp_path / "node" / "known_peers.json").read_text()  # the name, not what it resolved to
        node = honest(tmp_path, "node")  # restarted with no bootstrap configured: it rejoins from memory
        assert wait_until(lambda: helper.peer_id in node.host.connected_peers())
    finally:
        if node is not None:
            node.stop()
        helper.stop()

