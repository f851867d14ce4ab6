"""`swarmling config`: the effective configuration, or every key with its default."""

from __future__ import annotations

from ..config import describe_config, describe_keys
from .arguments import Invocation, add_config_flags


def config_arguments(p) -> None:
    p.add_argument("--keys", action="store_true", help="list every key with its default")
    add_config_flags(p)


def config_main(c: Invocation) -> int:
    print(describe_keys() if c.args.keys else describe_config(c.config))
    return 0
