"""The GGUF LoRA writer refuses architectures whose q/k layout nobody checked (a wrong guess
would not fail: llama.cpp would silently compute something else). The checked ones are tested
against torch in test_handoff.py."""

from __future__ import annotations

import numpy as np
import pytest

from swarmling.backends.gguf_lora import ModelShape, write_gguf_lora


def test_an_unchecked_architecture_is_refused(tmp_path):
    state = {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": np.zeros((4, 8), np.float32)}
    with pytest.raises(ValueError, match="no checked GGUF LoRA layout for architecture 'qwen2'"):
        write_gguf_lora(state, ModelShape("qwen2", 1, 2, 2), 8.0, tmp_path / "adapter.gguf")
    assert not list(tmp_path.iterdir())
