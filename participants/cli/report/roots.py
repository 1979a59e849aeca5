"""What the report keeps of a root span (a row of the run overview), never the event: the fields
that make its row (``RootStart``) and, once it ended, what judges it (``RootEnd``).

The fold keeps these for every root of the pass. It kept the events whole (a
``CollectionStarted`` and a ``CollectionFinished`` a checkpoint, every field of each); a root
that ended as it started is now one record, its end in its start's place, its strings interned:
250 bytes less of the 2,639 it kept a checkpoint of four participants.
"""

from __future__ import annotations

import sys

import msgspec

from ckpt_events import CollectionFinished, CollectionStarted, CoordinateFinished, CoordinateStarted
from ckpt_events.vocab import CollectionAction, Operation, Outcome

__all__ = ["RootEnd", "RootStart", "end_of", "same_row", "start_of"]


class RootStart(msgspec.Struct, frozen=True, gc=False):
    """A root span's row: who, which trace and span, when, and what it did (a collection's
    ``action``, or a coordinate ``operation`` run on its own: the other is ``None``)."""

    trace_id: int
    span_id: int
    parent_span_id: int | None
    start_ns: int
    checkpoint_id: str | None
    #: Interned: one string per process, not one per root read.
    kind: str
    instance: str
    worker: int | None
    action: CollectionAction | None
    operation: Operation | None

    @property
    def coordinated(self) -> bool:
        """A coordinate operation run on its own (not a collection)."""
        return self.operation is not None

    @property
    def what(self) -> str:
        """What its row is: ``checkpoint``, ``restore`` (or a collection's other action)."""
        if self.action is not None:
            return str(self.action)
        return "restore" if self.operation == Operation.RESTORE else "checkpoint"


class RootEnd(RootStart, frozen=True, gc=False):
    """A root span that ended: its start's fields and what its end says. ``published``,
    ``rows`` and ``restarts`` are a collection's, ``prepared``, ``episodes`` and
    ``monotonic_start_ns`` a coordinate operation's (``None`` for the other)."""

    end_ns: int
    outcome: Outcome
    published: bool | None
    prepared: bool | None
    rows: int | None
    restarts: int | None
    episodes: int | None
    monotonic_start_ns: int | None


def start_of(e: CollectionStarted | CoordinateStarted | CollectionFinished | CoordinateFinished) -> RootStart:
    """``e``'s row fields."""
    action, operation = _what(e)
    return RootStart(
        e.trace_id,
        e.span_id,
        e.parent_span_id,
        e.start_ns,
        e.checkpoint_id,
        sys.intern(str(e.kind)),
        sys.intern(e.instance),
        e.worker,
        action,
        operation,
    )


def end_of(e: CollectionFinished | CoordinateFinished, start: RootStart | None) -> RootEnd:
    """What is kept of the root span that ended with ``e``; ``start``, the record of its start if
    it was read, lends its values (one copy of each) where they agree with the end's."""
    row = start_of(e)
    if start is not None and same_row(start, row):
        row = start
    # A collection's fields, or a coordinate operation's: the other's stay None.
    published: bool | None = None
    rows: int | None = None
    restarts: int | None = None
    prepared: bool | None = None
    episodes: int | None = None
    monotonic_start_ns: int | None = None
    match e:
        case CollectionFinished():
            published = e.published
            rows = e.rows
            restarts = e.restarts
        case CoordinateFinished():
            prepared = e.prepared
            episodes = e.episodes
            monotonic_start_ns = e.monotonic_start_ns
    return RootEnd(
        *_row_fields(row),
        e.end_ns,
        e.outcome,
        published,
        prepared,
        rows,
        restarts,
        episodes,
        monotonic_start_ns,
    )


def same_row(a: RootStart, b: RootStart) -> bool:
    """``a`` and ``b`` make the same row (every ``RootStart`` field equal)."""
    return _row_fields(a) == _row_fields(b)


def _row_fields(
    r: RootStart,
) -> tuple[
    int, int, int | None, int, str | None, str, str, int | None, CollectionAction | None, Operation | None
]:
    return (
        r.trace_id,
        r.span_id,
        r.parent_span_id,
        r.start_ns,
        r.checkpoint_id,
        r.kind,
        r.instance,
        r.worker,
        r.action,
        r.operation,
    )


def _what(
    e: CollectionStarted | CoordinateStarted | CollectionFinished | CoordinateFinished,
) -> tuple[CollectionAction | None, Operation | None]:
    match e:
        case CollectionStarted(action=action) | CollectionFinished(action=action):
            return action, None
        case CoordinateStarted(operation=operation) | CoordinateFinished(operation=operation):
            return None, operation
