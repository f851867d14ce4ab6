"""Render a ChatPrompt with the model's own Jinja chat template (read from the GGUF).

Every backend renders prompts here, so the same conversation becomes the same text whichever
framework samples or trains on it. The template is model data, so it runs in Jinja's sandbox.
"""

from __future__ import annotations

from functools import lru_cache

from jinja2.sandbox import ImmutableSandboxedEnvironment

from .base import ChatPrompt

# For models whose GGUF carries no template (e.g. Gemma 3 270M base): a plain, readable format.
PLAIN_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ m['content'] }}\n\n"
    "{% elif m['role'] == 'user' %}Question: {{ m['content'] }}\n"
    "{% else %}Answer: {{ m['content'] }}\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}Answer: {% endif %}"
)


@lru_cache(maxsize=8)
def _compile(template: str):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(message: str):  # used by many HF templates
        raise ValueError(message)

    env.globals["raise_exception"] = raise_exception
    return env.from_string(template)


def render(prompt: ChatPrompt, template: str | None, bos_token: str = "", eos_token: str = "") -> str:
    messages = []
    if prompt.system:
        messages.append({"role": "system", "content": prompt.system})
    messages.append({"role": "user", "content": prompt.user})
    text = _compile(template or PLAIN_TEMPLATE).render(
        messages=messages, add_generation_prompt=True, bos_token=bos_token, eos_token=eos_token
    )
    return text + prompt.prefill
