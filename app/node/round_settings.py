"""The round's settings (learning/round.py's RoundSettings) from the node's config and the shape
its hardware chose: the one place a config key becomes a round's behaviour."""

from __future__ import annotations

from ..config import Config
from ..learning.curriculum import Curriculum
from ..learning.prompt import PromptFormat
from ..learning.round import RoundSettings
from ..sizing import RoundShape
from ..swarm.verification.intake import IntakeContext


def round_settings(config: Config, shape: RoundShape, temperature: float, model: str) -> RoundSettings:
    """The round's shape as configured, with what was left to the hardware filled in; the sampling
    temperature is the backend's (the trainer scores at the one it was built with)."""
    return RoundSettings(
        questions=shape.questions,
        completions=shape.completions,
        max_new_tokens=shape.max_new_tokens,
        temperature=temperature,
        local_groups=shape.local_groups,
        external_groups=config.round.external_groups,
        prefill_answer=config.reward.prefill_answer,
        format_bonus=config.reward.format_bonus,
        max_groups_per_peer=config.round.max_groups_per_peer,
        fill=config.round.peer_groups == "fill",
        min_signal_groups=config.train.min_signal_groups,
        external_text_margin=config.train.external_text_margin,
        common_questions=min(config.round.common_questions, shape.questions),
        rescue=config.round.rescue,
        swarm=config.swarm.name,
        model=model,
    )


def intake_context(config: Config, shape: RoundShape, sampler, model: str, curriculum: Curriculum) -> IntakeContext:
    """What peers' groups are checked against this round: our prompt, tokenizer, length limit and
    the format bonus at the curriculum's stage."""
    return IntakeContext.for_sampler(
        sampler, model, prompt=PromptFormat(config.reward.prefill_answer),
        format_bonus=curriculum.format_bonus(config.reward.format_bonus),
        max_new_tokens=shape.max_new_tokens, group_size=shape.completions,
    )
