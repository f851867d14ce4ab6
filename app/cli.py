"""The `swarmling` command: its arguments, and a table of which module runs each subcommand
(every one lives in `app/commands/`)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from .config import Config, ConfigError, describe_config, describe_keys, load_config, parse_value
from .paths import Paths, resolve_paths


def _positive_minutes(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of minutes") from None
    if not value > 0:
        raise argparse.ArgumentTypeError("must be more than 0")
    return value


def _whole_number(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be {least} or more")
    return value


def _not_negative(text: str) -> int:
    return _whole_number(text, 0)


def _positive(text: str) -> int:
    return _whole_number(text, 1)


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

    exp = sub.add_parser("experiment", help="does sharing help? a design's arms x seeds, N in-process nodes each")
    exp.add_argument("--design", default="specialists",  # checked where the designs are (design_named)
                     help="specialists (default), rare-success, paper (README 'Does sharing help?'), "
                          "rescue (docs/rescue-experiment.md) or "
                          "volunteer (one node on the default preset: the learning defaults' screen)")
    exp.add_argument("--nodes", type=_positive, help="nodes per configuration (default: the design's)")
    exp.add_argument("--rounds", type=_positive, help="rounds per node (default: the design's)")
    exp.add_argument("--seeds", type=_positive, help="seeds, i.e. pairs (default: the design's)")
    exp.add_argument("--seed-offset", type=_not_negative,
                     help="the first seed (default: the design's, 200/300/400, never used to choose anything)")
    exp.add_argument("--arms", default="", help="comma-separated arms to run (default: all the design's); the others may "
                     "run later into the same --out")
    exp.add_argument("--models", default="", help="comma-separated models, round-robin over the nodes (default: the configured one)")
    exp.add_argument("--burn-in", type=_not_negative, metavar="R", help="count the evaluations after round R (default: the design's)")
    exp.add_argument("--eval-every", type=_positive, metavar="R", help="evaluate every R rounds (default: the design's)")
    exp.add_argument("--minutes", type=_positive_minutes,
                     help="stop after this long (at a round's end); the same command resumes")
    exp.add_argument("--out", type=Path, default=Path("swarmling-experiment"), help="results folder; run again to resume")
    exp.add_argument("--tiny", action="store_true", help="tiny rounds (smoke runs)")
    exp.add_argument("--archive", type=Path, metavar="FILE",
                     help="restore finished runs from FILE before the grid, write it anew after (machines that start bare)")
    _add_overrides(exp, threads_default="backend.threads if configured, else 2, the threads the README's figures were measured on")

    ev = sub.add_parser("eval", help="held-out accuracy of a checkpoint (default: the newest) or the base model")
    which = ev.add_mutually_exclusive_group()
    which.add_argument("--checkpoint", type=Path, metavar="DIR", help="a checkpoint folder (default: this home's newest)")
    which.add_argument("--best", action="store_true", help="the best checkpoint by held-out accuracy")
    which.add_argument("--base", action="store_true", help="the base model, without any adapter")
    ev.add_argument("--pass-at", type=_positive, metavar="K",
                    help="pass@K instead: K replies per item at the training temperature (the base model's is the "
                         "ceiling RL can be expected to approach)")
    ev.add_argument("--json", action="store_true", help="machine-readable output")
    _add_overrides(ev)

    ex = sub.add_parser("export", help="the trained model as files other tools read: GGUF + LoRA + Ollama Modelfile, "
                                       "or a merged transformers folder; with a model card")
    exwhich = ex.add_mutually_exclusive_group()
    exwhich.add_argument("--checkpoint", type=Path, metavar="DIR", help="a checkpoint folder (default: this home's newest)")
    exwhich.add_argument("--best", action="store_true", help="the best checkpoint by held-out accuracy")
    ex.add_argument("--format", dest="fmt", choices=("gguf", "hf"),
                    help="gguf: base GGUF + adapter GGUF + Modelfile, for llama.cpp and Ollama (the default where the "
                         "base is a GGUF); hf: merged safetensors for transformers")
    ex.add_argument("--out", type=Path, required=True, metavar="DIR", help="a new (or empty) folder to write")
    _add_overrides(ex)

    ak = sub.add_parser("ask", help="the trained model and the base model answer a question side by side")
    ak.add_argument("question", help='e.g. "What is 17 + 25?"')
    akwhich = ak.add_mutually_exclusive_group()
    akwhich.add_argument("--checkpoint", type=Path, metavar="DIR", help="a checkpoint folder (default: this home's newest)")
    akwhich.add_argument("--best", action="store_true", help="the best checkpoint by held-out accuracy")
    _add_overrides(ak)

    rs = sub.add_parser("reset", help="start again from the base model (or --best: from the best checkpoint); "
                                      "checkpoints and metrics are archived, identity and peers kept")
    rs.add_argument("--best", action="store_true", help="resume from the checkpoint with the best held-out accuracy")

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

    soak = sub.add_parser("soak", help="days of a swarm compressed: network-only nodes on 127.0.0.1 in tiny rounds, "
                                       "sampling memory, descriptors, threads, connections, streams, caches and disk")
    soak.add_argument("--nodes", type=_positive, default=3, help="nodes, one process each (default 3)")
    soak.add_argument("--rounds", type=_positive, default=1000, help="rounds (default 1000)")
    soak.add_argument("--round-seconds", type=float, default=1.0, help="length of a round (default 1 s)")
    soak.add_argument("--every", type=_positive, default=10, help="rounds between samples (default 10)")
    soak.add_argument("--warmup", type=int, default=100, help="rounds left out of the slopes (default 100)")
    soak.add_argument("--dir", type=Path, help="where the nodes and the results go (default: a temp folder)")

    cfg = sub.add_parser("config", help="show the effective configuration, or all keys")
    cfg.add_argument("--keys", action="store_true", help="list every key with its default")
    _add_overrides(cfg)
    return parser


def _add_overrides(p: argparse.ArgumentParser, threads_default: str = "all cores but one") -> None:
    p.add_argument("--model", help="shipped model name, path to a .gguf file, or (CUDA) a Hugging Face folder / cached id")
    p.add_argument("--preset", help="task preset (starter-2, the default; starter; sapo9)")
    p.add_argument("--threads", type=_positive, help=f"CPU threads (default: {threads_default})")
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


@dataclass(frozen=True)
class Invocation:
    """What every subcommand is run with: its arguments, the effective config and where things live."""

    args: argparse.Namespace
    config: Config
    paths: Paths
    config_file: Path

    @property
    def overrides(self) -> list[tuple[str, object]]:
        return _cli_overrides(self.args)


# Each subcommand's module is imported only when it runs: `swarmling status` must not pay for
# torch, and the headless node never imports Textual.
def _run(c: Invocation) -> int:
    from .commands.run import run_command

    return run_command(c.config, c.paths, c.args.rounds, c.args.headless, c.config_file, c.overrides)


def _control(c: Invocation) -> int:
    from .commands.control import control_command

    return control_command(c.paths, c.args.command, getattr(c.args, "json", False))


def _service(c: Invocation) -> int:
    from .commands.service import service_command

    return service_command(c.paths, c.args.action, os.environ.get("SWARMLING_HOME") or c.args.home, not c.args.no_start)


def _config(c: Invocation) -> int:
    print(describe_keys() if c.args.keys else describe_config(c.config))
    return 0


def _invite(c: Invocation) -> int:
    from .commands.swarm import invite_command

    return invite_command(c.config, c.paths, c.args.helpers, c.args.public_host)


def _join(c: Invocation) -> int:
    from .commands.swarm import join_command

    return join_command(c.paths, c.config_file, c.args.invite, c.args.replace)


def _identity(c: Invocation) -> int:
    from .commands.swarm import identity_command

    return identity_command(c.config, c.paths, new=c.args.new, adopt=c.args.adopt)


def _relay(c: Invocation) -> int:
    from .commands.swarm import relay_command

    return relay_command(c.config, c.paths, c.args.public_host, c.args.every)


def _doctor(c: Invocation) -> int:
    from .commands.doctor import doctor

    return doctor(c.config, c.paths, c.config_file)


def _sim(c: Invocation) -> int:
    from .commands.sim import SimOptions, compare, simulate

    a = c.args
    runs = [SimOptions(n, a.rounds, a.dir / f"{n}-nodes" if a.dir and len(a.nodes) > 1 else a.dir, a.tiny, a.timeout,
                       c.overrides) for n in a.nodes]
    return simulate(runs[0], c.paths) if len(runs) == 1 else compare(runs, c.paths)


def _bench_gpu(c: Invocation) -> int:
    from .commands.bench_gpu import bench_gpu

    return bench_gpu(c.args.device, c.args.tiny, c.args.rounds)


def _bench_swarm(c: Invocation) -> int:
    from .commands.swarm_bench import BenchOptions, bench_swarm

    a = c.args
    warmup = a.warmup if a.warmup is not None else 7 if a.cold else 3
    return bench_swarm(BenchOptions(a.nodes, rounds=a.rounds, warmup=warmup, round_s=a.round_seconds, dial=a.dial,
                                    directory=a.dir, cold=a.cold))


def _soak(c: Invocation) -> int:
    from .commands.soak import SoakOptions, soak_command

    a = c.args
    return soak_command(SoakOptions(a.nodes, a.rounds, a.round_seconds, a.every, a.warmup, a.dir))


def _experiment(c: Invocation) -> int:
    from .commands.experiment import ExperimentOptions, design_named, experiment_command
    from .errors import NodeError

    a, design = c.args, design_named(c.args.design)
    design = replace(design, burn_in=design.burn_in if a.burn_in is None else a.burn_in,
                     eval_every=a.eval_every or design.eval_every)
    rounds = a.rounds or design.rounds
    counted, needed = sum(design.counted(r) for r in design.eval_rounds(rounds)), 1 if a.tiny else 3  # --tiny: smoke runs
    if counted < needed:
        raise NodeError(f"--rounds {rounds}: {counted} evaluations would come after the burn-in (round {design.burn_in}; "
                        f"evaluations every {design.eval_every} rounds), an experiment needs {needed}: give more rounds, "
                        "or --burn-in/--eval-every")
    threads = c.config.backend.threads or 2  # an experiment's default: the 2 threads its figures were measured on
    overrides = tuple((k, v) for k, v in c.overrides if k != "backend.threads")
    return experiment_command(ExperimentOptions(
        design=design, out=a.out, nodes=a.nodes or design.nodes, rounds=rounds,
        seeds=a.seeds or design.seeds, seed_offset=design.first_seed if a.seed_offset is None else a.seed_offset, models=tuple(m for m in a.models.split(",") if m),
        tiny=a.tiny, threads=threads, minutes=a.minutes, overrides=overrides, archive=a.archive,
        arms=tuple(name for name in a.arms.split(",") if name)), c.paths)


def _eval(c: Invocation) -> int:
    from .commands.evaluate import eval_command

    return eval_command(c.config, c.paths, c.args.checkpoint, c.args.base, c.args.json, c.args.best, c.args.pass_at)


def _export(c: Invocation) -> int:
    from .commands.export import export_command

    return export_command(c.config, c.paths, c.args.out, c.args.checkpoint, c.args.best, c.args.fmt)


def _ask(c: Invocation) -> int:
    from .commands.ask import ask_command

    return ask_command(c.config, c.paths, c.args.question, c.args.checkpoint, c.args.best)


def _reset(c: Invocation) -> int:
    from .commands.reset import reset_command

    return reset_command(c.paths, c.args.best)


def _bench(c: Invocation) -> int:
    from .commands.bench import bench

    return bench(c.config, c.paths, c.args.rounds)


@dataclass(frozen=True)
class Command:
    run: Callable[[Invocation], int]
    logs_to_file: bool = True  # the node's log file: for commands that run a node, a helper or a probe


COMMANDS: dict[str, Command] = {
    "run": Command(_run),
    "status": Command(_control, logs_to_file=False),
    "pause": Command(_control, logs_to_file=False),
    "resume": Command(_control, logs_to_file=False),
    "finish": Command(_control, logs_to_file=False),
    "service": Command(_service, logs_to_file=False),
    "config": Command(_config, logs_to_file=False),
    "invite": Command(_invite, logs_to_file=False),
    "join": Command(_join, logs_to_file=False),
    "id": Command(_identity),
    "relay": Command(_relay),
    "doctor": Command(_doctor),
    "sim": Command(_sim),
    "bench": Command(_bench),
    "bench-gpu": Command(_bench_gpu),
    "bench-swarm": Command(_bench_swarm),
    "soak": Command(_soak),
    "experiment": Command(_experiment),
    "eval": Command(_eval),
    "reset": Command(_reset, logs_to_file=False),
    "export": Command(_export, logs_to_file=False),
    "ask": Command(_ask, logs_to_file=False),
}


def with_default_command(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """`argv` with `run` put in where no command is named: `swarmling --threads 2` is `swarmling
    run --threads 2` (README's common flags work with the default command). The command's place is
    after the top-level options (--home, --config, -v); whatever comes there that is not a command
    (or a request for help) starts run's own options."""
    takes_value = {o for a in parser._actions if a.nargs != 0 for o in a.option_strings}
    no_value = {o for a in parser._actions if a.nargs == 0 for o in a.option_strings}
    i = 0
    while i < len(argv):
        word = argv[i]
        if word in takes_value:
            i += 2
        elif word in no_value - {"-h", "--help"} or word.split("=", 1)[0] in takes_value:
            i += 1
        else:
            break
    if i < len(argv) and (argv[i] in COMMANDS or argv[i] in ("-h", "--help")):
        return argv
    return [*argv[:i], "run", *argv[i:]]


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    return parser.parse_args(with_default_command(parser, list(sys.argv[1:] if argv is None else argv)))


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="swarmling: %(message)s")
    # The node's own progress notes (e.g. the one-time model conversion) are for the user.
    logging.getLogger("swarmling").setLevel(logging.INFO)
    # py-libp2p logs every failed dial of a departed peer at ERROR: the node reports what matters
    # (importing py-libp2p resets this: swarm/host/host.py sets it again).
    logging.getLogger("libp2p").setLevel(logging.INFO if args.verbose else logging.CRITICAL)
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
    command = COMMANDS[args.command]
    if command.logs_to_file:
        _log_to_file(paths, config)
    return _guard(lambda: command.run(Invocation(args, config, paths, config_file)))


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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
