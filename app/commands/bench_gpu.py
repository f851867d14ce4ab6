"""`swarmling bench-gpu`: the CUDA backend's round for the paper's shape, against references
measured in the same run.

Round shape (SAPO paper): 9 questions x 8 completions, 150-token prompts, 256 new tokens (EOS
ignored, so every sequence runs the full length), random weights in the node's precision (fp32 with
TF32 matmuls: backends/cuda.py says why), for the SmolLM2-135M and Qwen2.5-0.5B shapes, then the
SmolLM2 shape again in bf16 (what the precision costs, without the HF reference). Per model it prints:
- our phases: generate (first call, which includes compiling the decode step = warm-up, then the
  median of the steady calls), score (the real verifier on 72 replies), train (one GRPO step with
  LoRA r16, shared prefixes), hand-off, and the steady round total;
- the same training step with each completion alone (every prompt recomputed), and which fused
  attention kernel takes the shared-prefix mask (a math fallback would be slow);
- the memory-bandwidth floor for generation: bytes read per decode step (weights + the average
  KV cache) x steps / the device-to-device copy bandwidth measured now;
- Hugging Face `generate` with a static cache (compiled by transformers on CUDA) on the same
  inputs, warm-up and steady.
Target: a steady round <= 2 s on an H100 (stretch: 1 s). `--device cpu --tiny` runs the same
code on a toy shape, to check the command without a GPU (its times mean nothing).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ...backends.base import SamplingParams, TrainSample
from ...backends.cuda import CudaSettings, allow_tensor_cores
from ...backends.torch_generator import TorchGenerator
from ...backends.settings import GrpoSettings, LoraSettings, OptimSettings
from ...backends.torch_lora import TorchLoraTrainer
from ..config import Config
from .arguments import Invocation, positive


@dataclass(frozen=True)
class Shape:
    questions: int = 9
    completions: int = 8
    prompt_tokens: int = 150
    new_tokens: int = 256


PAPER = Shape()
TINY = Shape(questions=2, completions=2, prompt_tokens=16, new_tokens=8)


def model_configs(tiny: bool):
    from transformers import LlamaConfig, Qwen2Config

    layers = (2, 2) if tiny else (30, 24)
    return {
        "SmolLM2-135M": LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers[0],
                                    num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                                    tie_word_embeddings=True, rope_theta=100000.0),
        "Qwen2.5-0.5B": Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=layers[1],
                                    num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                                    tie_word_embeddings=True, rope_theta=1000000.0),
    }


class _Ids:
    """The benchmark's prompts are random ids: nothing to detokenize, no EOS to stop at."""

    pad_token_id = 0

    @staticmethod
    def decode(ids, skip_special_tokens: bool = True) -> str:
        return ""


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _timed(fn, device: str) -> tuple[float, object]:
    _sync(device)
    start = time.perf_counter()
    out = fn()
    _sync(device)
    return time.perf_counter() - start, out


def copy_bandwidth(device: str) -> float:
    """Bytes per second of a large device-to-device copy (read + write)."""
    n = (1 << 30) if device.startswith("cuda") else (1 << 26)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    seconds, _ = _timed(lambda: [dst.copy_(src) for _ in range(5)], device)
    return 2 * n * 5 / seconds


