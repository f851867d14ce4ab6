"""What the node tells its viewers (the headless printer today, the TUI later)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class NodeStarted:
    backend: str
    device: str
    model: str
    preset: str
    reason: str  # why this backend
    resumed_round: int  # 0 on a fresh start
    settings: dict


@dataclass(frozen=True)
class PhaseChanged:
    round: int
    phase: str


@dataclass(frozen=True)
class RoundFinished:
    metrics: dict


@dataclass(frozen=True)
class Notice:
    level: str  # "info", "warning", "error"
    text: str


Event = NodeStarted | PhaseChanged | RoundFinished | Notice
Listener = Callable[[Event], None]
