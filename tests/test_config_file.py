"""Settings saved into the user's config.toml: comments kept, precedence reported, bad values refused."""

from __future__ import annotations

import pytest

from swarmling.app.config import ConfigError
from swarmling.app.config_file import update_config_file


def test_config_file_edit_keeps_comments_and_applies_precedence(tmp_path, monkeypatch):
    file = tmp_path / "config.toml"
    file.write_text("# my node\n[round]\n# more questions on my desktop\nquestions = 16\npreset = \"starter\"\n")
    monkeypatch.setenv("SWARMLING_ROUND__EXTERNAL_GROUPS", "3")
    config, overridden = update_config_file(file, {"round.questions": None, "round.external_groups": 2,
                                                   "backend.threads": 2})
    text = file.read_text()
    assert "# my node" in text and "# more questions on my desktop" in text
    assert "questions = 16" not in text and "external_groups = 2" in text and "threads = 2" in text
    assert config.round.questions is None and config.backend.threads == 2
    assert config.round.external_groups == 3 and overridden == ["round.external_groups"]  # the env still wins


def test_config_file_edit_refuses_bad_values_and_leaves_the_file(tmp_path):
    file = tmp_path / "config.toml"
    file.write_text("[round]\nquestions = 4\n")
    with pytest.raises(ConfigError, match=r"round.questions.*config.toml"):
        update_config_file(file, {"round.questions": 0})
    with pytest.raises(ConfigError, match="not a config key"):
        update_config_file(file, {"nope.key": 1})
    assert file.read_text() == "[round]\nquestions = 4\n"
    assert [p.name for p in tmp_path.iterdir()] == ["config.toml"]  # no temp file left behind


def test_a_setting_this_machine_cannot_run_is_refused_before_the_file_is_written(tmp_path):
    """The settings screen hands the node's own check: a ceiling no round fits is said now, not
    at the next start."""

    def check(config):
        if config.resources.max_memory_gb is not None and config.resources.max_memory_gb < 1:
            raise ConfigError("resources.max_memory_gb = 0.5 is below what this model needs")

    file = tmp_path / "config.toml"
    file.write_text("[round]\nquestions = 4\n")
    with pytest.raises(ConfigError, match="below what this model needs"):
        update_config_file(file, {"resources.max_memory_gb": 0.5}, check=check)
    assert file.read_text() == "[round]\nquestions = 4\n"
    update_config_file(file, {"resources.max_memory_gb": 3.0}, check=check)
    assert "max_memory_gb = 3.0" in file.read_text()
