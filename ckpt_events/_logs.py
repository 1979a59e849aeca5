"""The library's own loggers: ``library_logger(name)``, and what a record of ours may hold.

Each is a ``logging.LoggerAdapter`` over the stdlib logger of that name (every name under
``ckpt_events``: a user routes, filters or silences them as any other), and its records are the
stdlib's own, with the caller's file and line. Two things differ from calling the logger itself:

- A record's exception (``exc_info``) is said within bounds and without credentials: where a
  message in its chain is longer than ``LOGGED_MESSAGE_CHARS`` or holds a credential (the
  redaction rule of ``Redactor.redact_message``), the record carries a stand-in of the same
  class name, traceback and chain, whose message is cut and redacted. A sink raising an error
  that quoted a megabyte payload logged that megabyte, and a URL's ``user:password`` or a
  ``Bearer`` token in an error's text went to the server's log verbatim. So does one whose
  message or notes hold a control or format character (``escape``; a line break is kept, each
  line escaped): a remote participant's ``\x1b]8;;`` link, ``\u202e`` or ``\x1b[2J`` reached
  the terminal showing the log, in the traceback's last line.
- A handler of the user's that raises in ``emit`` (one not going through ``handleError``, which
  the stdlib does not catch) loses the record, not the caller: the bus's delivery task logging a
  failed sink raised out of its task group and took ``async with Bus()`` (and the application's
  code inside it) down; the OTLP export thread ended. With ``logging.raiseExceptions`` (the
  stdlib's switch for "tell me about logging errors") its first such error is said on stderr,
  in one line, as ``Handler.handleError`` would.
"""

from __future__ import annotations

import io
import logging
import sys
import traceback
from collections.abc import Mapping
from types import FrameType, TracebackType
from typing import Final

from ckpt_events._inert import escape
from ckpt_events._public_home import publish
from ckpt_events._redact import DEFAULT_REDACTOR

__all__ = [
    "LOGGED_MESSAGE_CHARS",
    "ONE_LINE_CHARS",
    "LibraryLogger",
    "fit_for_log",
    "fit_line",
    "library_logger",
    "one_line",
    "said_in_log",
]

#: The longest message of an exception a record of ours carries (a few lines of a validation
#: error stay whole; a payload quoted in an error does not).
LOGGED_MESSAGE_CHARS: Final = 2000
#: The longest message of one exception said inside a log line's own text (``said_in_log``).
SAID_CHARS: Final = 300
#: Redacted before the cut, this much further: a credential across the cut is redacted whole.
_REDACT_SLACK: Final = 400
#: Exceptions of a chain (causes, contexts, a group's members) given stand-ins at most; past
#: them a chain ends (a cycle, or thousands of chained errors, stays bounded).
_MOST_EXCEPTIONS: Final = 50
_RULE: Final = DEFAULT_REDACTOR
# The stdlib logging module's own file: its frames are skipped to find the caller, as
# ``Logger.findCaller`` does (``logging._srcfile`` is private).
_LOGGING_FILE: Final = logging.Logger.log.__code__.co_filename

ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None]


