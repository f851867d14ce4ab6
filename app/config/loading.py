"""Loading the configuration: a TOML file, environment variables and the command line, in that
order of precedence (the later wins), checked against the schema; errors name the key, where its
value came from and what is accepted."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .schema import Config, ConfigError

ENV_PREFIX = "SWARMLING_"
# Environment variables that are not config keys.
ENV_NOT_KEYS = {"SWARMLING_HOME", "SWARMLING_CACHE_DIR", "SWARMLING_CONFIG"}


def parse_value(text: str) -> Any:
    """A value as TOML would read it (4, 0.5, true, ["a", "b"]), else the plain string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _set_path(tree: dict, dotted: str, value: Any, origin: str, origins: dict[str, str]) -> None:
    parts = [p for p in dotted.split(".") if p]
    if len(parts) != 2:
        raise ConfigError(f"{origin}: {dotted!r} is not a key; use section.key, e.g. round.questions")
    section, key = parts
    tree.setdefault(section, {})
    if not isinstance(tree[section], dict):
        raise ConfigError(f"{origin}: [{section}] must be a table")
    tree[section][key] = value
    origins[f"{section}.{key}"] = origin


def env_overrides(environ: Mapping[str, str]) -> list[tuple[str, Any, str]]:
    out = []
    for name, raw in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX) or name in ENV_NOT_KEYS:
            continue
        rest = name[len(ENV_PREFIX) :].lower()
        if "__" not in rest:
            # Not a config key (other SWARMLING_* variables exist), unless it looks like a typo of one.
            if rest.split("_")[0] in Config.model_fields:
                raise ConfigError(f"environment variable {name}: config keys are SWARMLING_SECTION__KEY (two underscores)")
            continue
        dotted = rest.replace("__", ".")
        out.append((dotted, parse_value(raw), f"environment variable {name}"))
    return out


def load_config(
    file: Path | None,
    environ: Mapping[str, str] | None = None,
    cli: list[tuple[str, Any]] | None = None,
) -> Config:
    tree: dict[str, Any] = {}
    origins: dict[str, str] = {}
    if file is not None and file.exists():
        try:
            data = tomllib.loads(file.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{file} is not valid TOML: {exc}") from None
        for section, table in data.items():
            if not isinstance(table, dict):
                raise ConfigError(f"{file}: top-level key {section!r} must be a [section]; sections: {_sections()}")
            for key, value in table.items():
                _set_path(tree, f"{section}.{key}", value, f"{file}", origins)
    for dotted, value, origin in env_overrides(os.environ if environ is None else environ):
        _set_path(tree, dotted, value, origin, origins)
    for dotted, value in cli or []:
        _set_path(tree, dotted, value, "command line", origins)
    try:
        return Config.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(_explain(exc, origins)) from None


def _sections() -> str:
    return ", ".join(Config.model_fields)


def _explain(exc: ValidationError, origins: dict[str, str]) -> str:
    lines = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        key = ".".join(loc[:2])
        origin = origins.get(key, "")
        where = f" (from {origin})" if origin else ""
        if err["type"] == "extra_forbidden":
            if len(loc) == 1:
                lines.append(f"unknown section [{loc[0]}]{where}; sections are: {_sections()}")
            else:
                section = Config.model_fields.get(loc[0])
                accepted = ", ".join(section.annotation.model_fields) if section else ""
                lines.append(f"unknown key {key}{where}; keys in [{loc[0]}] are: {accepted}")
            continue
        got = err.get("input")
        lines.append(f"{key}{where}: {err['msg']} (got {got!r})")
    return "invalid configuration:\n  " + "\n  ".join(lines)
