"""`swarmling bench`'s training comparison on the fake backend: every pass starts from the same
state, a switch's pass (bf16, activation checkpointing) runs only where the backend offers it,
and the backend is left as the node runs it. (The figures come from the real backend:
`swarmling bench`.)"""

from __future__ import annotations

import pytest
from fakes import FakeBackend

from swarmling.app.commands import bench, bench_generation
from swarmling.app.commands.bench import _compare_training, reset_peak_rss
from swarmling.backends.base import TrainerSwitches, TrainSample


class Clock:
    """Stands in for `time` in app.bench: a step's cost is what the fake says it is."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(bench, "time", c)
    return c


class SwitchesFake(FakeBackend):
    """A backend with the CPU trainer's switches, recording which passes ran; a step takes 1 s
    with shared prefixes, 4 s without, 3 s in bf16, 1.5 s with checkpointing."""

    def __init__(self, clock: Clock, checkpointing: bool = False, compiled: bool | None = None) -> None:
        super().__init__()
        self.clock = clock
        self.bf16_base = False
        self.activation_checkpointing = checkpointing
        self.compiled = compiled
        self.passes: list[tuple[bool, bool, bool]] = []
        self.switch_log: list[TrainerSwitches] = []
        self.loads = 0

    def switches(self) -> TrainerSwitches:
        return TrainerSwitches(self.shared_prefix, self.bf16_base, self.activation_checkpointing, self.compiled)

    def set_switches(self, switches: TrainerSwitches) -> None:
        self.shared_prefix = switches.shared_prefix
        self.bf16_base, self.activation_checkpointing = switches.bf16_base, switches.activation_checkpointing
        self.compiled = switches.compiled

    def train_step(self, samples, should_stop=None, on_progress=None):
        self.passes.append((self.shared_prefix, self.bf16_base, self.activation_checkpointing))
        self.switch_log.append(self.switches())
        self.clock.now += (1.0 if self.shared_prefix else 4.0) * (3.0 if self.bf16_base else 1.0) * (
            1.5 if self.activation_checkpointing else 1.0) * (0.5 if self.compiled else 1.0)
        return super().train_step(samples, should_stop, on_progress)

    def load_state(self, directory) -> None:
        self.loads += 1
        super().load_state(directory)


def samples() -> list[TrainSample]:
    return [TrainSample([1, 2, 3], [4, 5], advantage=a, behaviour_logprobs=[-1.0, -1.0]) for a in (1.0, -1.0)]


def test_the_comparison_times_each_switch_from_the_same_state(capsys, clock, tmp_path):
    backend = SwitchesFake(clock)
    backend.save_state(tmp_path)  # the state the samples were drawn with
    backend.train_steps = 5
    _compare_training(backend, samples(), "the test's", tmp_path)
    # no bf16 pass: the trainer is not compiled, and a node never trains eager bf16
    assert backend.passes == [(True, False, False), (False, False, False), (True, False, True)]
    assert backend.loads == 4  # the saved state before every pass, and again after the last
    assert backend.train_steps == 0
    assert (backend.shared_prefix, backend.bf16_base, backend.activation_checkpointing) == (True, False, False)
    out = capsys.readouterr().out
    assert "shared is 4.00x faster" in out and "bf16" not in out
    assert "activation checkpointing    1.50 s vs 1.00 s without: 1.50x the time" in out
    if reset_peak_rss():  # Linux: each pass's own peak
        assert "training peak" in out


def test_compiled_layers_are_compared_with_eager_and_every_other_pass_is_warmed_first(capsys, clock, tmp_path):
    backend = SwitchesFake(clock, compiled=True)
    backend.save_state(tmp_path)
    _compare_training(backend, samples(), "the test's", tmp_path)
    # the node's pass, then each other pass twice: once to build its graphs, once timed
    assert len(backend.passes) == 1 + 2 * 4 and backend.passes[1] == backend.passes[2]
    assert backend.compiled  # left as the node runs it
    out = capsys.readouterr().out
    assert "torch.compile      0.50 s vs eager fp32 1.00 s: 2.00x (the node runs compiled, fp32)" in out
    assert "bf16 base          1.50 s vs fp32 0.50 s: 0.33x" in out  # both compiled


def test_no_bf16_pass_on_a_cpu_without_bf16_instructions_that_trains_fp32(capsys, clock, tmp_path):
    backend = SwitchesFake(clock, compiled=True)
    backend.save_state(tmp_path)
    _compare_training(backend, samples(), "the test's", tmp_path, bf16_cpu=False)
    assert not any(bf16 for _, bf16, _ in backend.passes)
    assert "bf16 base       not timed: this CPU has no bf16 instructions" in capsys.readouterr().out


def test_a_compiled_bf16_node_is_compared_with_eager_fp32_what_it_would_run_uncompiled(capsys, clock, tmp_path):
    backend = SwitchesFake(clock, compiled=True)
    backend.bf16_base = True
    backend.save_state(tmp_path)
    _compare_training(backend, samples(), "the test's", tmp_path)
    eager = [p for p, s in zip(backend.passes, backend.switch_log) if not s.compiled]
    assert eager and all(not bf16 for _, bf16, _ in eager)  # never eager bf16
    assert "torch.compile      1.50 s vs eager fp32 1.00 s" in capsys.readouterr().out


def test_a_switch_the_node_runs_with_is_compared_against_it_off(capsys, clock, tmp_path):
    backend = SwitchesFake(clock, checkpointing=True)
    backend.save_state(tmp_path)
    _compare_training(backend, samples(), "the test's", tmp_path)
    assert backend.passes[0] == (True, False, True) and backend.passes[-1] == (True, False, False)
    assert backend.activation_checkpointing  # left on, as the node runs it
    out = capsys.readouterr().out
    assert "activation checkpointing    1.50 s vs 1.00 s without: 1.50x the time" in out
    assert "train.activation_checkpointing = true" in out


def test_checkpointing_the_memory_limit_required_is_not_timed_without(capsys, clock, tmp_path):
    backend = SwitchesFake(clock, checkpointing=True)
    backend.save_state(tmp_path)
    _compare_training(backend, samples(), "the test's", tmp_path, checkpointing_required=True)
    assert all(ckpt for _, _, ckpt in backend.passes)
    assert "not timed without activation checkpointing" in capsys.readouterr().out


def test_no_bf16_pass_where_the_backend_has_no_such_choice(capsys, tmp_path):
    backend = FakeBackend()
    backend.save_state(tmp_path)
    _compare_training(backend, samples(), "the test's", tmp_path)
    out = capsys.readouterr().out
    assert "shared is" in out and "bf16" not in out and "checkpointing" not in out


def test_the_bench_times_the_same_rounds_every_run_unless_a_seed_is_configured():
    from swarmling.app.commands.bench import BENCH_SEED, bench_config
    from swarmling.app.config import load_config

    assert bench_config(load_config(None, environ={})).run.seed == BENCH_SEED
    assert bench_config(load_config(None, environ={}, cli=[("run.seed", 9)])).run.seed == 9


def test_steady_state_leaves_out_the_first_round_and_every_round_that_compiled():
    from types import SimpleNamespace

    from swarmling.app.commands.bench import cold_start_line, steady_rounds

    rows = [SimpleNamespace(round=i, seconds={"train": t}) for i, t in enumerate([69.7, 11.8, 4.0, 4.2, 3.9, 4.1], 1)]
    steady, note = steady_rounds(rows, compiled={1, 2})
    assert [r.round for r in steady] == [3, 4, 5, 6] and note == ""
    assert "69.7" not in cold_start_line(rows, {1, 2}, steady)
    assert cold_start_line(rows, {1, 2}, steady).split()[1] == f"{(69.7 - 4.05) + (11.8 - 4.05):.2f}"
    few, note = steady_rounds(rows[:3], compiled={1, 2})  # today's --rounds 3 on a cold cache
    assert [r.round for r in few] == [3] and "give --rounds 5 or more" in note


def test_the_decode_step_cost_is_split_into_a_fixed_part_and_a_part_per_live_reply():
    from swarmling.backends.base import GenerationProfile

    live = [64, 40, 20, 8, 4, 2, 2]
    profile = GenerationProfile(live_per_step=live, seconds_per_step=[(20 + 5 * n) / 1e3 for n in live])
    fixed, per_reply, tail = bench_generation.step_cost(profile)
    assert fixed == pytest.approx(20) and per_reply == pytest.approx(5)
    assert tail == pytest.approx((40 + 30 + 30) / 1e3)  # the steps with 4 or fewer live
    assert "a step costs 20.0 ms + 5.00 ms a live reply" in bench_generation.generation_profile(
        GenerationProfile(prefill_s=0.1, prefill_tokens=10, decode_s=sum(profile.seconds_per_step), total_s=1.0,
                          live_per_step=live, seconds_per_step=profile.seconds_per_step))
    assert bench_generation.step_cost(GenerationProfile(live_per_step=[3, 3], seconds_per_step=[0.1, 0.1])) is None
