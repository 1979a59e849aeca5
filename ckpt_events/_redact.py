"""The redaction rule every sink applies to user-supplied attributes and to error messages.

A string value whose attribute name matches a redact key becomes ``"[REDACTED]"``. The
match is on the last dotted segment of the name (``user.api_key`` matches ``key`` only
through ``mode="substring"``), so our own ``nemo.gym.checkpoint.*`` names never match under
the default rule; a test checks that under every mode.

An error message (an exception's text: ``str(exc)``) is free text, and may hold a credential:
``redact_message`` replaces the value of a ``name=value`` or ``name: value`` pair whose name
matches (as an attribute's would, or by one of its words: ``access_token`` or ``accessToken`` by
``token``), the credentials after ``Bearer``/``Basic``/``Digest``/``Token``, and a URL's user and
password (``https://[REDACTED]@host``); the rest of the message is kept, for the diagnosis. OpenTelemetry's
SDK records ``exception.message`` verbatim; Sentry's SDK scrubs by key names only (headers,
variables), and its server by value patterns as well: here both, on by default, and
``Redactor(messages=False)`` keeps messages verbatim.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Final, Literal

from ckpt_events._errors import InvalidTypeError, InvalidValueError, UnknownNameError, shown
from ckpt_events._public_home import publish

__all__ = ["DEFAULT_REDACTOR", "DEFAULT_REDACT_KEYS", "REDACTED", "Redactor"]

REDACTED: Final = "[REDACTED]"
DEFAULT_REDACT_KEYS: Final = frozenset(
    {"prompt", "input_text", "output_text", "text", "password", "token", "secret", "key"}
)
MatchMode = Literal["exact", "last_segment", "substring"]
_MODES: Final = ("exact", "last_segment", "substring")
#: A URL's ``user:password@`` (or ``token@``): everything between ``//`` and the last ``@`` before
#: the path, as URL parsers split it: a password may hold an unencoded ``@`` (``:p@ss@host``).
#: The scheme is read from the start of its run of scheme characters, once (``*+``): searched
#: from each character of a long run to its end, a 30,000-character blob took 14 s.
_USERINFO: Final = re.compile(r"(?P<scheme>(?<![A-Za-z0-9+.-])[A-Za-z0-9+.-]++://)[^/?#\s]+@")
#: A value after an HTTP auth scheme: ``Authorization: Bearer eyJ...``, ``Basic dXNlcjpw...``.
#: Never another scheme word: in ``wrong bearer token`` the word ``token`` is prose, and the
#: search goes on at it (``bearer token ghp_...``).
_SCHEMES: Final = ("bearer", "basic", "digest", "token")
_AUTH: Final = re.compile(
    r"\b(?P<scheme>Bearer|Basic|Digest|Token)(?P<gap>\s+)"
    r"(?!(?:Bearer|Basic|Digest|Token)\b)(?P<credential>[A-Za-z0-9._~+/=-]+)",
    re.IGNORECASE,
)
#: A word of prose after ``basic``, ``digest`` or ``token`` (``token expired``, ``basic checks``,
#: ``digest mismatch``): lowercase letters only, never a credential (base64, hex and vendors'
#: tokens mix in capitals, digits or ``_``). After ``Bearer`` anything is a credential.
_PROSE: Final = re.compile(r"[a-z]+")
#: ``name=value``, ``name: value``, ``"name": "value"``: the value is quoted (to its closing quote,
#: past an escaped one as JSON writes it, or to the end of a message cut short), or runs to a space
#: or a delimiter of query strings, lists and JSON (``&``, ``,``, ``;``, quotes, brackets). The value
#: is looked ahead at, not consumed: in ``failed: password=x`` the search goes on at ``password``.
#: The name is the whole run of name characters (``[\w.-]``), read once from its start (as for
#: ``_USERINFO``); ``_redact_pairs`` drops what comes before its first letter or ``_``.
_PAIR: Final = re.compile(
    r"""(?P<name>(?<![\w.-])[\w.-]++)["']?\s*[=:]\s*"""
    r"""(?=(?P<value>"(?:[^"\\]|\\.)*(?:"|\Z)|'(?:[^'\\]|\\.)*(?:'|\Z)|[^\s&,;"'<>()\[\]{}]+))""",
    re.DOTALL,
)
#: What precedes a name's first letter or ``_`` in its run (``1password``: ``password``).
_NAME_START: Final = re.compile(r"^[^A-Za-z_]*")
#: Words of a name in a message, each matched as a key: ``api_token``, ``db-password``, ``x.secret``.
_WORDS: Final = re.compile(r"[._-]+")
#: Where a camelCase name's words meet (``accessToken``, ``APIKey``), as JSON bodies spell names.
_CAMEL: Final = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
#: Distinct messages whose redaction is remembered: a failing dependency repeats one message.
_MESSAGE_CACHE: Final = 1024


def _auth_credential(match: re.Match[str]) -> str:
    """An ``_AUTH`` match with its credential redacted, or whole when that is a word of prose."""
    if match["scheme"].lower() != "bearer" and _PROSE.fullmatch(match["credential"]):
        return match[0]
    return f"{match['scheme']}{match['gap']}{REDACTED}"


