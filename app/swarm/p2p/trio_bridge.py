"""A trio loop on a daemon thread of its own, and the thread-safe ways into it.

py-libp2p runs only on trio (anyio on asyncio fails), and the node's round loop must never wait on
the network, nor the network on the round loop: trio gets its own thread. Other threads hand it
items with `send_nowait` (through trio's `run_sync_soon`: it never blocks) and ask it to stop with
`stop`; what the trio side produces goes back through callbacks that only touch thread-safe
structures.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable, Callable

import trio

log = logging.getLogger("swarmling.swarm")


class TrioThread:
    """Runs `main` in trio on a daemon thread; `main` calls `ready()` once other threads may reach it."""

    def __init__(self, name: str, main: Callable[[], Awaitable[None]]) -> None:
        self._name = name
        self._main = main
        self._thread: threading.Thread | None = None
        self._token: trio.lowlevel.TrioToken | None = None  # set while `main` is ready
        self._ready = threading.Event()
        self._stop: trio.Event | None = None
        self.start_error: BaseException | None = None  # what `main` raised before it was ready

    # ---- any thread --------------------------------------------------------------------------
    def start(self, timeout_s: float) -> bool:
        """Start the thread; True once `main` is ready or failed getting there (see `start_error`)."""
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()
        return self._ready.wait(timeout_s)

    def stop(self, timeout_s: float) -> None:
        """Ask `main` to finish (`until_stopped` returns) and wait up to `timeout_s` for the thread."""
        if self._token is not None and self._stop is not None:
            try:
                self._token.run_sync_soon(self._stop.set)
            except trio.RunFinishedError:
                pass
        if self._thread is not None:
            self._thread.join(timeout_s)

    def send_nowait(self, channel: trio.MemorySendChannel | None, item) -> bool:
        """Hand `item` to a trio channel; False when trio is not running. A full queue drops it (logged)."""
        if self._token is None or channel is None:
            return False

        def put() -> None:
            try:
                channel.send_nowait(item)
            except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
                log.debug("swarm queue full or closed; dropped one item")

        try:
            self._token.run_sync_soon(put)
        except trio.RunFinishedError:
            return False
        return True

    # ---- the trio side -----------------------------------------------------------------------
    @property
    def is_ready(self) -> bool:
        """`ready()` was called: `start` has returned, a later failure is the caller's to survive."""
        return self._ready.is_set() and self.start_error is None

    def ready(self) -> None:
        """Called by `main` in trio: `start` returns, and other threads can now reach it."""
        self._token = trio.lowlevel.current_trio_token()
        self._ready.set()

    async def until_stopped(self) -> None:
        """Returns once `stop` was called."""
        assert self._stop is not None
        await self._stop.wait()

    def _run(self) -> None:
        try:
            trio.run(self._main_until_stopped)
        except BaseException as exc:  # noqa: BLE001 — reported to start() or logged; never kills the node
            if not self._ready.is_set():
                self.start_error = exc
                self._ready.set()
            else:
                log.warning("swarm host stopped: %s", exc)
        finally:
            self._token = None

    async def _main_until_stopped(self) -> None:
        self._stop = trio.Event()
        await self._main()
