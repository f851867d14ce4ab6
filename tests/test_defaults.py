"""Per-hardware defaults: the training microbatch fitted under a memory ceiling."""

from __future__ import annotations

import pytest

from swarmling.app.defaults import ResourceError, estimate_peak_bytes, fit_microbatch


def test_the_microbatch_halves_until_the_estimated_peak_fits():
    assert fit_microbatch(2048, 3e9) == 512 and estimate_peak_bytes(512) <= 3e9 < estimate_peak_bytes(1024)


def test_a_ceiling_below_the_smallest_microbatch_is_refused_with_what_would_fit():
    with pytest.raises(ResourceError, match="max_memory_gb"):
        fit_microbatch(2048, 0.5e9)
