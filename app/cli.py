"""The `swarmling` command: the options every command shares, and a table of the commands. Each
command declares its own flags and its entry point in its module under `app/commands/`; that
module is imported only when its command runs (or its help is asked for), so `swarmling status`
never pays for torch and the headless node never imports Textual."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from .commands.arguments import Invocation, config_overrides
from .config import ConfigError, load_config
from .paths import resolve_paths


@dataclass(frozen=True)
class Command:
    module: str  # under app/commands/
    summary: str
    run: str  # the module's `(Invocation) -> int`
    arguments: str | None = None  # the module's `(ArgumentParser) -> None`, where it takes flags
    logs_to_file: bool = True  # the node's log file: for commands that run a node, a helper or a probe


COMMANDS: dict[str, Command] = {
    "run": Command("run", "run the node (rounds until stopped); the default command", "run_main", "run_arguments"),
    "sim": Command("sim", "run N real nodes on 127.0.0.1 as one swarm (demos, tests, experiments)",
                   "sim_main", "sim_arguments"),
    "status": Command("control", "what the running node is doing (over its local control socket)", "control_main", "status_arguments",
                      logs_to_file=False),
    "pause": Command("control", "pause the running node now (the round in flight is dropped)", "control_main",
                     logs_to_file=False),
    "resume": Command("control", "resume a paused node", "control_main", logs_to_file=False),
    "finish": Command("control", "let the running node finish its round, then pause", "control_main",
                      logs_to_file=False),
    "service": Command("service", "run the node as a per-user service (systemd user unit / launchd agent)",
                       "service_main", "service_arguments", logs_to_file=False),
    "id": Command("swarm", "show this node's peer ID and the addresses peers can dial", "identity_main",
                  "identity_arguments"),
    "invite": Command("swarm", "print a one-line invite to this swarm (its name and helpers' addresses)",
                      "invite_main", "invite_arguments", logs_to_file=False),
    "join": Command("swarm", "join the swarm of an invite: its name and helpers go into your config file",
                    "join_main", "join_arguments", logs_to_file=False),
    "doctor": Command("doctor", "show hardware, the backend it would use and why, model and paths",
                      "doctor_main", "doctor_arguments"),
    "relay": Command("swarm", "run a public helper (no model): bootstrap, relay and dial-back for nodes behind NAT",
                     "relay_main", "relay_arguments"),
    "experiment": Command("experiment", "does sharing help? a design's arms x seeds, N in-process nodes each",
                          "experiment_main", "experiment_arguments"),
    "eval": Command("evaluate", "held-out accuracy of a checkpoint (default: the newest) or the base model",
                    "eval_main", "eval_arguments"),
    "export": Command("export", "the trained model as files other tools read: GGUF + LoRA + Ollama Modelfile, "
                                "or a merged transformers folder; with a model card",
                      "export_main", "export_arguments", logs_to_file=False),
    "ask": Command("ask", "the trained model and the base model answer a question side by side",
                   "ask_main", "ask_arguments", logs_to_file=False),
    "reset": Command("reset", "start again from the base model (or --best: from the best checkpoint); "
                              "checkpoints and metrics are archived, identity and peers kept",
                     "reset_main", "reset_arguments", logs_to_file=False),
    "bench": Command("bench", "time a round's phases against raw llama.cpp throughput", "bench_main", "bench_arguments"),
    "bench-gpu": Command("bench_gpu", "the CUDA backend's round (paper shape, two model sizes) vs HF generate "
                                      "and the bandwidth floor", "bench_gpu_main", "bench_gpu_arguments"),
    "bench-swarm": Command("swarm_bench", "per-node swarm traffic at several swarm sizes: network-only nodes "
                                          "(real libp2p on 127.0.0.1, synthetic bundles, no model)",
                           "bench_swarm_main", "bench_swarm_arguments"),
    "soak": Command("soak", "days of a swarm compressed: network-only nodes on 127.0.0.1 in tiny rounds, "
                            "sampling memory, descriptors, threads, connections, streams, caches and disk",
                    "soak_main", "soak_arguments"),
    "config": Command("show_config", "show the effective configuration, or all keys", "config_main",
                      "config_arguments", logs_to_file=False),
}


def _entry(command: Command, name: str):
    return getattr(importlib.import_module(f".commands.{command.module}", __package__), name)


def build_parser(chosen: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, with the flags of `chosen` (the command that runs) filled in."""
    parser = argparse.ArgumentParser(prog="swarmling", description="A volunteer node for collective RL post-training (SAPO).")
    parser.add_argument("--home", help="keep config, state, cache and logs under this folder (also SWARMLING_HOME)")
    parser.add_argument("--config", type=Path, help="config file (default: config.toml in the config dir)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log more")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, command in COMMANDS.items():
        subparser = sub.add_parser(name, help=command.summary, description=command.summary)
        if name == chosen and command.arguments:
            _entry(command, command.arguments)(subparser)
    return parser


def with_default_command(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """`argv` with `run` put in where no command is named: `swarmling --threads 2` is `swarmling
    run --threads 2` (README's common flags work with the default command). Whatever comes after
    the top-level options that is not a command (or a request for help) starts run's own options."""
    i = _command_place(parser, argv)
    if i < len(argv) and (argv[i] in COMMANDS or argv[i] in ("-h", "--help")):
        return argv
    return [*argv[:i], "run", *argv[i:]]


def _command_place(parser: argparse.ArgumentParser, argv: list[str]) -> int:
    """Where the command's name goes: after the top-level options (--home, --config, -v)."""
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
    return i


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    top = build_parser()
    argv = with_default_command(top, list(sys.argv[1:] if argv is None else argv))
    i = _command_place(top, argv)
    return build_parser(argv[i] if i < len(argv) else None).parse_args(argv)


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
        config = load_config(config_file, cli=config_overrides(args))
    except ConfigError as exc:
        print(f"swarmling: {exc}", file=sys.stderr)
        return 2
    command = COMMANDS[args.command]
    if command.logs_to_file:
        _log_to_file(paths, config)
    return _guard(lambda: _entry(command, command.run)(Invocation(args, config, paths, config_file)))


def _log_to_file(paths, config) -> None:
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
    from .errors import NodeError
    from .learning.tasks import TaskError
    from .models import ModelError
    from .sizing import ResourceError

    try:
        return fn()
    except (NodeError, ModelError, TaskError, ConfigError, ResourceError) as exc:
        print(f"swarmling: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
