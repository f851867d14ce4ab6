"""`swarmling doctor`: what this machine is, what the node would run on it and why, and where
it keeps its files. Fast: it loads no model."""

from __future__ import annotations

from pathlib import Path

from ..node.backend_slot import model_scale
from ..config import Config
from ..sizing import ResourceError, cpu_bf16_choice, cpu_compile_choice, plan
from ..hardware import choose_backend, detect
from ..models import SHIPPED, ModelError, resolve_model
from ..paths import Paths
from ..learning.tasks import load_preset
from .arguments import Invocation, add_config_flags


def swarm_report(config: Config, paths: Paths) -> None:
    """The swarm's settings and whether peers can dial this node: the running node's verdict, or
    a short live check through the configured helpers."""
    sw = config.swarm
    print("swarm")
    if not sw.enabled:
        print("  off (swarm.enabled = false): training on local groups only")
        return
    print(f"  name {sw.name!r}, port {sw.port or 'any'}, {len(sw.bootstrap)} helper/bootstrap peer(s), "
          f"{len(sw.peers)} static peer(s), mDNS {'on' if sw.mdns else 'off'}")
    from ..node.control import ControlError, send
    from ..node.status import NodeStatus

    try:
        host = NodeStatus.from_dict(send(paths.state_dir, "status", timeout_s=2.0)).swarm_host
        print(f"  reachability (the running node): {(host and host.reachability_text) or 'not reported yet'}")
        return
    except ControlError:
        pass
    if not sw.bootstrap:
        print("  reachability: not checked (no helper in swarm.bootstrap; `swarmling join <invite>` adds one)")
        return
    from ..swarm.host.host import SwarmError
    from ..swarm.p2p.identity import IdentityError
    from ..swarm.helper import PROBE_TIMEOUT_S, probe

    print(f"  reachability: asking the helpers (up to {PROBE_TIMEOUT_S:.0f} s)…", flush=True)
    try:
        verdict = probe(sw.name, sw.listen_host, sw.port, sw.bootstrap, paths.data_dir)
        print(f"  reachability: {verdict.describe() if verdict.state != 'unknown' else 'no helper answered'}")
    except (SwarmError, IdentityError, ValueError) as exc:
        print(f"  reachability: could not check: {exc}")


def doctor(config: Config, paths: Paths, config_file: Path) -> int:
    hw = detect()
    print("hardware")
    print(f"  system      {hw.system} ({hw.machine})")
    print(f"  cpu         {hw.cpu}: {hw.physical_cores} cores / {hw.logical_cores} threads")
    print(f"  memory      {hw.memory_total / 2**30:.1f} GiB ({hw.memory_available / 2**30:.1f} GiB free)")
    compiler, compiling = cpu_compile_choice(config.train.cpu_compile, hw)
    print(f"  bf16 on cpu {'yes (AVX-512 BF16 or AMX)' if hw.has_bf16_cpu else 'no'}: the trainer would run "
          f"{cpu_bf16_choice(config.train.cpu_bf16, hw, compiler is not None)[1]} (`swarmling bench` compares both)")
    print(f"  c++         {hw.cxx_compiler or 'none'}: the CPU trainer would run {compiling}")
    print(f"  cuda        {', '.join(hw.cuda_devices) or 'none'}")
    print(f"  apple mlx   {'yes' if hw.mlx_importable else 'no'}")
    status = 0
    model = None
    try:
        model = resolve_model(config.model.name, paths.cache_dir)
    except ModelError as exc:
        model_problem = str(exc)
        status = 1
    preset = load_preset(config.round.preset)
    try:
        sizing, problem = plan(config, hw, preset, model_scale(model) if model is not None else 1.0), None
        choice = sizing.backend
    except ResourceError as exc:  # the round does not fit: still say which backend it would be
        sizing, problem, choice = None, str(exc), choose_backend(hw, config.backend.kind)
    print("backend")
    print(f"  {choice.name}: {choice.reason}")
    print("round")
    print(f"  preset {preset.name} ({preset.description})")
    if sizing is not None:
        shape, build = sizing.shape, sizing.build
        print(
            f"  {shape.questions} questions x {shape.completions} completions, up to {shape.max_new_tokens} new tokens, "
            f"{build.threads} threads, training microbatch {build.microbatch_tokens} tokens"
            f"{' with activation checkpointing' if build.activation_checkpointing else ''}"
        )
    else:
        print(f"  problem: {problem}")
        status = 1
    print("model")
    if model is not None:
        print(f"  {model.name}: {model.source}")
    else:
        print(f"  problem: {model_problem}")
    for name, entry in SHIPPED.items():
        print(f"  available: {name} — {entry.description}")
    swarm_report(config, paths)
    print("paths")
    print(f"  config file   {config_file}{'' if config_file.exists() else ' (not created; defaults in use)'}")
    for label, value in paths.as_dict().items():
        if label != "config file":
            print(f"  {label:<13} {value}")
    return status


def doctor_arguments(p) -> None:
    add_config_flags(p)


def doctor_main(c: Invocation) -> int:
    return doctor(c.config, c.paths, c.config_file)
