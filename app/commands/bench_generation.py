"""`swarmling bench`'s generation figures: the last round's prompts and reply lengths decoded again
by the sampler's raw engine (llama.cpp's C sampler, no logprobs), the node's throughput against
it; where the sampler runs a copy of the model's file, the copy against the file as shipped; and
where the last round's generation spent its time."""

from __future__ import annotations

import contextlib
import statistics
from pathlib import Path

from ..node.loop import Node
from ...backends.base import GenerationProfile, ReferenceDecoder

DECODE_SEED = 11
COMPARISON_REPEATS = 3  # each of the four decodes of the copy's comparison, alternated: the median of each


def generation_report(node: Node, outcome, settings) -> str | None:
    """The generation lines for the last round's `outcome`; None where the backend has no
    reference decoder."""
    reference = node.backend.reference_decoder()
    if reference is None or outcome is None:
        return None
    groups = outcome.groups
    prompt_ids = [g.prompt_ids for g in groups]
    lengths = [[len(c.token_ids) for c in g.completions] for g in groups]
    ref_tokens, ref_seconds = _decode(reference, prompt_ids, lengths, settings)
    ref_tps = ref_tokens / ref_seconds
    round_tps = outcome.record.tokens_per_s
    lines = ["\ngeneration throughput (same prompts, same completion lengths, prefill included)",
             f"  raw llama.cpp, C sampler, no logprobs   {ref_tps:7.1f} tok/s ({ref_tokens} tokens in {ref_seconds:.2f} s)",
             f"  swarmling round (last round)            {round_tps:7.1f} tok/s  ratio {round_tps / ref_tps:.2f}  (target >= 0.90)"]
    shipped = node.model.gguf if node.model is not None else None
    if shipped is not None and reference.path != shipped:  # the sampler runs a copy (backend.sampler_weights)
        lines.append(copy_against_shipped(node, reference, shipped, prompt_ids, lengths, settings))
    if reference.last_profile.total_s > 0:  # the last round's generation
        lines.append(generation_profile(reference.last_profile))
    return "\n".join(lines)


def _decode(decoder: ReferenceDecoder, prompt_ids, lengths, settings) -> tuple[int, float]:
    """(tokens, seconds) of `decoder` decoding exactly `lengths` for `prompt_ids`."""
    return decoder.reference_decode(prompt_ids, settings.completions, lengths, settings.temperature, DECODE_SEED)


def copy_against_shipped(node: Node, reference: ReferenceDecoder, shipped: Path, prompt_ids, lengths, settings) -> str:
    """The sampler's copy against the file as shipped, on the same prompts and lengths, both warm,
    without the adapter and with the one the sampler holds (an adapter of the node's shape: what
    it costs llama.cpp does not depend on its values). The four decodes alternate, repeated, so
    that no file is always the one timed first or after the other."""
    from ...backends.llama_cpp_generator import LlamaCppError, LlamaCppGenerator

    adapter = reference.adapter_path
    as_shipped = LlamaCppGenerator(shipped, node.sizing.build.threads)
    times: dict[str, list[float]] = {"copy": [], "shipped": [], "copy+adapter": [], "shipped+adapter": []}
    note = ""

    def seconds(decoder) -> float:
        return _decode(decoder, prompt_ids, lengths, settings)[1]

    try:
        as_shipped.reference_decode(prompt_ids[:1], 1, [[2]], settings.temperature, DECODE_SEED)  # pages its weights in
        for _ in range(COMPARISON_REPEATS):
            with node.backend.base_sampling() or contextlib.nullcontext():
                times["copy"].append(seconds(reference))
            as_shipped.set_adapter(None)
            times["shipped"].append(seconds(as_shipped))
            if adapter is None or note:
                continue
            times["copy+adapter"].append(seconds(reference))
            try:
                as_shipped.set_adapter(adapter)
            except LlamaCppError as exc:
                note = f"  (the file as shipped refused the adapter: {exc})"
                continue
            times["shipped+adapter"].append(seconds(as_shipped))
    finally:
        as_shipped.close()
    tokens = sum(map(sum, lengths))
    median = {k: statistics.median(v) for k, v in times.items() if v}
    lines = [f"  raw llama.cpp on the file as shipped      {tokens / median['shipped']:7.1f} tok/s: the sampler's copy "
             f"({reference.path.name}) decodes in {median['copy'] / median['shipped']:.2f}x its time "
             f"(both without the adapter; medians of {COMPARISON_REPEATS}, alternated)"]
    if "shipped+adapter" in median:
        lines.append(f"  ... both with the sampler's adapter       {tokens / median['shipped+adapter']:7.1f} tok/s on the "
                     f"file as shipped: the copy in {median['copy+adapter'] / median['shipped+adapter']:.2f}x its time "
                     f"(the adapter adds {median['copy+adapter'] / median['copy'] - 1:+.0%} to the copy, "
                     f"{median['shipped+adapter'] / median['shipped'] - 1:+.0%} to the file as shipped)")
    return "\n".join(lines) + (f"\n{note}" if note else "")


def generation_profile(p: GenerationProfile) -> str:
    """The last round's generation phase: llama.cpp's prefill and decode steps, and the Python
    around them (sampling, logprobs, end checks, batch building)."""
    steps = p.live_per_step
    tokens = sum(steps)
    lines = [f"  the last round's generation, {p.total_s:.2f} s:",
             f"    prefill  {p.prefill_s:6.2f} s  {p.prefill_tokens} prompt tokens ({p.prefill_tokens / max(p.prefill_s, 1e-9):.0f} tok/s; the common prefix once)",
             f"    decode   {p.decode_s:6.2f} s  {len(steps)} steps, {tokens} tokens, "
             f"{p.decode_s / max(len(steps), 1) * 1e3:.1f} ms a step"]
    if steps:
        half = steps[len(steps) // 2]
        lines.append(f"             live sequences per step: {steps[0]} at the first, {half} halfway, {steps[-1]} at the last "
                     f"(mean {tokens / len(steps):.1f}: the longest reply holds the batch open)")
    cost = step_cost(p)
    if cost is not None:
        fixed_ms, per_reply_ms, tail_s = cost
        lines.append(f"             a step costs {fixed_ms:.1f} ms + {per_reply_ms:.2f} ms a live reply (least squares over the steps); "
                     f"steps with 4 or fewer live took {tail_s:.2f} s")
    lines.append(f"    Python   {p.python_s:6.2f} s  ({p.python_s / p.total_s:.0%}: sampling, logprobs, end checks, batches)")
    return "\n".join(lines)


def step_cost(p: GenerationProfile) -> tuple[float, float, float] | None:
    """(fixed ms, ms per live reply, seconds of the steps with 4 or fewer live) from the decode
    steps' own times: does a step's cost follow the replies still being written, or the cache the
    batch holds (a large fixed part)? None with fewer than 3 distinct live counts to fit."""
    live, seconds = p.live_per_step, p.seconds_per_step
    if len(set(live)) < 3 or len(seconds) != len(live):
        return None
    per_reply, fixed = statistics.linear_regression(live, [t * 1e3 for t in seconds])
    return fixed, per_reply, sum(t for n, t in zip(live, seconds) if n <= 4)
