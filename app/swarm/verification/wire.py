"""What travels between nodes: a round's bundle of question-groups, as schema-checked msgpack,
compressed. Every byte from the network is hostile until this module has decoded it.

- Strict schemas (msgspec): unknown fields refused, a hard cap on every string, list and number,
  UTF-8 only (msgpack str), NaN/inf refused by the range checks, nothing pickled or executed.
- Size caps before and after decompression (a zlib bomb stops at the cap, it is never inflated).
- Never an answer, never a reward: the receiver regenerates the task from its spec and scores
  every completion itself (`intake.py`).
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Sequence
from typing import Annotated

import msgspec
from msgspec import Meta, Struct

from ...learning.rollout import QuestionGroup
from ...learning.tasks import TaskSpec

PROTOCOL_VERSION = 1
MAX_BUNDLE_BYTES = 512 * 1024  # compressed, on the wire
MAX_DECOMPRESSED_BYTES = 4 * 1024 * 1024
MAX_TEXT_CHARS = 4096
MAX_COMPLETIONS = 64
MAX_GROUPS = 64

Name = Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[a-z0-9_][a-z0-9_.-]*$")]
PeerId = Annotated[str, Meta(min_length=1, max_length=128, pattern=r"^[1-9A-HJ-NP-Za-km-z]+$")]  # base58
ModelName = Annotated[str, Meta(min_length=1, max_length=128)]
Text = Annotated[str, Meta(max_length=MAX_TEXT_CHARS)]


class WireSpec(Struct, forbid_unknown_fields=True, frozen=True):
    preset: Name
    dataset: Name
    config: Annotated[str, Meta(min_length=2, max_length=2048)]  # canonical JSON, checked against the preset
    seed: Annotated[int, Meta(ge=0, lt=2**31)]
    index: Annotated[int, Meta(ge=0, lt=1_000_000)]

    def task_spec(self) -> TaskSpec:
        return TaskSpec(self.preset, self.dataset, self.config, self.seed, self.index)


class WireCompletion(Struct, forbid_unknown_fields=True, frozen=True):
    text: Text  # the whole reply, any prefill included
    tokens: Annotated[int, Meta(ge=0, le=16384)]  # in the sender's tokenizer
    logprob: Annotated[float, Meta(ge=-1e7, le=0.0)]  # the sender's summed sampling logprob


class WireGroup(Struct, forbid_unknown_fields=True, frozen=True):
    spec: WireSpec
    question_hash: Annotated[str, Meta(pattern=r"^[0-9a-f]{32}$")]
    completions: Annotated[list[WireCompletion], Meta(min_length=2, max_length=MAX_COMPLETIONS)]


class Bundle(Struct, forbid_unknown_fields=True, frozen=True):
    version: Annotated[int, Meta(ge=1, le=1000)]
    swarm: Name
    node_id: PeerId
    model: ModelName
    round: Annotated[int, Meta(ge=0, lt=2**53)]
    timestamp: Annotated[float, Meta(ge=0, le=1e11)]
    groups: Annotated[list[WireGroup], Meta(min_length=1, max_length=MAX_GROUPS)]


MAX_ANNOUNCEMENT_BYTES = 16 * 1024
MAX_ADDRS = 4

Digest = Annotated[str, Meta(pattern=r"^[0-9a-f]{64}$")]
Addr = Annotated[str, Meta(min_length=8, max_length=200)]


class AnnouncedGroup(Struct, forbid_unknown_fields=True, frozen=True):
    spec: WireSpec
    reward_mean: Annotated[float, Meta(ge=0.0, le=1.0)]  # the sender's own score; a hint, re-checked


class Announcement(Struct, forbid_unknown_fields=True, frozen=True):
    """Gossiped each round (small, signed by libp2p): what a node has, so that receivers fetch
    only the bundles their sampler wants, directly from the node that made them."""

    version: Annotated[int, Meta(ge=1, le=1000)]
    swarm: Name
    node_id: PeerId
    model: ModelName
    round: Annotated[int, Meta(ge=0, lt=2**53)]
    timestamp: Annotated[float, Meta(ge=0, le=1e11)]
    digest: Digest  # sha256 of the compressed bundle
    size: Annotated[int, Meta(ge=1, le=MAX_BUNDLE_BYTES)]
    addrs: Annotated[list[Addr], Meta(max_length=MAX_ADDRS)]
    groups: Annotated[list[AnnouncedGroup], Meta(min_length=1, max_length=MAX_GROUPS)]


class WireError(ValueError):
    """Why bytes from a peer were refused (logged with the peer; nothing else happens)."""


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Bundle)
_announcement_decoder = msgspec.msgpack.Decoder(Announcement)


def encode_announcement(announcement: Announcement) -> bytes:
    data = _encoder.encode(announcement)
    if len(data) > MAX_ANNOUNCEMENT_BYTES:
        raise WireError(f"announcement is {len(data)} bytes, over the {MAX_ANNOUNCEMENT_BYTES} limit")
    return data


def decode_announcement(data: bytes) -> Announcement:
    if len(data) > MAX_ANNOUNCEMENT_BYTES:
        raise WireError(f"announcement of {len(data)} bytes exceeds {MAX_ANNOUNCEMENT_BYTES}")
    return _decode_checked(_announcement_decoder, data, "announcement")


def _decode_checked(decoder: msgspec.msgpack.Decoder, raw: bytes, what: str):
    """Schema-checked msgpack of this protocol version, or WireError."""
    try:
        value = decoder.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError) as exc:  # bad UTF-8 raises the last
        raise WireError(f"bad {what}: {exc}") from None
    if value.version != PROTOCOL_VERSION:
        raise WireError(f"protocol version {value.version}, this node speaks {PROTOCOL_VERSION}")
    return value


def encode_bundle(bundle: Bundle) -> bytes:
    body = zlib.compress(_encoder.encode(bundle), 6)
    if len(body) > MAX_BUNDLE_BYTES:
        raise WireError(f"bundle is {len(body)} bytes compressed, over the {MAX_BUNDLE_BYTES} limit: share fewer groups")
    return body


def decode_bundle(data: bytes) -> Bundle:
    if len(data) > MAX_BUNDLE_BYTES:
        raise WireError(f"bundle of {len(data)} bytes exceeds {MAX_BUNDLE_BYTES}")
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(data, MAX_DECOMPRESSED_BYTES + 1)
    except zlib.error as exc:
        raise WireError(f"not a zlib stream: {exc}") from None
    if len(raw) > MAX_DECOMPRESSED_BYTES or inflater.unconsumed_tail:
        raise WireError(f"bundle inflates beyond {MAX_DECOMPRESSED_BYTES} bytes")
    if not inflater.eof:
        raise WireError("truncated zlib stream")
    return _decode_checked(_decoder, raw, "bundle")


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def announce(bundle: Bundle, body: bytes, addrs: Sequence[str], rewards: Sequence[float]) -> Announcement:
    groups = [AnnouncedGroup(g.spec, min(1.0, max(0.0, r))) for g, r in zip(bundle.groups, rewards)]
    return Announcement(
        PROTOCOL_VERSION, bundle.swarm, bundle.node_id, bundle.model, bundle.round, bundle.timestamp,
        digest(body), len(body), [a for a in addrs if 8 <= len(a) <= 200][:MAX_ADDRS], groups,
    )


def text_logprobs(c) -> list[float]:
    """The sampler's logprobs of the tokens that make up the reply's text: an end-of-generation
    token is kept in `token_ids` but not in the text, and a receiver re-tokenising the text can
    only weigh what it sees, so the sender's sum leaves it out too."""
    logprobs = list(c.sampler_logprobs or [])
    return logprobs[:-1] if c.finish_reason == "eos" and logprobs else logprobs


def bundle_from_groups(
    groups: Sequence[QuestionGroup], *, swarm: str, node_id: str, model: str, round_no: int, timestamp: float, prefill: str
) -> Bundle:
    """A round's share: specs, question hashes and completions, never answers or rewards."""
    wire_groups = []
    for g in groups[:MAX_GROUPS]:
        spec = g.task.spec
        completions = [
            WireCompletion(
                text=(prefill + c.text)[:MAX_TEXT_CHARS],
                tokens=len(c.token_ids),
                logprob=max(-1e7, min(0.0, float(sum(text_logprobs(c))))),
            )
            for c in g.completions[:MAX_COMPLETIONS]
        ]
        wire_groups.append(
            WireGroup(WireSpec(spec.preset, spec.dataset, spec.config, spec.seed, spec.index), g.task.question_hash, completions)
        )
    return Bundle(PROTOCOL_VERSION, swarm, node_id, model, round_no, timestamp, wire_groups)
