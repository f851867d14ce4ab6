"""Who this node is and what it is doing, in two lines."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from ..view import NodeView

STATE_STYLES = {
    "starting": "bold yellow",
    "running": "bold green",
    "pausing": "bold yellow",
    "paused": "bold yellow",
    "finishing": "bold cyan",
    "suspended": "bold magenta",
    "stopping": "bold yellow",
    "stopped": "bold",
    "failed": "bold red",
}


def short_id(peer_id: str, keep: int = 6) -> str:
    """12D3KooW… ids share their first 8 characters: show the distinctive tail."""
    if not peer_id:
        return "-"
    return f"…{peer_id[-keep:]}" if len(peer_id) > keep else peer_id


class NodeHeader(Static):
    _view: NodeView | None = None

    def on_resize(self) -> None:
        if self._view is not None:
            self.show(self._view)

    def show(self, view: NodeView) -> None:
        self._view = view
        line1 = Text()
        line1.append(" swarmling ", style="bold reverse")
        line1.append("  ")
        line1.append(view.state.upper(), style=STATE_STYLES.get(view.state, "bold"))
        if view.round:
            line1.append(f"   round {view.round}")
            if view.phase:
                line1.append(f" · {view.phase}", style="cyan")
        if view.state_detail:
            line1.append(f"   {view.state_detail}", style="dim")
        line2 = Text(style="dim")
        wide = self.size.width >= 100
        parts = [
            view.model or "loading the model…",
            (f"{view.backend} ({view.device})" if wide else view.backend) if view.backend else "",
            f"preset {view.preset}" if view.preset else "",
        ]
        if view.model:  # the swarm is known once the node has started
            parts.append(f"swarm {view.swarm} · peer {short_id(view.peer_id)}" if view.swarm else "swarm off")
        line2.append(" " + " · ".join(p for p in parts if p))
        self.update(Text("\n").join([line1, line2]))
