"""app/'s packages and top-level modules import only downward, in this order (README's Layout):

    __main__, cli    the command line
    commands/        one module per command; `run` opens the TUI, so commands sit above it
    tui/, headless   what a viewer sees
    node/            the node around the round
    swarm/           peers' rollouts in, ours out
    events, metrics  what the node tells its viewers, and the rounds' records
    sizing           the backend and the round's shape for this machine
    hardware, models, config_file
    learning/        the round's learning, no network and no node around it
    config/          the settings' schema and loading
    paths, errors    the bottom

A module of app/ that is in no layer fails the test: a new one is placed here, where it belongs.
"""

from __future__ import annotations

from pathlib import Path

APP = Path(__file__).resolve().parents[1] / "app"
LAYERS = [
    {"__main__"},
    {"cli"},
    {"commands"},
    {"tui", "headless"},
    {"node"},
    {"swarm"},
    {"events", "metrics"},
    {"sizing"},
    {"hardware", "models", "config_file"},
    {"learning"},
    {"config"},
    {"paths", "errors"},
]
RANK = {unit: rank for rank, layer in enumerate(LAYERS) for unit in layer}


def unit_of(path: Path) -> str:
    """The package (or top-level module) of app/ that a file belongs to."""
    first = path.relative_to(APP).parts[0]
    return first.removesuffix(".py")


def imported_units(path: Path, module_imports) -> set[str]:
    """The units of app/ this file imports, itself left out."""
    found = {n.removeprefix("swarmling.app.").split(".")[0] for n in module_imports(path) if n.startswith("swarmling.app.")}
    return found - {unit_of(path)}


def app_files() -> list[Path]:
    """Every module of app/ but app/__init__.py (the package itself)."""
    return sorted(p for p in APP.rglob("*.py") if "__pycache__" not in p.parts and p != APP / "__init__.py")


def test_every_unit_of_app_has_a_layer():
    units = {unit_of(p) for p in app_files()}
    assert units - RANK.keys() == set(), "place the new module or package in LAYERS"
    assert RANK.keys() - units == set(), "a layer names a unit app/ no longer has"


def test_app_imports_only_downward(module_imports):
    upward = [(str(p.relative_to(APP)), unit) for p in app_files() for unit in imported_units(p, module_imports)
              if RANK[unit] <= RANK[unit_of(p)]]
    assert upward == []
