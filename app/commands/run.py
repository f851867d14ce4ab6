"""`swarmling run`: the node, with its TUI in a terminal or headless elsewhere."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from ..config import Config
from .arguments import Invocation, add_config_flags, positive


def run_command(config: Config, paths, rounds: int | None, headless: bool, config_file: Path, cli) -> int:
    if headless or not interactive():
        return run_headless(config, paths, rounds)
    return run_tui(config, paths, rounds, config_file, cli)


def interactive() -> bool:
    """The TUI needs a real terminal on both ends; pipes, services and CI get headless."""
    return sys.stdin.isatty() and sys.stdout.isatty() and os.environ.get("TERM", "") not in ("", "dumb")


def run_tui(config: Config, paths, rounds: int | None, config_file: Path, cli) -> int:
    from ..tui.app import create_app

    app = create_app(config, paths, rounds=rounds, config_file=config_file, cli=cli)
    code = app.run()
    if app.forced:
        force_exit()
    if app.control.alive:  # SIGTERM / SIGHUP closed the UI first; a second signal forces
        print("swarmling: stopping the node; the last checkpoint is kept", file=sys.stderr, flush=True)
    app.control.join()
    if app.view.state == "failed":
        print(f"swarmling: {app.view.state_detail}", file=sys.stderr)
        return 1
    return code or 0


def force_exit() -> None:
    """The second stop request: out now, without waiting for the node's thread, which may be
    inside a native call. Checkpoints are written atomically, so the last one is intact."""
    print("swarmling: forced exit; the last checkpoint is intact", file=sys.stderr, flush=True)
    if "swarmling.backends.torch_compile" in sys.modules:  # a quit, not a crash in compiled code
        sys.modules["swarmling.backends.torch_compile"].abandon_first_pass()
    os._exit(130)


def run_headless(config: Config, paths, rounds: int | None) -> int:
    from ..headless import HeadlessPrinter
    from ..node.loop import Node

    node = Node(config, paths, HeadlessPrinter())
    signals = {"count": 0}

    def on_signal(signum, frame):
        signals["count"] += 1
        if signals["count"] == 1:
            what = "finishing" if config.run.on_stop == "finish" else "abandoning"
            print(f"swarmling: stopping ({what} the round in flight; again to force)", file=sys.stderr, flush=True)
            node.request_stop()
        else:
            force_exit()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        node.start()
        done = node.run(rounds)
    finally:
        node.close()
    if rounds is not None and done == rounds:  # a run of N rounds that ran them: what it learnt, on one question
        from ..node.try_it import before_and_after

        shown = before_and_after(config, paths)
        if shown:
            print(shown, flush=True)
    return 0


def run_arguments(p) -> None:
    p.add_argument("--headless", action="store_true",
                   help="no UI: one line per round on stdout (the default when not on a terminal)")
    p.add_argument("--rounds", type=positive, help="stop after this many rounds")
    add_config_flags(p)


def run_main(c: Invocation) -> int:
    return run_command(c.config, c.paths, c.args.rounds, c.args.headless, c.config_file, c.overrides)
