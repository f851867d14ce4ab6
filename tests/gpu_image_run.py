"""Run by test_gpu_chunk.py in a fresh interpreter: one round of an experiment on the CUDA backend's
code (on the CPU) with every package the GPU machine would not have hidden, then the
distributions it imported, as JSON on the last line.

usage: python gpu_image_run.py OUT CACHE '{"image": [...], "carried": [...]}'

Allowed: the carried packages as listed (their needs must be listed too), the image's packages and
what they need as installed here (the image has its packages' needs, at its own versions).
"""

from __future__ import annotations

import importlib.abc
import importlib.metadata
import json
import re
import sys
from dataclasses import replace
from pathlib import Path


def normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


class NotOnTheImage(importlib.abc.MetaPathFinder):
    """Wraps one of sys.meta_path's finders: a top-level module that belongs only to distributions
    outside `allowed` is not found, as on the GPU machine (libraries that probe for optional
    packages then see them absent, as they would there)."""

    def __init__(self, inner, allowed: set[str], owners) -> None:
        self.inner, self.allowed, self.owners = inner, allowed, owners

    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        owners = {normal(d) for d in self.owners.get(top, ())}
        if owners and not owners & self.allowed:
            return None
        find = getattr(self.inner, "find_spec", None)
        return find(name, path, target) if find else None

    def find_distributions(self, *args, **kwargs):  # importlib.metadata asks the same finders
        find = getattr(self.inner, "find_distributions", None)
        return find(*args, **kwargs) if find else iter(())

    def invalidate_caches(self):
        if hasattr(self.inner, "invalidate_caches"):
            self.inner.invalidate_caches()


def with_needs(names: set[str]) -> set[str]:
    """`names` and, recursively, the distributions they require (extras left out) as installed here."""
    todo, seen = list(names), set(names)
    while todo:
        try:
            requires = importlib.metadata.requires(todo.pop()) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for requirement in requires:
            if "extra ==" in requirement:
                continue
            name = normal(re.split(r"[\s;<>=!~\[(]", requirement, maxsplit=1)[0])
            if name not in seen:
                seen.add(name)
                todo.append(name)
    return seen


def main() -> None:
    out, cache, lists = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
    allowed = with_needs({normal(n) for n in lists["image"]}) | {normal(n) for n in lists["carried"]} | {"swarmling"}
    owners = importlib.metadata.packages_distributions()
    sys.meta_path[:] = [NotOnTheImage(finder, allowed, owners) for finder in sys.meta_path]

    import swarmling.app.cli  # noqa: F401  (the chunk's entry point, as `python3 -m swarmling.app`)
    from swarmling.app.commands.experiment.designs import DESIGNS
    from swarmling.app.commands.experiment.grid import ExperimentOptions, run_experiment
    from swarmling.app.commands.experiment.report import summarise
    from swarmling.app.paths import resolve_paths
    from swarmling.backends.factory import torch_backend

    # Smaller than --tiny (2 questions x 2 replies of at most 4 tokens, one held-out item): what is
    # checked is which packages a round imports, and the CUDA code's fp32 torch on a CPU is slow.
    # A round whose replies all score alike takes no step; the trainer is built (and its modules
    # imported) with the backend either way.
    design = replace(DESIGNS["rare-success"], rounds=1, eval_every=1, burn_in=0, eval_items=1)
    options = ExperimentOptions(design=design, out=out, nodes=2, rounds=1, seeds=1, tiny=True, threads=2,
                                overrides=(("train.min_signal_groups", 0), ("round.questions", 2),
                                           ("round.completions", 2), ("round.max_new_tokens", 4)))
    paths = replace(resolve_paths(out / "home"), cache_dir=cache)
    assert run_experiment(options, paths, build=lambda spec: torch_backend(spec, "cpu"), progress=print)
    summary = summarise(options)
    imported = sorted({normal(d) for m in list(sys.modules) for d in owners.get(m.partition(".")[0], ())})
    print(json.dumps({"imported": imported, "arms": {a: len(v.seeds) for a, v in summary.arms.items()}}))


if __name__ == "__main__":
    main()
