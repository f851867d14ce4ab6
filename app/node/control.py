"""The local control channel: `swarmling status|pause|resume|finish` talk to the running node.

A Unix socket in the node's state dir, in a directory only the user can enter (0700) and itself
0600; on Linux the server also checks the caller's uid (SO_PEERCRED). Nothing listens on a
network address. One JSON request per connection, one JSON reply:
  {"cmd": "status"} -> {"ok": true, "status": {...}}
  {"cmd": "pause" | "resume" | "finish"} -> {"ok": true, "status": {...}}
A bad request gets {"ok": false, "error": "..."}; nothing a local caller sends can stop the node.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import socketserver
import struct
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ..events import Listener, Notice

if TYPE_CHECKING:
    from .status import NodeStatus

SOCKET_NAME = "control.sock"
MAX_REQUEST = 4096
COMMANDS = ("status", "pause", "resume", "finish")


class Controllable(Protocol):
    def status(self) -> NodeStatus: ...
    def pause(self, finish_round: bool = False) -> None: ...
    def resume(self) -> None: ...


class ControlError(RuntimeError):
    """For the CLI: what went wrong and what to do."""


def socket_path(state_dir: Path) -> Path:
    return state_dir / "control" / SOCKET_NAME


def _same_user(sock: socket.socket) -> bool:
    if not sys.platform.startswith("linux"):
        return True  # the 0700 directory is the guard there
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid == os.getuid()


def handle(node: Controllable, raw: bytes) -> dict:
    """One request → one reply (pure, so it is tested without sockets too)."""
    try:
        request = json.loads(raw.decode("utf-8"))
        cmd = request["cmd"] if isinstance(request, dict) else None
    except (ValueError, KeyError, UnicodeDecodeError):
        return {"ok": False, "error": "expected one JSON object with a 'cmd'"}
    if cmd not in COMMANDS:
        return {"ok": False, "error": f"unknown command {cmd!r}; commands: {', '.join(COMMANDS)}"}
    if cmd == "pause":
        node.pause(finish_round=False)
    elif cmd == "finish":
        node.pause(finish_round=True)
    elif cmd == "resume":
        node.resume()
    return {"ok": True, "status": node.status().to_dict()}


class ControlServer:
    def __init__(self, node: Controllable, state_dir: Path) -> None:
        self.node = node
        self.path = socket_path(state_dir)
        self._server: socketserver.UnixStreamServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        folder = self.path.parent
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o700)
        if len(str(self.path)) > 100:
            raise ControlError(f"control socket path {self.path} is too long for a Unix socket; use a shorter --home")
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # a crashed node's socket; the node lock guarantees no live one
        node = self.node

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                self.request.settimeout(5)
                try:
                    if not _same_user(self.request):
                        return
                    raw = self.request.recv(MAX_REQUEST)
                    reply = handle(node, raw)
                    self.request.sendall(json.dumps(reply).encode("utf-8") + b"\n")
                except OSError:
                    pass

        old_umask = os.umask(0o177)  # the socket is created 0600
        try:
            self._server = socketserver.ThreadingUnixStreamServer(str(self.path), Handler)
        finally:
            os.umask(old_umask)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="swarmling-control", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def open_control(node: Controllable, state_dir: Path, emit: Listener) -> ControlServer | None:
    """The node's control socket, started; None (and a warning) when it cannot be: the node still
    runs, only `swarmling status/pause/resume` cannot reach it."""
    server = ControlServer(node, state_dir)
    try:
        server.start()
    except (ControlError, OSError) as exc:
        emit(Notice("warning", f"no control socket ({exc}); `swarmling status/pause/resume` will not work"))
        return None
    return server


def send(state_dir: Path, cmd: str, timeout_s: float = 10.0) -> dict:
    """The CLI's side: one command to the node running on this state dir."""
    path = socket_path(state_dir)
    if not path.exists():
        raise ControlError(f"no swarmling node is running here (no control socket at {path}); start one with `swarmling`")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        try:
            sock.connect(str(path))
            sock.sendall(json.dumps({"cmd": cmd}).encode("utf-8"))
            sock.shutdown(socket.SHUT_WR)
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        except ConnectionRefusedError:
            raise ControlError(f"the node that owned {path} is gone (it did not stop cleanly); start it again") from None
        except OSError as exc:
            raise ControlError(f"could not talk to the node at {path}: {exc}") from None
    try:
        reply = json.loads(data.decode("utf-8"))
    except ValueError:
        raise ControlError("the node sent a reply this version does not understand") from None
    if not reply.get("ok"):
        raise ControlError(reply.get("error", "the node refused the command"))
    return reply["status"]
