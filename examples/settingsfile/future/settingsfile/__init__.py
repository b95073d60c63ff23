"""Application settings: defaults, overridden by a TOML file."""

import tomli

DEFAULTS = {"host": "127.0.0.1", "port": 8000, "debug": False}


def load(text: str, defaults: dict | None = None) -> dict:
    """The settings a TOML document gives, over `defaults` (DEFAULTS when None)."""
    settings = dict(DEFAULTS if defaults is None else defaults)
    settings.update(tomli.loads(text))
    return settings
