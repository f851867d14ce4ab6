"""Where torch.compile's CPU code generator (inductor) keeps what it built, and the guard against
a start that dies in it.

Inductor's on-disk cache is not keyed by the instruction set its kernels were built for. Measured
here: after one run with torch held to AVX2 on an AVX-512 CPU, every compiled start crashed
(a segfault, or glibc's "corrupted size"), and a crash is not an exception the trainer's fallback
can catch. A node would then crash again at every restart. So the cache lives under the node's
cache folder, one folder per torch version and CPU feature set (a home folder moved to another
machine starts afresh), and a node that died in its first compiled pass finds its marker at the
next start: that folder is emptied and the node trains eagerly this once.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch

from .cpu_features import cpu_info

log = logging.getLogger(__name__)

CACHE_FOLDER = "torch-compile"
FIRST_PASS_MARKER = "compiling.marker"  # in the node's runtime folder while its first compiled pass runs
T = TypeVar("T")


def cache_folder(cache_dir: Path) -> Path:
    """This machine's inductor cache: keyed by torch's version and the CPU's flags."""
    flags = hashlib.sha256(" ".join(sorted(cpu_info()[1])).encode()).hexdigest()[:12]
    return Path(cache_dir) / CACHE_FOLDER / f"torch-{torch.__version__}-cpu-{flags}"


def prepare(compiler: str, cache_dir: Path, runtime_dir: Path) -> str | None:
    """Point inductor at `compiler` and this machine's cache folder. Returns why not to compile
    this start (the last one died in its first compiled pass), or None."""
    folder = cache_folder(cache_dir)
    marker = Path(runtime_dir) / FIRST_PASS_MARKER
    if marker.exists():
        shutil.rmtree(folder, ignore_errors=True)
        marker.unlink(missing_ok=True)
        log.warning("the last start died in its first compiled pass: its compile cache is cleared, and this "
                    "start trains without torch.compile")
        return "the last start died in its first compiled pass (cache cleared; the next start compiles again)"
    from torch._inductor import config as inductor
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    # torch fills the variable with its /tmp default once anything asks; only a user's own choice wins.
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR") in (None, os.path.abspath(default_cache_dir())):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    inductor.cpp.cxx = (compiler,)
    return None


def first_pass_guarded(runtime_dir: Path, unproven: bool, run: Callable[[], T]) -> T:
    """`run()`, with the marker standing while it runs if it is the first compiled pass: only a
    crash (no Python exception, no interrupt) leaves it behind for the next start to find."""
    if not unproven:
        return run()
    marker = Path(runtime_dir) / FIRST_PASS_MARKER
    marker.write_text("a compiled pass began and did not end\n")
    try:
        return run()
    finally:
        marker.unlink(missing_ok=True)
