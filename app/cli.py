"""The `swarmling` command: its arguments, and which module runs each subcommand (the swarm's in
`swarm_cli.py`; the node's run, control and service here)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path

from .config import Config, ConfigError, describe_keys, load_config, parse_value
from .paths import resolve_paths
from .commands.swarm import identity_command, invite_command, join_command, relay_command


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be 1 or more")
    return value


def _node_counts(text: str) -> tuple[int, ...]:
    counts = tuple(_positive(part) for part in text.split(",") if part.strip())
    if not counts:
        raise argparse.ArgumentTypeError("give a node count, or several: 8,16")
    return counts


def _assignment(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: expected section.key=value, e.g. round.questions=4")
    return key.strip(), parse_value(value.strip())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="swarmling", description="A volunteer node for collective RL post-training (SAPO).")
    parser.add_argument("--home", help="keep config, state, cache and logs under this folder (also SWARMLING_HOME)")
    parser.add_argument("--config", type=Path, help="config file (default: config.toml in the config dir)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log more")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser("run", help="run the node (rounds until stopped); the default command")
    run.add_argument("--headless", action="store_true",
                     help="no UI: one line per round on stdout (the default when not on a terminal)")
    run.add_argument("--rounds", type=_positive, help="stop after this many rounds")
    _add_overrides(run)

    sim = sub.add_parser("sim", help="run N real nodes on 127.0.0.1 as one swarm (demos, tests, experiments)")
    sim.add_argument("--nodes", type=_node_counts, default=(3,), metavar="N[,N…]",
                     help="how many nodes (default 3); several counts, e.g. 8,16, run one swarm after the other "
                          "and compare their per-node traffic (the swarm benchmark)")
    sim.add_argument("--rounds", type=_positive, default=3, help="rounds per node (default 3)")
    sim.add_argument("--dir", type=Path, help="where the nodes keep their state (default: a new folder under the state dir)")
    sim.add_argument("--tiny", action="store_true", help="tiny rounds (4 questions x 4 completions, 12 tokens): for network experiments")
    sim.add_argument("--timeout", type=_positive, default=3600, help="stop every node after this many seconds (default 3600)")
    _add_overrides(sim)

    st = sub.add_parser("status", help="what the running node is doing (over its local control socket)")
    st.add_argument("--json", action="store_true", help="machine-readable")
    for name, text in (("pause", "pause the running node now (the round in flight is dropped)"),
                       ("resume", "resume a paused node"),
                       ("finish", "let the running node finish its round, then pause")):
        sub.add_parser(name, help=text)
    svc = sub.add_parser("service", help="run the node as a per-user service (systemd user unit / launchd agent)")
    svc.add_argument("action", choices=("install", "uninstall", "status"))
    svc.add_argument("--no-start", action="store_true", help="install: write the unit file only")

    ident = sub.add_parser("id", help="show this node's peer ID and the addresses peers can dial")
    who = ident.add_mutually_exclusive_group()
    who.add_argument("--new", action="store_true", help="replace the identity with a fresh one (a cloned machine, a leaked key)")
    who.add_argument("--adopt", action="store_true", help="keep the identity on this machine after moving the node here")
    _add_overrides(ident)

    inv = sub.add_parser("invite", help="print a one-line invite to this swarm (its name and helpers' addresses)")
    inv.add_argument("--helper", dest="helpers", action="append", default=[], metavar="MULTIADDR",
                     help="also invite through this helper, /ip4|dns4/…/tcp/…/p2p/<peer id> (repeatable)")
    inv.add_argument("--public-host", default="", metavar="IP|NAME",
                     help="this machine's public IP or DNS name, when it is not on one of its interfaces "
                          "(a forwarded port, a cloud VM)")
    _add_overrides(inv)
    jn = sub.add_parser("join", help="join the swarm of an invite: its name and helpers go into your config file")
    jn.add_argument("invite", help="the line `swarmling invite` printed (swarmling:1:…)")
    jn.add_argument("--replace", action="store_true", help="drop the helpers listed before instead of keeping them")

    doctor = sub.add_parser("doctor", help="show hardware, the backend it would use and why, model and paths")
    _add_overrides(doctor)

    relay = sub.add_parser("relay", help="run a public helper (no model): bootstrap, relay and dial-back for nodes behind NAT")
    relay.add_argument("--public-host", default="", metavar="IP",
                       help="the address peers dial when it is not this machine's (a forwarded port on a home router)")
    relay.add_argument("--every", type=_positive, default=60, metavar="S", help="print figures every S seconds (default 60)")
    _add_overrides(relay)

    exp = sub.add_parser("experiment", help="does sharing help? N in-process nodes per local/external mix and seed")
    exp.add_argument("--nodes", type=_positive, default=4, help="nodes per configuration (default 4)")
    exp.add_argument("--rounds", type=_positive, default=20, help="rounds per node (default 20)")
    exp.add_argument("--seeds", type=_positive, default=3, help="seeds per mix (default 3)")
    exp.add_argument("--mixes", default="8/0,6/2,4/4,2/6", help="local/external mixes in the paper's units of 8, "
                     "scaled to the round's Q (default: the paper's four)")
    exp.add_argument("--models", default="", help="comma-separated models, round-robin over the nodes (default: the configured one)")
    exp.add_argument("--out", type=Path, default=Path("swarmling-experiment"), help="results folder; run again to resume")
    exp.add_argument("--tiny", action="store_true", help="tiny rounds (smoke runs)")
    _add_overrides(exp)

    ev = sub.add_parser("eval", help="held-out accuracy of a checkpoint (default: the newest) or the base model")
    ev.add_argument("--checkpoint", type=Path, metavar="DIR", help="a checkpoint folder (default: this home's newest)")
    ev.add_argument("--base", action="store_true", help="the base model, without any adapter")
    ev.add_argument("--json", action="store_true", help="machine-readable output")
    _add_overrides(ev)

    bench = sub.add_parser("bench", help="time a round's phases against raw llama.cpp throughput")
    bench.add_argument("--rounds", type=_positive, default=2, help="rounds to time (default 2; the first warms up)")
    _add_overrides(bench)

    gpu = sub.add_parser("bench-gpu", help="the CUDA backend's round (paper shape, two model sizes) vs HF generate and the bandwidth floor")
    gpu.add_argument("--device", default="cuda", help="cuda (default), or cpu with --tiny to check the command")
    gpu.add_argument("--tiny", action="store_true", help="a toy shape (for checking the command, not for timing)")
    gpu.add_argument("--rounds", type=_positive, default=3, help="steady calls to take the median of (default 3)")

    bsw = sub.add_parser("bench-swarm", help="per-node swarm traffic at several swarm sizes: network-only nodes "
                                             "(real libp2p on 127.0.0.1, synthetic bundles, no model)")
    bsw.add_argument("--nodes", type=_node_counts, default=(8, 16, 32, 64), metavar="N[,N…]",
                     help="swarm sizes, one after the other (default 8,16,32,64)")
    bsw.add_argument("--rounds", type=_positive, default=3, help="measured rounds per size (default 3)")
    bsw.add_argument("--warmup", type=int, help="rounds before measuring (default 3; 7 with --cold)")
    bsw.add_argument("--round-seconds", type=float, default=0.0,
                     help="length of a round (default: 15 s, or 0.9 s per node when more)")
    bsw.add_argument("--cold", action="store_true",
                     help="start every node on one topic (shard levels then settle within 7 rounds)")
    bsw.add_argument("--dial", type=_positive, default=4, help="random peers each node dials (default 4)")
    bsw.add_argument("--dir", type=Path, help="where the nodes keep identities and the results (default: a temp folder)")

    cfg = sub.add_parser("config", help="show the effective configuration, or all keys")
    cfg.add_argument("--keys", action="store_true", help="list every key with its default")
    _add_overrides(cfg)
    return parser


def _add_overrides(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="shipped model name, path to a .gguf file, or (CUDA) a Hugging Face folder / cached id")
    p.add_argument("--preset", help="task preset (starter, sapo9)")
    p.add_argument("--threads", type=_positive, help="CPU threads (default: all cores but one)")
    p.add_argument("--max-memory", type=float, metavar="GB", help="memory ceiling in GB (resources.max_memory_gb)")
    p.add_argument("--peer", dest="peers", action="append", default=[], metavar="MULTIADDR",
                   help="a peer to stay connected to, /ip4/…/tcp/…/p2p/<peer id> (repeatable)")
    p.add_argument("--port", type=int, help="swarm listen port (0: any free port)")
    p.add_argument("--swarm", help="swarm name: nodes only meet nodes of the same swarm")
    p.add_argument("--set", dest="assignments", action="append", type=_assignment, default=[], metavar="SECTION.KEY=VALUE",
                   help="override any config key (repeatable)")


def _cli_overrides(args: argparse.Namespace) -> list[tuple[str, object]]:
    pairs = list(getattr(args, "assignments", []) or [])
    for flag, key in (
        ("model", "model.name"), ("preset", "round.preset"), ("threads", "backend.threads"),
        ("max_memory", "resources.max_memory_gb"),
        ("port", "swarm.port"), ("swarm", "swarm.name"),
    ):
        value = getattr(args, flag, None)
        if value is not None:
            pairs.append((key, value))
    peers = getattr(args, "peers", None)
    if peers:
        pairs.append(("swarm.peers", tuple(peers)))
    return pairs


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="swarmling: %(message)s")
    # The node's own progress notes (e.g. the one-time model conversion) are for the user.
    logging.getLogger("swarmling").setLevel(logging.INFO)
    # py-libp2p logs every failed dial of a departed peer at ERROR: the node reports what matters
    # (importing py-libp2p resets this: swarm/host.py sets it again).
    logging.getLogger("libp2p").setLevel(logging.INFO if args.verbose else logging.CRITICAL)
    if args.command is None:
        args = parser.parse_args([*(sys.argv[1:] if argv is None else argv), "run"])
    paths = resolve_paths(args.home)
    config_file = args.config or Path(os.environ.get("SWARMLING_CONFIG", paths.config_file))
    if args.config is not None and not args.config.exists():
        print(f"swarmling: config file {args.config} does not exist", file=sys.stderr)
        return 2
    try:
        config = load_config(config_file, cli=_cli_overrides(args))
    except ConfigError as exc:
        print(f"swarmling: {exc}", file=sys.stderr)
        return 2
    if args.command == "config":
        return _config(config, args)
    if args.command in ("status", "pause", "resume", "finish"):
        return _control(paths, args.command, getattr(args, "json", False))
    if args.command == "service":
        return _service(paths, args)
    if args.command == "invite":
        return invite_command(config, paths, args.helpers, args.public_host)
    if args.command == "join":
        return join_command(paths, config_file, args.invite, args.replace)
    _log_to_file(paths, config)
    if args.command == "doctor":
        from .commands.doctor import doctor

        return _guard(lambda: doctor(config, paths, config_file))
    if args.command == "id":
        return _guard(lambda: identity_command(config, paths, new=args.new, adopt=args.adopt))
    if args.command == "relay":
        return _guard(lambda: relay_command(config, paths, args.public_host, args.every))
    if args.command == "sim":
        from .commands.sim import SimOptions, compare, simulate

        runs = [SimOptions(n, args.rounds, args.dir / f"{n}-nodes" if args.dir and len(args.nodes) > 1 else args.dir,
                           args.tiny, args.timeout, _cli_overrides(args)) for n in args.nodes]
        if len(runs) == 1:
            return _guard(lambda: simulate(runs[0], paths))
        return _guard(lambda: compare(runs, paths))
    if args.command == "bench-gpu":
        from .commands.bench_gpu import bench_gpu

        return bench_gpu(args.device, args.tiny, args.rounds)
    if args.command == "bench-swarm":
        from .commands.swarm_bench import BenchOptions, bench_swarm

        warmup = args.warmup if args.warmup is not None else 7 if args.cold else 3
        return bench_swarm(BenchOptions(args.nodes, rounds=args.rounds, warmup=warmup,
                                        round_s=args.round_seconds, dial=args.dial, directory=args.dir, cold=args.cold))
    if args.command == "experiment":
        from .commands.experiment import ExperimentOptions, experiment_command, parse_mixes

        return _guard(lambda: experiment_command(ExperimentOptions(
            out=args.out, nodes=args.nodes, rounds=args.rounds, seeds=args.seeds, mixes=parse_mixes(args.mixes),
            models=tuple(m for m in args.models.split(",") if m), tiny=args.tiny,
            overrides=tuple(_cli_overrides(args))), paths))
    if args.command == "eval":
        from .commands.evaluate import eval_command

        return _guard(lambda: eval_command(config, paths, args.checkpoint, args.base, args.json))
    if args.command == "bench":
        from .commands.bench import bench

        return _guard(lambda: bench(config, paths, args.rounds))
    if args.headless or not _interactive():
        return _guard(lambda: _run(config, paths, args.rounds))
    return _guard(lambda: _run_tui(config, paths, args.rounds, config_file, _cli_overrides(args)))


def _interactive() -> bool:
    """The TUI needs a real terminal on both ends; pipes, services and CI get headless."""
    return sys.stdin.isatty() and sys.stdout.isatty() and os.environ.get("TERM", "") not in ("", "dumb")


def _log_to_file(paths, config: Config) -> None:
    """Round lines, notices and the node's log into a rotating file in the log dir."""
    from logging.handlers import RotatingFileHandler

    try:
        paths.log_dir.mkdir(parents=True, exist_ok=True)
        handler = RotatingFileHandler(paths.log_dir / "swarmling.log", maxBytes=int(config.logging.max_mb * 2**20),
                                      backupCount=config.logging.keep, encoding="utf-8")
    except OSError as exc:
        print(f"swarmling: warning: no log file ({exc})", file=sys.stderr)
        return
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    for name in ("swarmling", "swarmling.rounds"):
        logging.getLogger(name).addHandler(handler)
    logging.getLogger("swarmling.rounds").setLevel(logging.INFO)


