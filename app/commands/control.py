"""`swarmling status | pause | resume | finish`: steer the running node over its local socket."""

from __future__ import annotations

import json
import sys

from ..node.control import ControlError, send
from .arguments import Invocation


def control_command(paths, cmd: str, as_json: bool) -> int:
    try:
        status = send(paths.state_dir, cmd)
    except ControlError as exc:
        print(f"swarmling: {exc}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(status, indent=1))
        return 0
    done = {"pause": "pausing", "resume": "resuming", "finish": "finishing the round, then pausing"}.get(cmd)
    if done:
        print(f"swarmling: {done}")
    state = status["state"] + (f" ({status['detail']})" if status.get("detail") else "")
    print(f"state    {state}")
    print(f"round    {status['round']}" + (f" · {status['phase']}" if status.get("phase") else ""))
    print(f"model    {status.get('model')} on {status.get('backend')}  (pid {status['pid']})")
    last = status.get("last_round")
    if last:
        learnable = f", learnable {last['learnable_groups']}/{last['questions']}" if "learnable_groups" in last else ""
        if last.get("rescued_by"):  # peers' right replies on questions it got all wrong
            learnable += f", {last['rescued_by']}"
        print(f"last     round {last['round']}: reward {last['reward_mean']:.3f}, solved {last['solved']}/"
              f"{last['questions']}{learnable}, {last['wall_seconds']:.0f} s")
    if status.get("best"):
        print(f"best     held-out {status['best']['accuracy']:.0%} at round {status['best']['round']} "
              "(`swarmling eval --best`, `swarmling reset --best`)")
    if status.get("peers") is not None:
        print(f"peers    {status['peers']}")
    if status.get("swarm_share") is not None:
        print(f"learnt   {status['swarm_share']:.0%} from the swarm (peers' groups' share of the advantage mass, "
              "last 10 rounds)")
    if status.get("given"):  # counted by this node from what it served (swarm/given.py)
        print(f"gave     {status['given']}")
    host = status.get("swarm_host")
    if host and host.get("reachability_text"):
        print(f"reach    {host['reachability_text']}")
    if host and host.get("cut_off_rounds"):
        print(f"gossip   in no gossip mesh for {host['cut_off_rounds']} rounds while connected: "
              "peers' announcements are not reaching this node")
    if host and (host["restarts"] or not host["running"]):
        state = "running" if host["running"] else "restarting"
        print(f"swarm    host {state}, restarted {host['restarts']}x (last failure: {host['last_error'] or '-'})")
    return 0


def status_arguments(p) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable")


def control_main(c: Invocation) -> int:
    """status, pause, resume and finish: one message to the running node's control socket."""
    return control_command(c.paths, c.args.command, getattr(c.args, "json", False))
