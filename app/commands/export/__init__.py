"""`swarmling export`: the model a node grew, in the formats the volunteer's tools read.

    gguf_folder        base GGUF + the adapter as a GGUF LoRA + Modelfile (modelfile) + llama.cpp
                       lines (llama_cpp_lines)
    hf_folder          the adapter merged into the base, a transformers folder
    model_card         README.md: base, licence, rounds, held-out curve, peers' share, usage

Which checkpoint, copied and verified beside a running node: app/node/checkpoint_choice.py (`ask`
reads checkpoints the same way). The folder is filled under a temporary name beside `--out` and
renamed into place at the end, so an export that fails or is interrupted leaves nothing that
looks like a model.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

from ....backends.atomic import atomic_folder
from ....backends.llama_cpp_engine import gguf_metadata
from ...config import Config
from ...errors import NodeError
from ...learning.prompt import PromptFormat
from ...learning.tasks import load_preset
from ...models import SHIPPED, ResolvedModel, resolve_model
from ...paths import Paths
from ...sizing import reply_tokens
from ..arguments import Invocation, add_checkpoint_choice, add_config_flags
from ...node.checkpoint_choice import take_checkpoint
from .gguf_folder import write_gguf_files
from .hf_folder import write_hf_files
from .model_card import CardFacts, model_card, provenance

FORMATS = ("gguf", "hf")
SNAPSHOT = ".checkpoint"  # the verified copy, inside the temporary folder while it is being filled


def export_command(config: Config, paths: Paths, out: Path, checkpoint: Path | None = None, best: bool = False,
                   fmt: str | None = None) -> int:
    started = time.perf_counter()
    model = resolve_model(config.model.name, paths.cache_dir)
    fmt = fmt or ("gguf" if model.gguf is not None else "hf")
    if fmt == "gguf" and model.gguf is None:
        raise NodeError(f"model {model.name} has no GGUF base ({model.source}): export it with --format hf")
    out = Path(out).expanduser().resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise NodeError(f"{out} already exists and is not an empty folder: name a new one")
    form = PromptFormat(config.reward.prefill_answer)
    max_new = reply_tokens(config, load_preset(config.round.preset))
    with atomic_folder(out, fsync=True, prefix=f".{out.name}.export-") as folder:
        _as_if_made_by_mkdir(folder)
        taken = take_checkpoint(paths.checkpoints, checkpoint, best, model.name, folder / SNAPSHOT)
        heading = f"{model.name} after {taken.round} swarmling rounds"
        if fmt == "gguf":
            usage = write_gguf_files(folder, taken, model.gguf, form, max_new, heading).usage(
                form, max_new, _ollama_name(model.name, taken.round))
        else:
            write_hf_files(folder, taken, _hf_base(model, paths), _chat_template(model), max_new)
            usage = _hf_usage(out, form, max_new)
        facts = CardFacts(model.name, _description(model), _licence(model), taken, fmt, form, usage)
        (folder / "README.md").write_text(model_card(facts), encoding="utf-8")
        shutil.rmtree(folder / SNAPSHOT)
        files = {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file()}
        (folder / "swarmling-export.json").write_text(provenance(facts, files), encoding="utf-8")
    size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    print(f"swarmling: exported round {taken.round} of {model.name} ({fmt}) to {out}: "
          f"{size / 1e6:.0f} MB in {time.perf_counter() - started:.1f} s; README.md there says how to use it")
    return 0


def _as_if_made_by_mkdir(folder: Path) -> None:
    """The temporary folder is private (mkdtemp's 0700); the export is the user's, readable as any folder they make."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)


def _ollama_name(model_name: str, round_no: int) -> str:
    return re.sub(r"[^a-z0-9._-]+", "-", f"{model_name}-swarmling-r{round_no}".lower())


def _hf_base(model: ResolvedModel, paths: Paths) -> Path:
    """The trainer's base: the GGUF's converted folder (made once, cached), or the HF folder."""
    if model.hf_dir is not None:
        return model.hf_dir
    from ....backends.hf_from_gguf import converted_folder

    return converted_folder(model.gguf, paths.cache_dir)


def _chat_template(model: ResolvedModel) -> str | None:
    if model.gguf is None:
        return None  # an HF folder's tokenizer carries its own
    return gguf_metadata(model.gguf, "tokenizer.chat_template").get("tokenizer.chat_template")


def _licence(model: ResolvedModel) -> str | None:
    if model.gguf is not None:
        return gguf_metadata(model.gguf, "general.license").get("general.license")
    return None


def _description(model: ResolvedModel) -> str:
    return SHIPPED[model.name].description if model.name in SHIPPED else model.source


def _hf_usage(out: Path, form: PromptFormat, max_new_tokens: int) -> str:
    return "\n".join([
        "With transformers (the folder is a plain model: no peft, no swarmling):", "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        f"model = AutoModelForCausalLM.from_pretrained({str(out)!r})",
        f"tokenizer = AutoTokenizer.from_pretrained({str(out)!r})",
        f"messages = [{{'role': 'system', 'content': {form.system!r}}},",
        "            {'role': 'user', 'content': 'What is 17 + 25?'}]",
        "prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)"
        + (f" + {form.prefill!r}" if form.prefill else ""),
        "ids = tokenizer(prompt, return_tensors='pt', add_special_tokens=False).input_ids",
        f"reply = model.generate(ids, max_new_tokens={max_new_tokens}, do_sample=False, "
        f"stop_strings=['</answer>'], tokenizer=tokenizer)",
        "print(tokenizer.decode(reply[0, ids.shape[1]:], skip_special_tokens=True))",
        "```",
    ])


def export_arguments(p) -> None:
    add_checkpoint_choice(p)
    p.add_argument("--format", dest="fmt", choices=("gguf", "hf"),
                   help="gguf: base GGUF + adapter GGUF + Modelfile, for llama.cpp and Ollama (the default where the "
                        "base is a GGUF); hf: merged safetensors for transformers")
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="a new (or empty) folder to write")
    add_config_flags(p)


def export_main(c: Invocation) -> int:
    return export_command(c.config, c.paths, c.args.out, c.args.checkpoint, c.args.best, c.args.fmt)
