"""Turn a GGUF file into a Hugging Face (fp32 safetensors) folder once, and cache it.

transformers can dequantize a GGUF into a torch model, so the file llama.cpp samples from is the
very file the trainer learns on. Doing it costs about a minute on a small CPU, so the result is
saved once under the cache dir (keyed by the GGUF's size, mtime and a hash of its head) and later
loads take about a second. `save_pretrained` refuses GGUF-loaded models ("quantized with gguf and
is not serializable"); detaching the quantizer first is the documented-by-practice workaround.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
from pathlib import Path

from .atomic import atomic_folder, made_once

log = logging.getLogger(__name__)

MARKER = "swarmling-conversion.json"


def gguf_fingerprint(gguf: Path) -> str:
    st = gguf.stat()
    h = hashlib.sha256(f"{gguf.name}:{st.st_size}".encode())
    with gguf.open("rb") as f:  # the header + metadata + first tensors: enough to tell files apart
        h.update(f.read(4 << 20))
        f.seek(max(0, st.st_size - (4 << 20)))
        h.update(f.read(4 << 20))
    return h.hexdigest()[:16]


def _target(gguf: Path, cache_dir: Path) -> Path:
    return cache_dir / "hf-models" / f"{gguf.stem}-{gguf_fingerprint(gguf)}"


def is_converted(gguf: Path, cache_dir: Path) -> bool:
    """Whether `converted_folder` will find the folder made already (or convert first)."""
    return (_target(Path(gguf).resolve(), cache_dir) / MARKER).is_file()


def converted_folder(gguf: Path, cache_dir: Path) -> Path:
    """The cached HF folder for `gguf`, converting it first if needed (atomic: temp dir + rename;
    one process at a time)."""
    gguf = Path(gguf).resolve()
    target = _target(gguf, cache_dir)

    def convert() -> None:
        log.info("converting %s to a torch checkpoint (once; about a minute on a small CPU)", gguf.name)
        # A folder already at `target` is a half-written one from a crash (no marker): it is replaced.
        with atomic_folder(target, fsync=False, prefix=".convert-") as tmp:
            _convert(gguf, tmp)
            (tmp / MARKER).write_text(json.dumps({"source": str(gguf), "fingerprint": gguf_fingerprint(gguf)}))

    made_once(target, (target / MARKER).is_file, convert)
    return target


def _convert(gguf: Path, out: Path) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything comes from the GGUF file
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    # transformers' GGUF loader draws a plain tqdm bar (not switchable at run time): keep it off
    # the node's terminal; failures still raise.
    with contextlib.redirect_stderr(io.StringIO()):
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
