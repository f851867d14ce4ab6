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


def test_gguf_metadata_reads_the_shipped_files_header_through_llama_cpp(gguf_path, tmp_path):
    """gguf_metadata reads through llama.cpp (vocab only; gguf-py parses every field in Python, ~25x
    slower): numbers as text, a chat template longer than the first buffer whole, absent keys left
    out, a file that is no GGUF refused."""
    from swarmling.backends.gguf_lora import model_shape
    from swarmling.backends.llama_cpp_engine import LlamaCppError, gguf_metadata

    meta = gguf_metadata(gguf_path, "general.file_type", "general.architecture", "tokenizer.chat_template",
                         "general.license", "no.such.key")
    template = meta.pop("tokenizer.chat_template")
    assert meta == {"general.file_type": "3", "general.architecture": "llama", "general.license": "apache-2.0"}
    assert len(template) > 256 and template.startswith("{% for message in messages %}") and template.endswith("{% endif %}")
    assert model_shape(gguf_path) == ModelShape("llama", 30, 9, 3)
    (tmp_path / "not.gguf").write_bytes(b"not a model")
    with pytest.raises(LlamaCppError, match="could not read"):
        gguf_metadata(tmp_path / "not.gguf", "general.architecture")
