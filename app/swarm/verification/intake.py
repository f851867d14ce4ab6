"""Turning a peer's question-group into one this node may train on — or refusing it, with a reason.

The sender's word is taken for nothing: the task is regenerated from its spec (which must be one
of a known preset's levels), the question hash must match what this node regenerates, the
completions are re-tokenised with this node's tokenizer and scored by this node's verifier.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ....backends.base import ChatPrompt, Sampler
from ...learning.prompt import PromptFormat
from ...learning.reward import CLOSE, OPEN
from ...learning.rollout import RIGHT, QuestionGroup, ScoredCompletion
from ...learning.tasks import EVAL_SEED, TaskError, load_preset, preset_names, regenerate
from .wire import WireGroup


@dataclass(frozen=True)
class Rejected:
    peer: str
    reason: str
    # True when the group can only be a lie (a question that does not match its spec); False for
    # what an honest peer on another version or tokenizer may send.
    blame: bool = True


@dataclass(frozen=True)
class IntakeContext:
    """What this node needs to rebuild a group as its own."""

    prompt: PromptFormat  # the prompts this node's own rounds build, rebuilt for a peer's task
    format_bonus: float
    max_completion_tokens: int
    encode_prompt: Callable[[ChatPrompt], list[int]]
    tokenize: Callable[[str], list[int]]
    # This node's model and reply limit: a peer on the same model (same tokenizer) cannot have
    # written more tokens than this node's sampler may; other tokenizers get max_completion_tokens.
    model: str = ""
    max_new_tokens: int | None = None
    group_size: int | None = None  # this node's G: larger groups are subsampled to it

    @classmethod
    def for_sampler(
        cls, sampler: Sampler, model: str, prompt: PromptFormat, format_bonus: float, max_new_tokens: int, group_size: int
    ) -> IntakeContext:
        """Groups rebuilt as this sampler's own: its prompt rendering, its tokenizer."""
        return cls(
            prompt=prompt,
            format_bonus=format_bonus,
            max_completion_tokens=2 * max_new_tokens,  # other tokenizers split the same text differently
            encode_prompt=sampler.encode_prompt,
            tokenize=sampler.tokenize,
            model=model,
            max_new_tokens=max_new_tokens,
            group_size=group_size,
        )

    def token_limit(self, sender_model: str) -> int:
        same_tokenizer = bool(self.model) and sender_model == self.model and self.max_new_tokens is not None
        return self.max_new_tokens + SAME_TOKENIZER_SLACK if same_tokenizer else self.max_completion_tokens


MAX_LOST_SHARE = 0.25  # a group that lost more of its replies here is refused
# Re-tokenising a sampled text, even with the same tokenizer, can take a few more tokens than the
# sampler drew: its tokens are not always the canonical split, and the reply is tokenised
# without the prefill in front of it. Replies cut at the length limit would otherwise be dropped.
SAME_TOKENIZER_SLACK = 4

MAX_TAIL_CHARS = 3  # what the token completing `</answer>` may carry after it

# C0 controls but tab and newline, DEL and C1. SmolLM2's vocabulary is byte-level, so an honest
# sampler at temperature 1 does write a stray one now and then (an honest node's group was refused
# whole for it in the three-node sim): such a reply is dropped, not blamed. A terminal escape
# *sequence* (ESC and the character that makes it one, or a C1 CSI/OSC) is what no sampler writes
# by chance.
CONTROL_CHARACTERS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
ESCAPE_SEQUENCE = re.compile(r"\x1b[\x20-\x7e]|[\x9b\x9d]")  # ESC c (reset), ESC [ (CSI), ESC ] (OSC), ...