class Redactor:
    """Decides which attribute names are redacted, and redacts a mapping of attributes.

    ``mode`` is how a name matches a key: ``exact`` (the whole name), ``last_segment``
    (the part after the last dot; the default) or ``substring`` (anywhere in the name).
    ``keys`` is an iterable of non-empty names (``["token"]``; a bare string is refused).
    ``messages`` (default ``True``): error messages are redacted too (``redact_message``), by
    every sink that writes them (the JSON-lines log, a ``LoggingSink`` record's event, a span's
    status description and ``exception.message``); ``False`` keeps them verbatim.
    """

    __slots__ = ("_cache", "_messages", "keys", "messages", "mode")

    def __init__(
        self,
        keys: Iterable[str] = DEFAULT_REDACT_KEYS,
        *,
        mode: MatchMode = "last_segment",
        messages: bool = True,
    ) -> None:
        if mode not in _MODES:
            raise UnknownNameError("redaction match mode", mode, _MODES)
        if isinstance(keys, str | bytes):  # Redactor("token") made the keys t, o, k, e and n
            raise InvalidTypeError(
                f"keys must be an iterable of names, not the string {shown(keys)}: pass [{shown(keys)}]"
            )
        try:
            listed = list(keys)
        except TypeError:
            raise InvalidTypeError(f"keys must be an iterable of names (str), not {shown(keys)}") from None
        for key in listed:
            if not isinstance(key, str):
                raise InvalidTypeError(f"each redact key must be a str, not {shown(key)}")
            if not key:  # matched every name ("substring") or names ending in a dot
                raise InvalidValueError("a redact key must not be empty")
        if not isinstance(messages, bool):
            raise InvalidTypeError(f"messages must be True or False, not {shown(messages)}")
        self.keys = frozenset(k.lower() for k in listed)
        self.mode = mode
        self.messages = messages
        self._cache: dict[str, bool] = {}
        self._messages: dict[str, str] = {}

    def matches(self, name: str) -> bool:
        """Whether string values under attribute ``name`` are redacted."""
        hit = self._cache.get(name)
        if hit is None:
            hit = self._match(name.lower())
            if len(self._cache) < 4096:  # bounded: names are a small, fixed set in practice
                self._cache[name] = hit
        return hit

    def _match(self, lowered: str) -> bool:
        if self.mode == "exact":
            return lowered in self.keys
        if self.mode == "last_segment":
            return lowered.rsplit(".", 1)[-1] in self.keys
        return any(k in lowered for k in self.keys)

    def redact_message(self, message: str) -> str:
        """``message`` with its credentials replaced by ``[REDACTED]`` (see the module's
        docstring), or as it is when ``messages`` is off or it holds none."""
        if not self.messages or not message:
            return message
        done = self._messages.get(message)
        if done is None:
            done = _USERINFO.sub(rf"\g<scheme>{REDACTED}@", message)
            done = self._redact_pairs(_AUTH.sub(_auth_credential, done))
            if len(self._messages) < _MESSAGE_CACHE:
                self._messages[message] = done
        return done

    def _redact_pairs(self, text: str) -> str:
        parts: list[str] = []
        done = 0  # text[:done] is in parts
        for match in _PAIR.finditer(text):  # bounded: each match moves on past a name
            value = match["value"]
            if (
                match.start() < done
                or value.startswith(REDACTED)
                or value.lower() in _SCHEMES  # ``Authorization: Bearer x``: _AUTH redacted the x
                or not self._names_a_secret(_NAME_START.sub("", match["name"]))
            ):
                continue
            quoted = value[0] in "\"'"  # a quoted value keeps its quotes: JSON stays JSON
            parts += [text[done : match.end()], f"{value[0]}{REDACTED}{value[0]}" if quoted else REDACTED]
            done = match.end() + len(value)
        return "".join(parts) + text[done:] if parts else text

    def _names_a_secret(self, name: str) -> bool:
        """Whether a name in a message matches: as an attribute's name would, or, unless
        ``mode="exact"``, by one of its words (``access_token``, ``db-password``, ``apiKey``). Not cached in
        ``matches``'s cache: a message's words would crowd out the attributes' names."""
        lowered = name.lower()
        if self._match(lowered):
            return True
        if self.mode == "exact":
            return False
        return any(word in self.keys for word in _WORDS.split(_CAMEL.sub("_", name).lower()))

    def apply(self, attributes: Mapping[str, object]) -> dict[str, object]:
        """A copy of ``attributes`` with matching string values replaced by ``[REDACTED]``."""
        return {
            name: REDACTED if isinstance(value, str) and self.matches(name) else value
            for name, value in attributes.items()
        }


#: The default rule, for what the library says of errors it caught (``one_line``, log records).
DEFAULT_REDACTOR: Final = Redactor()


# Pickles, reprs and tracebacks name the public module (_public_home.py says why).
publish("ckpt_events", Redactor)
