"""What every command shares on the command line: the value types of its flags, the flags that
override the config (`--model`, `--threads`, `--set`, …), and what a command is run with."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from ..config import Config, parse_value
from ..paths import Paths


@dataclass(frozen=True)
class Invocation:
    """What every subcommand is run with: its arguments, the effective config and where things live."""

    args: argparse.Namespace
    config: Config
    paths: Paths
    config_file: Path

    @property
    def overrides(self) -> list[tuple[str, object]]:
        return config_overrides(self.args)


def positive_minutes(text: str) -> float:
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


def not_negative(text: str) -> int:
    return _whole_number(text, 0)


def positive(text: str) -> int:
    return _whole_number(text, 1)


def node_counts(text: str) -> tuple[int, ...]:
    counts = tuple(positive(part) for part in text.split(",") if part.strip())
    if not counts:
        raise argparse.ArgumentTypeError("give a node count, or several: 8,16")
    return counts


def _assignment(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: expected section.key=value, e.g. round.questions=4")
    return key.strip(), parse_value(value.strip())


def add_config_flags(p: argparse.ArgumentParser, threads_default: str = "all cores but one") -> None:
    """The flags that override config keys, for the commands that build a node, a helper or a probe."""
    p.add_argument("--model", help="shipped model name, path to a .gguf file, or (CUDA) a Hugging Face folder / cached id")
    p.add_argument("--preset", help="task preset (starter-2, the default; starter; sapo9)")
    p.add_argument("--threads", type=positive, help=f"CPU threads (default: {threads_default})")
    p.add_argument("--max-memory", type=float, metavar="GB", help="memory ceiling in GB (resources.max_memory_gb)")
    p.add_argument("--peer", dest="peers", action="append", default=[], metavar="MULTIADDR",
                   help="a peer to stay connected to, /ip4/…/tcp/…/p2p/<peer id> (repeatable)")
    p.add_argument("--port", type=int, help="swarm listen port (0: any free port)")
    p.add_argument("--swarm", help="swarm name: nodes only meet nodes of the same swarm")
    p.add_argument("--set", dest="assignments", action="append", type=_assignment, default=[], metavar="SECTION.KEY=VALUE",
                   help="override any config key (repeatable)")


def config_overrides(args: argparse.Namespace) -> list[tuple[str, object]]:
    """The config keys the command line sets, `--set` first and the named flags after (they win)."""
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


def add_checkpoint_choice(p: argparse.ArgumentParser, base: bool = False) -> None:
    """--checkpoint DIR | --best (| --base): which trained adapter a command reads."""
    which = p.add_mutually_exclusive_group()
    which.add_argument("--checkpoint", type=Path, metavar="DIR", help="a checkpoint folder (default: this home's newest)")
    which.add_argument("--best", action="store_true", help="the best checkpoint by held-out accuracy")
    if base:
        which.add_argument("--base", action="store_true", help="the base model, without any adapter")
