"""The node on a thread of its own, for viewers that need their thread for themselves (the TUI).

The round loop never runs on the viewer's thread: the viewer only calls the control methods here
(each returns at once) and reads the events the node emits. Whatever ends the node — a finished
run, a stop, or an error — is reported as a final `StateChanged` ("stopped" or "failed") with
what to do, never as an exception on the viewer's side.
"""

from __future__ import annotations

import logging
import threading
import traceback

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..config import Config, ConfigError
from ..config_file import update_config_file
from ..events import Listener, Notice, StateChanged
from ..errors import NodeError
from .loop import Node
from ..paths import Paths

log = logging.getLogger("swarmling.runner")


class NodeRunner:
    def __init__(
        self,
        config: Config,
        paths: Paths,
        listener: Listener,
        rounds: int | None = None,
        config_file: Path | None = None,
        cli: list[tuple[str, Any]] | None = None,
    ) -> None:
        self.emit = listener
        self.node = Node(config, paths, listener)
        self.rounds = rounds
        self.config_file = config_file or paths.config_file
        self.cli = list(cli or [])
        # A daemon thread: a forced quit must not wait for a decode step or a training pass.
        self._thread = threading.Thread(target=self._main, name="swarmling-node", daemon=True)

    # ---- control (called from the viewer's thread; all return at once) -------------------------
    def start(self) -> None:
        self.emit(StateChanged("starting", "loading the model"))
        self._thread.start()

    def pause(self) -> None:
        self.node.pause(finish_round=False)

    def finish_then_pause(self) -> None:
        self.node.pause(finish_round=True)

    def resume(self) -> None:
        self.node.resume()

    def stop(self) -> None:
        self.node.request_stop()

    @property
    def paused(self) -> bool:
        return self.node.paused

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def config(self) -> Config:
        return self.node.config

    def save_settings(self, changes: Mapping[str, Any]) -> tuple[list[str], list[str]]:
        """Write the changes to the config file and apply what can be applied live. Returns the
        keys that need a restart and the keys a flag or environment variable still overrides;
        raises ConfigError (file unchanged) on a bad value."""
        config, overridden = update_config_file(self.config_file, changes, self.cli, check=self.node.check_config)
        return self.node.apply_config(config), overridden

    # ---- the node's thread ---------------------------------------------------------------------
    def _main(self) -> None:
        final = StateChanged("stopped", f"last checkpoint: round {self.node.round}")
        try:
            self.node.start()
            self.node.run(self.rounds)
            final = StateChanged("stopped", f"last checkpoint: round {self.node.round}")
        except (NodeError, ConfigError) as exc:
            self.emit(Notice("error", str(exc)))
            final = StateChanged("failed", str(exc))
        except Exception as exc:  # a bug or a backend crash: keep the viewer up and say what to do
            log.debug("node failed:\n%s", traceback.format_exc())
            text = (
                f"the node stopped: {type(exc).__name__}: {exc}. The last checkpoint (round {self.node.round}) "
                "is intact; restart to resume, or run `swarmling doctor` and report the log if it happens again"
            )
            self.emit(Notice("error", text))
            final = StateChanged("failed", text)
        finally:
            try:
                self.node.close()
            except Exception as exc:  # closing must not hide why we stopped
                self.emit(Notice("warning", f"while closing the node: {exc}"))
            self.emit(final)
