"""What an OTLP request header may be: an HTTP token for its name (not one the sender sets
itself: Content-Type, Content-Encoding, Content-Length, Transfer-Encoding), one line of latin-1
for its value.

``http.client`` refuses anything else only when a request is made, on the export thread: a
value of ``%E2%82%AC`` in ``OTEL_EXPORTER_OTLP_HEADERS`` (a euro sign, not latin-1) or one
holding CR/LF was accepted by ``configure()`` and then raised at the first export. So headers are
checked where they are given: ``header_problem`` says what is wrong with one, and the sinks
(``check_headers``) and the environment parser turn that into their own precise error.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from ckpt_events import InvalidTypeError, InvalidValueError
from ckpt_events._errors import shown
from ckpt_events.vocab import REDACTED

__all__ = ["HEADER_RULES", "check_headers", "header_problem"]

#: RFC 9110's ``token``: the characters a header name may hold.
_TOKEN: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BREAKS: Final = ("\r", "\n", "\0")
#: Headers the sender writes itself, refused as given: a ``Content-Length: 5`` sent 5 bytes of
#: each body (counted as exported), ``Transfer-Encoding`` left the collector waiting, and a
#: ``content-type`` or ``Content-Encoding`` went out beside or against the real one.
_OWN: Final = {
    "content-length": "the body's length",
    "transfer-encoding": "the body's length",
    "content-type": "the protocol (OTEL_EXPORTER_OTLP_PROTOCOL, protocol=)",
    "content-encoding": "the compression (OTEL_EXPORTER_OTLP_COMPRESSION, compression=)",
}
#: What is valid, said once for every error message.
HEADER_RULES: Final = (
    "a header name is an HTTP token (letters, digits and !#$%&'*+-.^_`|~) other than "
    "Content-Type, Content-Encoding, Content-Length and Transfer-Encoding, "
    "a value latin-1 text without CR, LF or NUL"
)


def _name_said(name: str) -> str:
    """A name that is not a token, for an error: up to and with its first character a name may
    not hold, the rest ``[REDACTED]``. Whole, it showed a credential: ``Authorization: Basic
    ...==`` (written as curl has it) is read as the name ``Authorization: Basic ...``, its
    base64 padding taken for the ``=`` of a pair."""
    bad = next((at for at, char in enumerate(name) if not _TOKEN.fullmatch(char)), len(name))
    return name[: bad + 1] + (REDACTED if bad + 1 < len(name) else "")


def header_problem(name: str, value: str) -> str | None:
    """What is wrong with the header ``name: value`` (both ``str``), or ``None`` when it can be sent."""
    if not _TOKEN.fullmatch(name):
        return f"header name {shown(_name_said(name))} is not an HTTP token"
    if name.lower() in _OWN:
        return f"header {shown(name)} is the sender's own, set from {_OWN[name.lower()]}"
    if any(mark in value for mark in _BREAKS):
        return f"header {shown(name)} has a CR, LF or NUL in its value"
    try:
        value.encode("latin-1")
    except UnicodeEncodeError as exc:  # the character, not the value: a value is a credential, often
        return f"header {shown(name)} has a value that is not latin-1 text ({shown(value[exc.start])} in it)"
    return None


def check_headers(headers: Mapping[str, str] | None, where: str = "headers") -> dict[str, str]:
    """``headers`` as a dict when every name and value can be sent; else ``InvalidTypeError`` (not
    a mapping of ``str`` to ``str``) or ``InvalidValueError`` naming ``where`` and the header."""
    if headers is None:
        return {}
    if not isinstance(headers, Mapping):
        raise InvalidTypeError(f"{where} must be a mapping of header names to values, not {shown(headers)}")
    checked: dict[str, str] = {}
    for name, value in headers.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise InvalidTypeError(  # the value's type only: a value is a credential, often
                f"{where} must map str names to str values, not {shown(name)}: {type(value).__name__}"
            )
        problem = header_problem(name, value)
        if problem is not None:
            raise InvalidValueError(f"{where}: {problem}; {HEADER_RULES}")
        checked[name] = value
    return checked
