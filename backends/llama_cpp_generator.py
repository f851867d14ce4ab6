"""Batched sampling with per-token logprobs on llama.cpp's low-level API, with LoRA hot-swap.

Why the low-level API: the high-level `Llama` object samples one sequence at a time and its
`logprobs=` option needs `logits_all=True` (≈ 9 tok/s here). Instead all completions of a round
share one context (`kv_unified`, one sequence id each): every prompt is decoded once and its KV
cells are shared with its G completions by `llama_memory_seq_cp`, then each step decodes one
token for every live sequence in a single `llama_decode`. Sampling happens in numpy on the whole
(live sequences × vocab) logits matrix, which gives the exact logprob of each sampled token
for the cost of one softmax per row.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import llama_cpp as lc
import numpy as np

from .base import Completion, GenerationProfile, GenerationResult, ProgressCallback, SamplingParams, StopCheck
from .completion import check_sampling, generation_result
from .cpu_features import has_amx
from .sequence_end import SequenceEnd

_LOG_LOCK = threading.Lock()
_LOG_CALLBACK = None


def _silence_llama_logs() -> None:
    """llama.cpp prints model-loading chatter to stderr; the node has its own logging."""
    global _LOG_CALLBACK
    with _LOG_LOCK:
        if _LOG_CALLBACK is None:
            _LOG_CALLBACK = lc.llama_log_callback(lambda level, text, user_data: None)
            lc.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))
            lc.llama_backend_init()


class LlamaCppError(RuntimeError):
    pass


@dataclass
class _Seq:
    prompt_index: int
    end: SequenceEnd[bytes]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


class LlamaCppGenerator:
    def __init__(self, gguf_path: Path, threads: int) -> None:
        _silence_llama_logs()
        self.path = Path(gguf_path)
        self.threads = max(1, int(threads))
        params = lc.llama_model_default_params()
        params.n_gpu_layers = 0
        # llama.cpp's extra weight layouts include AMX tiles on CPUs that have them; in this build
        # (llama-cpp-python 0.3.36) the first llama_decode through them segfaults (measured on a
        # Xeon with AMX, any batch size). Elsewhere they stay on (repacked Q4_0/Q4_K on AVX2).
        params.use_extra_bufts = not has_amx()
        self._model = lc.llama_model_load_from_file(str(self.path).encode(), params)
        if not self._model:
            raise LlamaCppError(f"llama.cpp could not load {self.path} (not a GGUF model, or unsupported)")
        self._vocab = lc.llama_model_get_vocab(self._model)
        self.n_vocab = lc.llama_vocab_n_tokens(self._vocab)
        template = lc.llama_model_chat_template(self._model, None)
        self.chat_template = template.decode("utf-8") if template else None
        self.add_bos = bool(lc.llama_vocab_get_add_bos(self._vocab))
        self._ctx = None
        self._ctx_cells = 0
        self._ctx_seqs = 0
        self._ctx_batch = 0
        self._adapter = None
        self._adapter_path: Path | None = None
        self._piece_cache: dict[int, bytes] = {}
        self.last_profile = GenerationProfile()

    # ---- model facts -------------------------------------------------------------------------
    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = lc.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    @property
    def architecture(self) -> str:
        return self.meta("general.architecture") or "unknown"

    @property
    def model_bytes(self) -> int:
        return int(lc.llama_model_size(self._model))

    def token_text(self, token: int) -> str:
        return self._piece(token, special=True).decode("utf-8", "replace")

    # ---- tokens ------------------------------------------------------------------------------
    def tokenize(self, text: str, *, add_bos: bool = False, parse_special: bool = False) -> list[int]:
        raw = text.encode("utf-8")
        cap = len(raw) + 8
        out = (lc.llama_token * cap)()
        n = lc.llama_tokenize(self._vocab, raw, len(raw), out, cap, add_bos, parse_special)
        if n < 0:  # buffer too small: -n is the size needed
            cap = -n
            out = (lc.llama_token * cap)()
            n = lc.llama_tokenize(self._vocab, raw, len(raw), out, cap, add_bos, parse_special)
        return list(out[:n])

    def tokenize_prompt(self, rendered: str) -> list[int]:
        """A rendered chat prompt: its special tokens are real tokens, BOS as the model wants."""
        return self.tokenize(rendered, add_bos=self.add_bos, parse_special=True)

    def _piece(self, token: int, special: bool = False) -> bytes:
        key = token if not special else -token - 1
        cached = self._piece_cache.get(key)
        if cached is None:
            buf = ctypes.create_string_buffer(256)
            n = lc.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
            cached = buf.raw[: max(n, 0)]
            self._piece_cache[key] = cached
        return cached

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self._piece(t) for t in tokens).decode("utf-8", "replace")

    def is_end_of_generation(self, token: int) -> bool:
        return bool(lc.llama_vocab_is_eog(self._vocab, token))

    # ---- context -----------------------------------------------------------------------------
    def _ensure_context(self, cells: int, seqs: int, batch: int) -> None:
        if self._ctx is not None and cells <= self._ctx_cells and seqs <= self._ctx_seqs and batch <= self._ctx_batch:
            lc.llama_memory_clear(lc.llama_get_memory(self._ctx), True)
            return
        self.release_context()
        params = lc.llama_context_default_params()
        # Round sizes up so that slightly bigger rounds reuse the context.
        params.n_ctx = max(512, -(-cells // 256) * 256)
        params.n_batch = max(64, batch)
        params.n_ubatch = min(512, params.n_batch)
        params.n_seq_max = max(1, seqs)
        params.kv_unified = True
        params.n_threads = self.threads
        params.n_threads_batch = self.threads
        params.no_perf = True
        ctx = lc.llama_init_from_model(self._model, params)
        if not ctx:
            raise LlamaCppError(
                f"llama.cpp could not create a context for {seqs} sequences / {cells} tokens: "
                "lower round.questions, round.completions or round.max_new_tokens"
            )
        self._ctx, self._ctx_cells, self._ctx_seqs, self._ctx_batch = ctx, params.n_ctx, params.n_seq_max, params.n_batch
        self._apply_adapter()

    def release_context(self) -> None:
        """Free the context and its KV cache (~0.2 GB for a default round); the next call that
        decodes creates one again (~0.1 s: llama.cpp zeroes the cache as it allocates it)."""
        if self._ctx is not None:
            lc.llama_free(self._ctx)
            self._ctx = None

    # ---- LoRA hot-swap -----------------------------------------------------------------------
    def set_adapter(self, path: Path | None) -> None:
        """Swap the LoRA adapter without reloading the base weights (None removes it)."""
        new = None
        if path is not None:
            new = lc.llama_adapter_lora_init(self._model, str(path).encode())
            if not new:
                raise LlamaCppError(f"llama.cpp rejected the LoRA adapter {path}")
        old, self._adapter, self._adapter_path = self._adapter, new, path
        self._apply_adapter()
        if old is not None:
            lc.llama_adapter_lora_free(old)

    def _apply_adapter(self) -> None:
        if self._ctx is None:
            return
        if self._adapter is None:
            rc = lc.llama_set_adapters_lora(self._ctx, None, 0, None)
        else:
            adapters = (lc.llama_adapter_lora_p_ctypes * 1)(self._adapter)
            scales = (ctypes.c_float * 1)(1.0)  # llama.cpp multiplies by alpha/r itself, as peft does
            rc = lc.llama_set_adapters_lora(self._ctx, adapters, 1, scales)
        if rc != 0:
            raise LlamaCppError(f"llama_set_adapters_lora failed ({rc})")
        lc.llama_memory_clear(lc.llama_get_memory(self._ctx), True)

    # ---- decoding ----------------------------------------------------------------------------
    def _decode(self, batch, entries: list[tuple[int, int, int, bool]]) -> None:
        """entries: (token, pos, seq_id, want_logits)."""
        batch.n_tokens = len(entries)
        for i, (tok, pos, seq, want) in enumerate(entries):
            batch.token[i] = tok
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = 1 if want else 0
        rc = lc.llama_decode(self._ctx, batch)
        if rc != 0:
            raise LlamaCppError(f"llama_decode failed ({rc}): the context is too small for this round")

    def _logits(self, rows: int) -> np.ndarray:
        ptr = lc.llama_get_logits(self._ctx)
        return np.ctypeslib.as_array(ptr, shape=(rows, self.n_vocab))

    def prompt_logits(self, token_ids: Sequence[int]) -> np.ndarray:
        """Logits at every position of one token sequence (for tests and diagnostics)."""
        n = len(token_ids)
        self._ensure_context(n + 8, 1, n)
        batch = lc.llama_batch_init(n, 0, 1)
        try:
            self._decode(batch, [(t, i, 0, True) for i, t in enumerate(token_ids)])
            return self._logits(n).copy()
        finally:
            lc.llama_batch_free(batch)
            lc.llama_memory_clear(lc.llama_get_memory(self._ctx), True)

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        n: int,
        params: SamplingParams,
        should_stop: StopCheck | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> GenerationResult:
        check_sampling(params)
        start = time.perf_counter()
        rng = np.random.default_rng(params.seed)
        n_prompts = len(prompt_ids)
        n_seqs = n_prompts * n
        prompt_tokens = sum(len(p) for p in prompt_ids)
        cells = prompt_tokens + n_seqs * (params.max_new_tokens + 1) + 16
        max_prompt = max(len(p) for p in prompt_ids)
        batch_cap = max(n_seqs, max_prompt)
        self._ensure_context(cells, n_seqs, batch_cap)
        memory = lc.llama_get_memory(self._ctx)
        # Byte pieces: a stop string is found even when its token splits a UTF-8 character.
        stops = [s.encode("utf-8") for s in params.stop]
        seqs = [
            _Seq(i // n, SequenceEnd(params.max_new_tokens, stops, self.is_end_of_generation, self._piece))
            for i in range(n_seqs)
        ]
        batch = lc.llama_batch_init(batch_cap, 0, 1)
        try:
            # Prefill: each prompt once, as the sequence of its first completion; its KV cells are
            # then shared with the prompt's other completions.
            logits_by_prompt: dict[int, np.ndarray] = {}

            def keep_rows(which: list[int], _positions: list[int]) -> None:
                logits = self._logits(len(which))
                for row, p in enumerate(which):
                    logits_by_prompt[p] = logits[row].copy()

            profile = GenerationProfile()
            tick = time.perf_counter()
            profile.prefill_tokens = self._prefill_prompts(batch, batch_cap, prompt_ids, n, keep_rows)
            profile.prefill_s = time.perf_counter() - tick

            # First token of every completion comes from its prompt's last-position logits.
            live = list(range(n_seqs))
            generated = 0
            rows = np.stack([logits_by_prompt[s.prompt_index] for s in seqs])
            while live:
                if should_stop is not None and should_stop():
                    for i in live:
                        seqs[i].end.abandon()
                    break
                tokens, logprobs = _sample(rows, params.temperature, rng)
                still: list[int] = []
                for row, i in enumerate(live):
                    s = seqs[i]
                    tok = int(tokens[row])
                    s.token_ids.append(tok)
                    s.logprobs.append(float(logprobs[row]))
                    if not s.end.add(tok):
                        still.append(i)
                generated += len(live)
                live = still
                if on_progress is not None:
                    on_progress(n_seqs - len(live), n_seqs, generated)
                if not live:
                    break
                entries = [
                    (seqs[i].token_ids[-1], len(prompt_ids[seqs[i].prompt_index]) + len(seqs[i].token_ids) - 1, i, True)
                    for i in live
                ]
                tick = time.perf_counter()
                self._decode(batch, entries)
                profile.decode_s += time.perf_counter() - tick
                profile.live_per_step.append(len(live))
                rows = self._logits(len(live))
        finally:
            lc.llama_batch_free(batch)
            lc.llama_memory_clear(memory, True)
        profile.total_s = time.perf_counter() - start
        self.last_profile = profile

        completions = [Completion(self._visible_text(s), s.token_ids, s.logprobs, s.end.finish_reason) for s in seqs]
        return generation_result(prompt_ids, n, completions, start)

    def _visible_text(self, s: _Seq) -> str:
        """The completion's text: its end-of-generation token, when it has one, writes none."""
        return self.detokenize(s.token_ids[:-1] if s.end.reason == "eos" else s.token_ids)

    def _prefill_prompts(self, batch, batch_cap: int, prompt_ids, n: int, on_decoded) -> int:
        """Decode every prompt once into sequence p * n and share its KV cells with its other n - 1
        sequences. The prompts' common prefix (the chat template's system turn: about half of a
        short task's prompt) is decoded once and shared with every prompt before their own tokens
        are decoded, several prompts per llama_decode while they fit in the batch;
        `on_decoded(prompt indices, batch positions of their last tokens)` is called after each
        decode (logits rows are in that order). Returns the number of tokens decoded."""
        memory = lc.llama_get_memory(self._ctx)
        shared = common_prefix_length(prompt_ids) if len(prompt_ids) > 1 else 0
        for start in range(0, shared, batch_cap):
            prefix = prompt_ids[0][start: min(shared, start + batch_cap)]
            self._decode(batch, [(t, start + i, 0, False) for i, t in enumerate(prefix)])
        for p in range(1, len(prompt_ids) if shared else 0):
            lc.llama_memory_seq_cp(memory, 0, p * n, -1, -1)

        def flush(which: list[int]) -> None:
            entries, last_positions = [], []
            for p in which:
                ids = prompt_ids[p]
                entries.extend((ids[pos], pos, p * n, pos == len(ids) - 1) for pos in range(shared, len(ids)))
                last_positions.append(len(entries) - 1)
            self._decode(batch, entries)
            on_decoded(which, last_positions)

        pending: list[int] = []
        used = 0
        for p, ids in enumerate(prompt_ids):
            if used + len(ids) - shared > batch_cap and pending:
                flush(pending)
                pending, used = [], 0
            pending.append(p)
            used += len(ids) - shared
        if pending:
            flush(pending)
        for p in range(len(prompt_ids)):
            for g in range(1, n):
                lc.llama_memory_seq_cp(memory, p * n, p * n + g, -1, -1)
        return shared + sum(len(ids) - shared for ids in prompt_ids)

    def reference_decode(
        self, prompt_ids: Sequence[Sequence[int]], n: int, lengths: Sequence[Sequence[int]], temperature: float, seed: int = 0
    ) -> tuple[int, float]:
        """Raw llama.cpp throughput for the benchmark: the same prompts, `n` sequences each, decoding
        exactly `lengths[p][g]` tokens per sequence with llama.cpp's own C sampler (temperature +
        dist), no logprobs, no Python-side sampling. Returns (tokens, seconds)."""
        n_seqs = len(prompt_ids) * n
        cells = sum(len(p) for p in prompt_ids) + sum(sum(ls) for ls in lengths) + n_seqs + 16
        batch_cap = max(n_seqs, max(len(p) for p in prompt_ids))
        self._ensure_context(cells, n_seqs, batch_cap)
        memory = lc.llama_get_memory(self._ctx)
        chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_temp(temperature))
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_dist(seed))
        batch = lc.llama_batch_init(batch_cap, 0, 1)
        start = time.perf_counter()
        tokens = 0
        try:
            first_token: dict[int, int] = {}

            def sample_first(which: list[int], positions: list[int]) -> None:
                for p, position in zip(which, positions):  # llama.cpp indexes logits by batch position
                    for g in range(n):
                        first_token[p * n + g] = lc.llama_sampler_sample(chain, self._ctx, position)

            self._prefill_prompts(batch, batch_cap, prompt_ids, n, sample_first)
            remaining = {i: lengths[i // n][i % n] for i in range(n_seqs)}
            last = dict(first_token)
            made = {i: 1 for i in range(n_seqs)}
            tokens = n_seqs
            while True:
                live = [i for i in range(n_seqs) if made[i] < remaining[i]]
                if not live:
                    break
                entries = [(last[i], len(prompt_ids[i // n]) + made[i] - 1, i, True) for i in live]
                self._decode(batch, entries)
                for row, i in enumerate(live):
                    last[i] = lc.llama_sampler_sample(chain, self._ctx, row)
                    made[i] += 1
                    tokens += 1
        finally:
            lc.llama_batch_free(batch)
            lc.llama_sampler_free(chain)
            lc.llama_memory_clear(memory, True)
        return tokens, time.perf_counter() - start

    def close(self) -> None:
        self.release_context()
        if self._adapter is not None:
            lc.llama_adapter_lora_free(self._adapter)
            self._adapter = None
        if self._model is not None:
            lc.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:  # best effort; close() is the real API
        try:
            self.close()
        except Exception:
            pass


def common_prefix_length(prompt_ids: Sequence[Sequence[int]]) -> int:
    """Tokens every prompt starts with, leaving each at least its last token to decode (whose
    logits give the prompt's first reply token)."""
    shortest = min(len(p) for p in prompt_ids)
    length = 0
    while length < shortest - 1 and all(p[length] == prompt_ids[0][length] for p in prompt_ids):
        length += 1
    return length


def _sample(logits: np.ndarray, temperature: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Sample one token per row from softmax(logits / T); return tokens and their logprobs."""
    x = logits.astype(np.float32, copy=True)
    x /= temperature
    peak = x.max(axis=1, keepdims=True)
    x -= peak
    np.exp(x, out=x)
    cdf = np.cumsum(x, axis=1)
    total = cdf[:, -1]
    u = rng.random(len(total)) * total
    tokens = np.array([np.searchsorted(cdf[r], u[r], side="right") for r in range(len(total))])
    tokens = np.minimum(tokens, logits.shape[1] - 1)
    picked = logits[np.arange(len(tokens)), tokens].astype(np.float64) / temperature
    logprobs = picked - peak[:, 0].astype(np.float64) - np.log(total.astype(np.float64))
    return tokens, logprobs
