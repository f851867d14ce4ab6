"""Bounded waits for tests: poll a condition instead of sleeping a fixed time and hoping."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable


def wait_until(predicate: Callable[[], object], timeout_s: float = 15.0, interval_s: float = 0.1) -> bool:
    """Poll `predicate` every `interval_s` until it holds or `timeout_s` has passed; whether it held."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return bool(predicate())


async def wait_until_async(predicate: Callable[[], object], pause: Callable[[float], Awaitable[object]],
                           timeout_s: float = 15.0, interval_s: float = 0.2) -> bool:
    """The same inside an event loop (a Textual pilot): `pause(interval_s)` lets the loop run."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        await pause(interval_s)
    return bool(predicate())
