"""What any thread may ask of the node, and what it says back at once: stop, pause now or after
the round in flight, resume, and the guest rules' readings (the TUI, the control socket, signal
handlers and the guest monitor call these; the round loop only reads `lifecycle`)."""

from __future__ import annotations

from ..config import Config
from ..events import Listener, StateChanged
from .guest_monitor import GuestMonitor
from .lifecycle import Intent, Lifecycle
from .status import StatusBoard


class NodeControls:
    """Part of `Node` (node/loop.py), which provides these attributes."""

    config: Config
    lifecycle: Lifecycle
    board: StatusBoard
    emit: Listener
    guest: GuestMonitor  # the guest rules (the monitor's thread applies them; tests call its check)

    @property
    def state(self) -> str:
        return self.board.state

    @property
    def phase(self) -> str:
        return self.board.phase

    @property
    def suspended_for(self) -> str | None:
        """Why a guest rule (battery, hours, idle, disk) holds the node."""
        return self.lifecycle.suspended_for

    @property
    def paused(self) -> bool:
        return self.lifecycle.paused

    def request_stop(self) -> None:
        """Ctrl-C / SIGTERM / quit: abandon or finish the round in flight, as configured."""
        finish = self.config.run.on_stop == "finish"
        self.lifecycle.stop(finish_round=finish)
        self.emit(StateChanged("stopping", "finishing the round in flight" if finish else ""))

    def pause(self, finish_round: bool = False) -> None:
        """Stop taking rounds: at once (the round in flight is dropped; it costs only its own work),
        or after the round in flight is trained and checkpointed."""
        self.lifecycle.pause(finish_round)
        if finish_round:
            self.emit(StateChanged("finishing", "pausing after this round"))
        else:
            # A training pass cannot be cut short: it ends at its microbatch's end (seconds to tens
            # of seconds on a small CPU); generation stops at the next token.
            self.emit(StateChanged("pausing", "the training pass in flight ends first" if self.phase == "train" else ""))

    def resume(self) -> None:
        was_paused = self.state in ("paused", "pausing")
        before = self.lifecycle.resume()
        if was_paused and self.suspended_for is None:  # say so at once; the loop wakes within 0.5 s
            self.emit(StateChanged("running"))
        if before is Intent.PAUSE_AFTER_ROUND:  # the round in flight goes on; nothing waited yet
            self.emit(StateChanged("running"))
