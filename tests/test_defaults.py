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