def _message(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # its own __str__ raised; we are already saying a failure
        return "(its message could not be read)"


def fit_text(text: str, limit: int, *, sized: bool = True) -> str:
    """``text`` (a failure's message, a peer's reply) with its credentials redacted by the
    default ``Redactor`` rule, then cut at ``limit`` characters, its size said (if ``sized``)
    when longer. Redacted before the cut: a credential across it goes whole."""
    fitted = _RULE.redact_message(text[: limit + _REDACT_SLACK])
    if len(text) > limit or len(fitted) > limit:
        return f"{fitted[:limit]}... ({len(text):,} characters)" if sized else f"{fitted[:limit]}..."
    return fitted


def fit_line(text: str, limit: int) -> str:
    """``text`` on one line (each run of whitespace one space), fitted by ``fit_text`` (redacted,
    then cut), at most ``limit`` characters in all: a cut text ends in ``...`` within them. Its
    control and format characters are then shown as escapes (``escape``; each up to 10
    characters): a peer's ``\\x1b[2J`` in a log line cleared the terminal showing it."""
    fitted = fit_text(" ".join(text.split()), limit, sized=False)
    return escape(fitted if len(fitted) <= limit else f"{fitted[: limit - 3]}...")


#: The longest message ``one_line`` keeps of an error (a sink's may carry a whole payload).
ONE_LINE_CHARS: Final = 300


def one_line(exc: BaseException) -> str:
    """``exc`` said in one line, its class first (``ValueError: batch 1 refused``), its message
    redacted by the default ``Redactor`` rule and cut at ``ONE_LINE_CHARS``: how a caught error of
    someone else's code (a sink's ``handle``) is kept in stats and results (``SinkStats.error``,
    a replay's failures), where a URL's user:password or a Bearer token in it stayed verbatim.
    Never raises, whatever the error's ``__str__`` does."""
    try:
        said = str(exc)
    except Exception:  # its own __str__ raised; we are already handling a failure
        said = "(its message could not be read)"
    said = fit_line(said, ONE_LINE_CHARS)
    return f"{type(exc).__name__}: {said}" if said else type(exc).__name__


def said_in_log(exc: BaseException) -> str:
    """``exc`` for the text of a log line: its class, its message in one line, cut and redacted
    (``ValueError: POST https://[REDACTED]@host failed``), its control and format characters
    shown as escapes (``escape``): a participant's refusal quoting ``\\x1b[2J`` cleared the
    terminal of the controller's log."""
    said = escape(fit_text(" ".join(_message(exc)[: SAID_CHARS + _REDACT_SLACK].split()), SAID_CHARS))
    return f"{type(exc).__name__}: {said}" if said else type(exc).__name__


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what a traceback of it shows (causes, contexts, a group's members), bounded."""
    seen: dict[int, BaseException] = {}
    todo = [exc]
    while todo and len(seen) < _MOST_EXCEPTIONS:
        one = todo.pop()
        if id(one) in seen:
            continue
        seen[id(one)] = one
        todo.extend(e for e in (one.__cause__, one.__context__) if e is not None)
        if isinstance(one, BaseExceptionGroup):
            todo.extend(one.exceptions)
    return list(seen.values())


def _escaped(text: str) -> str:
    """``text`` with each line's control and format characters shown as escapes (``escape``),
    its line breaks kept: a message of a few lines stays on its lines, as a traceback shows it."""
    return "\n".join(escape(line) for line in text.split("\n"))


def _shown_raw(text: str) -> bool:
    """Whether ``text`` can be shown as it is: short, no credential, nothing a terminal obeys."""
    return len(text) <= LOGGED_MESSAGE_CHARS and _RULE.redact_message(text) == text and _escaped(text) == text


def _needs_stand_in(exc: BaseException) -> bool:
    for one in _chain(exc):
        if not _shown_raw(_message(one)):
            return True
        if any(not _shown_raw(str(note)) for note in getattr(one, "__notes__", ())):
            return True
    return False


def fit_for_log(exc: BaseException) -> BaseException:
    """``exc`` itself when every message its traceback shows is short and holds no credential
    and no control or format character; else a stand-in (``exc`` is left as it is): same class
    name and module, same traceback, its chain stood in for alike, each message cut at
    ``LOGGED_MESSAGE_CHARS``, redacted, and its control and format characters escaped."""
    if not _needs_stand_in(exc):
        return exc
    made: dict[int, BaseException] = {}
    return _stand_in(exc, made)


def _stand_in(exc: BaseException, made: dict[int, BaseException]) -> BaseException:
    done = made.get(id(exc))
    if done is not None:
        return done
    kind = type(exc)
    names = {"__module__": kind.__module__, "__qualname__": kind.__qualname__}
    # A group's str() adds "(2 sub-exceptions)", which its traceback adds again.
    said = exc.message if isinstance(exc, BaseExceptionGroup) else _message(exc)
    message = _escaped(fit_text(said, LOGGED_MESSAGE_CHARS))
    stand_in: BaseException
    if isinstance(exc, BaseExceptionGroup):
        # Its members first: a group cannot hold itself, and a cycle through a member's
        # context ends at the member, stood in for before its chain is followed.
        members = [_plain(_stand_in(e, made)) for e in exc.exceptions[:_MOST_EXCEPTIONS]]
        stand_in = type(kind.__name__, (ExceptionGroup,), names)(message, members)
    else:
        stand_in = type(kind.__name__, (Exception,), names)(message)
    made[id(exc)] = stand_in
    stand_in.__traceback__ = exc.__traceback__
    stand_in.__suppress_context__ = exc.__suppress_context__
    for note in list(getattr(exc, "__notes__", ()))[:_MOST_EXCEPTIONS]:
        stand_in.add_note(_escaped(fit_text(str(note), LOGGED_MESSAGE_CHARS)))
    if len(made) < _MOST_EXCEPTIONS:
        if exc.__cause__ is not None:
            stand_in.__cause__ = _stand_in(exc.__cause__, made)
        if exc.__context__ is not None:
            stand_in.__context__ = _stand_in(exc.__context__, made)
    return stand_in


def _plain(exc: BaseException) -> Exception:
    # An ExceptionGroup holds Exceptions only; every stand-in is one.
    return exc if isinstance(exc, Exception) else Exception(str(exc))


class LibraryLogger(logging.LoggerAdapter[logging.Logger]):
    """A logger of ours: the stdlib's records, fitted exceptions, and a raising handler contained."""

    def __init__(self, logger: logging.Logger) -> None:
        super().__init__(logger, None)
        self._told = False  # a handler raised and stderr was told, once

    def log(  # type: ignore[override]
        self,
        level: int,
        msg: object,
        *args: object,
        exc_info: object = None,
        stack_info: bool = False,
        stacklevel: int = 1,
        extra: Mapping[str, object] | None = None,
    ) -> None:
        logger = self.logger
        if not logger.isEnabledFor(level):
            return
        caller = _caller(stacklevel)
        info = _exc_info(exc_info)
        if info is not None:
            fitted = fit_for_log(info[1])
            info = (type(fitted), fitted, fitted.__traceback__)
        stack = None
        if stack_info and caller is not None:
            out = io.StringIO()
            out.write("Stack (most recent call last):\n")
            traceback.print_stack(caller, file=out)
            stack = out.getvalue().rstrip("\n")
        where = ("(unknown file)", 0, "(unknown function)")
        if caller is not None:
            where = (caller.f_code.co_filename, caller.f_lineno, caller.f_code.co_name)
        try:
            record = logger.makeRecord(
                logger.name, level, where[0], where[1], msg, args, info, where[2], extra, stack
            )
            logger.handle(record)
        except Exception as exc:  # a handler's or filter's own failure: the record is lost, not the caller
            if logging.raiseExceptions and not self._told:
                self._told = True
                sys.stderr.write(
                    f"--- Logging error: a handler of logger {logger.name!r} raised "
                    f"{said_in_log(exc)}; a record of ckpt_events was lost (said once) ---\n"
                )


def _caller(stacklevel: int) -> FrameType | None:
    """The frame that called us, past the logging module's own (``LoggerAdapter.warning``)."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename == _LOGGING_FILE:
        frame = frame.f_back  # type: ignore[assignment]
    for _ in range(stacklevel - 1):
        if frame is None or frame.f_back is None:
            break
        frame = frame.f_back
    return frame


def _exc_info(exc_info: object) -> ExcInfo | None:
    """``exc_info`` as ``Logger`` reads it: an exception, a ``sys.exc_info()`` tuple, or true
    for the exception being handled."""
    if not exc_info:
        return None
    if isinstance(exc_info, BaseException):
        return (type(exc_info), exc_info, exc_info.__traceback__)
    if isinstance(exc_info, tuple) and len(exc_info) == 3 and isinstance(exc_info[1], BaseException):
        return (type(exc_info[1]), exc_info[1], exc_info[2])
    current = sys.exc_info()
    return None if current[1] is None else (type(current[1]), current[1], current[2])


def library_logger(name: str) -> LibraryLogger:
    """The logger ``name`` (one under ``ckpt_events``) as the library logs on it."""
    return LibraryLogger(logging.getLogger(name))


# Pickles, reprs and tracebacks name the public module (_public_home.py says why).
publish("ckpt_events.checks", LibraryLogger, fit_for_log, fit_text, library_logger, said_in_log)
