"""Write a peft LoRA adapter as a GGUF LoRA adapter that llama.cpp can hot-swap.

Two details decide whether llama.cpp then computes what torch computes:
- tensor names follow llama.cpp's (`blk.N.attn_q.weight.lora_a`), A stored (r, in) and B (out, r)
  exactly as peft keeps them, alpha in `adapter.lora.alpha` (llama.cpp scales by alpha / r like peft);
- llama-family GGUFs store q/k projection rows permuted for llama.cpp's rotary layout
  (convert_hf_to_gguf's `permute`), so lora_B of q_proj / k_proj must get the same row permutation.
  Without it nothing fails, outputs are just subtly wrong. Gemma's GGUFs are not permuted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .atomic import atomic_file
from .llama_cpp_engine import gguf_metadata

# Architectures whose GGUF conversion applies the rotary row permutation to q and k weights, and
# those checked to need none. A wrong guess fails silently (the adapter just computes something
# else in llama.cpp), so any other architecture is refused until someone checks it.
PERMUTED_QK_ARCHS = frozenset({"llama"})
UNPERMUTED_ARCHS = frozenset({"gemma3"})


@dataclass(frozen=True)
class ModelShape:
    arch: str  # GGUF general.architecture, e.g. "llama", "gemma3"
    n_layers: int
    n_head: int
    n_head_kv: int


def rotary_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_tensor_names(lora_state: Mapping[str, "np.ndarray"], shape: ModelShape) -> dict[str, str]:
    """peft state-dict key -> GGUF tensor name."""
    import gguf

    arch_by_name = {name: arch for arch, name in gguf.MODEL_ARCH_NAMES.items()}
    if shape.arch not in arch_by_name:
        raise ValueError(f"no GGUF tensor map for architecture {shape.arch!r}")
    name_map = gguf.get_tensor_name_map(arch_by_name[shape.arch], shape.n_layers)
    out = {}
    for key in lora_state:
        module, _, kind = key.rpartition(".lora_")  # "...q_proj", "A.weight"
        module = module.removeprefix("base_model.model.")
        gguf_name = name_map.get_name(module)
        if gguf_name is None:
            raise ValueError(f"LoRA module {module!r} has no llama.cpp tensor name")
        suffix = {"A.weight": "lora_a", "B.weight": "lora_b"}.get(kind)
        if suffix is None:
            raise ValueError(f"unexpected LoRA tensor {key!r}")
        out[key] = f"{gguf_name}.weight.{suffix}"
    return out


def write_gguf_lora(lora_state: Mapping[str, np.ndarray], shape: ModelShape, alpha: float, path: Path) -> None:
    """Write atomically (temp file + rename): llama.cpp may be reading the previous adapter."""
    import gguf

    names = gguf_tensor_names(lora_state, shape)
    path = Path(path)
    if shape.arch not in PERMUTED_QK_ARCHS | UNPERMUTED_ARCHS:
        raise ValueError(
            f"no checked GGUF LoRA layout for architecture {shape.arch!r} (checked: "
            f"{', '.join(sorted(PERMUTED_QK_ARCHS | UNPERMUTED_ARCHS))}); run it on the CUDA or MLX backend"
        )
    permute = shape.arch in PERMUTED_QK_ARCHS
    with atomic_file(path, fsync=False) as tmp:
        writer = gguf.GGUFWriter(str(tmp), shape.arch)
        writer.add_string("general.type", "adapter")
        writer.add_string("adapter.type", "lora")
        writer.add_float32("adapter.lora.alpha", float(alpha))
        for key in sorted(lora_state):
            tensor = np.ascontiguousarray(np.asarray(lora_state[key], dtype=np.float32))
            name = names[key]
            if permute and name.endswith(".weight.lora_b"):
                if ".attn_q." in name:
                    tensor = np.ascontiguousarray(rotary_permute(tensor, shape.n_head))
                elif ".attn_k." in name:
                    tensor = np.ascontiguousarray(rotary_permute(tensor, shape.n_head_kv))
            writer.add_tensor(name, tensor)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()


def model_shape(gguf_path: Path) -> ModelShape:
    """The base model's shape as its GGUF states it (what the CPU backend reads from its trainer's config)."""
    arch = gguf_metadata(gguf_path, "general.architecture")["general.architecture"]
    meta = gguf_metadata(gguf_path, f"{arch}.block_count", f"{arch}.attention.head_count",
                         f"{arch}.attention.head_count_kv")
    heads = int(meta[f"{arch}.attention.head_count"])
    return ModelShape(arch=str(arch), n_layers=int(meta[f"{arch}.block_count"]), n_head=heads,
                      n_head_kv=int(meta.get(f"{arch}.attention.head_count_kv", heads)))


def peft_adapter_as_gguf(adapter_dir: Path, base_gguf: Path, out: Path) -> None:
    """A checkpoint's peft adapter (adapter_model.safetensors + adapter_config.json) as a GGUF LoRA
    for `base_gguf`: the file the CPU backend hands its sampler after every update."""
    import json

    from safetensors.numpy import load_file

    from .adapter_format import ADAPTER_CONFIG, ADAPTER_FILE

    config = json.loads((Path(adapter_dir) / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    if config.get("mode") == "full":
        raise ValueError("a fully fine-tuned checkpoint has no adapter to write as a GGUF LoRA")
    state = load_file(str(Path(adapter_dir) / ADAPTER_FILE))
    write_gguf_lora(state, model_shape(base_gguf), float(config["alpha"]), out)
