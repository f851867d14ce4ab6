"""The llama.cpp command lines that load an exported base + LoRA pair, and ask as the node does."""

from __future__ import annotations

import json
import shlex

from ....backends.cpu_features import has_amx
from ...learning.prompt import STOP

EXAMPLE_QUESTION = "What is 17 + 25?"


def no_repack_flag() -> list[str]:
    """llama.cpp's extra weight layouts (repacking) include AMX tiles that crash this project's
    llama.cpp build at the first decode (backends/llama_cpp_engine.py); `--no-repack` turns
    them off. Written where the exporting CPU has AMX; elsewhere it only costs speed."""
    return ["--no-repack"] if has_amx() else []


def command_lines(base_file: str, adapter_file: str, example_prompt: str, system_prompt: str, max_new_tokens: int) -> str:
    """Markdown: a server with a raw-prompt request (the node's prompt, exactly), the raw-prompt
    CLI, and the chat CLI (the model's chat template, without the pre-started answer)."""
    load = ["-m", base_file, "--lora", adapter_file, *no_repack_flag()]
    request = json.dumps({"prompt": example_prompt, "temperature": 0, "repeat_penalty": 1,
                          "n_predict": max_new_tokens, "stop": list(STOP)})
    server = shlex.join(["llama-server", *load, "--port", "8080"])
    curl = shlex.join(["curl", "-s", "http://127.0.0.1:8080/completion", "-d", request])
    completion = shlex.join(["llama-completion", *load, "-p", example_prompt, "-n", str(max_new_tokens),
                             "--temp", "0", "--repeat-penalty", "1", "-no-cnv"])
    chat = shlex.join(["llama-cli", *load, "-sys", system_prompt, "--temp", "0"])
    python_server = shlex.join(["python", "-m", "llama_cpp.server", "--model", base_file, "--lora_path", adapter_file,
                                "--port", "8000"])
    openai_request = json.dumps({"prompt": example_prompt, "temperature": 0, "repeat_penalty": 1,
                                 "max_tokens": max_new_tokens, "stop": list(STOP)})
    python_curl = shlex.join(["curl", "-s", "http://127.0.0.1:8000/v1/completions", "-H",
                              "Content-Type: application/json", "-d", openai_request])
    amx = ("`--no-repack` is there because the exporting machine's CPU has AMX, whose repacked weights crash some "
           "llama.cpp builds at the first token; keep it on such CPUs, drop it elsewhere for speed (llama-cpp-python's "
           "server has no such switch: on this CPU serve with llama-server)."
           if no_repack_flag() else
           "On a CPU with AMX (recent Xeons) add `--no-repack` if llama.cpp crashes at the first token (llama-cpp-python's "
           "server has no such switch: serve with llama-server there).")
    return "\n".join([
        "llama.cpp's programs (`llama-server`, `llama-completion`, `llama-cli`) come with its releases "
        "(github.com/ggml-org/llama.cpp) and many package managers.",
        "",
        f"A server, asked with the node's own prompt for {EXAMPLE_QUESTION!r} (put your question in its place; the "
        "reply is what follows the pre-started `<answer>`):",
        "", "```bash", server, curl, "```", "",
        "Or with Python alone: llama-cpp-python's OpenAI-compatible server (`pip install "
        "'llama-cpp-python[server]'`; tested: `tests/test_export.py`), asked the same way:",
        "", "```bash", python_server, python_curl, "```", "",
        "The same prompt from the command line (`llama-completion`; builds before late 2025 call it `llama-cli`):",
        "", "```bash", completion, "```", "",
        "A chat in the terminal (the model's chat template and the node's system prompt, without the pre-started "
        "`<answer>`, so replies may wander from the trained format):",
        "", "```bash", chat, "```", "", amx,
    ])
