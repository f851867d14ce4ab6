"""Per-hardware defaults: the training microbatch and activation checkpointing fitted under a
memory ceiling (the user's, or the guest's share of the machine), per backend."""

from __future__ import annotations

import pytest

from swarmling.app.config import Config
from swarmling.app.sizing import (
    GUEST_BYTES,
    ONE_GROUP_MICROBATCH,
    ResourceError,
    estimate_peak_bytes,
    fit_microbatch,
    guest_bytes,
    memory_note,
    plan,
)
from swarmling.app.hardware import Hardware
from swarmling.app.learning.tasks import load_preset


def machine(gib: float, **kw) -> Hardware:
    return Hardware(system="Linux", machine="x86_64", cpu="x", physical_cores=2, logical_cores=2,
                    memory_total=int(gib * 2**30), memory_available=int(gib * 2**30), **kw)


def resolved(gib: float = 8, hw: Hardware | None = None, **sections):
    return plan(Config.model_validate(sections), hw or machine(gib), load_preset("starter")).build


def test_the_microbatch_halves_until_the_estimated_peak_fits():
    assert fit_microbatch(2048, 3e9) == 512 and estimate_peak_bytes(512) <= 3e9 < estimate_peak_bytes(1024)


def test_a_ceiling_below_the_smallest_microbatch_is_refused_with_what_would_fit():
    with pytest.raises(ResourceError, match="max_memory_gb"):
        fit_microbatch(2048, 0.5e9)


def test_without_a_ceiling_the_cpu_default_is_a_good_guest_on_any_machine():
    """Sized from the guest ceiling, not from the machine's memory: an 8 GB box and a 64 GB one
    get the same microbatch, a group in one pass, under the guest ceiling; a 4 GB one keeps the
    node under its guest share (checkpointing, at ~1.4x the training time); a ceiling the user
    sets wins."""
    big = {resolved(gib) for gib in (8, 64)}
    assert len(big) == 1
    default = big.pop()
    assert default.microbatch_tokens == ONE_GROUP_MICROBATCH and not default.activation_checkpointing
    assert estimate_peak_bytes(default.microbatch_tokens) <= GUEST_BYTES
    small = resolved(4)
    assert small.activation_checkpointing and small.microbatch_tokens >= ONE_GROUP_MICROBATCH
    assert estimate_peak_bytes(small.microbatch_tokens, checkpointing=True) <= guest_bytes(machine(4))
    tiny = resolved(3)  # under the share even so: the least memory that keeps a group in one pass
    assert tiny.activation_checkpointing
    roomy = resolved(64, resources={"max_memory_gb": 8})
    assert estimate_peak_bytes(roomy.microbatch_tokens) > GUEST_BYTES and not roomy.activation_checkpointing


def test_a_bigger_model_on_a_big_machine_keeps_its_speed_under_the_guest_cap():
    big_model = plan(Config(), machine(64), load_preset("starter"), model_scale=1.5).build
    assert not big_model.activation_checkpointing


def test_a_microbatch_asked_for_without_a_ceiling_is_taken_as_is():
    asked = resolved(4, train={"microbatch_tokens": 2048})
    assert asked.microbatch_tokens == 2048 and not asked.activation_checkpointing


def test_a_tight_ceiling_turns_checkpointing_on_and_still_keeps_a_group_in_one_pass():
    """2 GB is below a group's pass without checkpointing (~2.1 GB) but fits one with it."""
    tight = resolved(resources={"max_memory_gb": 2})
    assert tight.activation_checkpointing and tight.microbatch_tokens >= ONE_GROUP_MICROBATCH
    assert estimate_peak_bytes(tight.microbatch_tokens, checkpointing=True) <= 2e9
    with pytest.raises(ResourceError, match="with activation checkpointing"):
        resolved(resources={"max_memory_gb": 1.2})


def test_a_small_microbatch_the_user_asked_for_that_fits_gets_no_checkpointing():
    small = resolved(resources={"max_memory_gb": 2}, train={"microbatch_tokens": 128})
    assert small.microbatch_tokens == 128 and not small.activation_checkpointing


def test_the_users_choice_of_checkpointing_wins_and_the_ceiling_is_still_kept():
    forced_off = resolved(resources={"max_memory_gb": 2}, train={"activation_checkpointing": False})
    assert not forced_off.activation_checkpointing
    assert estimate_peak_bytes(forced_off.microbatch_tokens) <= 2e9  # a split group, prompt repeated
    assert resolved(train={"activation_checkpointing": True}).activation_checkpointing


def test_the_mlx_trainer_cannot_checkpoint_so_a_ceiling_is_kept_by_the_microbatch_alone():
    mac = machine(16, apple_silicon=True, mlx_importable=True)
    under = resolved(hw=mac, resources={"max_memory_gb": 2})
    assert under.kind == "mlx" and not under.activation_checkpointing
    assert estimate_peak_bytes(under.microbatch_tokens) <= 2e9
    sections = {"resources": {"max_memory_gb": 2}, "train": {"activation_checkpointing": True}}
    asked = resolved(hw=mac, **sections)
    assert not asked.activation_checkpointing  # what runs
    assert "not implemented by the MLX trainer" in memory_note(Config.model_validate(sections), asked)


