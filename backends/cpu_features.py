"""What the CPU reports (/proc/cpuinfo on Linux): read once, for the node's hardware summary
(app/hardware.py) and for the backends' own choices that depend on an instruction set."""

from __future__ import annotations

import functools
import platform


@functools.cache
def cpu_info() -> tuple[str, frozenset[str]]:
    """(model name, flags); the flags are empty where the OS does not list them (macOS, Windows)."""
    name, flags = platform.processor() or platform.machine(), frozenset()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name") and ":" in line:
                    name = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and ":" in line:
                    flags = frozenset(line.split(":", 1)[1].split())
                if name and flags:
                    break
    except OSError:
        pass
    return name, flags


def has_amx() -> bool:
    return bool({"amx_tile", "amx_int8", "amx_bf16"} & cpu_info()[1])
