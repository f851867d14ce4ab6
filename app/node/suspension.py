"""While the node is held (paused by its user, or suspended by a guest rule: battery, hours,
idle, disk), it waits between rounds; during a long suspension it gives the model's memory back
to the machine's owner, and loads it again before the next round."""

from __future__ import annotations

import time

from ..events import Listener, Notice, StateChanged
from .backend_slot import BackendSlot
from .lifecycle import Lifecycle


def wait_while_held(lifecycle: Lifecycle, slot: BackendSlot, release_after_s: float, emit: Listener) -> None:
    """Return when rounds may start again, or the node is stopping (`release_after_s` 0: never
    release the model)."""
    if not lifecycle.held:
        return
    emit(StateChanged("paused") if lifecycle.paused else StateChanged("suspended", lifecycle.suspended_for or ""))
    held_since = time.monotonic()
    while lifecycle.held and not lifecycle.stopping:
        lifecycle.wait(0.5)
        long_suspension = release_after_s and time.monotonic() - held_since >= release_after_s
        if lifecycle.suspended_for is not None and long_suspension and slot.release():
            emit(Notice("info", "released the model's memory while suspended; it reloads on resume"))
    if lifecycle.stopping:
        return
    if slot.released:
        emit(StateChanged("starting", "reloading the model"))
        slot.reload()
    emit(StateChanged("running"))
