"""The `gguf` format: the base model's GGUF as shipped, the adapter as a GGUF LoRA (the very file
the CPU backend hands its sampler), an Ollama Modelfile, and llama.cpp's command lines.

Kept as a pair rather than merged: a merged GGUF would have to be requantized (the base is Q4),
which changes the weights the node sampled from; the pair is what the node ran."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from ....backends.gguf_lora import peft_adapter_as_gguf
from ....backends.llama_cpp_engine import LlamaCppError
from ....backends.llama_cpp_generator import LlamaCppGenerator
from ...errors import NodeError
from ...learning.prompt import PromptFormat
from ...node.checkpoint_choice import TakenCheckpoint
from .llama_cpp_lines import EXAMPLE_QUESTION, command_lines
from .modelfile import modelfile

ADAPTER_FILE = "adapter.gguf"
MODELFILE = "Modelfile"


@dataclass(frozen=True)
class GgufExport:
    base_file: str
    chat_template: str | None

    def usage(self, form: PromptFormat, max_new_tokens: int, ollama_name: str) -> str:
        """Markdown for the model card: Ollama, then llama.cpp."""
        from ....backends.chat_template import render

        example = render(form.prompt(EXAMPLE_QUESTION), self.chat_template)
        return "\n".join([
            "With [Ollama](https://ollama.com) (the Modelfile asks as the node does: its system prompt, the "
            "pre-started `<answer>`, greedy decoding, stopping at `</answer>`):", "",
            "```bash", f"ollama create {ollama_name} -f {MODELFILE}", f"ollama run {ollama_name} {EXAMPLE_QUESTION!r}",
            "```", "",
            "With [llama.cpp](https://github.com/ggml-org/llama.cpp) (any recent build; the adapter is applied at "
            "load, the base stays as shipped):", "",
            command_lines(self.base_file, ADAPTER_FILE, example, form.system, max_new_tokens),
        ])


def write_gguf_files(folder: Path, taken: TakenCheckpoint, base_gguf: Path, form: PromptFormat, max_new_tokens: int,
                     heading: str) -> GgufExport:
    shutil.copyfile(base_gguf, folder / base_gguf.name)
    try:
        peft_adapter_as_gguf(taken.copy.path, base_gguf, folder / ADAPTER_FILE)
    except (ValueError, KeyError, OSError) as exc:
        raise NodeError(f"{taken.source}'s adapter cannot be written for llama.cpp ({exc}): try --format hf") from None
    chat_template = _check_pair(folder / base_gguf.name, folder / ADAPTER_FILE)
    (folder / MODELFILE).write_text(
        modelfile(base_gguf.name, ADAPTER_FILE, chat_template, form, max_new_tokens, heading), encoding="utf-8")
    return GgufExport(base_gguf.name, chat_template)


def _check_pair(base: Path, adapter: Path) -> str | None:
    """Load the written pair in llama.cpp (which checks every adapter tensor's shape against the
    base: an adapter of another model is refused here); returns the chat template it reads."""
    generator = LlamaCppGenerator(base, threads=1)
    try:
        generator.set_adapter(adapter)
        return generator.chat_template
    except LlamaCppError as exc:
        raise NodeError(f"llama.cpp refuses the exported adapter with its base ({exc}): the checkpoint does not "
                        "fit this model") from None
    finally:
        generator.close()
