"""Give memory that the process has freed back to the operating system.

glibc's malloc keeps freed heap memory for reuse instead of returning it, and torch frees a
training step's activations into that heap: without a trim a CPU node holds ~0.5 GB more between
rounds than it uses (measured: 1.74 GB held after a step, 1.18 GB after `malloc_trim`, in ~10 ms).
A guest on someone's laptop gives that back. Elsewhere (macOS, musl, Windows) this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys


@functools.cache
def _glibc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def return_freed_memory() -> bool:
    """Release the heap's free pages to the OS; True when the allocator could do it."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