def _control(paths, cmd: str, as_json: bool) -> int:
    import json

    from .node.control import ControlError, send

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
        print(f"last     round {last['round']}: reward {last['reward_mean']:.3f}, solved {last['solved']}/"
              f"{last['questions']}, {last['wall_seconds']:.0f} s")
    if status.get("peers") is not None:
        print(f"peers    {status['peers']}")
    if status.get("swarm_share") is not None:
        print(f"learnt   {status['swarm_share']:.0%} from the swarm (peers' groups' share of the advantage mass, "
              "last 10 rounds)")
    host = status.get("swarm_host")
    if host and host.get("reachability_text"):
        print(f"reach    {host['reachability_text']}")
    if host and (host["restarts"] or not host["running"]):
        state = "running" if host["running"] else "restarting"
        print(f"swarm    host {state}, restarted {host['restarts']}x (last failure: {host['last_error'] or '-'})")
    return 0


def _service(paths, args) -> int:
    from .commands import service

    home = os.environ.get("SWARMLING_HOME") or args.home
    try:
        if args.action == "install":
            print(service.install(paths, str(Path(home).resolve()) if home else None, start=not args.no_start))
        elif args.action == "uninstall":
            print(service.uninstall())
        else:
            print(service.status())
    except service.ServiceError as exc:
        print(f"swarmling: {exc}", file=sys.stderr)
        return 1
    return 0


