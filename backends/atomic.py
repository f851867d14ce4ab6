"""Atomic writes: a file or a folder is written under a temporary name beside its place and
renamed into it, so a reader (llama.cpp loading an adapter, the node resuming, a user's editor)
sees the old version or the new one, never half of one, and a crash leaves no torn file.

Written once for the whole project (the backends' adapter and converted model, the node's
checkpoints, config file, metrics log, identity, known peers, the helper's figures, the service
files): the app imports it from here, the lowest layer both share. Each caller says what it
needs beyond the rename: `fsync` (the bytes are on disk before the rename; what must survive a
power cut) and `mode` (permissions from the first byte, for secrets).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Make a rename inside `path` durable (best effort: not every platform allows it)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


@contextlib.contextmanager
def atomic_file(path: Path, *, fsync: bool = True, mode: int | None = None) -> Iterator[Path]:
    """Yield a temporary path beside `path` to write; on a clean exit it replaces `path`, on an
    exception it is removed and `path` is untouched. `mode`: the temporary file is created with
    these permissions before the caller writes a byte."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if mode is not None:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode))
        yield tmp
        if fsync:
            _fsync_file(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def made_once(target: Path, done: Callable[[], bool], make: Callable[[], None]) -> None:
    """`make()` unless `done()`, by one process at a time: a lock file beside `target`, and `done()`
    asked again once the lock is held (nodes started together on one machine make a cache entry
    once; without the lock each replaced what another was loading)."""
    if done():
        return
    from filelock import FileLock  # torch's and huggingface_hub's dependency

    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(target.with_name(target.name + ".lock")):
        if not done():  # another process made it while this one waited
            make()


def remove_stale_temporaries(path: Path) -> None:
    """Remove what `atomic_file(path)` writers killed mid-write left beside `path`; call only
    while no writer of `path` can run (under the caller's lock)."""
    for stale in Path(path).parent.glob(f".{Path(path).name}.*.tmp"):
        stale.unlink(missing_ok=True)


def write_atomic(path: Path, data: bytes | str, *, fsync: bool = True, mode: int | None = None) -> None:
    """`path` holds `data` (text is written as UTF-8), all or nothing."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    with atomic_file(path, fsync=fsync, mode=mode) as tmp, open(tmp, "r+b" if mode is not None else "wb") as f:
        f.write(raw)


@contextlib.contextmanager
def atomic_folder(final: Path, *, fsync: bool = True, prefix: str = ".tmp-") -> Iterator[Path]:
    """Yield an empty temporary folder beside `final` to fill; on a clean exit it replaces
    `final` (a previous one, complete or half-written, is removed first), on an exception it is
    removed. `fsync`: the folder's entry and its parent's are made durable (the files' own
    contents are the caller's to sync: only it knows which matter)."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=final.parent))
    try:
        yield tmp
        if fsync:
            fsync_dir(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        if fsync:
            fsync_dir(final.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
