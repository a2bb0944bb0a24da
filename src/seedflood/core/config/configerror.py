"""The one error every configuration check raises, and the one-line check that raises it.

Owns: `ConfigError` (a configuration problem in one line naming the key) and `require`, the check
the section dataclasses' `__post_init__` use. The CLI maps ConfigError to exit status 2.

Assumes nothing: pure Python.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration problem; the message is one line naming the key."""

    def __init__(self, message: str) -> None:
        # One line whatever went into it (a key or value quoted from a file may hold a newline).
        super().__init__(str(message).replace("\r", "\\r").replace("\n", "\\n"))


def require(cond: bool, key: str, msg: str) -> None:
    """Raise ConfigError("key: msg") unless `cond`."""
    if not cond:
        raise ConfigError(f"{key}: {msg}")
