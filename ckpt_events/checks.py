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
"""

from __future__ import annotations

from ckpt_events._errors import SHOWN_CHARS, check_int, check_number, shown

__all__ = ["SHOWN_CHARS", "check_int", "check_number", "shown"]
