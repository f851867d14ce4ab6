"""`?`: the keys, and what the node is doing on your machine."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

HELP = """\
# swarmling

This node post-trains a small language model with reinforcement learning (SAPO). Every round it
samples reasoning tasks, writes several answers to each, scores them with its own verifier,
shares them with the swarm, trains on a mix of its own and peers' question-groups, and saves a
checkpoint. Nothing is lost when you quit: it resumes from the last round.

| key | what it does |
|-----|--------------|
| `p` | pause now (drops the round in flight), or resume |
| `f` | finish this round, then pause |
| `s` | settings: round mix, task preset, threads |
| `t` | try it: ask the trained and the base model a question |
| `enter` | on the Rollouts tab: the whole question-group |
| `tab` / `1`-`4` | switch between Overview, Swarm, Rollouts, Log |
| `?` | this help |
| `q` | quit (keeps the last checkpoint); `q` again forces it |

Peers only ever send text: every answer they share is re-scored here before it is used.
`swarmling --headless` runs the same node without this screen.
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-body", classes="dialog"):
            yield Markdown(HELP)
