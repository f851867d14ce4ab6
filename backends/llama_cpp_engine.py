"""llama.cpp's low-level API for one GGUF model: loading it, its tokens, a context (KV cache) sized
to the round and reused, LoRA adapters swapped without reloading the base, and decoding a batch.
The sampler on top of it is llama_cpp_generator.py."""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Sequence
from pathlib import Path

import llama_cpp as lc
import numpy as np

from .cpu_features import has_amx

_LOG_LOCK = threading.Lock()
_LOG_CALLBACK = None


def silence_llama_logs() -> None:
    """llama.cpp prints model-loading chatter to stderr; the node has its own logging."""
    global _LOG_CALLBACK
    with _LOG_LOCK:
        if _LOG_CALLBACK is None:
            _LOG_CALLBACK = lc.llama_log_callback(lambda level, text, user_data: None)
            lc.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))
            lc.llama_backend_init()


# KV_LAYOUT, measured (issue 38; 2-core EPYC, AVX2 only, 2 threads, llama-cpp-python 0.3.36; one
# real round's 64 replies replayed token for token under each layout, so the work is identical):
# a decode step costs about 45 ms + 4.8 ms per live reply with one buffer for every sequence
# (kv_unified): each token's attention runs over every sequence's cells and masks the others out,
# so its cost grows with the cache the round holds, not with its own reply. Flash attention skips
# masked cells (ggml's CPU kernel): 23 ms + 4.5 ms a live reply, the round's generation 0.82-0.91x
# (prefill 0.87-0.93x). One stream per sequence (kv_unified off) should attend only to its own
# cells, but in this build it costs 72-90 ms a step more (its per-stream views): 1.2-1.4x slower,
# not used. What flash attention changes: the same tokens' logprobs move by 0.06 nats a token
# (max 0.75; its CPU kernel accumulates in f16), but their distance to the fp32 trainer's is the
# same either way (mean 0.063 vs 0.064 nats, 6.0 vs 7.4 % of tokens outside a ratio of
# [0.8, 1.2]): the Q4_1 weights dominate that gap. The sampler's logprobs stay exact for the
# logits it samples from.


class LlamaCppError(RuntimeError):
    pass


def gguf_metadata(gguf_path: Path, *keys: str) -> dict[str, str]:
    """Some of a GGUF file's metadata, as llama.cpp prints it (numbers as text); absent keys are left
    out. llama.cpp reads the header and the vocabulary only (vocab_only), in ~0.3 s: gguf-py's
    reader parses every field in Python, the tokenizer's ~100,000 strings included, 7.5 s for the
    shipped SmolLM2 file on a 2-core Xeon, and each start of a CPU node asks (its file type)."""
    silence_llama_logs()
    params = lc.llama_model_default_params()
    params.n_gpu_layers = 0
    params.vocab_only = True
    model = lc.llama_model_load_from_file(str(gguf_path).encode(), params)
    if not model:
        raise LlamaCppError(f"llama.cpp could not read {gguf_path} (not a GGUF model, or unsupported)")
    try:
        return {key: value for key in keys if (value := _meta_value(model, key)) is not None}
    finally:
        lc.llama_model_free(model)


def _meta_value(model, key: str) -> str | None:
    """A loaded model's metadata value as text, however long (a chat template can pass 4 KB)."""
    buf = ctypes.create_string_buffer(256)
    n = lc.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    if n < 0:
        return None
    if n >= len(buf):  # truncated: n is the length it needs
        buf = ctypes.create_string_buffer(n + 1)
        lc.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode("utf-8", "replace")


class LlamaCppEngine:
    def __init__(self, gguf_path: Path, threads: int) -> None:
        silence_llama_logs()
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
        self._adapter_off = 0  # blocks of base_weights open: the base model alone while any is
        self._adapter_path: Path | None = None
        self._piece_cache: dict[int, bytes] = {}

    # ---- model facts -------------------------------------------------------------------------
    def meta(self, key: str) -> str | None:
        return _meta_value(self._model, key)

    @property
    def architecture(self) -> str:
        return self.meta("general.architecture") or "unknown"

    @property
    def model_bytes(self) -> int:
        return int(lc.llama_model_size(self._model))

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
        params.kv_unified = True  # see KV_LAYOUT above
        params.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_ENABLED
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
    @property
    def adapter_path(self) -> Path | None:
        """The LoRA adapter file loaded (applied outside `base_weights` blocks), or None."""
        return self._adapter_path

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

    @contextlib.contextmanager
    def base_weights(self):
        """Decode with the base model alone within this block: the adapter stays loaded and is
        applied again after (a context made meanwhile starts without it too)."""
        self._adapter_off += 1
        try:
            self._apply_adapter()
            yield
        finally:
            self._adapter_off -= 1
            self._apply_adapter()

    def _apply_adapter(self) -> None:
        if self._ctx is None:
            return
        if self._adapter is None or self._adapter_off:
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
