"""`swarmling bench`'s training comparison on the fake backend: every pass starts from the same
state, the bf16 pass runs only where the backend offers the choice, and the backend is left as
the node runs it. (The figures themselves come from the real backend: `swarmling bench`.)"""

from __future__ import annotations

from fakes import FakeBackend

from swarmling.app.bench import _compare_training
from swarmling.backends.base import TrainSample


class PrecisionFake(FakeBackend):
    """A backend with the CPU trainer's bf16 switch, recording which passes ran."""

    def __init__(self) -> None:
        super().__init__()
        self.bf16_matmuls = False
        self.passes: list[tuple[bool, bool]] = []
        self.loads = 0

    def train_step(self, samples, should_stop=None, on_progress=None):
        self.passes.append((self.shared_prefix, self.bf16_matmuls))
        return super().train_step(samples, should_stop, on_progress)

    def load_state(self, directory) -> None:
        self.loads += 1
        super().load_state(directory)


def samples() -> list[TrainSample]:
    return [TrainSample([1, 2, 3], [4, 5], advantage=a, behaviour_logprobs=[-1.0, -1.0]) for a in (1.0, -1.0)]


def test_the_comparison_times_shared_unshared_and_bf16_from_the_same_state(capsys):
    backend = PrecisionFake()
    _compare_training(backend, samples())
    assert backend.passes == [(True, False), (False, False), (True, True)]
    assert backend.loads == 3  # back to the saved state after every pass
    assert (backend.shared_prefix, backend.bf16_matmuls) == (True, False)  # as the node runs it
    out = capsys.readouterr().out
    assert "shared is" in out and "matmuls in bf16" in out


def test_no_bf16_pass_where_the_backend_has_no_such_choice(capsys):
    backend = FakeBackend()
    _compare_training(backend, samples())
    out = capsys.readouterr().out
    assert "shared is" in out and "bf16" not in out
