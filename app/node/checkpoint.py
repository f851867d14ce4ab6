"""Atomic, verified checkpoints: one folder per finished round.

A checkpoint is written into a temporary folder, every file fsynced, a manifest with each file's
sha256 written last, then the folder is renamed into place (atomic on POSIX) and the parent
fsynced. Loading walks rounds newest first and takes the first whose manifest and checksums hold,
so a half-written or corrupted checkpoint falls back to the previous one. The newest `keep`
valid checkpoints are kept.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ...backends.atomic import atomic_folder

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
STATE = "state.json"
_NAME = re.compile(r"^round-(\d{8})$")


@dataclass(frozen=True)
class Checkpoint:
    round: int
    path: Path
    state: dict


class CheckpointError(RuntimeError):
    pass


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def round_folder(root: Path, round_no: int) -> Path:
    return root / f"round-{round_no:08d}"


def save_checkpoint(root: Path, round_no: int, state: dict, write_files: Callable[[Path], None], keep: int = 3) -> Path:
    """`write_files(folder)` writes the backend's files; `state` (JSON) holds the node's own."""
    final = round_folder(root, round_no)
    # A folder of this round already there: a previous run wrote it and crashed before moving on.
    with atomic_folder(final, fsync=True, prefix=f".round-{round_no:08d}-") as tmp:
        write_files(tmp)
        (tmp / STATE).write_text(json.dumps(state, indent=1, sort_keys=True), encoding="utf-8")
        files = sorted(p for p in tmp.iterdir() if p.is_file())
        for p in files:
            with p.open("rb") as f:
                os.fsync(f.fileno())
        manifest = {"round": round_no, "files": {p.name: _sha256(p) for p in files}}
        with (tmp / MANIFEST).open("w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
    _prune(root, keep)
    return final


def verify(folder: Path) -> Checkpoint:
    """The checkpoint in `folder` if its manifest and checksums hold; CheckpointError if not."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        for name, digest in manifest["files"].items():
            if _sha256(folder / name) != digest:
                raise CheckpointError(f"{name} does not match its checksum")
        state = json.loads((folder / STATE).read_text(encoding="utf-8"))
        round_no = int(manifest["round"])
        if state.get("round") != round_no:
            raise CheckpointError("state and manifest disagree on the round")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(str(exc)) from exc
    return Checkpoint(round_no, folder, state)


def copy_checkpoint(folder: Path, into: Path) -> Checkpoint:
    """A verified copy of the checkpoint in `folder`, at `into` (which must not exist yet), for
    readers beside a running node (export, ask): copied first and then checked against its
    manifest, so a folder the node prunes or replaces while it is read gives CheckpointError,
    never a mix of two rounds. The node's lock is not taken: it would stop the node for the copy."""
    try:
        shutil.copytree(folder, into)
        return verify(into)
    except (OSError, shutil.Error) as exc:
        shutil.rmtree(into, ignore_errors=True)
        raise CheckpointError(f"{folder} changed or went away while it was copied ({exc})") from exc
    except CheckpointError:
        shutil.rmtree(into, ignore_errors=True)
        raise


def _rounds(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _NAME.match(p.name)]
    return sorted(found, key=lambda p: p.name, reverse=True)


def latest_checkpoint(root: Path) -> Checkpoint | None:
    for folder in _rounds(root):
        try:
            return verify(folder)
        except CheckpointError as exc:
            log.warning("checkpoint %s is damaged (%s); trying the one before", folder.name, exc)
    return None


def _prune(root: Path, keep: int) -> None:
    for p in root.iterdir():  # temp folders of crashed saves
        if p.is_dir() and p.name.startswith((".round-", ".best-")):
            shutil.rmtree(p, ignore_errors=True)
    valid = 0
    for folder in _rounds(root):
        try:
            verify(folder)
            valid += 1
            if valid > keep:
                shutil.rmtree(folder, ignore_errors=True)
        except CheckpointError:
            if valid >= 1:  # a damaged one older than a valid one is useless
                shutil.rmtree(folder, ignore_errors=True)
