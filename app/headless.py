"""Headless mode: one concise line per round on stdout, notices on stderr. No Textual here."""

from __future__ import annotations

import sys
from typing import TextIO

from .events import Event, NodeStarted, Notice, RoundFinished


def format_round(m: dict) -> str:
    s = m.get("seconds", {})
    train = f"train {s['train']:.1f}s " if "train" in s else "train skipped (no signal) "
    return (
        f"round {m['round']:>4}  reward {m['reward_mean']:.3f} (shaped {m['shaped_reward_mean']:.3f})  "
        f"solved {m['solved']}/{m['questions']}  signal {m['signal_share']:.0%}  tags {m['tag_rate']:.0%}  |  "
        f"generate {s.get('generate', 0):.1f}s score {s.get('score', 0):.2f}s {train}"
        f"hand-off {s.get('hand-off', 0):.2f}s  |  {m['tokens_per_s']:.0f} tok/s"
    )


class HeadlessPrinter:
    def __init__(self, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> None:
        self.out, self.err = out, err

    def __call__(self, event: Event) -> None:
        if isinstance(event, RoundFinished):
            print(format_round(event.metrics), file=self.out, flush=True)
        elif isinstance(event, NodeStarted):
            start = f"resuming after round {event.resumed_round}" if event.resumed_round else "fresh start"
            st = event.settings
            print(
                f"swarmling: {event.model} on {event.backend} ({event.device}), preset {event.preset}, {start}; "
                f"{st['questions']} questions x {st['completions']} completions, {st['max_new_tokens']} new tokens max\n"
                f"  backend choice: {event.reason}",
                file=self.err,
                flush=True,
            )
        elif isinstance(event, Notice):
            print(f"swarmling: {event.level}: {event.text}", file=self.err, flush=True)
