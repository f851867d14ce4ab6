"""`swarmling status | pause | resume | finish`: steer the running node over its local socket."""

from __future__ import annotations

import json
import sys

from ..node.control import ControlError, send
from ..node.status import NodeStatus
from .arguments import Invocation


def control_command(paths, cmd: str, as_json: bool) -> int:
    try:
        sent = send(paths.state_dir, cmd)
    except ControlError as exc:
        print(f"swarmling: {exc}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(sent, indent=1))
        return 0
    status = NodeStatus.from_dict(sent)
    done = {"pause": "pausing", "resume": "resuming", "finish": "finishing the round, then pausing"}.get(cmd)
    if done:
        print(f"swarmling: {done}")
    print(f"state    {status.state}" + (f" ({status.detail})" if status.detail else ""))
    print(f"round    {status.round}" + (f" · {status.phase}" if status.phase else ""))
    print(f"model    {status.model} on {status.backend}  (pid {status.pid})")
    if last := status.last_round:
        learnable = f", learnable {last.learnable_groups}/{last.questions}" if last.learnable_groups is not None else ""
        if last.rescued_by:  # peers' right replies on questions it got all wrong
            learnable += f", {last.rescued_by}"
        print(f"last     round {last.round}: reward {last.reward_mean:.3f}, solved {last.solved}/"
              f"{last.questions}{learnable}, {last.wall_seconds:.0f} s")
    if best := status.best:
        print(f"best     held-out {best.accuracy:.0%} at round {best.round} "
              "(`swarmling eval --best`, `swarmling reset --best`)")
    if status.peers is not None:
        print(f"peers    {status.peers}")
    if status.swarm_share is not None:
        print(f"learnt   {status.swarm_share:.0%} from the swarm (peers' groups' share of the advantage mass, "
              "last 10 rounds)")
    if status.given:  # counted by this node from what it served (swarm/given.py)
        print(f"gave     {status.given}")
    if host := status.swarm_host:
        if host.reachability_text:
            print(f"reach    {host.reachability_text}")
        if host.cut_off_rounds:
            print(f"gossip   in no gossip mesh for {host.cut_off_rounds} rounds while connected: "
                  "peers' announcements are not reaching this node")
        if host.restarts or not host.running:
            state = "running" if host.running else "restarting"
            print(f"swarm    host {state}, restarted {host.restarts}x (last failure: {host.last_error or '-'})")
    return 0


def status_arguments(p) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable")


def control_main(c: Invocation) -> int:
    """status, pause, resume and finish: one message to the running node's control socket."""
    return control_command(c.paths, c.args.command, getattr(c.args, "json", False))
