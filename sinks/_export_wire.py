"""The export process's pipe: how a batch of the server's bus is written, and read back as events.

One line per batch, a JSON array of the batch's items in the bus's order. An item is:

* an event: ``["event", {...}]``, the event as ``msgspec.json`` writes a ``CheckpointEvent``;
* a span handle (``OperationSpan``, ``StepSpan``: array-like structs tagged ``operation`` and
  ``step``), as msgspec writes it: ``["operation", [kind, instance, worker], operation, ...]``,
  every field in order, the ``Telemetry``'s identity in place of the ``Telemetry``. A handle
  stands for its span's end (its ``*Finished`` event); after a ``0`` (``START``), for its start;
* a string of digits ``"k"``: the end of the span whose record is the line's item ``k``,
  written there as its start (``START`` before it) by a span that started and ended in one
  batch. A string, not a number: a line cut short inside ``"12"`` leaves no ``1`` that names
  another span's record.

Each span goes twice, its start where it started and its end where it ended, so the child's
sinks get the events in this process's order (its two events at one place would put a
parent's end before its children's starts). A span whose start and end are in one batch, as
nearly every request's are, has its fields written once, at its start, and its end is that
record's index: the line is half as long, and the server encodes each handle once. A line cut
short (the server died while writing it) keeps its starts, as before: the record is the
earlier of the two.

The export process's buffer is the bus's raw one (``_Buffer.raw``): it gets each handle at the
span's start and again at its end, and no event is built for it in the server, neither on the
request path (a ``*Started``) nor in the delivery task (a ``*Finished``). The child builds both
from the records (``OperationRecord``, ``StepRecord``: the handles' fields, as decoded), the
same events the server would have built.
"""

from __future__ import annotations

import re
from operator import attrgetter
from typing import Any, Final

import msgspec

from ckpt_events import CheckpointEvent
from ckpt_events._events import (
    AttributeValue,
    Event,
    OperationFinished,
    OperationStarted,
    StepFinished,
    StepStarted,
)
from ckpt_events._span_handles import (
    QUEUED_HANDLES,
    RAW_QUEUED,
    RAW_SENT,
    OperationSpan,
    StepSpan,
    operation_finished,
    operation_started,
    step_finished,
    step_started,
)
from ckpt_events._vocab import Operation, Outcome, Phase

__all__ = [
    "START",
    "EventItem",
    "OperationRecord",
    "StepRecord",
    "encoder",
    "read_batch",
    "whole_events",
    "wire_items",
]

#: The item before a handle that stands for its span's start.
START: Final = 0


def encoder() -> msgspec.json.Encoder:
    """The encoder of a batch's line (``wire_items``): a handle's ``Telemetry`` goes as its identity."""
    return msgspec.json.Encoder(enc_hook=attrgetter("_identity"))


def wire_items(batch: list[Any]) -> list[Any]:
    """``batch`` (from the raw buffer) as the line's items: each start a ``START`` and its handle,
    each end its handle, or its record's index when its start is in the same line."""
    items: list[Any] = []
    append = items.append
    # The handles written as their start in this line. Until the loop ends, each one's ``_wire``
    # is its record's index, negated (met again in this line: its end); then ``RAW_SENT``.
    opened: list[Any] = []
    for item in batch:
        cls = item.__class__
        if cls not in QUEUED_HANDLES:
            append(EventItem(item))
            continue
        wire = item._wire
        if (cls is OperationSpan or cls is StepSpan) and item._event is None:
            if wire == RAW_QUEUED:  # the first time this buffer's one consumer meets it: its start
                append(START)
                item._wire = -len(items)
                opened.append(item)
                append(item)
            elif wire < 0:
                # Its end, its start in this line: that record (encoded after this loop, so with
                # every field as the span ended) stands for both, by its index.
                append(str(-wire))
                item._wire = RAW_SENT
            else:
                append(item)
        # A subclass (``BridgedOperationSpan`` holds the bridge), or a handle whose event
        # another sink's delivery built already: its events, not its fields twice.
        elif wire == RAW_QUEUED:
            item._wire = RAW_SENT
            append(EventItem(item._started()))
        else:
            append(EventItem(item._finished()))
    for item in opened:  # those whose end is in a later line
        item._wire = RAW_SENT
    return items


class EventItem(msgspec.Struct, frozen=True, gc=False, array_like=True, tag="event"):
    """An event on the pipe: ``["event", {...}]`` (every item of a line an int, a string or an array, the
    child decodes the whole line at once)."""

    event: CheckpointEvent


