"""Keeping the best, starting again, and resuming an earlier version's checkpoint, on a node with a
fake backend (the files and the loop are real)."""

from __future__ import annotations

import hashlib
import json

import pytest
from fakes import make_node, records

from swarmling.app.commands.reset import reset_command
from swarmling.app.errors import NodeError
from swarmling.app.learning.evaluation import EvalResult
from swarmling.app.node.best import read_best
from swarmling.app.node.status import BestScore
from swarmling.app.paths import resolve_paths


def scripted(node, accuracies):
    """The node's held-out scores, in turn (its backend cannot learn)."""
    scores = iter(accuracies)
    node.held_out._measure = lambda weights_round, stop: EvalResult(next(scores), {"chain_sum": 0.5}, 1.0, 240, 0.1)


def round_on_restart(home) -> int:
    """The round a node started again in `home` resumes from."""
    node, _ = make_node(home)
    try:
        node.start()
        return node.round
    finally:
        node.close()


def test_the_best_evaluation_keeps_its_checkpoint_and_every_record_says_which(tmp_path):
    node, _ = make_node(tmp_path, **{"eval.every_rounds": 2, "checkpoint.keep": 1})
    scripted(node, [0.10, 0.30, 0.20, 0.25])  # the start, rounds 2, 4, 6
    try:
        node.run(6)
        status = node.status()
    finally:
        node.close()
    best = read_best(tmp_path / "state" / "checkpoints")
    assert (best.round, best.accuracy) == (2, 0.30)  # kept though the rotating checkpoints moved on
    assert sorted(p.name for p in (tmp_path / "state" / "checkpoints").iterdir()) == ["best", "round-00000006"]
    recs = records(tmp_path)
    assert [(r["eval_best_accuracy"], r["eval_best_of_round"]) for r in recs[1:]] == [(0.30, 2)] * 5
    assert status.best == BestScore(accuracy=0.30, round=2)
    # measured on another preset's held-out set, it is no best of this one's: the next evaluation replaces it
    assert read_best(tmp_path / "state" / "checkpoints", "starter-2").accuracy == 0.30
    assert read_best(tmp_path / "state" / "checkpoints", "sapo9") is None


def test_reset_to_the_best_resumes_there_and_keeps_identity_and_peers(tmp_path):
    node, _ = make_node(tmp_path, **{"eval.every_rounds": 2})
    scripted(node, [0.1, 0.4, 0.2])
    try:
        node.run(4)
    finally:
        node.close()
    paths = resolve_paths(tmp_path)
    (paths.data_dir / "identity.key").write_bytes(b"key")
    (paths.data_dir / "known_peers.json").write_text("{}")
    assert reset_command(paths, to_best=True) == 0
    assert [r["round"] for r in records(tmp_path)] == [1, 2]
    assert round_on_restart(tmp_path) == 2
    assert (paths.data_dir / "identity.key").read_bytes() == b"key" and (paths.data_dir / "known_peers.json").exists()
    archived = list((paths.state_dir / "archive").iterdir())
    assert len(archived) == 1 and (archived[0] / "metrics.jsonl").exists()


def test_reset_starts_again_from_the_base_model_and_is_refused_while_the_node_runs(tmp_path):
    node, _ = make_node(tmp_path)
    try:
        node.run(2)
        with pytest.raises(NodeError, match="another swarmling node"):
            reset_command(resolve_paths(tmp_path), to_best=False)
    finally:
        node.close()
    with pytest.raises(NodeError, match="no best checkpoint"):
        reset_command(resolve_paths(tmp_path), to_best=True)  # none kept (no evaluation ran): nothing moved
    assert [r["round"] for r in records(tmp_path)] == [1, 2]
    assert reset_command(resolve_paths(tmp_path), to_best=False) == 0
    assert round_on_restart(tmp_path) == 0


def test_an_earlier_versions_checkpoint_resumes_its_adapter_with_a_fresh_optimizer(tmp_path):
    node, built = make_node(tmp_path)
    try:
        node.run(2)
    finally:
        node.close()
    newest = tmp_path / "state" / "checkpoints" / "round-00000002"
    state = json.loads((newest / "state.json").read_text())
    del state["learning"], state["waiting"]  # what the earlier version wrote
    state["rng"] = {"bit_generator": "PCG64", "state": {"state": 1, "inc": 1}, "has_uint32": 0, "uinteger": 0}
    (newest / "state.json").write_text(json.dumps(state))
    manifest = json.loads((newest / "manifest.json").read_text())
    manifest["files"]["state.json"] = hashlib.sha256((newest / "state.json").read_bytes()).hexdigest()
    (newest / "manifest.json").write_text(json.dumps(manifest))
    events = []
    node, built = make_node(tmp_path, events)
    try:
        node.start()
        assert node.round == 2 and built[-1].train_steps == 0  # the adapter only: AdamW starts afresh
        node.run(1)
    finally:
        node.close()
    said = [e.text for e in events if "new learning defaults" in getattr(e, "text", "")]
    assert len(said) == 1
    assert json.loads((tmp_path / "state" / "checkpoints" / "round-00000003" / "state.json").read_text())["learning"] == 2
