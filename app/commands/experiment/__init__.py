"""`swarmling experiment --design NAME`: does sharing help? An experiment with the power to answer.

  designs     who trains on what, what is measured, each design's defaults
  exchange    the in-memory network between an experiment's nodes
  grid        running (and resuming) the grid of arms x seeds
  statistics  paired differences, their interval, the smallest detectable effect
  report      summary.json, table.md and the plot
  archive     the finished runs' results, carried between machines (--archive)

`swarmling sim` runs nodes as separate processes over real libp2p on 127.0.0.1: use it to test
the network, and this to measure whether sharing helps.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from ....backends.atomic import write_atomic
from ...config import load_config
from ...errors import NodeError
from ...paths import Paths
from ..arguments import Invocation, add_config_flags, not_negative, positive, positive_minutes
from .archive import pack, unpack
from .designs import DESIGNS
from .grid import ExperimentOptions, run_experiment
from .report import plot, summarise, table

DEFAULT_DESIGN = "specialists"
EXPERIMENT_THREADS = 2  # an experiment's default: the threads its figures were measured on


def design_named(name: str):
    try:
        return DESIGNS[name]
    except KeyError:
        raise NodeError(f"--design: {name!r} is not a design; designs: {', '.join(DESIGNS)}") from None


def experiment_command(options: ExperimentOptions, paths: Paths) -> int:
    nice = load_config(None, environ={}).resources.nice
    if nice:
        os.nice(nice)  # once for the whole process (each node's own nice is set to 0)
    if options.archive is not None and options.archive.exists():
        restored = unpack(options.archive, options.out)
        print(f"experiment: {restored} files of finished runs restored from {options.archive}")
    carry = (lambda: pack(options, options.archive)) if options.archive is not None else (lambda: None)
    try:
        finished = run_experiment(options, paths, finished=carry)  # carried after each finished run too
        if finished:
            summary = summarise(options)
            write_atomic(options.out / "summary.json", summary.to_json())
            write_atomic(options.out / "table.md", table(summary))
            plot(summary, options.out)
            print(table(summary))
            print(f"experiment: summary.json, table.md and experiment.png / .svg in {options.out}")
    finally:  # the outputs too, and whatever finished before an error
        if options.archive is not None:
            print(f"experiment: {pack(options, options.archive)} files of finished runs archived in {options.archive}")
    return 0 if finished else 3  # 3: stopped by --minutes, resumable


def experiment_arguments(p) -> None:
    designs = ", ".join(f"{name} (default)" if name == DEFAULT_DESIGN else name for name in DESIGNS)
    p.add_argument("--design", default=DEFAULT_DESIGN, help=f"one of {designs}; docs/experiments.md says what each asks")
    p.add_argument("--nodes", type=positive, help="nodes per configuration (default: the design's)")
    p.add_argument("--rounds", type=positive, help="rounds per node (default: the design's)")
    p.add_argument("--seeds", type=positive, help="seeds, i.e. pairs (default: the design's)")
    p.add_argument("--seed-offset", type=not_negative,
                   help="the first seed (default: the design's, 200/300/400, never used to choose anything)")
    p.add_argument("--arms", default="", help="comma-separated arms to run (default: all the design's); the others may "
                   "run later into the same --out")
    p.add_argument("--models", default="", help="comma-separated models, round-robin over the nodes (default: the configured one)")
    p.add_argument("--burn-in", type=not_negative, metavar="R", help="count the evaluations after round R (default: the design's)")
    p.add_argument("--eval-every", type=positive, metavar="R", help="evaluate every R rounds (default: the design's)")
    p.add_argument("--minutes", type=positive_minutes,
                   help="stop after this long (at a round's end); the same command resumes")
    p.add_argument("--out", type=Path, default=Path("swarmling-experiment"), help="results folder; run again to resume")
    p.add_argument("--tiny", action="store_true", help="tiny rounds (smoke runs)")
    p.add_argument("--archive", type=Path, metavar="FILE",
                   help="restore finished runs from FILE before the grid, write it anew after (machines that start bare)")
    add_config_flags(p, threads_default=f"backend.threads if configured, else {EXPERIMENT_THREADS}, "
                                        "the threads the experiments' figures were measured on")


def experiment_main(c: Invocation) -> int:
    a, design = c.args, design_named(c.args.design)
    design = replace(design, burn_in=design.burn_in if a.burn_in is None else a.burn_in,
                     eval_every=a.eval_every or design.eval_every)
    rounds = a.rounds or design.rounds
    counted, needed = sum(design.counted(r) for r in design.eval_rounds(rounds)), 1 if a.tiny else 3  # --tiny: smoke runs
    if counted < needed:
        raise NodeError(f"--rounds {rounds}: {counted} evaluations would come after the burn-in (round {design.burn_in}; "
                        f"evaluations every {design.eval_every} rounds), an experiment needs {needed}: give more rounds, "
                        "or --burn-in/--eval-every")
    overrides = tuple((k, v) for k, v in c.overrides if k != "backend.threads")
    return experiment_command(ExperimentOptions(
        design=design, out=a.out, nodes=a.nodes or design.nodes, rounds=rounds,
        seeds=a.seeds or design.seeds, seed_offset=design.first_seed if a.seed_offset is None else a.seed_offset,
        models=tuple(m for m in a.models.split(",") if m), tiny=a.tiny,
        threads=c.config.backend.threads or EXPERIMENT_THREADS, minutes=a.minutes, overrides=overrides,
        archive=a.archive, arms=tuple(name for name in a.arms.split(",") if name)), c.paths)
