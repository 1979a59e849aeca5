"""What an OTLP/HTTP endpoint URL may be: checked where it is given, not at the first export.

``endpoint_problem`` says what is wrong with one, and the sender (``InvalidValueError``) and the
environment parser (``ConfigurationError`` naming the variable) make it their own error. Taken as
they were, ``http://c:4318#x`` and ``http://c:4318?k=v`` as a base had the signal path land in
the fragment or the query (every export posted to ``/``), a space or an ``é`` in the path or a
host ``a..b`` made each export raise, and ``user:password@`` was never sent but logged.
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import urlsplit

from ckpt_events import Redactor

__all__ = ["endpoint_problem", "safe_url"]

#: What ``http.client`` refuses in a request target (a space or a control character; it
#: encodes the rest as ASCII).
_UNSENDABLE: Final = re.compile(r"[\x00-\x20\x7f]")


def safe_url(url: str) -> str:
    """``url`` for an error or a log line, with a user and password and a credential in its
    query (``?api_key=...``) redacted: those lines are printed, logged and collected."""
    return Redactor().redact_message(url)


def endpoint_problem(url: str, *, base: bool) -> str | None:
    """What is wrong with ``url`` as an OTLP/HTTP endpoint, said to follow the URL in a message,
    or ``None``; ``base``: a signal path (``/v1/traces``) is to be appended to it."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # "Invalid IPv6 URL": an unclosed [
        return f"is not a valid URL ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "is not an http(s) URL such as 'http://127.0.0.1:4318'"
    try:
        port = parts.port  # raises on a port that is not one
    except ValueError:
        return "has an invalid port"
    try:
        parts.hostname.encode("idna")  # as the connect does: it raised at every export
    except UnicodeError:
        return "has a host name that cannot be one (an empty label, or one over 63 characters)"
    if port == 0:
        return "has an invalid port (0: nothing listens there)"
    if parts.username is not None or parts.password is not None:
        return "holds credentials, which are never sent: give them as a header (Authorization=...)"
    if "#" in url:
        return "has a #fragment, which HTTP never sends"
    if base and (parts.query or url.endswith("?")):
        return "has a ?query, which the signal path would be appended to: give it in a per-signal endpoint"
    target = parts.path + parts.query
    if _UNSENDABLE.search(target) or not target.isascii():  # http.client sends it as ASCII
        return "has a space, a control or a non-ASCII character in its path (percent-encode it, e.g. %20)"
    return None
