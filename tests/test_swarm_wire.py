"""Bytes from peers: schema-checked, size-capped, and never trusted for answers or rewards."""

from __future__ import annotations

import json
import zlib

import msgspec
import pytest

from swarmling.app.learning.reward import score
from swarmling.app.learning.prompt import SYSTEM_PROMPT, PromptFormat
from swarmling.app.learning.rollout import QuestionGroup, ScoredCompletion
from swarmling.app.swarm.verification.intake import IntakeContext, Rejected, admit_group
from swarmling.app.swarm.verification.wire import (
    MAX_BUNDLE_BYTES,
    MAX_DECOMPRESSED_BYTES,
    MAX_TEXT_CHARS,
    PROTOCOL_VERSION,
    Bundle,
    WireError,
    bundle_from_groups,
    decode_bundle,
    encode_bundle,
)
from swarmling.app.learning.tasks import load_preset, regenerate
from swarmling.backends.base import ChatPrompt
from swarmling.backends.chat_template import render

PEER = "12D3KooWPeerAbc"


def local_group(seed=1, index=2):
    task = regenerate(load_preset("starter").spec("chain_sum", 0, seed, index))
    right, wrong = task.entry["answer"], str(int(task.entry["answer"]) + 3)
    comps = [
        ScoredCompletion(f"{right}</answer>", [1, 2], [-0.5, -0.25], "stop", 1.0, True, 1.0),
        ScoredCompletion(f"{wrong}</answer>", [3, 4], [-1.0, -2.0], "stop", 0.0, True, 0.2),
    ]
    return QuestionGroup(task, 0, ChatPrompt(SYSTEM_PROMPT, task.question, "<answer>"), [0], comps)


def bundle(**kw):
    fields = dict(swarm="test", node_id=PEER, model="smollm2-135m", round_no=3, timestamp=1.7e9, prefill="<answer>")
    fields.update(kw)
    return bundle_from_groups([local_group()], **fields)


def raw(obj) -> bytes:
    return zlib.compress(msgspec.msgpack.encode(obj))


def test_round_trip_and_no_answers_or_rewards_on_the_wire():
    b = bundle()
    again = decode_bundle(encode_bundle(b))
    assert again == b
    assert again.groups[0].completions[0].logprob == -0.75
    names = set(msgspec.structs.fields(Bundle)[i].name for i in range(len(msgspec.structs.fields(Bundle))))
    group_fields = {f.name for f in msgspec.structs.fields(type(b.groups[0]))}
    completion_fields = {f.name for f in msgspec.structs.fields(type(b.groups[0].completions[0]))}
    assert not ({"answer", "reward", "score"} & (names | group_fields | completion_fields))


def as_dict(b: Bundle) -> dict:
    return msgspec.to_builtins(b)


@pytest.mark.parametrize(
    "mutate, reason",
    [
        (lambda d: d.update(extra="x"), "unknown field"),
        (lambda d: d.pop("model"), "missing required field"),
        (lambda d: d.update(version=PROTOCOL_VERSION + 1), "protocol version"),
        (lambda d: d.update(node_id="not/a peer id"), "node_id"),
        (lambda d: d["groups"][0]["completions"][0].update(text="x" * (MAX_TEXT_CHARS + 1)), "text"),
        (lambda d: d["groups"][0]["completions"][0].update(logprob=float("nan")), "logprob"),
        (lambda d: d["groups"][0]["completions"][0].update(logprob=5.0), "logprob"),
        (lambda d: d["groups"][0].update(completions=d["groups"][0]["completions"][:1]), "completions"),
        (lambda d: d.update(groups=d["groups"] * 65), "groups"),
        (lambda d: d["groups"][0].update(question_hash="zz"), "question_hash"),
        (lambda d: d["groups"][0]["spec"].update(seed=-1), "seed"),
        (lambda d: d["groups"][0]["spec"].update(config="x" * 5000), "config"),
        (lambda d: d.update(round="three"), "round"),
    ],
)
def test_hostile_bundles_are_refused(mutate, reason):
    d = as_dict(bundle())
    mutate(d)
    with pytest.raises(WireError, match=reason):
        decode_bundle(raw(d))


