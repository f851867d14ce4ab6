"""Bounded waits for tests: poll a condition instead of sleeping a fixed time and hoping."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], object], timeout_s: float = 15.0, interval_s: float = 0.1) -> bool:
    """Poll `predicate` every `interval_s` until it holds or `timeout_s` has passed; whether it held."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return bool(predicate())