def floor_seconds(config, shape: Shape, weight_bytes: int, bandwidth: float, dtype_bytes: int) -> float:
    kv_per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * (config.hidden_size // config.num_attention_heads) * dtype_bytes
    batch = shape.questions * shape.completions
    avg_context = shape.prompt_tokens + shape.new_tokens / 2
    per_step = weight_bytes + kv_per_token * batch * avg_context
    return shape.new_tokens * per_step / bandwidth


def bench_gpu(device: str = "cuda", tiny: bool = False, steady_rounds: int = 3) -> int:
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("swarmling bench-gpu: no CUDA device here; run it on a machine with an NVIDIA GPU "
              "(or --device cpu --tiny to check the command itself)")
        return 2
    shape = TINY if tiny else PAPER
    dtype = CudaSettings.dtype  # the node's, on the GPU and off it
    if device.startswith("cuda"):
        allow_tensor_cores()
    name = torch.cuda.get_device_name(0) if device.startswith("cuda") else "CPU"
    bandwidth = copy_bandwidth(device)
    print(f"swarmling bench-gpu: {name}, torch {torch.__version__}, {str(dtype).removeprefix('torch.')}, "
          f"copy bandwidth {bandwidth / 1e9:.0f} GB/s")
    print(f"round: {shape.questions} questions x {shape.completions} completions, {shape.prompt_tokens}-token prompts, "
          f"{shape.new_tokens} new tokens (EOS ignored), random weights\n")
    for i, (label, config) in enumerate(model_configs(tiny).items()):
        round_s = _bench_model(label, config, shape, device, dtype, bandwidth, steady_rounds)
        if i == 0:  # the default model's shape again in bf16: what the node's precision costs
            bf16 = _bench_model(f"{label}, bf16 (for comparison)", config, shape, device, torch.bfloat16, bandwidth,
                                steady_rounds, hf_reference=False)
            print(f"{label}: the node's precision ({str(dtype).removeprefix('torch.')}) takes {round_s / bf16:.2f}x "
                  "the bf16 round\n")
    return 0


def _bench_model(label, config, shape: Shape, device, dtype, bandwidth, steady_rounds, hf_reference: bool = True) -> float:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="swarmling-bench-gpu-") as tmp:
        AutoModelForCausalLM.from_config(config).save_pretrained(tmp)
        train = Config().train  # the defaults a node trains with
        microbatch, checkpointing = node_training(device, shape)
        trainer = TorchLoraTrainer(Path(tmp), LoraSettings.from_config(train),
                                   OptimSettings.from_config(train, microbatch, checkpointing),
                                   GrpoSettings.from_config(train), 1.0, device=device, dtype=dtype)
    on_gpu = device.startswith("cuda")
    generator = TorchGenerator(trainer.model, _Ids(), set(), trainer.softcap, compile_step=on_gpu)
    prompts = torch.randint(10, config.vocab_size, (shape.questions, shape.prompt_tokens)).tolist()
    params = SamplingParams(max_new_tokens=shape.new_tokens, temperature=1.0, seed=1)

    def generate():
        return generator.generate(prompts, shape.completions, params)

    first, result = _timed(generate, device)
    steady = [_timed(generate, device)[0] for _ in range(steady_rounds)]
    gen_s = statistics.median(steady)
    score_s = _score_seconds(shape.questions * shape.completions)
    samples = [TrainSample(result.prompt_ids[p], c.token_ids, (-1.0) ** i, c.logprobs)
               for p, row in enumerate(result.completions) for i, c in enumerate(row)]
    train_first, stats = _timed(lambda: trainer.train_step(samples), device)
    train_s = statistics.median(_timed(lambda: trainer.train_step(samples), device)[0] for _ in range(steady_rounds))
    trainer.shared_prefix = False
    unshared_s = statistics.median(_timed(lambda: trainer.train_step(samples), device)[0] for _ in range(steady_rounds))
    trainer.shared_prefix = True
    kernel = masked_attention_kernel(trainer, samples[: shape.completions])
    handoff_s, _ = _timed(lambda: None, device)  # one copy of the weights: nothing to hand over
    weights = sum(p.numel() * p.element_size() for p in trainer.model.parameters())
    floor = floor_seconds(config, shape, weights, bandwidth, torch.finfo(dtype).bits // 8)
    hf_first, hf_steady = (_hf_generate(trainer, prompts, shape, device, steady_rounds) if hf_reference
                           else (float("nan"), float("nan")))
    round_s = gen_s + score_s + train_s + handoff_s

    print(f"{label}  ({weights / 1e6:.0f} MB of weights; training microbatches of {microbatch:,} tokens)")
    rows = [
        ("generate, first call (warm-up incl.)", first, ""),
        ("generate, steady (median)", gen_s, f"{gen_s / floor:.1f}x the floor; decode step {generator.decoding}"),
        (f"score (real verifier, {len(samples)} replies)", score_s, ""),
        ("train (GRPO step, LoRA r16), first / steady", train_s, f"first {train_first:.2f} s"),
        ("train, each completion alone (steady)", unshared_s, f"shared prefixes {unshared_s / train_s:.1f}x faster; "
         f"attention: sdpa, {kernel}"),
        ("hand-off", handoff_s, ""),
        ("round total, steady", round_s, "toy shape: times mean nothing" if shape == TINY
         else f"target <= 2 s: {'met' if round_s <= 2 else 'NOT met'}, stretch <= 1 s: {'met' if round_s <= 1 else 'not met'}"),
        ("floor: generation at copy bandwidth", floor, ""),
        ("HF generate static cache, warm-up", hf_first, ""),
        ("HF generate static cache, steady", hf_steady, f"ours is {hf_steady / gen_s:.1f}x faster"),
    ]
    for what, seconds, note in rows:
        print(f"  {what:<46} {seconds:>8.3f} s  {note}")
    print(f"  sampler/trainer logprob gap {stats.sampler_logprob_gap:.2e} per token, "
          f"{stats.sampler_ratio_outside:.1%} of tokens with ratio outside [0.8, 1.2]\n")
    return round_s


def node_training(device: str, shape: Shape) -> tuple[int, bool]:
    """The training microbatch and activation checkpointing a node on this GPU takes (sizing.py:
    the microbatch follows device memory, 32k tokens on an 80 GB card, so the paper's round is one
    pass); elsewhere (`--device cpu --tiny`, a check of the command) eight replies a pass, so that
    even the toy shape runs several."""
    if not device.startswith("cuda"):
        return 8 * (shape.prompt_tokens + shape.new_tokens), False
    from ..hardware import detect
    from ..sizing import build_settings

    build = build_settings(Config(), detect(), "cuda")  # sized on the first GPU, as a node is
    return build.microbatch_tokens, build.activation_checkpointing


def masked_attention_kernel(trainer: TorchLoraTrainer, samples: list[TrainSample]) -> str:
    """The first fused SDPA kernel that accepts a shared-prefix microbatch's mask here, tried one
    at a time with the others forbidden; the math fallback (slow, memory quadratic in the row)
    only if none does."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    mb = trainer._batches(samples)[0]
    for kernel in (SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION):
        try:
            with sdpa_kernel([kernel]), torch.no_grad():
                trainer._logprobs(mb)
            return f"{kernel.name.lower()} kernel"
        except RuntimeError:
            continue
    return "MATH FALLBACK (slow)"


def _score_seconds(replies: int) -> float:
    from ..learning.reward import score
    from ..learning.tasks import load_preset, regenerate

    preset = load_preset("starter")
    task = regenerate(preset.spec(preset.datasets[0], 0, 1, 1))
    start = time.perf_counter()
    for i in range(replies):
        score(task, f"<answer>{i}</answer>", 0.5)
    return time.perf_counter() - start


def _hf_generate(trainer, prompts, shape: Shape, device, steady_rounds) -> tuple[float, float]:
    model = trainer.model.get_base_model()  # with the LoRA layers, as ours samples
    ids = torch.tensor(prompts, device=device).repeat_interleave(shape.completions, dim=0)
    mask = torch.ones_like(ids)
    was = model.config.use_cache
    model.config.use_cache = True
    model.eval()

    def run():
        with torch.no_grad():
            return model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0,
                                  max_new_tokens=shape.new_tokens, min_new_tokens=shape.new_tokens,
                                  cache_implementation="static", pad_token_id=0)

    try:
        first, _ = _timed(run, device)
        steady = statistics.median(_timed(run, device)[0] for _ in range(steady_rounds))
    finally:
        model.config.use_cache = was
        model.train()
    return first, steady


def bench_gpu_arguments(p) -> None:
    p.add_argument("--device", default="cuda", help="cuda (default), or cpu with --tiny to check the command")
    p.add_argument("--tiny", action="store_true", help="a toy shape (for checking the command, not for timing)")
    p.add_argument("--rounds", type=positive, default=3, help="steady calls to take the median of (default 3)")


def bench_gpu_main(c: Invocation) -> int:
    return bench_gpu(c.args.device, c.args.tiny, c.args.rounds)
