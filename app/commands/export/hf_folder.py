"""The `hf` format: the adapter merged into the base weights, saved as a transformers folder
(safetensors, config, tokenizer with its chat template, a greedy generation config) that
`AutoModelForCausalLM.from_pretrained` loads with no peft and no swarmling.

The base is the trainer's own (the GGUF dequantized once to fp32, backends/hf_from_gguf.py, or
the Hugging Face folder a CUDA node trained on), saved in fp32 as trained: merging changes the
log-probs by float rounding only (tests/test_export.py states the tolerance)."""

from __future__ import annotations

import json
from pathlib import Path

from ....backends.adapter_format import ADAPTER_CONFIG, ADAPTER_FILE, FULL_WEIGHTS_FILE
from ...errors import NodeError
from ...node.checkpoint_choice import TakenCheckpoint


def merged_model(base_dir: Path, checkpoint: Path):
    """The base model with the checkpoint's adapter (or full weights) merged in: a plain transformers model."""
    import torch
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    config = json.loads((checkpoint / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    try:
        if config.get("mode") == "full":
            result = model.load_state_dict(load_file(str(checkpoint / FULL_WEIGHTS_FILE)), strict=False)
            misfits = [k for k in result.missing_keys if k != "lm_head.weight"] + list(result.unexpected_keys)
            if misfits:
                raise ValueError(f"weights that do not fit: {misfits[:3]}")
            return model
        peft = get_peft_model(model, LoraConfig(r=int(config["r"]), lora_alpha=float(config["alpha"]), lora_dropout=0.0,
                                                target_modules=list(config["target_modules"]), bias="none",
                                                task_type="CAUSAL_LM"))
        state = load_file(str(checkpoint / ADAPTER_FILE))
        result = set_peft_model_state_dict(peft, state)
        misfits = [k for k in getattr(result, "unexpected_keys", []) if "lora_" in k]
        if misfits or not state:
            raise ValueError(f"adapter tensors that do not fit: {misfits[:3]}")
        return peft.merge_and_unload()
    except (RuntimeError, ValueError, KeyError) as exc:
        raise NodeError(f"the checkpoint in {checkpoint} does not fit the base model in {base_dir} ({exc})") from None


def write_hf_files(folder: Path, taken: TakenCheckpoint, base_dir: Path, chat_template: str | None,
                   max_new_tokens: int) -> None:
    from transformers import AutoTokenizer

    model = merged_model(base_dir, taken.copy.path)
    generation = model.generation_config
    generation.do_sample, generation.max_new_tokens = False, max_new_tokens
    for sampling_only in ("temperature", "top_p", "top_k"):
        setattr(generation, sampling_only, None)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer = AutoTokenizer.from_pretrained(str(base_dir))
    if not tokenizer.chat_template and chat_template:
        tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(folder)