def _config(config: Config, args: argparse.Namespace) -> int:
    if args.keys:
        print(describe_keys())
        return 0
    for section, values in config.model_dump().items():
        print(f"[{section}]")
        for key, value in values.items():
            print(f"{key} = {'auto' if value is None else repr(value)}")
    return 0


def _guard(fn) -> int:
    from .sizing import ResourceError
    from .errors import NodeError
    from .models import ModelError
    from .learning.tasks import TaskError

    try:
        return fn()
    except (NodeError, ModelError, TaskError, ConfigError, ResourceError) as exc:
        print(f"swarmling: {exc}", file=sys.stderr)
        return 1


def _run_tui(config: Config, paths, rounds: int | None, config_file: Path, cli) -> int:
    from .tui.app import create_app

    app = create_app(config, paths, rounds=rounds, config_file=config_file, cli=cli)
    code = app.run()
    if app.forced:
        print("swarmling: forced exit; the last checkpoint is intact", file=sys.stderr, flush=True)
        os._exit(130)  # the node's thread may be inside a native call: do not wait for it
    if app.control.alive:  # SIGTERM / SIGHUP closed the UI first; a second signal forces
        print("swarmling: stopping the node; the last checkpoint is kept", file=sys.stderr, flush=True)
    app.control.join()
    if app.view.state == "failed":
        print(f"swarmling: {app.view.state_detail}", file=sys.stderr)
        return 1
    return code or 0


def _run(config: Config, paths, rounds: int | None) -> int:
    from .headless import HeadlessPrinter
    from .node.loop import Node

    node = Node(config, paths, HeadlessPrinter())
    signals = {"count": 0}

    def on_signal(signum, frame):
        signals["count"] += 1
        if signals["count"] == 1:
            what = "finishing" if config.run.on_stop == "finish" else "abandoning"
            print(f"swarmling: stopping ({what} the round in flight; again to force)", file=sys.stderr, flush=True)
            node.request_stop()
        else:
            print("swarmling: forced exit; the last checkpoint is intact", file=sys.stderr, flush=True)
            os._exit(130)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        node.start()
        node.run(rounds)
    finally:
        node.close()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
