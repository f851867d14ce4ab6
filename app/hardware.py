"""What machine is this, and which backend should it use — and why (the user is told)."""

from __future__ import annotations

import importlib.util
import os
import platform
import sys
from dataclasses import dataclass, field

import shutil

import psutil

from ..backends.cpu_features import cpu_info
from ..backends import registry

@dataclass(frozen=True)
class Hardware:
    system: str
    machine: str
    cpu: str
    physical_cores: int
    logical_cores: int
    memory_total: int
    memory_available: int
    cpu_flags: frozenset[str] = field(default_factory=frozenset)
    cuda_devices: tuple[str, ...] = ()
    cuda_memory: tuple[int, ...] = ()  # total bytes per CUDA device
    apple_silicon: bool = False
    mlx_importable: bool = False
    cxx_compiler: str | None = None  # what torch.compile's CPU code generator would build with

    @property
    def has_bf16_cpu(self) -> bool:
        return bool({"avx512_bf16", "amx_bf16"} & self.cpu_flags)


@dataclass(frozen=True)
class BackendChoice:
    name: str
    reason: str


def _cuda_devices() -> tuple[tuple[str, ...], tuple[int, ...]]:
    # Cheap tell first: importing torch costs seconds and CUDA is absent on most volunteer laptops.
    if sys.platform == "darwin" or not (os.path.exists("/proc/driver/nvidia") or os.environ.get("CUDA_VISIBLE_DEVICES")):
        return (), ()
    try:
        import torch

        if torch.cuda.is_available():
            props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
            return tuple(p.name for p in props), tuple(int(p.total_memory) for p in props)
    except Exception:
        pass
    return (), ()


def physical_cores() -> int:
    """Cores without their hyperthreads (matrix work gains little from those); cheap, no GPU probe."""
    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


def detect() -> Hardware:
    cpu, flags = cpu_info()
    mem = psutil.virtual_memory()
    apple = sys.platform == "darwin" and platform.machine() == "arm64"
    cuda = _cuda_devices()
    return Hardware(
        system=f"{platform.system()} {platform.release()}",
        machine=platform.machine(),
        cpu=cpu,
        physical_cores=physical_cores(),
        logical_cores=psutil.cpu_count(logical=True) or os.cpu_count() or 1,
        memory_total=mem.total,
        memory_available=mem.available,
        cpu_flags=flags,
        cuda_devices=cuda[0],
        cuda_memory=cuda[1],
        apple_silicon=apple,
        mlx_importable=apple and importlib.util.find_spec("mlx") is not None,
        cxx_compiler=_cxx_compiler(),
    )


def _cxx_compiler() -> str | None:
    """$CXX, or the first C++ compiler on the PATH: inductor compiles the code it generates."""
    named = os.environ.get("CXX")
    return shutil.which(named) if named else next(filter(None, map(shutil.which, ("g++", "clang++", "c++"))), None)


def choose_backend(hw: Hardware, requested: str = "auto") -> BackendChoice:
    """The backend `requested` names, or for "auto" the first in the registry's order that fits
    this machine (the CPU's fits every one); with the reason the user is told."""
    if requested != "auto":
        registry.backend_kind(requested)  # ValueError, in words, for a name this release lacks
        return BackendChoice(requested, f"asked for in the config (backend.kind = {requested!r})")
    return next(BackendChoice(entry.name, reason) for entry in registry.BACKENDS if (reason := entry.chosen_for(hw)))
