"""`backends.heap`: freed heap memory goes back to the OS, which glibc alone would keep."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import pytest

from swarmling.backends.heap import _glibc, return_freed_memory

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or _glibc() is None,
                                reason="glibc's malloc_trim: Linux with glibc only")


def anonymous_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon in /proc/self/status")


def test_freed_heap_chunks_below_a_live_one_are_returned():
    """What a training step leaves: many mid-sized blocks freed, with something still alive above
    them, so glibc's own trimming (from the top of the heap only) cannot give them back."""
    libc = _glibc()
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    chunk, count = 64 * 1024, 2000  # 128 MB, below the size glibc would mmap on its own
    blocks = [libc.malloc(chunk) for _ in range(count)]
    assert all(blocks)
    for b in blocks:
        ctypes.memset(b, 1, chunk)
    top = libc.malloc(chunk)
    for b in blocks:
        libc.free(b)
    held = anonymous_rss()
    assert return_freed_memory()
    released = held - anonymous_rss()
    libc.free(top)
    assert released > 100e6, f"only {released / 1e6:.0f} MB returned"