def reply_shape_problem(reply: str, peer: str) -> Rejected | None:
    """Why a peer's whole reply (prefill included) is not one this node's own sampler could have
    written, or None. A local sample ends with the token that completes the first `</answer>`, so
    nothing but the rest of that token can follow it (SmolLM2's `>.`, `>")`, `></`: a few
    characters, no letters or digits); anything else rides on the answer (spam, escape sequences,
    a second answer) and would be trained on with the answer's reward. Free text before the first
    `<answer>` is the reasoning mode's (prefill off), screened by learning/screening.py."""
    if ESCAPE_SEQUENCE.search(reply):
        return Rejected(peer, "a reply with a terminal escape sequence")
    first_close = reply.find(CLOSE)
    tail = reply[first_close + len(CLOSE):].strip() if first_close >= 0 else ""
    if len(tail) > MAX_TAIL_CHARS or any(ch.isalnum() for ch in tail):
        return Rejected(peer, "a reply with text after its closing </answer>")
    first_open, last_open = reply.find(OPEN), reply.rfind(OPEN)
    if last_open > first_open and reply[first_open:last_open].replace(OPEN, "").strip():
        # Honest policies may write this, but the scorer would grade only what follows the last
        # tag while training pushes up everything before it: the reply is dropped (not blamed).
        return Rejected(peer, "a reply with text before a second <answer> tag", blame=False)
    if CONTROL_CHARACTERS.search(reply):
        return Rejected(peer, "a reply with a control character", blame=False)
    return None


def admit_group(wire: WireGroup, peer: str, ctx: IntakeContext, sender_model: str = "") -> QuestionGroup | Rejected:
    spec = wire.spec.task_spec()
    if spec.preset not in preset_names():
        return Rejected(peer, f"unknown preset {spec.preset!r}", blame=False)
    if spec.seed >= EVAL_SEED:  # no round draws these: held out for evaluation, never trained on
        return Rejected(peer, "a task from the held-out evaluation seeds")
    try:
        level = load_preset(spec.preset).level_of(spec)
        task = regenerate(spec)
    except TaskError as exc:
        return Rejected(peer, str(exc))
    if task.question_hash != wire.question_hash:
        return Rejected(peer, f"question hash mismatch for {spec.dataset} (a different task, or another reasoning-gym)")

    prefill = ctx.prompt.prefill
    prompt = ctx.prompt.prompt(task.question)
    prompt_ids = ctx.encode_prompt(prompt)
    token_limit = ctx.token_limit(sender_model)
    completions = []
    for wc in wire.completions:
        # The reply travels whole; train on it after our own prefill when it starts with it.
        if not prefill:
            completion_text = wc.text
        elif wc.text.startswith(prefill):
            completion_text = wc.text[len(prefill) :]
        else:
            continue  # written without the prefill our prompt puts in front of it: not this policy's action
        if refused := reply_shape_problem(ctx.prompt.whole_reply(completion_text), peer):
            if refused.blame:
                return refused  # the whole group: no honest sampler writes this, it came to carry it
            continue  # an honest policy may write it; it is just not trained on
        token_ids = ctx.tokenize(completion_text)
        if not token_ids or len(token_ids) > token_limit:
            continue
        s = ctx.prompt.score(task, completion_text, ctx.format_bonus)
        completions.append(
            ScoredCompletion(
                completion_text, token_ids, None, "external", s.strict, s.well_formed, s.reward, sender_logprob=wc.logprob
            )
        )
    if len(completions) < 2:
        return Rejected(peer, "fewer than two usable completions", blame=False)
    lost = len(wire.completions) - len(completions)
    if lost > len(wire.completions) * MAX_LOST_SHARE:
        # What is left is biased (the long replies, or the ones in another prefill, are gone), and
        # advantages centred on that subset would misjudge the rest.
        return Rejected(peer, f"{lost} of {len(wire.completions)} replies unusable here", blame=False)
    if ctx.group_size is not None and len(completions) > ctx.group_size:
        completions = _subsample(completions, ctx.group_size, f"{peer}/{wire.question_hash}")
    other_model = bool(ctx.model) and sender_model != ctx.model
    return QuestionGroup(task, level, prompt, prompt_ids, completions, source=peer, other_model=other_model)


def _subsample(completions: list[ScoredCompletion], k: int, key: str) -> list[ScoredCompletion]:
    """k of the group's replies, uniformly: a peer's 64-reply group must weigh what one of ours
    does in the token mean. Seeded by the group, so every node (and every retry) keeps the same.
    A group with a right reply keeps one: a rare success is what a rescue (learning/rescue.py)
    needs, and keeping it moves the group's mean by at most 1/k."""
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little"))
    picked = [int(i) for i in rng.choice(len(completions), size=k, replace=False)]
    right = [i for i, c in enumerate(completions) if c.strict >= RIGHT]
    if right and not set(picked) & set(right):
        picked[int(rng.integers(k))] = right[int(rng.integers(len(right)))]
    return [completions[i] for i in sorted(picked)]
