"""Per-hardware defaults: the training microbatch fitted under a memory ceiling."""

from __future__ import annotations

import pytest

from swarmling.app.defaults import ResourceError, estimate_peak_bytes, fit_microbatch


def test_the_microbatch_halves_until_the_estimated_peak_fits():
    assert fit_microbatch(2048, 3e9) == 512 and estimate_peak_bytes(512) <= 3e9 < estimate_peak_bytes(1024)


def test_a_ceiling_below_the_smallest_microbatch_is_refused_with_what_would_fit():
    with pytest.raises(ResourceError, match="max_memory_gb"):
        fit_microbatch(2048, 0.5e9)


def test_without_a_ceiling_the_cpu_default_is_a_good_guest_on_any_machine():
    """Sized from the guest ceiling, not from the machine's memory: a 64 GB box and a 4 GB one get
    the same microbatch, whose estimated peak stays under the guest ceiling; a ceiling the user sets wins."""
    from swarmling.app.config import Config
    from swarmling.app.defaults import GUEST_BYTES, resolve
    from swarmling.app.hardware import Hardware
    from swarmling.app.tasks import load_preset

    def machine(gib):
        return Hardware(system="Linux", machine="x86_64", cpu="x", physical_cores=2, logical_cores=2,
                        memory_total=gib * 2**30, memory_available=gib * 2**30)

    preset = load_preset("starter")
    sizes = {resolve(Config(), machine(gib), preset).microbatch_tokens for gib in (4, 8, 64)}
    assert len(sizes) == 1 and estimate_peak_bytes(sizes.pop()) <= GUEST_BYTES
    roomy = Config.model_validate({"resources": {"max_memory_gb": 8}})
    assert estimate_peak_bytes(resolve(roomy, machine(64), preset).microbatch_tokens) > GUEST_BYTES


def resolve_on_a_small_cpu(**sections):
    from swarmling.app.config import Config
    from swarmling.app.defaults import resolve
    from swarmling.app.hardware import Hardware
    from swarmling.app.tasks import load_preset

    hw = Hardware(system="Linux", machine="x86_64", cpu="x", physical_cores=2, logical_cores=2,
                  memory_total=4 * 2**30, memory_available=4 * 2**30)
    return resolve(Config.model_validate(sections), hw, load_preset("starter"))


def test_checkpointing_stays_off_unless_a_ceiling_cannot_hold_a_group_in_one_pass():
    from swarmling.app.defaults import ONE_GROUP_MICROBATCH

    guest = resolve_on_a_small_cpu()
    assert not guest.activation_checkpointing and guest.microbatch_tokens == ONE_GROUP_MICROBATCH
    roomy = resolve_on_a_small_cpu(resources={"max_memory_gb": 3})
    assert not roomy.activation_checkpointing and roomy.microbatch_tokens >= ONE_GROUP_MICROBATCH


def test_a_tight_ceiling_turns_checkpointing_on_and_still_keeps_a_group_in_one_pass():
    """2 GB is below a group's pass without checkpointing (~2.1 GB) but fits one with it."""
    tight = resolve_on_a_small_cpu(resources={"max_memory_gb": 2})
    assert tight.activation_checkpointing
    assert tight.microbatch_tokens >= 256
    assert estimate_peak_bytes(tight.microbatch_tokens, checkpointing=True) <= 2e9
    with pytest.raises(ResourceError, match="with activation checkpointing"):
        resolve_on_a_small_cpu(resources={"max_memory_gb": 1.2})


def test_the_users_choice_of_checkpointing_wins_and_the_ceiling_is_still_kept():
    forced_off = resolve_on_a_small_cpu(resources={"max_memory_gb": 2}, train={"activation_checkpointing": False})
    assert not forced_off.activation_checkpointing
    assert estimate_peak_bytes(forced_off.microbatch_tokens) <= 2e9  # a split group, prompt repeated
    assert resolve_on_a_small_cpu(train={"activation_checkpointing": True}).activation_checkpointing


def test_the_memory_note_says_when_checkpointing_was_chosen():
    from swarmling.app.config import Config
    from swarmling.app.defaults import memory_note

    config = Config.model_validate({"resources": {"max_memory_gb": 2}})
    note = memory_note(config, resolve_on_a_small_cpu(resources={"max_memory_gb": 2}))
    assert note is not None and "activation checkpointing" in note
