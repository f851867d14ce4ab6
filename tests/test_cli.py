"""The command line: README's common flags work with the default command (`swarmling --threads 2`)."""

from __future__ import annotations

import pytest

from swarmling.app.cli import build_parser, main, parse_arguments


@pytest.mark.parametrize("flags, attribute, value", [
    (["--threads", "2"], "threads", 2),
    (["--model", "gemma3-270m"], "model", "gemma3-270m"),
    (["--set", "round.questions=4"], "assignments", [("round.questions", 4)]),
    (["--rounds", "3", "--headless"], "rounds", 3),
], ids=["threads", "model", "set", "rounds"])
def test_flags_before_any_command_reach_run(tmp_path, flags, attribute, value):
    args = parse_arguments(["--home", str(tmp_path), "-v", *flags])
    assert args.command == "run"
    assert getattr(args, attribute) == value
    assert args.home == str(tmp_path) and args.verbose


@pytest.mark.parametrize("argv, command", [
    ([], "run"),
    (["--home=/tmp/x"], "run"),
    (["--home", "/tmp/x", "status", "--json"], "status"),
    (["--config", "c.toml", "eval", "--base"], "eval"),
])
def test_a_named_command_is_kept_and_none_is_run(argv, command):
    assert parse_arguments(argv).command == command


def test_a_flag_before_the_command_reaches_runs_configuration(tmp_path, capsys):
    # The bad value is refused by the config loader, before any model loads: the flag got there.
    assert main(["--home", str(tmp_path), "--set", "round.temperature=hot"]) == 2
    assert "round.temperature" in capsys.readouterr().err


def test_an_unknown_flag_is_still_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--home", str(tmp_path), "--no-such-flag"])
    assert "--no-such-flag" in capsys.readouterr().err


def test_an_experiment_too_short_for_its_burn_in_is_refused_before_any_work(tmp_path, capsys):
    out = tmp_path / "exp"
    assert main(["--home", str(tmp_path), "experiment", "--design", "rare-success", "--rounds", "10",
                 "--out", str(out)]) == 1
    assert "--rounds 10: 0 evaluations would come after the burn-in (round 10" in capsys.readouterr().err
    assert not out.exists()
    assert main(["--home", str(tmp_path), "experiment", "--design", "rare-success", "--rounds", "20",
                 "--out", str(out)]) == 1  # two after it (rounds 15, 20): a mean of two is too noisy to pair on
    assert "2 evaluations would come after the burn-in" in capsys.readouterr().err and not out.exists()


def test_an_experiment_arm_the_design_lacks_is_refused_before_any_work(tmp_path, capsys):
    out = tmp_path / "exp"
    assert main(["--home", str(tmp_path), "experiment", "--design", "rare-success", "--arms", "alone,alone-uniform",
                 "--out", str(out)]) == 1
    assert "--arms: alone-uniform not an arm of rare-success; its arms: alone, sharing" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("flag", [["--burn-in", "-1"], ["--minutes", "0"], ["--minutes", "soon"]])
def test_an_experiment_flag_out_of_range_is_refused(tmp_path, capsys, flag):
    with pytest.raises(SystemExit):
        main(["--home", str(tmp_path), "experiment", *flag])
    assert flag[0] in capsys.readouterr().err


def test_a_command_that_only_talks_to_the_node_imports_no_model_library(tmp_path):
    """Each command's module is imported when it runs: `status` (and `--help`) stay instant."""
    import subprocess
    import sys

    code = ("import sys; from swarmling.app.cli import main; main(['--home', sys.argv[1], 'status']); "
            "print(sorted(m for m in ('torch', 'textual', 'llama_cpp', 'reasoning_gym', 'libp2p') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr


@pytest.mark.parametrize("command, flag", [
    ("run", "--headless"), ("eval", "--pass-at"), ("export", "--format"), ("experiment", "--design"),
    ("bench-swarm", "--cold"), ("config", "--keys"), ("join", "--replace"), ("status", "--json"), ("sim", "--tiny"),
])
def test_each_command_declares_its_flags_in_its_own_module(command, flag, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_arguments([command, "--help"])
    assert exit_.value.code == 0
    assert flag in capsys.readouterr().out.split("options:", 1)[1]
    assert flag not in {o for a in build_parser()._actions for o in a.option_strings}  # not at the top level
