"""`swarmling bench`'s training comparison on the fake backend: every pass starts from the same
state, a switch's pass (bf16, activation checkpointing) runs only where the backend offers it,
and the backend is left as the node runs it. (The figures come from the real backend:
`swarmling bench`.)"""

from __future__ import annotations

from fakes import FakeBackend

from swarmling.app.bench import _compare_training
from swarmling.backends.base import TrainSample


class SwitchesFake(FakeBackend):
    """A backend with the CPU trainer's switches, recording which passes ran."""

    def __init__(self, checkpointing: bool = False) -> None:
        super().__init__()
        self.bf16_matmuls = False
        self.activation_checkpointing = checkpointing
        self.passes: list[tuple[bool, bool, bool]] = []
        self.loads = 0

    def train_step(self, samples, should_stop=None, on_progress=None):
        self.passes.append((self.shared_prefix, self.bf16_matmuls, self.activation_checkpointing))
        return super().train_step(samples, should_stop, on_progress)

    def load_state(self, directory) -> None:
        self.loads += 1
        super().load_state(directory)


def samples() -> list[TrainSample]:
    return [TrainSample([1, 2, 3], [4, 5], advantage=a, behaviour_logprobs=[-1.0, -1.0]) for a in (1.0, -1.0)]


def test_the_comparison_times_each_switch_from_the_same_state(capsys):
    backend = SwitchesFake()
    _compare_training(backend, samples())
    assert backend.passes == [(True, False, False), (False, False, False), (True, True, False), (True, False, True)]
    assert backend.loads == 4  # back to the saved state after every pass
    assert (backend.shared_prefix, backend.bf16_matmuls, backend.activation_checkpointing) == (True, False, False)
    out = capsys.readouterr().out
    assert "shared is" in out and "matmuls in bf16" in out and "activation checkpointing" in out
    assert "training peak" in out  # Linux resets the peak for each pass


def test_a_switch_the_node_runs_with_is_compared_against_it_off(capsys):
    backend = SwitchesFake(checkpointing=True)
    _compare_training(backend, samples())
    assert backend.passes[0] == (True, False, True) and backend.passes[-1] == (True, False, False)
    assert backend.activation_checkpointing  # left on, as the node runs it
    assert "train.activation_checkpointing = true" in capsys.readouterr().out


def test_no_bf16_pass_where_the_backend_has_no_such_choice(capsys):
    backend = FakeBackend()
    _compare_training(backend, samples())
    out = capsys.readouterr().out
    assert "shared is" in out and "bf16" not in out and "checkpointing" not in out