def test_malformed_bytes_bombs_and_bad_utf8_are_refused():
    for junk in (b"", b"\x00\x01garbage", zlib.compress(b"\xc1\xff\xff")[:-3]):
        with pytest.raises(WireError):
            decode_bundle(junk)
    with pytest.raises(WireError, match="exceeds"):
        decode_bundle(b"\0" * (MAX_BUNDLE_BYTES + 1))
    bomb = zlib.compress(b"\0" * (MAX_DECOMPRESSED_BYTES * 4), 9)
    assert len(bomb) < MAX_BUNDLE_BYTES
    with pytest.raises(WireError, match="inflates"):
        decode_bundle(bomb)
    # a msgpack str with invalid UTF-8 (0xa3 = fixstr of 3 bytes) where the model name goes
    good = msgspec.msgpack.encode(as_dict(bundle()))
    bad = good.replace(msgspec.msgpack.encode("smollm2-135m"), b"\xac" + b"\xff\xfe" + b"smollm2-13")
    assert bad != good
    with pytest.raises(WireError):
        decode_bundle(zlib.compress(bad))


@pytest.fixture(scope="module")
def ctx(generator):
    return IntakeContext(
        prompt=PromptFormat(),
        format_bonus=0.0,
        max_completion_tokens=64,
        encode_prompt=lambda p: generator.tokenize_prompt(render(p, generator.chat_template)),
        tokenize=generator.tokenize,
    )


def test_honest_group_is_rescored_locally(ctx, generator):
    wire_group = bundle().groups[0]
    # the sender cannot claim anything about rewards: we score; the right answer earns 1, the wrong 0
    group = admit_group(wire_group, PEER, ctx)
    assert isinstance(group, QuestionGroup) and group.source == PEER
    assert [c.strict for c in group.completions] == [1.0, 0.0]
    assert group.completions[0].token_ids == generator.tokenize(group.completions[0].text)
    assert group.completions[0].sampler_logprobs is None  # external: no per-token sampler logprobs
    assert group.has_signal
    assert score(group.task, "<answer>" + group.completions[0].text, 0.0).strict == 1.0


def test_wrong_question_for_its_spec_is_refused(ctx):
    g = bundle().groups[0]
    other = regenerate(load_preset("starter").spec("chain_sum", 0, 999, 7))
    forged = msgspec.structs.replace(g, question_hash=other.question_hash)
    rejected = admit_group(forged, PEER, ctx)
    assert isinstance(rejected, Rejected) and "hash mismatch" in rejected.reason


@pytest.mark.parametrize(
    "spec_change, reason",
    [
        ({"preset": "nonesuch"}, "unknown preset"),
        ({"dataset": "bf"}, "not in preset"),
        ({"config": json.dumps({"min_terms": 2, "max_terms": 40, "min_digits": 1, "max_digits": 9})}, "outside"),
        ({"config": "{not json"}, "outside"),
    ],
)
def test_specs_outside_known_presets_are_refused(ctx, spec_change, reason):
    g = bundle().groups[0]
    forged = msgspec.structs.replace(g, spec=msgspec.structs.replace(g.spec, **spec_change))
    rejected = admit_group(forged, PEER, ctx)
    assert isinstance(rejected, Rejected) and reason in rejected.reason


def test_completions_without_our_prefill_or_too_long_are_dropped(ctx):
    g = bundle().groups[0]
    c = g.completions
    no_prefill = msgspec.structs.replace(c[0], text="12</answer>")
    too_long = msgspec.structs.replace(c[1], text="<answer>" + "word " * 500)
    rejected = admit_group(msgspec.structs.replace(g, completions=[no_prefill, too_long]), PEER, ctx)
    assert isinstance(rejected, Rejected) and "usable" in rejected.reason
