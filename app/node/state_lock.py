"""One node per state dir: two writers would interleave checkpoints and metrics."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

from ..errors import NodeError


class StateDirLock:
    """An exclusive `flock` on `<state dir>/node.lock`, holding the owner's pid for the message."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self._handle: IO[str] | None = None

    def acquire(self) -> None:
        handle = open(self.state_dir / "node.lock", "a+", encoding="utf-8")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "?"
            handle.close()
            raise NodeError(
                f"another swarmling node (pid {holder}) is running with {self.state_dir}; stop it first, "
                "or give this one its own --home"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        self._handle = handle

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()  # releases the flock
            self._handle = None
