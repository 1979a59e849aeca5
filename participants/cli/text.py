"""Strings from a log or a participant made inert before the command line shows them.

An instance name, a kind, a checkpoint id, a step or an error message is the user's text, read
from a file anyone could have written: on a terminal it must not clear the screen, set the
window title or colour what follows, and in a page it must not be markup. ``escape`` is the one
rule for what a string may put on a terminal (the library's own, ``ckpt_events.checks.escape``,
which its log lines follow too); ``escape_html`` is the same text for HTML and SVG.

Rich markup is not this module's business: a string given to rich as a ``str`` is parsed as
markup (``[link=...]`` writes an OSC 8 hyperlink), so renderers hand rich a ``Text`` built from
``escape(...)``, which rich never parses.
"""

from __future__ import annotations

import html
import sys
from typing import Final

from ckpt_events.checks import escape

__all__ = ["escape", "escape_html", "say", "short_id"]

#: A checkpoint id longer than this is shown cut (its start, ``...``, its end, its length).
_WHOLE_ID: Final = 80
_ID_HEAD: Final = 48
_ID_TAIL: Final = 16


def short_id(checkpoint_id: str | None, missing: str = "") -> str:
    """A checkpoint id as the report shows it (still to ``escape``): ``missing`` for none, ``''``
    for the empty one (it read as no id: ``#4 checkpoint , start ...``), one past 80 characters
    cut to its start and end with its length (a 10 KB id filled 61 lines of the overview)."""
    if checkpoint_id is None:
        return missing
    if checkpoint_id == "":
        return "''"
    if len(checkpoint_id) <= _WHOLE_ID:
        return checkpoint_id
    return f"{checkpoint_id[:_ID_HEAD]}...{checkpoint_id[-_ID_TAIL:]} ({len(checkpoint_id):,} characters)"


def escape_html(text: object) -> str:
    """``escape(text)`` for HTML and SVG text and attribute values (``html.escape`` with quotes):
    well-formed XML, since no control character but the shown escape is left."""
    return html.escape(escape(text), quote=True)


def say(line: str) -> None:
    """``line`` on stderr with its newline in one write, flushed. A server and its workers share
    stderr, and ``print`` writes a line and its newline apart (stderr is unbuffered): another
    process's line landed between them ("worker 0: interruptedworker 0 lost: connection
    ended", a clean-clone CI run)."""
    sys.stderr.write(f"{line}\n")
    sys.stderr.flush()
