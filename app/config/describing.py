"""The configuration in words: every key with its default, and the effective values."""

from __future__ import annotations

from .schema import Config


def describe_keys() -> str:
    """All keys with their defaults, for `swarmling config --keys` and error hints."""
    out = []
    for section, field in Config.model_fields.items():
        out.append(f"[{section}]")
        for key, f in field.annotation.model_fields.items():
            default = "auto (per hardware)" if f.default is None else repr(f.default)
            out.append(f"  {key} = {default}")
    return "\n".join(out)


def describe_config(config: Config) -> str:
    """The effective configuration, for `swarmling config`."""
    out = []
    for section, values in config.model_dump().items():
        out.append(f"[{section}]")
        out.extend(f"{key} = {'auto' if value is None else repr(value)}" for key, value in values.items())
    return "\n".join(out)
