"""What a trace's failed spans said: each exception's message, once per message.

A waterfall row names a failed span's exception type (``commit judge-0 ✗ ValueError``); its
message (``error_message``, cut at 1,024 characters and redacted by the library) answers why,
and was only in the JSON-lines log. Here each distinct (type, message) of a trace is one line,
clipped to ``MESSAGE_SHOWN`` characters on one line, with which spans said it and whose they
are: an exception that left a step and then its operation, or the same failure on sixteen
participants, is said once. Each is what those spans recorded, said by whom (``of``), not a
cause: a controller's error that relays a participant's refusal is the controller's words. A
failed span whose event has no message adds nothing. The lines are the user's text still: a
renderer escapes them (``text.escape``, ``escape_html``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from ckpt_events.participants.cli.report.cancels import mark
from ckpt_events.participants.cli.report.folding import error_type
from ckpt_events.participants.cli.report.model import Span
from ckpt_events.participants.cli.words import clipped, counted

__all__ = ["MESSAGE_SHOWN", "failure_lines", "said"]

#: A failed span's ``Type: message`` is cut (at a word) past this many characters.
MESSAGE_SHOWN: Final = 80
#: Participants named on a failure's line; the rest are counted.
_WHO_SHOWN: Final = 3
#: Distinct failures said per trace; the rest are counted on one more line.
_LINES: Final = 8


def said(s: Span) -> str | None:
    """``ValueError: bad rows: [...]``, clipped to ``MESSAGE_SHOWN`` on one line: the exception
    type (without its module path) and message of a failed span; ``None`` when it did not fail
    or its event holds no message."""
    failed = error_type(s)
    if failed is None:
        return None
    message = s.details.get("error_message")
    if not isinstance(message, str) or not message.strip():
        return None
    return clipped(f"{failed.rsplit('.', 1)[-1]}: {message}", MESSAGE_SHOWN)


def failure_lines(spans: Sequence[Span]) -> list[str]:
    """One line per distinct failure of ``spans`` (in the order first seen, the controller's
    last): ``✗ ValueError:
    bad rows: [...] (commit, upload of judge/judge-0)``, or ``(prepare of 16 participants:
    environment/env-0, ... and 13 more)``; ``[]`` when no failed span holds a message."""
    # Dicts as ordered sets: a list's ``in`` made one message of 40,000 participants 7.0 s.
    seen: dict[str, tuple[dict[str, None], dict[str, None]]] = {}
    marks: dict[str, str] = {}  # ``✗``, or ``⊘`` for a cancellation (its type's name starts ``text``)
    for s in spans:
        text = said(s)
        if text is None:
            continue
        marks.setdefault(text, mark(error_type(s)))
        names, whos = seen.setdefault(text, ({}, {}))
        names.setdefault(s.short)
        whos.setdefault(s.who)
    # A controller's error relays what its participants said (``commit failed: resources-0:
    # refused: ...``): theirs come first, the answer to why, then its own.
    relayed = sorted(seen.items(), key=lambda item: all(who == "controller" for who in item[1][1]))
    lines = []
    for text, (names, said_by) in relayed[:_LINES]:
        by = list(said_by)
        where = ", ".join(by[:_WHO_SHOWN])
        if len(by) > _WHO_SHOWN:
            where = f"{counted(len(by), 'participant')}: {where} and {len(by) - _WHO_SHOWN:,} more"
        lines.append(f"{marks[text]} {text} ({', '.join(names)} of {where})")
    if len(seen) > _LINES:
        lines.append(f"... and {counted(len(seen) - _LINES, 'more distinct failure')}")
    return lines
