"""What the ASGI server logs of an exception that left an instrumented app: redacted and bounded.

uvicorn logs an exception escaping the app ("Exception in ASGI application") with its
traceback on ``uvicorn.error``, hypercorn ("Error in ASGI Framework") on ``hypercorn.error``,
message and all: a URL's ``user:password@`` or a ``Bearer``
token in it reached the server's log verbatim, where every record of ours is redacted
(``ckpt_events.checks.fit_for_log``). ``instrument()`` puts one filter on those loggers (once per
process); it changes only a record whose exception left an instrumented app's middleware
(noted by ``escaped`` in the request's own context: uvicorn logs it from the task that called
the app, and the note goes with that task), and only when a message in its chain holds a
credential or is too long: the record then carries ``fit_for_log``'s stand-in (same class name, module,
traceback and chain; each message redacted and cut). The exception object itself is never
touched: the app's own handlers and any outer middleware see it as it was raised.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from typing import Final

from ckpt_events.checks import fit_for_log

__all__ = ["SERVER_LOGGERS", "escaped", "redact_server_log"]

#: The loggers an ASGI server says an escaped exception on: uvicorn's (gunicorn's uvicorn
#: workers use it too) and hypercorn's ("Error in ASGI Framework", its default ``errorlog``).
SERVER_LOGGERS: Final = ("uvicorn.error", "hypercorn.error")


class _EscapedRedaction(logging.Filter):
    """Gives a record whose exception left an instrumented app ``fit_for_log``'s stand-in."""

    def filter(self, record: logging.LogRecord) -> bool:
        info = record.exc_info
        if info and info[1] is not None and info[1] is _ESCAPED.get():
            stand_in = fit_for_log(info[1])
            if stand_in is not info[1]:
                record.exc_info = (type(stand_in), stand_in, info[2])
                record.exc_text = None  # a handler's cached text of the original, if any
        return True


_FILTER: Final = _EscapedRedaction()
# Not a set of every escaped exception: an exception takes no weak reference, and strong ones
# would keep each failed request's frames. Set in the task serving the request, it ends with it.
_ESCAPED: Final[ContextVar[BaseException | None]] = ContextVar("ckpt_events_escaped", default=None)


def escaped(exc: BaseException) -> None:
    """Note that ``exc`` is leaving an instrumented app: the server's record of it, logged from
    the same task, is redacted."""
    _ESCAPED.set(exc)


def redact_server_log() -> None:
    """Put the filter on ``SERVER_LOGGERS`` (once: a second call changes nothing)."""
    for name in SERVER_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
