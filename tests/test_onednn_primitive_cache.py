"""The trainer caps oneDNN's primitive cache (backends/torch_precision.py), checked by oneDNN's own
account of each matmul primitive it creates (ONEDNN_VERBOSE), in a fresh process as a node has."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

PROBE = textwrap.dedent("""
    import torch
    import swarmling.backends.cpu  # what a node imports before its trainer's first pass
    from swarmling.backends.torch_precision import ONEDNN_PRIMITIVES

    def matmul(rows):
        torch.randn(rows, 64).bfloat16() @ torch.randn(64, 32).bfloat16()

    matmul(7)
    matmul(7)  # the cache's hit
    for rows in range(8, 8 + 2 * ONEDNN_PRIMITIVES):  # twice as many other shapes as it keeps
        matmul(rows)
    matmul(7)  # evicted: created again
""")


def matmul_creations(extra_env: dict[str, str]) -> list[str]:
    """'hit' or 'miss' for each matmul primitive the probe asked oneDNN for, in order."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_PRIMITIVE_CACHE_CAPACITY")}
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120,
                          env={**env, "ONEDNN_VERBOSE": "2", **extra_env})
    assert done.returncode == 0, done.stderr[-2000:]
    return [("hit" if "create:cache_hit" in line else "miss") for line in done.stdout.splitlines()
            if "create:cache_" in line and ",matmul," in line]


def onednn_runs_bf16_matmuls() -> bool:
    """torch's own test for sending bf16 products to oneDNN (x86: AVX-512); False where it has none."""
    try:
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


@pytest.mark.skipif(not onednn_runs_bf16_matmuls(),
                    reason="torch runs no bf16 matmul through oneDNN on this CPU (no AVX-512): nothing to cap")
def test_a_bf16_matmul_shape_unused_for_twice_the_cap_is_created_again_and_a_users_value_wins():
    created = matmul_creations({})
    assert created[:2] == ["miss", "hit"] and created[-1] == "miss", created
    # Where the volunteer set oneDNN's variable, under either spelling, theirs stands: at 1,024 the
    # shape is still kept.
    assert matmul_creations({"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1024"})[-1] == "hit"
    assert matmul_creations({"DNNL_PRIMITIVE_CACHE_CAPACITY": "1024"})[-1] == "hit"
