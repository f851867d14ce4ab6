"""The compiled trainer's graphs built off the critical path (backends/compile_warmup.py): eager fp32
steps while a replica compiles in the background, then compiled steps that build no graph of their
own, the trainer still its sampler's policy across the switch."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from swarmling.backends import torch_compile
from swarmling.backends.torch_compile import CompiledLayers, graphs_compiled
from swarmling.backends.settings import CpuTrainerChoice


class Built:
    """A background build that is done (or not yet), as compile_warmup.BackgroundCompile reports it."""

    def __init__(self, done: bool = True, failure: str = "") -> None:
        self.done, self.failure, self.seconds, self.graphs, self.waited = done, failure, 12.0, 3, False
        self.how = "compiled in a child process"

    def wait(self) -> None:
        self.waited, self.done = True, True


def layers():
    import torch

    return [torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)]


def test_the_layers_compile_between_passes_once_the_background_build_is_done():
    compiling, events = CompiledLayers(layers(), lambda: None), []
    build = Built(done=False)
    compiling.build_in_background(build, lambda: events.append(("built", compiling.on)))
    assert compiling.run(lambda: compiling.on) is False and compiling.pending  # not done: eager
    build.done = True
    assert compiling.run(lambda: compiling.on) is True and not compiling.pending
    assert events == [("built", False)]  # what goes with it (a bf16 base) before the first compiled pass
    assert compiling.built_in_background == (12.0, 3, "compiled in a child process")
    compiling.on = False


def test_a_choice_made_while_the_graphs_build_waits_for_them_and_holds():
    compiling = CompiledLayers(layers(), lambda: None)
    build = Built(done=False)
    compiling.build_in_background(build, lambda: None)
    compiling.on = False  # bench's eager pass: the build's end must not turn it back on later
    assert build.waited and not compiling.on and not compiling.pending
    assert compiling.run(lambda: compiling.on) is False


def test_a_background_build_that_failed_leaves_the_trainer_eager_and_says_why():
    compiling, built = CompiledLayers(layers(), lambda: None), []
    compiling.build_in_background(Built(failure="InductorError: no compiler"), lambda: built.append(1))
    assert compiling.run(lambda: compiling.on) is False
    assert compiling.failure == "InductorError: no compiler" and not built and not compiling.pending


def test_a_process_that_ends_while_the_graphs_build_leaves_no_crash_marker_and_no_replica(tmp_path):
    """A quit in the first minutes kills the build mid-way (a daemon thread): that is no crash, so
    the next start must not empty the cache and train eagerly; the replica's folder goes too."""
    from swarmling.backends.torch_compile import FIRST_PASS_MARKER

    runtime, scratch = tmp_path / "run", tmp_path / "tmp"
    runtime.mkdir()
    scratch.mkdir()
    code = textwrap.dedent(f"""
        import time
        from swarmling.backends import torch_compile
        from swarmling.backends.compile_warmup import start_background_compile

        class Compiling:
            on, failure = False, ""

        class Replica:
            compiling = Compiling()

            def train_step(self, samples):
                time.sleep(3)

        def guard(run):
            torch_compile.first_pass_guarded({str(runtime)!r}, {str(tmp_path)!r}, "g++", True, run)

        def make(folder):
            (folder / "weights").write_text("x")
            return Replica()

        start_background_compile(make, lambda: 0, guard)
        deadline = time.monotonic() + 30
        while not ({str(runtime)!r} and __import__("pathlib").Path({str(runtime / FIRST_PASS_MARKER)!r}).exists()):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        print("building")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TMPDIR": str(scratch)})
    assert done.returncode == 0 and "building" in done.stdout, done.stderr
    assert not (runtime / FIRST_PASS_MARKER).exists()
    assert list(scratch.iterdir()) == []


@pytest.mark.slow  # builds the backend (the model, llama.cpp)
def test_a_failed_background_build_leaves_the_node_eager_whatever_was_read_while_it_built(
        cpu_backend_maker, gguf_path, tmp_path, monkeypatch):
    from swarmling.backends import cpu

    def broken(recipe, folder, stopped, crashed):  # the child process's failure, as it reports it
        raise RuntimeError("InductorError: no compiler after all")

    monkeypatch.setattr(cpu, "compile_in_child", broken)
    backend = cpu_backend_maker(gguf_path, tmp_path / "run",
                               cpu_trainer=CpuTrainerChoice(compiler="/usr/bin/g++", compile_reason="compiled: g++"))
    try:
        read_while_building = backend.switches()
        assert read_while_building.compiled
        backend.set_switches(read_while_building)  # bench does this: it must not compile after a failure
        trainer = backend.trainer
        assert not trainer.compiling.on and "no compiler after all" in trainer.compiling.failure
        assert backend.switches().compiled is None and "torch.compile failed" in backend.info().trainer
    finally:
        backend.close()


@pytest.mark.slow  # compiles a replica (about a minute on 2 cores with a cold cache) and trains the real model
def test_a_fresh_node_trains_eagerly_while_its_graphs_build_then_compiled_without_building_any(
        cpu_backend_maker, gguf_path, tmp_path):
    from swarmling.backends.base import ChatPrompt, TrainSample

    graphs_before = graphs_compiled()
    backend = cpu_backend_maker(gguf_path, tmp_path / "run",
                               cpu_trainer=CpuTrainerChoice(compiler="/usr/bin/g++", compile_reason="compiled: g++"))
    guarded = []  # the main thread's passes: whether each stood under the first-pass crash marker
    real_guard = torch_compile.first_pass_guarded

    def recording(runtime, cache, compiler, unproven, run):
        if threading.current_thread() is threading.main_thread():
            guarded.append(unproven)
        return real_guard(runtime, cache, compiler, unproven, run)

    try:
        trainer = backend.trainer
        assert trainer.compiling.pending and not trainer.compiling.on and not trainer.bf16_base
        assert backend.switches().compiled  # what it will run with
        assert "building in the background" in backend.info().trainer
        prompt = backend.encode_prompt(ChatPrompt("Reply inside <answer></answer>.", "What is 5 + 3?", "<answer>"))
        samples = [TrainSample(prompt, backend.tokenize(reply), advantage) for reply, advantage in
                   (("8</answer>", 1.0), ("9</answer>", -1.0), ("The sum is 8.</answer>", 0.5), ("I think 7</answer>", -0.5))]
        steps, started = [], time.monotonic()
        torch_compile.first_pass_guarded = recording
        try:
            while not trainer.compiling.on and time.monotonic() - started < 900:
                began = time.perf_counter()
                backend.train_step(samples)  # eager, fp32, beside the build; the last one adopts its graphs
                steps.append(time.perf_counter() - began)
        finally:
            torch_compile.first_pass_guarded = real_guard
        assert trainer.compiling.on and trainer.compiling.proven and not trainer.compiling.failure
        assert guarded == [False] * (len(steps) - 1) + [True]  # the model's first compiled pass is guarded
        compiled_step = steps.pop()
        backend.train_step(samples)
        trainer.token_logprobs(samples)  # a pass without gradients: warmed too
        # Every graph built in this process since the backend began was the background build's.
        assert graphs_compiled() - graphs_before == trainer.compiling.built_in_background[1]
        # ... after a child process compiled them, or found them compiled by an earlier test's child
        assert trainer.compiling.built_in_background[2] in ("compiled in a child process", "the cache held the graphs")
        print(f"eager steps while building: {', '.join(f'{s:.2f}' for s in steps)} s; built in "
              f"{trainer.compiling.built_in_background[0]:.0f} s; first compiled step {compiled_step:.2f} s")
        # Across the switch the trainer still computes its sampler's policy (as in
        # tests/test_trainer_is_the_sampler.py: ~0.05-0.08 nats a token apart on the Q4_1 file).
        backend.hand_off()
        policy = np.concatenate([np.asarray(lp) for lp in trainer.token_logprobs(samples)])
        sampler = []
        for sample in samples:
            logits = backend.generator.prompt_logits(list(sample.prompt_ids) + list(sample.completion_ids)).astype(np.float64)
            for j, token in enumerate(sample.completion_ids):
                row = logits[len(sample.prompt_ids) - 1 + j]
                sampler.append(row[token] - row.max() - np.log(np.exp(row - row.max()).sum()))
        assert float(np.abs(policy - np.asarray(sampler)).mean()) < 0.12
    finally:
        backend.trainer.compiling.adopt(wait=True)
        backend.close()


def test_a_closing_backend_stops_its_build_after_the_pass_under_way_and_never_adopts_it():
    import threading as threads

    from swarmling.backends.compile_warmup import exercise

    compiling, stopped = CompiledLayers(layers(), lambda: None), []
    build = Built(done=False)
    build.stop = lambda: stopped.append(True)
    compiling.build_in_background(build, lambda: None)
    compiling.abandon_build()
    assert stopped and not compiling.pending and compiling.run(lambda: compiling.on) is False

    class Replica:
        passes = 0

        def train_step(self, samples):
            Replica.passes += 1

        token_logprobs = train_step

    closed = threads.Event()
    closed.set()
    with pytest.raises(RuntimeError, match="closed"):
        exercise(Replica(), closed)
    assert Replica.passes == 0
    exercise(Replica(), threads.Event())
    assert Replica.passes == 4


def a_recipe(compiler: str = "/usr/bin/g++"):
    from backend_settings import trainer_settings

    from swarmling.backends.compile_process import ReplicaRecipe

    made = trainer_settings()
    return ReplicaRecipe(made["lora"], made["optim"], made["grpo"], 1.0, 0, False, False, compiler, 1)


def test_a_recipe_travels_to_the_child_whole(tmp_path):
    from swarmling.backends.compile_process import ReplicaRecipe

    recipe = a_recipe()
    recipe.write(tmp_path)
    assert ReplicaRecipe.read(tmp_path) == recipe


def test_a_child_that_fails_says_why_and_one_that_dies_counts_as_a_death(tmp_path, monkeypatch):
    """No model in the folder: the child exits with transformers' reason; crashed (a signal of a
    fault), it is reported as a death, which torch_compile.prepare reads at the next start."""
    from swarmling.backends import compile_process

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "config.json").write_text("{}")  # an architecture with no model beside it
    deaths = []
    with pytest.raises(RuntimeError) as failed:
        compile_process.compile_in_child(a_recipe(), tmp_path, threading.Event(), lambda: deaths.append(1))
    assert "model_type" in str(failed.value) and not deaths, failed.value
    assert not (tmp_path / "cache" / compile_process.BUILT_NOTES).exists()

    real_popen = subprocess.Popen
    for signal_name, counted in (("SIGKILL", []), ("SIGSEGV", [1])):  # the OOM killer's is no crash
        code = f"import os, signal; os.kill(os.getpid(), signal.{signal_name})"
        monkeypatch.setattr(compile_process.subprocess, "Popen",
                            lambda args, **kw: real_popen([sys.executable, "-c", code], **kw))
        with pytest.raises(RuntimeError, match=f"died \\({signal_name}\\)"):
            compile_process.compile_in_child(a_recipe(), tmp_path, threading.Event(), lambda: deaths.append(1))
        assert deaths == counted


def test_a_closing_backend_kills_the_compiling_child_at_once(tmp_path, monkeypatch):
    from swarmling.backends import compile_process

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "config.json").write_text("{}")
    real_popen, children = subprocess.Popen, []

    def sleeper(args, **kw):
        children.append(real_popen([sys.executable, "-c", "import time; time.sleep(60)"], **kw))
        return children[-1]

    monkeypatch.setattr(compile_process.subprocess, "Popen", sleeper)
    stopped = threading.Event()
    threading.Timer(0.5, stopped.set).start()
    began = time.monotonic()
    with pytest.raises(RuntimeError, match="closed"):
        compile_process.compile_in_child(a_recipe(), tmp_path, stopped, lambda: None)
    assert time.monotonic() - began < 10 and children[0].poll() is not None


@pytest.mark.slow  # a replica compiled from an empty cache in a child process (~2 minutes on 2 cores)
def test_graphs_a_child_compiled_are_loaded_not_compiled_again_by_the_node(hf_model, tmp_path):
    """In a fresh process (no graph in memory), after the child filled an empty cache, the
    replica's every pass kind finds its graphs on disk: inductor's cache misses nothing. The next
    start skips the child."""
    code = textwrap.dedent(f"""
        import os, tempfile, threading
        from pathlib import Path
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = {str(tmp_path / "cache")!r}
        import torch
        torch.set_num_threads(1)  # a node at the recipe's thread count
        from torch._dynamo.utils import counters
        from torch._inductor import config as inductor
        from test_compile_warmup import a_recipe
        from swarmling.backends.compile_process import compile_in_child
        from swarmling.backends.compile_warmup import exercise, write_replica

        recipe, folder = a_recipe(), write_replica(Path({str(hf_model)!r}), Path({str(tmp_path / "replica")!r}))
        print("first:", compile_in_child(recipe, folder, threading.Event(), lambda: print("died")))
        # the next start: another folder (a new one at each start), the same recipe and architecture
        again = write_replica(Path({str(hf_model)!r}), Path({str(tmp_path / "next-start")!r}))
        print("again:", compile_in_child(recipe, again, threading.Event(), lambda: print("died")))
        inductor.cpp.cxx = (recipe.compiler,)
        replica = recipe.trainer(folder)
        replica.compiling.on = True
        exercise(replica)
        assert not replica.compiling.failure, replica.compiling.failure
        print("hits", counters["inductor"]["fxgraph_cache_hit"], "misses", counters["inductor"]["fxgraph_cache_miss"])
    """)
    tests = os.path.dirname(__file__)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900, cwd=tests,
                          env={**os.environ, "PYTHONPATH": tests + os.pathsep + os.environ.get("PYTHONPATH", "")})
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "first: compiled in a child process" in lines and "again: the cache held the graphs" in lines
    hits, misses = (int(word) for word in lines[-1].split()[1::2])
    assert hits > 0 and misses == 0, lines


@pytest.mark.slow  # a real child on a real replica
def test_the_compiling_child_ends_with_the_node_however_the_node_ends(hf_model, tmp_path):
    """A node killed outright (SIGKILL: no atexit, no stop) leaves no child compiling behind."""
    import psutil

    code = textwrap.dedent(f"""
        import os, threading
        from pathlib import Path
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = {str(tmp_path / "cache")!r}
        from test_compile_warmup import a_recipe
        from swarmling.backends.compile_process import compile_in_child
        from swarmling.backends.compile_warmup import write_replica

        folder = write_replica(Path({str(hf_model)!r}), Path({str(tmp_path / "replica")!r}))
        compile_in_child(a_recipe(), folder, threading.Event(), lambda: None)
    """)
    tests = os.path.dirname(__file__)
    node = subprocess.Popen([sys.executable, "-c", code], cwd=tests, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": tests + os.pathsep + os.environ.get("PYTHONPATH", "")})
    try:
        deadline, children = time.monotonic() + 120, []
        while not children:
            assert time.monotonic() < deadline and node.poll() is None
            children = psutil.Process(node.pid).children()
            time.sleep(0.2)
        time.sleep(3)  # the child under way (importing torch, or compiling)
        assert children[0].is_running()
    finally:
        node.kill()
        node.wait()
    child, deadline = children[0], time.monotonic() + 15

    def running() -> bool:
        try:
            return child.status() != psutil.STATUS_ZOMBIE  # a zombie has ended
        except psutil.NoSuchProcess:
            return False

    while running():
        assert time.monotonic() < deadline, "the compiling child outlived its node"
        time.sleep(0.2)
