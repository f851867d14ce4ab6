"""`backends/registry.py`: one entry per backend, from which the config's names, `auto`'s choice,
sizing and building are read (pure logic over the table; the builds themselves are tested per
backend)."""

from __future__ import annotations

import typing

import pytest

from swarmling.app.config import Config
from swarmling.app.config.schema import BackendSection
from swarmling.app.hardware import Hardware, choose_backend
from swarmling.backends.registry import BACKENDS, NAMES, BackendKind, backend_kind, build_backend
from swarmling.backends.base import BackendUnavailable


def machine(**changes) -> Hardware:
    base = dict(system="Linux 6", machine="x86_64", cpu="x", physical_cores=4, logical_cores=8,
                memory_total=16 * 2**30, memory_available=8 * 2**30)
    return Hardware(**{**base, **changes})


def test_the_configs_backend_names_are_the_registrys():
    kind = BackendSection.model_fields["kind"].annotation
    assert typing.get_args(kind) == ("auto", *NAMES)
    for name in NAMES:
        assert Config.model_validate({"backend": {"kind": name}}).backend.kind == name
    with pytest.raises(ValueError, match="'auto', 'cuda', 'mlx' or 'cpu'"):
        Config.model_validate({"backend": {"kind": "tpu"}})


def test_auto_takes_the_first_entry_that_fits_and_the_last_fits_every_machine():
    assert choose_backend(machine(cuda_devices=("H100",))).name == "cuda"
    assert choose_backend(machine(cuda_devices=("H100",), apple_silicon=True, mlx_importable=True)).name == "cuda"
    assert choose_backend(machine(apple_silicon=True, mlx_importable=True)).name == "mlx"
    plain = choose_backend(machine())
    assert plain.name == "cpu" and "no GPU found" in plain.reason and "4 cores" in plain.reason
    assert BACKENDS[-1].chosen_for(machine())  # the fallback fits a machine that has nothing else
    assert choose_backend(machine(), "mlx").name == "mlx"  # asked for: the build says if it cannot be had
    with pytest.raises(ValueError, match="not available in this release; choose from cuda, mlx, cpu"):
        choose_backend(machine(), "tpu")


def test_a_new_entry_is_chosen_sized_and_built_from_the_table_alone(monkeypatch):
    """What adding a backend takes: an entry (here one that fits every machine first, sized like
    the GPU's, built by a function of its own)."""
    from swarmling.app import sizing
    from swarmling.backends import registry

    built = []
    extra = BackendKind("npu", "NPU", built.append, lambda m: "an NPU was found", memory="device",
                        checkpointing=False, cpu_torch_trainer=False)
    monkeypatch.setattr(registry, "BACKENDS", (extra, *BACKENDS))
    monkeypatch.setattr(registry, "NAMES", ("npu", *NAMES))
    assert choose_backend(machine()).name == "npu"
    build = sizing.build_settings(Config(), machine(), "npu")
    assert build.memory_limit is None and build.cpu_trainer.compiler is None  # sized by the device, not compiled
    assert "not implemented by the NPU trainer" in sizing.memory_note(
        Config.model_validate({"train": {"activation_checkpointing": True}}), build)
    spec = type("Spec", (), {"kind": "npu"})()
    build_backend(spec)
    assert built == [spec]
    assert backend_kind("npu") is extra


def test_a_kind_the_release_lacks_cannot_be_built():
    spec = type("Spec", (), {"kind": "tpu"})()
    with pytest.raises(BackendUnavailable, match="backend 'tpu' is not available in this release"):
        build_backend(spec)
