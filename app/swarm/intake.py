"""Turning a peer's question-group into one this node may train on — or refusing it, with a reason.

The sender's word is taken for nothing: the task is regenerated from its spec (which must be one
of a known preset's levels), the question hash must match what this node regenerates, the
completions are re-tokenised with this node's tokenizer and scored by this node's verifier.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ...backends.base import ChatPrompt, Sampler
from ..reward import score
from ..rollout import QuestionGroup, ScoredCompletion
from ..round import SYSTEM_PROMPT
from ..tasks import TaskError, load_preset, preset_names, regenerate
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

    system_prompt: str
    prefill: str
    format_bonus: float
    max_completion_tokens: int
    encode_prompt: Callable[[ChatPrompt], list[int]]
    tokenize: Callable[[str], list[int]]

    @classmethod
    def for_sampler(cls, sampler: Sampler, prefill: str, format_bonus: float, max_new_tokens: int) -> IntakeContext:
        """Groups rebuilt as this sampler's own: its prompt rendering, its tokenizer."""
        return cls(
            system_prompt=SYSTEM_PROMPT,
            prefill=prefill,
            format_bonus=format_bonus,
            max_completion_tokens=2 * max_new_tokens,  # other tokenizers split the same text differently
            encode_prompt=sampler.encode_prompt,
            tokenize=sampler.tokenize,
        )


def admit_group(wire: WireGroup, peer: str, ctx: IntakeContext) -> QuestionGroup | Rejected:
    spec = wire.spec.task_spec()
    if spec.preset not in preset_names():
        return Rejected(peer, f"unknown preset {spec.preset!r}", blame=False)
    try:
        level = load_preset(spec.preset).level_of(spec)
        task = regenerate(spec)
    except TaskError as exc:
        return Rejected(peer, str(exc))
    if task.question_hash != wire.question_hash:
        return Rejected(peer, f"question hash mismatch for {spec.dataset} (a different task, or another reasoning-gym)")

    prefill = ctx.prefill
    prompt = ChatPrompt(ctx.system_prompt, task.question, prefill)
    prompt_ids = ctx.encode_prompt(prompt)
    completions = []
    for wc in wire.completions:
        # The reply travels whole; train on it after our own prefill when it starts with it.
        if not prefill:
            completion_text = wc.text
        elif wc.text.startswith(prefill):
            completion_text = wc.text[len(prefill) :]
        else:
            continue  # written without the prefill our prompt puts in front of it: not this policy's action
        token_ids = ctx.tokenize(completion_text)
        if not token_ids or len(token_ids) > ctx.max_completion_tokens:
            continue
        s = score(task, wc.text, ctx.format_bonus)
        completions.append(
            ScoredCompletion(
                completion_text, token_ids, None, "external", s.strict, s.well_formed, s.reward, sender_logprob=wc.logprob
            )
        )
    if len(completions) < 2:
        return Rejected(peer, "fewer than two usable completions", blame=False)
    return QuestionGroup(task, level, prompt, prompt_ids, completions, source=peer)
