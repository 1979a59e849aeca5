"""The attribute redaction rule every sink applies to user-supplied attributes.

A string value whose attribute name matches a redact key becomes ``"[REDACTED]"``. The
match is on the last dotted segment of the name (``user.api_key`` matches ``key`` only
through ``mode="substring"``), so our own ``nemo.gym.checkpoint.*`` names never match under
the default rule; a test checks that under every mode.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final, Literal

from ckpt_events._errors import InvalidTypeError, InvalidValueError, UnknownNameError

__all__ = ["DEFAULT_REDACT_KEYS", "REDACTED", "Redactor"]

REDACTED: Final = "[REDACTED]"
DEFAULT_REDACT_KEYS: Final = frozenset(
    {"prompt", "input_text", "output_text", "text", "password", "token", "secret", "key"}
)
MatchMode = Literal["exact", "last_segment", "substring"]
_MODES: Final = ("exact", "last_segment", "substring")


class Redactor:
    """Decides which attribute names are redacted, and redacts a mapping of attributes.

    ``mode`` is how a name matches a key: ``exact`` (the whole name), ``last_segment``
    (the part after the last dot; the default) or ``substring`` (anywhere in the name).
    ``keys`` is an iterable of non-empty names (``["token"]``; a bare string is refused).
    """

    __slots__ = ("_cache", "keys", "mode")

    def __init__(
        self, keys: Iterable[str] = DEFAULT_REDACT_KEYS, *, mode: MatchMode = "last_segment"
    ) -> None:
        if mode not in _MODES:
            raise UnknownNameError("redaction match mode", mode, _MODES)
        if isinstance(keys, str | bytes):  # Redactor("token") made the keys t, o, k, e and n
            raise InvalidTypeError(
                f"keys must be an iterable of names, not the string {keys!r}: pass [{keys!r}]"
            )
        try:
            listed = list(keys)
        except TypeError:
            raise InvalidTypeError(f"keys must be an iterable of names (str), not {keys!r}") from None
        for key in listed:
            if not isinstance(key, str):
                raise InvalidTypeError(f"each redact key must be a str, not {key!r}")
            if not key:  # matched every name ("substring") or names ending in a dot
                raise InvalidValueError("a redact key must not be empty")
        self.keys = frozenset(k.lower() for k in listed)
        self.mode = mode
        self._cache: dict[str, bool] = {}

    def matches(self, name: str) -> bool:
        """Whether string values under attribute ``name`` are redacted."""
        hit = self._cache.get(name)
        if hit is None:
            lowered = name.lower()
            if self.mode == "exact":
                hit = lowered in self.keys
            elif self.mode == "last_segment":
                hit = lowered.rsplit(".", 1)[-1] in self.keys
            else:
                hit = any(k in lowered for k in self.keys)
            if len(self._cache) < 4096:  # bounded: names are a small, fixed set in practice
                self._cache[name] = hit
        return hit

    def apply(self, attributes: Mapping[str, object]) -> dict[str, object]:
        """A copy of ``attributes`` with matching string values replaced by ``[REDACTED]``."""
        return {
            name: REDACTED if isinstance(value, str) and self.matches(name) else value
            for name, value in attributes.items()
        }