class OperationRecord(msgspec.Struct, frozen=True, gc=False, array_like=True, tag="operation"):
    """An ``OperationSpan`` as the pipe carries it: its fields, in order and by name
    (``test_export_wire``), the ``Telemetry``'s identity in ``_tel``."""

    _tel: tuple[str, str, int | None]
    operation: Operation
    checkpoint_id: str | None
    trace_id: int
    span_id: int
    parent_span_id: int | None
    parent_remote: bool
    sampled: bool
    _tracestate: str | None
    start_ns: int
    _mono_ns: int
    _end_ns: int
    _attributes: dict[str, AttributeValue] | None
    _outcome: Outcome
    _error_type: str | None
    _error_message: str | None
    _phase: Phase | None
    _blockers: int | None
    _records: int | None
    _bytes: int | None
    _episodes: int | None
    _rollouts: int | None
    _received_ns: int | None
    _loop_lag_ms: float | None
    _event: None  # a handle whose event another sink's delivery built goes as its events
    _wire: int

    def started(self) -> OperationStarted:
        return operation_started(self, *self._tel)

    def finished(self) -> OperationFinished:
        return operation_finished(self, *self._tel)


class StepRecord(msgspec.Struct, frozen=True, gc=False, array_like=True, tag="step"):
    """A ``StepSpan`` as the pipe carries it: its fields, in order and by name
    (``test_export_wire``), the ``Telemetry``'s identity in ``_tel``."""

    _tel: tuple[str, str, int | None]
    step: str
    checkpoint_id: str | None
    trace_id: int
    span_id: int
    parent_span_id: int | None
    sampled: bool
    _tracestate: str | None
    parent_remote: bool
    start_ns: int
    _mono_ns: int
    _end_ns: int
    _attributes: dict[str, AttributeValue] | None
    _outcome: Outcome
    _error_type: str | None
    _error_message: str | None
    _records: int | None
    _bytes: int | None
    _calls: int | None
    _cut_prefix: int | None
    _cut_failure: int | None
    _event: None
    _wire: int

    def started(self) -> StepStarted:
        return step_started(self, *self._tel)

    def finished(self) -> StepFinished:
        return step_finished(self, *self._tel)


_LINE: Final = msgspec.json.Decoder(list[int | str | OperationRecord | StepRecord | EventItem])


def read_batch(line: bytes) -> list[Event]:
    """The events of one batch's line; ``msgspec.DecodeError`` if it is not one."""
    events: list[Event] = []
    append = events.append
    start = False
    items = _LINE.decode(line)
    ended: set[int] = set()  # the indices of the records whose end was read
    for index, item in enumerate(items):
        if isinstance(item, OperationRecord | StepRecord):
            append(item.started() if start else item.finished())
            start = False
        elif isinstance(item, EventItem) and not start:
            append(item.event)
        elif item == START and not start:
            start = True
        elif isinstance(item, str) and not start:
            append(_record_at(items, item, index, ended).finished())
        else:
            raise msgspec.DecodeError(f"not an item of the export pipe: {item!r}")
    if start:
        raise msgspec.DecodeError("the export pipe's line ends with a start mark and no span")
    return events


def _record_at(items: list[Any], ref: str, index: int, ended: set[int]) -> OperationRecord | StepRecord:
    """The record an end's ``ref`` (item ``index``) names: a start's, earlier in the line, not ended yet."""
    at = int(ref) if ref.isascii() and ref.isdigit() else 0
    record = items[at] if 0 < at < index else None
    if not isinstance(record, OperationRecord | StepRecord) or items[at - 1] != START or at in ended:
        raise msgspec.DecodeError(f"item {index} of the export pipe's line ends no span it started: {ref!r}")
    ended.add(at)
    return record


#: A JSON string, or one of the characters that open, close or separate items.
_TOKENS: Final = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{},]')
#: Item boundaries tried, from the end back, in a line cut short by the parent's death.
_CUT_TRIES: Final = 8


def whole_events(cut: bytes) -> list[Event]:
    """The events of ``cut`` (a line missing its end) up to its last whole item: the line closed
    at one of its last top-level commas (a cut string or item leaves the rest undecodable)."""
    depth = 0
    commas: list[int] = []
    for token in _TOKENS.finditer(cut):
        char = token.group()[:1]
        if char in b"[{":
            depth += 1
        elif char in b"]}":
            depth -= 1
        elif char == b"," and depth == 1:
            commas.append(token.start())
    for end in [len(cut.rstrip(b",")), *commas[::-1][:_CUT_TRIES]]:
        prefix = cut[:end].rstrip(b",")
        if prefix[-2:] in (b",0", b"[0"):  # a start mark whose span was cut
            prefix = prefix[:-1].rstrip(b",")
        try:
            return read_batch(prefix + b"]")
        except msgspec.DecodeError:
            continue
    return []
