"""Checks of a sink's (or any caller's) arguments, with the library's own error classes.

``check_int`` and ``check_number`` are the one rule every constructor in ``ckpt_events``, its
sinks and the reference participants follows: a ``bool`` never counts as a number; the wrong
type raises ``InvalidTypeError``, a value out of range ``InvalidValueError`` (both an
``InvalidArgumentError``, and a ``TypeError`` or ``ValueError``), each with the caller's message,
which says what was expected and what was given. A sink of yours checks its own arguments the
same way ([writing a sink](../docs/writing-a-sink.md)).
"""

from __future__ import annotations

from ckpt_events._errors import check_int, check_number

__all__ = ["check_int", "check_number"]
