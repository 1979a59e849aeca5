"""Exceptions raised by ckpt_events.

The tree, all in one place::

    CkptEventsError                 root: catch this to catch everything we raise
    ├── UnknownNameError            a name outside a closed vocabulary (also a ValueError)
    ├── InvalidArgumentError        a value of the wrong type or range (also a TypeError)
    └── ConfigurationError          a bad setting or environment variable (also a ValueError)

The bus itself never raises into an emitting caller; these come from constructors and
validation at the public API. This is the core's part of the tree; ``participants.errors``
draws the whole project's (the core, the sinks and the participants) in its docstring.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["CkptEventsError", "ConfigurationError", "InvalidArgumentError", "UnknownNameError"]


class CkptEventsError(Exception):
    """Root of every exception that ckpt_events raises on purpose."""


class UnknownNameError(CkptEventsError, ValueError):
    """A name is not a member of its closed vocabulary; the message lists the valid names."""

    def __init__(self, what: str, name: object, valid: Iterable[str]) -> None:
        self.what = what
        self.name = name
        self.valid = tuple(valid)
        super().__init__(f"unknown {what} {name!r}; valid values: {', '.join(self.valid)}")


class InvalidArgumentError(CkptEventsError, TypeError):
    """An argument has the wrong type or is out of range; the message says what to pass."""


class ConfigurationError(CkptEventsError, ValueError):
    """A configuration value (argument or environment variable) is invalid."""
