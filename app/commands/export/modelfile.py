"""An Ollama Modelfile that asks the exported model exactly as the node does.

The TEMPLATE is not written by hand: the model's own chat template (the one the node renders
every prompt with, backends/chat_template.py) is rendered once with markers for the system
prompt and the question, then the markers become Ollama's `{{ .System }}` and `{{ .Prompt }}`.
So the prompt Ollama builds is, text for text, the node's prompt, the pre-started `<answer>` at
its end included; the reply Ollama prints is what follows it, up to the closing tag (a stop).
"""

from __future__ import annotations

from ....backends.base import ChatPrompt
from ....backends.chat_template import render
from ...learning.prompt import STOP, PromptFormat

_SYSTEM_MARK, _PROMPT_MARK = "\x00system\x00", "\x00prompt\x00"


class TemplateError(ValueError):
    pass


def ollama_template(chat_template: str | None, prefill: str) -> str:
    """The node's prompt as a Go template over `.System` and `.Prompt`."""
    text = render(ChatPrompt(_SYSTEM_MARK, _PROMPT_MARK, prefill), chat_template)
    if text.count(_SYSTEM_MARK) != 1 or text.count(_PROMPT_MARK) != 1:
        raise TemplateError("the model's chat template changes the system prompt or the question as it renders "
                            "them: no Ollama template can reproduce it")
    # In a Go template only "{{" starts an action: any the chat template writes stays literal text.
    literal = text.replace("{{", '{{ "{{" }}')
    return literal.replace(_SYSTEM_MARK, "{{ .System }}").replace(_PROMPT_MARK, "{{ .Prompt }}")


def _triple_quoted(text: str) -> str:
    if '"""' in text:
        raise TemplateError('a Modelfile string cannot hold """')
    return f'"""{text}"""'


def modelfile(base_file: str, adapter_file: str, chat_template: str | None, form: PromptFormat, max_new_tokens: int,
              heading: str) -> str:
    """The Modelfile's text: FROM the base GGUF, ADAPTER the LoRA, the node's prompt and its
    decoding (greedy, where the evaluation decodes at temperature 0.01 only because its sampler
    needs a distribution; no repeat penalty, which Ollama would otherwise add)."""
    lines = [
        f"# {heading}",
        f"FROM ./{base_file}",
        f"ADAPTER ./{adapter_file}",
        f"TEMPLATE {_triple_quoted(ollama_template(chat_template, form.prefill))}",
        f"SYSTEM {_triple_quoted(form.system)}",
        *(f'PARAMETER stop "{stop}"' for stop in STOP),
        "PARAMETER temperature 0",
        "PARAMETER repeat_penalty 1",
        f"PARAMETER num_predict {max_new_tokens}",
    ]
    return "\n".join(lines) + "\n"
