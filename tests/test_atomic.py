"""The one atomic-write helper (backends/atomic.py): all or nothing, for files and folders."""

from __future__ import annotations

import os
import stat

import pytest

from swarmling.backends.atomic import atomic_file, atomic_folder, made_once, remove_stale_temporaries, write_atomic


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("old")
    with pytest.raises(RuntimeError), atomic_file(path) as tmp:
        tmp.write_text("half")
        raise RuntimeError("disk full")
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.toml"]


def test_write_atomic_replaces_and_keeps_a_secret_private_from_the_first_byte(tmp_path):
    path = tmp_path / "identity.key"
    write_atomic(path, b"secret", mode=0o600)
    assert path.read_bytes() == b"secret"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    write_atomic(path, "text", fsync=False)
    assert path.read_text() == "text"


def test_a_folder_replaces_a_half_written_one_and_a_failed_one_leaves_nothing(tmp_path):
    final = tmp_path / "round-00000003"
    final.mkdir()
    (final / "stale").write_text("from a crash")
    with atomic_folder(final, prefix=".round-") as tmp:
        (tmp / "adapter.safetensors").write_text("new")
    assert sorted(p.name for p in final.iterdir()) == ["adapter.safetensors"]
    with pytest.raises(KeyboardInterrupt), atomic_folder(tmp_path / "round-00000004", prefix=".round-") as tmp:
        (tmp / "part").write_text("x")
        raise KeyboardInterrupt
    assert sorted(p.name for p in tmp_path.iterdir()) == ["round-00000003"]


def test_a_killed_writers_temporary_is_removed_and_nothing_else(tmp_path):
    target = tmp_path / "model.gguf"
    with pytest.raises(KeyboardInterrupt), atomic_file(target) as tmp:  # the name a writer uses
        stale = tmp
        raise KeyboardInterrupt
    stale.write_bytes(b"half")  # as a writer killed by SIGKILL leaves it (no finally ran)
    other = tmp_path / ".other.gguf.1.tmp"
    other.write_bytes(b"x")
    remove_stale_temporaries(target)
    assert not stale.exists() and other.exists()


def test_made_once_makes_once_among_concurrent_callers_and_not_when_done(tmp_path):
    import threading
    import time

    target = tmp_path / "cache" / "model"
    made = []

    def make():
        made.append(threading.get_ident())
        time.sleep(0.2)  # the others reach the lock meanwhile
        target.write_text("made")

    callers = [threading.Thread(target=made_once, args=(target, target.is_file, make)) for _ in range(4)]
    for t in callers:
        t.start()
    for t in callers:
        t.join(10)
    assert len(made) == 1 and target.read_text() == "made"
    made_once(target, target.is_file, lambda: made.append("again"))
    assert len(made) == 1
