"""Config: precedence CLI > environment > file, and errors that name the key and what is accepted."""

from __future__ import annotations

import pytest

from swarmling.app.cli import main
from swarmling.app.config import ConfigError, load_config


def write(tmp_path, text):
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_defaults_without_file(tmp_path):
    cfg = load_config(tmp_path / "missing.toml", environ={})
    assert cfg.model.name == "smollm2-135m"
    assert cfg.round.preset == "starter-2"
    assert cfg.round.questions is None  # filled per hardware


def test_precedence_cli_over_env_over_file(tmp_path):
    path = write(tmp_path, "[round]\nquestions = 3\ncompletions = 5\ntemperature = 0.7\n")
    env = {"SWARMLING_ROUND__QUESTIONS": "6", "SWARMLING_ROUND__COMPLETIONS": "7"}
    cfg = load_config(path, environ=env, cli=[("round.questions", 9)])
    assert cfg.round.questions == 9  # CLI
    assert cfg.round.completions == 7  # environment
    assert cfg.round.temperature == 0.7  # file


def test_unknown_key_names_it_and_lists_accepted(tmp_path):
    path = write(tmp_path, "[round]\nquestionz = 3\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, environ={})
    msg = str(err.value)
    assert "round.questionz" in msg and "questions" in msg and str(path) in msg


def test_unknown_section(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown section \[rounds\].*round"):
        load_config(write(tmp_path, "[rounds]\nx = 1\n"), environ={})


def test_bad_value_names_key_origin_and_accepted_values(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path / "none.toml", environ={"SWARMLING_BACKEND__KIND": "gpu"})
    msg = str(err.value)
    assert "backend.kind" in msg and "SWARMLING_BACKEND__KIND" in msg and "'auto'" in msg and "'cpu'" in msg


def test_out_of_range_value(tmp_path):
    with pytest.raises(ConfigError, match=r"round.completions.*greater than or equal to 2"):
        load_config(write(tmp_path, "[round]\ncompletions = 1\n"), environ={})


def test_invalid_toml(tmp_path):
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "[round\n"), environ={})


def test_cli_rejects_bad_config_with_exit_2(tmp_path, capsys):
    code = main(["--home", str(tmp_path), "run", "--headless", "--set", "round.temperature=hot"])
    assert code == 2
    assert "round.temperature" in capsys.readouterr().err


def test_cli_rejects_bad_flags(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--home", str(tmp_path), "run", "--rounds", "zero"])
    assert exit_.value.code == 2
    assert "not a whole number" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["run", "--set", "no-equals-sign"])


def test_unknown_preset_is_a_clear_error(tmp_path, capsys):
    code = main(["--home", str(tmp_path), "doctor", "--preset", "nope"])
    assert code != 0
    assert "unknown preset 'nope'" in capsys.readouterr().err


def test_environment_variable_typo_is_reported(tmp_path):
    with pytest.raises(ConfigError, match="two underscores"):
        load_config(tmp_path / "none.toml", environ={"SWARMLING_ROUND_QUESTIONS": "4"})
    # other SWARMLING_* variables are not config keys
    assert load_config(tmp_path / "none.toml", environ={"SWARMLING_TEST_CACHE": "/x"}).round.questions is None


def test_shipped_example_config_is_valid():
    from importlib import resources

    text = (resources.files("swarmling.assets") / "default_config.toml").read_text()
    # every commented key, uncommented, must be a valid setting
    import pathlib
    import re
    import tempfile

    key_line = re.compile(r"^# ([a-z_]+ = .*?)(\s+#.*)?$")
    uncommented = "\n".join(key_line.sub(r"\1", line) for line in text.splitlines())

    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "c.toml"
        path.write_text(uncommented)
        cfg = load_config(path, environ={})
    assert cfg.round.questions == 8 and cfg.train.lora_r == 16 and cfg.run.seed == 7


def test_swarm_peer_addresses_are_checked_up_front(tmp_path):
    good = "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWMbwCvYRJvACunXZ5n4EJawGy9RBD16vfrb4xpZZq48gD"
    cfg = load_config(None, environ={}, cli=[("swarm.peers", (good,))])
    assert cfg.swarm.peers == (good,) and cfg.swarm.enabled and cfg.round.external_groups == 4
    with pytest.raises(ConfigError, match=r"swarm.peers \(from command line\).*not a peer address"):
        load_config(None, environ={}, cli=[("swarm.peers", ("127.0.0.1:4001",))])
    with pytest.raises(ConfigError, match="swarm.name"):
        load_config(None, environ={}, cli=[("swarm.name", "Bad Name!")])


def test_lora_dropout_is_refused_with_why():
    import pytest

    from swarmling.app.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="pi_old"):
        load_config(None, environ={}, cli=[("train.lora_dropout", 0.1)])
