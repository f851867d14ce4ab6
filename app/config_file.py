"""Changing the user's config.toml from the app (the TUI's settings screen).

Edits go through tomlkit so the user's comments and layout survive; the result is checked with the
same schema and precedence as at start-up *before* anything is written, and written atomically
(temp file, fsync, rename), so a bad value or a full disk leaves the old file as it was.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import tomlkit

from ..backends.atomic import atomic_file

from .config import Config, ConfigError, env_overrides, load_config


def update_config_file(
    file: Path, changes: Mapping[str, Any], cli: list[tuple[str, Any]] | None = None,
    check: Callable[[Config], None] | None = None,
) -> tuple[Config, list[str]]:
    """Set `section.key` → value (None removes the key: back to the default / auto).

    Returns the effective config afterwards (file, environment and command line, as at start-up)
    and the changed keys that an environment variable or a command-line flag still overrides.
    Raises ConfigError, naming the key, when the result would not be a valid config, or when
    `check` (what this machine can run) refuses it; the file is then unchanged.
    """
    try:
        text = file.read_text(encoding="utf-8") if file.exists() else ""
        doc = tomlkit.parse(text)
    except (OSError, UnicodeDecodeError, tomlkit.exceptions.ParseError) as exc:
        raise ConfigError(f"cannot edit {file}: {exc}") from None
    for dotted, value in changes.items():
        section, _, key = dotted.partition(".")
        if section not in Config.model_fields or not key:
            raise ConfigError(f"{dotted!r} is not a config key")
        table = doc.get(section)
        if value is None:
            if table is not None and key in table:
                del table[key]
            continue
        if table is None:
            table = doc[section] = tomlkit.table()
        table[key] = value
    new_text = tomlkit.dumps(doc)
    # Validate exactly what start-up would read: the new file under today's env and flags.
    try:
        with atomic_file(file, fsync=True) as tmp:
            tmp.write_text(new_text, encoding="utf-8")
            try:
                config = load_config(tmp, cli=cli)
            except ConfigError as exc:  # the real file is untouched; name it, not the temp file
                raise ConfigError(str(exc).replace(str(tmp), str(file))) from None
            if check is not None:
                check(config)
    except OSError as exc:
        raise ConfigError(f"could not save {file}: {exc}; the file is unchanged") from None
    overridden_by = {dotted for dotted, _, _ in env_overrides(os.environ)} | {dotted for dotted, _ in cli or []}
    return config, sorted(k for k in changes if k in overridden_by)
