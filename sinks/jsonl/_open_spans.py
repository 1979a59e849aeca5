"""Spans a log leaves open, closed as truncated: what a crash mid-operation leaves behind.

A participant killed during a commit wrote ``operation_started`` and nothing more, so its trace
showed the controller calling a participant that did nothing. ``OpenSpans`` pairs each
``*Started`` event with its ``*Finished`` by span id, per process (kind, instance, worker), and
``close()`` turns what is still open into the ``*Finished`` event the process never wrote: ended
at that process's last event, outcome ``error`` (error type ``Truncated``) and the attribute
``nemo.gym.checkpoint.truncated=true``, as nemo-lens marks the spans it force-closes. Every
exporter then shows it as a span of its checkpoint's trace, with status ERROR.

``replay`` closes what a log leaves open; ``emit_truncated_spans(bus, path)`` is what a process
started again on its predecessor's log calls at start-up (``serve`` and its workers do), reading
the log's tail only (``truncated_spans``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any, Final

import msgspec

from ckpt_events import (
    Bus,
    CollectionFinished,
    CollectionStarted,
    CoordinateFinished,
    CoordinateStarted,
    OperationFinished,
    OperationStarted,
    StageFinished,
    StageStarted,
    StepFinished,
    StepStarted,
)
from ckpt_events._errors import check_int, shown
from ckpt_events._public_home import publish
from ckpt_events.sinks.jsonl._reader import CorruptLine, read_events
from ckpt_events.vocab import Attr, Outcome

__all__ = [
    "MAX_OPEN",
    "TAIL_BYTES",
    "TRUNCATED_ERROR",
    "OpenSpans",
    "emit_truncated_spans",
    "truncated_spans",
]

#: Each started span's class and the class of its end.
_FINISHED_OF: Final[dict[type, type]] = {
    OperationStarted: OperationFinished,
    StepStarted: StepFinished,
    CoordinateStarted: CoordinateFinished,
    StageStarted: StageFinished,
    CollectionStarted: CollectionFinished,
}
_FINISHED: Final = frozenset(_FINISHED_OF.values())
#: The error type of a truncated span (its status reads ``Truncated: <TRUNCATED_MESSAGE>``).
TRUNCATED_ERROR: Final = "Truncated"
TRUNCATED_MESSAGE: Final = "its process's log ends before it does (a crash?): closed at its last event"
_TRUNCATED_ATTRIBUTES: Final = {Attr.TRUNCATED: True}
_ERROR: Final = Outcome.ERROR
#: Open spans tracked at most: a log of a million unfinished spans must not hold a million.
MAX_OPEN: Final = 100_000
#: How much of a log's end ``truncated_spans`` reads: work a crash left open started shortly
#: before it, and start-up must not read a 10-million-line log (about 30 s) to find it.
TAIL_BYTES: Final = 16 << 20


def _event_time(event: Any) -> int:
    # The end of a finished span, the instant of a counted event, the start of a started one.
    stamp: int = getattr(event, "end_ns", None) or getattr(event, "time_ns", None) or event.start_ns
    return stamp


class OpenSpans:
    """Spans started and not (yet) finished in a stream of events, per process.

    Feed events in each process's order with ``add``; ``close()`` returns the ``*Finished``
    events of what is still open, truncated. A ``*Finished`` with no ``*Started`` seen (it began
    before the stream did) is ignored. At most ``MAX_OPEN`` spans are tracked; ``untracked``
    counts the rest.
    """

    __slots__ = ("_last_ns", "_open", "untracked")

    def __init__(self) -> None:
        self._open: dict[tuple[int, int], Any] = {}  # (trace id, span id) -> its *Started
        self._last_ns: dict[tuple[str, str, int | None], int] = {}  # per process: its last event
        self.untracked = 0

    def add(self, event: Any) -> None:
        """Fold one event in."""
        cls = event.__class__
        who = (event.kind, event.instance, event.worker)
        stamp = _event_time(event)
        last = self._last_ns
        if stamp > last.get(who, 0):
            last[who] = stamp
        if cls in _FINISHED_OF:
            if len(self._open) >= MAX_OPEN:
                self.untracked += 1
                return
            self._open[event.trace_id, event.span_id] = event
        elif cls in _FINISHED:
            self._open.pop((event.trace_id, event.span_id), None)

    def end(self, trace_id: int, span_id: int) -> None:
        """The span ended in a line this version could not decode (another version's
        ``*_finished`` event: ``CorruptLine.ended``): it is not open, whatever its outcome.
        Was: closed as truncated, an error its process never had."""
        self._open.pop((trace_id, span_id), None)

    def add_all(self, events: Iterable[Any]) -> None:
        """Fold every event of ``events`` in."""
        for event in events:
            self.add(event)

    def __len__(self) -> int:
        return len(self._open)

    def close(self) -> list[Any]:
        """The ``*Finished`` event of every open span, ended at its process's last event (never
        before its start), outcome ``error``, marked truncated; children before their parents,
        as a process ends them. Forgets them: a second ``close()`` returns nothing new."""
        closed = []
        for started in reversed(self._open.values()):
            end_ns = max(
                self._last_ns.get((started.kind, started.instance, started.worker), 0), started.start_ns
            )
            fields = msgspec.structs.asdict(started)
            closed.append(
                _FINISHED_OF[started.__class__](
                    **fields,
                    end_ns=end_ns,
                    outcome=_ERROR,
                    error_type=TRUNCATED_ERROR,
                    error_message=TRUNCATED_MESSAGE,
                    attributes=dict(_TRUNCATED_ATTRIBUTES),
                )
            )
        self._open.clear()
        return closed


def truncated_spans(path: str | os.PathLike[str], *, tail_bytes: int = TAIL_BYTES) -> list[Any]:
    """The spans the log at ``path`` leaves open, closed as truncated (``OpenSpans.close``): what a
    process started again on its predecessor's log emits, so the predecessor's open work reaches
    the traces and the log reads as finished. Reads the last ``tail_bytes`` only (a span started
    before them and never finished is missed); a missing file has none. Corrupt lines (a torn
    last line) are skipped."""
    check_int(tail_bytes, f"tail_bytes must be a positive int, not {shown(tail_bytes)}", minimum=1)
    spans = OpenSpans()
    try:
        file = open(path, "rb")  # noqa: SIM115 - closed below, after the seek
    except FileNotFoundError:
        return []
    with file:
        size = os.fstat(file.fileno()).st_size
        if size > tail_bytes:
            file.seek(size - tail_bytes)
            file.readline()  # the rest of a line cut by the seek
        for _, item in read_events(file):
            if not isinstance(item, CorruptLine):
                spans.add(item)
            elif item.ended is not None:
                spans.end(*item.ended[:2])
    return spans.close()


def emit_truncated_spans(bus: Bus, path: str | os.PathLike[str], *, tail_bytes: int = TAIL_BYTES) -> int:
    """Emit onto ``bus`` the end of every span the log at ``path`` leaves open
    (``truncated_spans``), and return how many. Call it once, when a process starts again on its
    predecessor's log, after its sinks are subscribed and before it emits anything: the log then
    reads as finished, and the spans reach the exporters as part of their checkpoint's trace.
    It assumes the log had one writer, the predecessor, now gone: every span open in it is
    closed, whoever wrote it. On a log several live processes share (every worker of
    ``uvicorn --workers N`` or gunicorn given one ``jsonl_path``), a restarted worker would
    close its siblings' work in progress as truncated: call it only on a log of one process.
    ``OSError`` from reading the log is the caller's to report."""
    closed = truncated_spans(path, tail_bytes=tail_bytes)
    for event in closed:
        bus.emit(event)
    return len(closed)


# Pickles, reprs and tracebacks name the public module (_public_home.py says why).
publish("ckpt_events.sinks.jsonl", OpenSpans, emit_truncated_spans, truncated_spans)
