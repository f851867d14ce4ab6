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

import json
import os

from ....backends.atomic import write_atomic
from ...config import load_config
from ...errors import NodeError
from ...paths import Paths
from .archive import pack, unpack
from .designs import DESIGNS
from .grid import ExperimentOptions, run_experiment
from .report import plot, summarise, table


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
            write_atomic(options.out / "summary.json", json.dumps(summary, indent=1))
            write_atomic(options.out / "table.md", table(summary))
            plot(summary, options.out)
            print(table(summary))
            print(f"experiment: summary.json, table.md and experiment.png / .svg in {options.out}")
    finally:  # the outputs too, and whatever finished before an error
        if options.archive is not None:
            print(f"experiment: {pack(options, options.archive)} files of finished runs archived in {options.archive}")
    return 0 if finished else 3  # 3: stopped by --minutes, resumable