def test_on_cuda_the_memory_note_says_nothing_of_a_host_memory_ceiling():
    gpu = machine(64, cuda_devices=("H100",), cuda_memory=(80 * 2**30,))
    sections = {"resources": {"max_memory_gb": 2}}
    assert memory_note(Config.model_validate(sections), resolved(hw=gpu, **sections)) is None


def test_the_cpu_backend_on_a_gpu_machine_keeps_the_ceiling_and_the_gpu_sizes_by_its_memory():
    gpu = machine(64, cuda_devices=("H100",), cuda_memory=(80 * 2**30,))
    on_gpu = resolved(hw=gpu, resources={"max_memory_gb": 2})
    assert on_gpu.microbatch_tokens == 32768 and not on_gpu.activation_checkpointing
    on_cpu = resolved(hw=gpu, resources={"max_memory_gb": 2}, backend={"kind": "cpu"})
    assert on_cpu.activation_checkpointing and estimate_peak_bytes(on_cpu.microbatch_tokens, checkpointing=True) <= 2e9


def test_a_round_too_big_to_generate_under_the_ceiling_is_refused_with_what_to_lower():
    with pytest.raises(ResourceError, match="round.questions"):
        resolved(resources={"max_memory_gb": 2}, round={"questions": 32, "completions": 16, "max_new_tokens": 256})


def test_the_memory_note_says_when_checkpointing_was_chosen():
    for train in ({}, {"microbatch_tokens": 512}):
        sections = {"resources": {"max_memory_gb": 2}, "train": train}
        note = memory_note(Config.model_validate(sections), resolved(**sections))
        assert note is not None and "activation checkpointing" in note, train
    small_machine = memory_note(Config(), resolved(4))
    assert small_machine is not None and "guest's share" in small_machine and "activation checkpointing" in small_machine
    assert memory_note(Config(), resolved(8)) is None


def test_a_bf16_base_goes_with_the_compiled_trainer_only():
    """Eager bf16 rounds the adapter's small updates away (app/sizing.cpu_bf16_choice): a bf16
    CPU trains in bf16 where it compiles, in fp32 where it cannot, and as told with `on`."""
    bf16 = frozenset({"avx512_bf16"})
    compiling = resolved(hw=machine(8, cxx_compiler="/usr/bin/g++", cpu_flags=bf16))
    assert compiling.cpu_trainer.bf16 and "compiled" in compiling.cpu_trainer.bf16_reason
    eager = resolved(hw=machine(8, cpu_flags=bf16))
    assert not eager.cpu_trainer.bf16 and "needs the compiled trainer" in eager.cpu_trainer.bf16_reason
    told = resolved(hw=machine(8, cpu_flags=bf16), train={"cpu_bf16": "on"})
    assert told.cpu_trainer.bf16 and told.cpu_trainer.bf16_forced and "rounded away" in told.cpu_trainer.bf16_reason
    assert not resolved(hw=machine(8, cxx_compiler="/usr/bin/g++")).cpu_trainer.bf16  # no bf16 instructions


def test_the_cpu_trainer_compiles_where_a_compiler_is_found_unless_told_not_to():
    with_gxx = machine(8, cxx_compiler="/usr/bin/g++")
    assert resolved(hw=with_gxx).cpu_trainer.compiler == "/usr/bin/g++"
    assert resolved(hw=machine(8)).cpu_trainer.compiler is None  # auto, and nothing to build with
    assert "no C++ compiler" in resolved(hw=machine(8)).cpu_trainer.compile_reason
    assert resolved(hw=with_gxx, train={"cpu_compile": "off"}).cpu_trainer.compiler is None
    assert resolved(hw=machine(8), train={"cpu_compile": "on"}).cpu_trainer.compiler == "g++"  # tried; falls back if it fails
    on_gpu = machine(8, cxx_compiler="/usr/bin/g++", cuda_devices=("H100",), cuda_memory=(80 * 2**30,))
    assert resolved(hw=on_gpu).cpu_trainer.compiler is None  # the CUDA trainer: not measured compiled


def test_the_cpu_sampler_runs_an_f16_copy_where_the_cpu_has_avx512_unless_told():
    """app/sizing.sampler_weights_choice: measured on AVX-512 only, so AVX2-only CPUs keep the file
    as shipped unless told `f16`; `shipped` keeps it everywhere."""
    avx512 = machine(8, cpu_flags=frozenset({"avx2", "avx512f"}))
    chosen = resolved(hw=avx512).cpu_sampler
    assert chosen.f16 and not chosen.f16_any and "AVX-512" in chosen.reason  # Q4_1 files only
    avx2 = resolved(hw=machine(8, cpu_flags=frozenset({"avx2"}))).cpu_sampler
    assert not avx2.f16 and "no AVX-512" in avx2.reason
    told = resolved(hw=machine(8, cpu_flags=frozenset({"avx2"})), backend={"sampler_weights": "f16"}).cpu_sampler
    assert told.f16 and told.f16_any
    assert not resolved(hw=avx512, backend={"sampler_weights": "shipped"}).cpu_sampler.f16
    with pytest.raises(ValueError):
        resolved(hw=avx512, backend={"sampler_weights": "q8"})
