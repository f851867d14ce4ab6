"""Who we trade with: peers, what they sent, what passed verification, bytes on the wire."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from ..view import NodeView
from .header import short_id

# Can peers fetch this node's rollouts? Green: directly; cyan: through a helper; yellow: they cannot.
REACHABILITY_STYLE = {"direct": "green", "relayed": "cyan", "unreachable": "yellow"}


def kib(n: int) -> str:
    return f"{n / 1024:,.1f} KiB" if n < 2**20 else f"{n / 2**20:,.1f} MiB"


class PeerTable(DataTable):
    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = True
        self.add_columns("peer", "address", "fetch", "recv", "used", "rej", "score")

    def show(self, view: NodeView) -> None:
        self.clear()
        for p in view.peers:
            host = p.address.split("/p2p/")[0] if p.address else ("connected" if p.connected else "gone")
            self.add_row(
                short_id(p.peer_id, 8),
                host,
                f"{p.fetch_seconds:.2f}s" if p.fetch_seconds is not None else "-",
                str(p.received),
                str(p.used),
                Text(str(p.rejected), style="red" if p.rejected else ""),
                Text(f"{p.score:+.0f}", style="red" if p.score < 0 else ""),
                key=p.peer_id,
            )


class SwarmPanel(Vertical):
    def compose(self) -> ComposeResult:
        yield Static(id="swarm-summary")
        yield PeerTable(id="peer-table")

    def show(self, view: NodeView) -> None:
        summary = Text()
        if not view.swarm:
            summary.append("The swarm is off: this node trains on its own groups only.", style="dim")
        else:
            connected = sum(p.connected for p in view.peers)
            summary.append(f"swarm {view.swarm}", style="bold")
            summary.append(f"  ·  {connected} connected  ·  in {kib(view.bytes_in)}  out {kib(view.bytes_out)}\n")
            if view.swarm_share is not None:
                # the peers' groups' share of the advantage mass the updates followed
                summary.append(f"{view.swarm_share:.0%} of what it learnt came from peers "
                               f"(last {len(view.swarm_shares)} rounds)\n")
            if view.given:
                summary.append(view.given + "\n", style="green")
            summary.append(f"peer {view.peer_id}\n", style="dim")
            summary.append("dial me at " + (view.listen_addrs[0] if view.listen_addrs else "-"), style="dim")
            if view.reachability:
                summary.append("\n" + view.reachability_text, style=REACHABILITY_STYLE.get(view.reachability, "dim"))
            if view.host_restarts:
                summary.append(f"\nswarm host restarted {view.host_restarts}x; last failure: {view.host_error}",
                               style="yellow")
        self.query_one("#swarm-summary", Static).update(summary)
        self.query_one(PeerTable).show(view)
