"""Checks of a sink's (or any caller's) arguments, with the library's own error classes.

``check_int`` and ``check_number`` are the one rule every constructor in ``ckpt_events``, its
sinks and the reference participants follows: a ``bool`` never counts as a number; the wrong
type raises ``InvalidTypeError``, a value out of range ``InvalidValueError`` (both an
``InvalidArgumentError``, and a ``TypeError`` or ``ValueError``), each with the caller's message,
which says what was expected and what was given. A sink of yours checks its own arguments the
same way ([writing a sink](../docs/writing-a-sink.md)).

``shown(value)`` is how such a message quotes what was given: ``repr(value)`` when short, else
cut to about ``SHOWN_CHARS`` characters with its size said (``'xxxx...xxxx' (10,000,000
characters)``), so a megabyte of bad input never becomes a megabyte of error message or log.

``said_in_log(exc)`` and ``fit_for_log(exc)`` are how the library's own log lines say a caught
exception, public so that a sink's (or the reference participants') log lines say it alike:
``said_in_log`` in the line's text (its class and its message in one line, cut at about 300
characters and its credentials redacted: ``ValueError: POST https://[REDACTED]@host failed``),
``fit_for_log`` as a record's ``exc_info`` (the exception itself when short, free of
credentials and of control and format characters, else a stand-in of the same class name and
traceback whose messages are cut at 2,000 characters, redacted and escaped line by line by
``escape``; the exception itself is left as it was); ``fit_text(text, limit)`` does the
same to any text (a peer's reply, a failure's detail): redacted, then cut with its size said. All follow the
``Redactor``'s message rule. ``escape(text)`` shows each control, format and line-separator
character of ``text`` as its Python escape (``\\x1b``, ``\\u202e``), so someone else's text on a
terminal cannot clear it or write a link; ``said_in_log`` (and the library's other one-line
sayings of a failure) apply it last.

``library_logger(name)`` is the logger the library itself logs on (a ``LibraryLogger``: the
stdlib logger of that name behind a ``LoggerAdapter``), public so that a sink's (or the
reference participants') records get the same two promises: a record's exception is fitted as
``fit_for_log`` fits it, and a handler of the user's that raises in ``emit`` loses that record,
never the caller (the stdlib lets it propagate out of ``logger.warning``).
"""

from __future__ import annotations

from ckpt_events._errors import SHOWN_CHARS, check_int, check_number, shown
from ckpt_events._inert import escape
from ckpt_events._logs import LibraryLogger, fit_for_log, fit_text, library_logger, said_in_log

__all__ = [
    "SHOWN_CHARS",
    "LibraryLogger",
    "check_int",
    "check_number",
    "escape",
    "fit_for_log",
    "fit_text",
    "library_logger",
    "said_in_log",
    "shown",
]
