"""The export process's pipe: how a batch of the server's bus is written, and read back as events.

One line per batch, a JSON array of the batch's items in the bus's order. An item is:

* a span handle (``OperationSpan``, ``StepSpan``: array-like structs tagged ``operation`` and
  ``step``), as msgspec writes it: ``["operation", [kind, instance, worker], operation, ...]``,
  every field in order, the ``Telemetry``'s identity in place of the ``Telemetry``. Its
  ``_wire`` is its start's number (``RAW_SEQUENCE`` in ``ckpt_events/_span_handles.py``). The
  first record of a number stands for its span's start; a second one, in this line or a later
  one, for its end; a record numbered ``0`` (its start was not queued: not wanted, or the
  buffer was full) for its end alone (its ``*Finished``);
* an int ``n`` (above 0): the end of the span whose start is the record numbered ``n``, in
  this line or an earlier one. A handle ends this way when its start was still waiting in the bus's
  buffer as it ended, so its record (written when the batch is taken) has every field as the
  span ended. This is nearly every request's spans: each is written once, with no work per
  item in the server, the whole batch encoded in one call;
* an event: ``["event", {...}]``, the event as ``msgspec.json`` writes a ``CheckpointEvent``.

Each span goes twice, its start where it started and its end where it ended, so the child's
sinks get the events in this process's order (its two events at one place would put a
parent's end before its children's starts). A line cut short (the server died while writing
it) keeps its whole items; an end whose start the reader never got (cut, corrupt, or past
``OPEN_LIMIT`` open spans) is counted (``WireReader.lost_ends``), not taken for another span.

JSON has no NaN or infinity: msgspec writes a non-finite float as ``null``. An attribute's
``null`` is read back as NaN, as the JSON-lines reader reads it (the one value changed, the
event kept: the line it was in failed to decode, and every event of its batch was lost).
A string holding a lone surrogate (``os.fsdecode`` of a bad file name) is no UTF-8: a batch
holding one is written by Python's ``json`` instead (``escaped_line``: ASCII, the surrogate
escaped), read back with it, so the child's sinks get the very string and treat it as in
process (the bus counted the whole batch as failed).

A line is at most ``MAX_LINE`` bytes (the child skips and counts a longer one): a batch whose
line is longer (large attributes) goes in several lines within it (``lines_within``), each
whole in itself; only an item longer than a line by itself is left out (the whole batch was).

The export process's buffer is the bus's raw one (``_Buffer.raw``): it gets each handle at the
span's start and again (or its end mark) at its end, and no event is built for it in the server,
neither on the request path (a ``*Started``) nor in the delivery task (a ``*Finished``). The
child builds both from the records (``OperationRecord``, ``StepRecord``: the handles' fields, as
decoded), the same events the server would have built.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from operator import attrgetter
from typing import Any, Final

import msgspec

from ckpt_events import CheckpointEvent
from ckpt_events._errors import shown
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
    OperationSpan,
    StepSpan,
    operation_finished,
    operation_started,
    step_finished,
    step_started,
)
from ckpt_events._vocab import Operation, Outcome, Phase
from ckpt_events.sinks._hexids import WIRE_DECODER, from_wire

__all__ = [
    "MAX_LINE",
    "OPEN_LIMIT",
    "EventItem",
    "OperationRecord",
    "StepRecord",
    "encoder",
    "WireReader",
    "escaped_line",
    "lines_within",
    "wire_items",
]

#: The most spans a reader holds open (started, not ended) between lines: a server that leaks
#: handles never ended costs the child this many records at most (the oldest go first).
OPEN_LIMIT: Final = 1 << 16
#: What a batch of only these is written as, as it is (one ``encode`` call, no loop in Python).
_PLAIN: Final = frozenset({OperationSpan, StepSpan, int})
_NAN: Final = float("nan")
#: The longest line the child reads, in bytes (without its newline): a batch of the parent's bus
#: (``batch_size`` items, 4,096 by default) is a few hundred bytes an item, unless its attributes
#: are large; then ``ExportProcess`` writes it in several lines (``lines_within``).
MAX_LINE: Final = 64 << 20


def encoder() -> msgspec.json.Encoder:
    """The encoder of a batch's line (``wire_items``): a handle's ``Telemetry`` goes as its identity."""
    return msgspec.json.Encoder(enc_hook=attrgetter("_identity"))


def escaped_line(items: list[Any]) -> bytes:
    """``items`` (``wire_items``) as the line ``encoder`` could not write (a string holding a
    lone surrogate, which UTF-8 cannot carry): by Python's ``json``, every non-ASCII character
    escaped (a NaN or an infinity as itself); ``WireReader`` reads it back, surrogates kept."""
    builtins = msgspec.to_builtins(items, enc_hook=attrgetter("_identity"))
    return json.dumps(builtins, separators=(",", ":")).encode("ascii")


def lines_within(
    items: list[Any], encode: Callable[[Any], bytes], limit: int = MAX_LINE
) -> tuple[list[bytes], int]:
    """``items`` (``wire_items``, whose one line is longer than ``limit``) as lines of at most
    ``limit`` bytes, in order, each read by a ``WireReader`` after the lines before it; and how
    many items were left out: one longer than a line by itself, and a span's end mark after its
    record left out (a mark names a start's number, in any earlier line)."""
    lines: list[bytes] = []
    chunk: list[bytes] = []
    size = 1  # "[": each item adds its bytes and a comma, or the closing "]"
    left_out: set[int] = set()  # the numbers of the records longer than a line
    dropped = 0
    for item in items:
        if item.__class__ is int and item in left_out:
            dropped += 1
            continue
        data = encode(item)
        if len(data) + 2 > limit:
            dropped += 1
            if isinstance(item, OperationSpan | StepSpan) and item._wire:
                left_out.add(item._wire)
            continue
        if size + len(data) + 1 > limit:
            lines.append(b"[" + b",".join(chunk) + b"]")
            chunk = []
            size = 1
        chunk.append(data)
        size += len(data) + 1
    if chunk:
        lines.append(b"[" + b",".join(chunk) + b"]")
    return lines, dropped


def wire_items(batch: list[Any]) -> list[Any]:
    """``batch`` (from the raw buffer) as the line's items: itself when it holds only plain
    handles and end marks (the request path's spans), else a copy with each event as an
    ``EventItem`` and each subclass of a handle (``BridgedOperationSpan``: the bridge is no field
    of the record) as a plain handle of its fields."""
    if _PLAIN.issuperset(map(type, batch)):  # in C: ~20 ns an item
        return batch
    items: list[Any] = []
    append = items.append
    for item in batch:
        cls = item.__class__
        if cls in _PLAIN:
            append(item)
        elif cls in QUEUED_HANDLES:
            base = OperationSpan if isinstance(item, OperationSpan) else StepSpan
            append(base(*[getattr(item, name) for name in base.__struct_fields__]))
        else:
            append(EventItem(item))
    return items


class EventItem(msgspec.Struct, frozen=True, gc=False, array_like=True, tag="event"):
    """An event on the pipe: ``["event", {...}]`` (every item of a line an int, a string or an array, the
    child decodes the whole line at once)."""

    event: CheckpointEvent


class _EventIn(msgspec.Struct, frozen=True, gc=False, array_like=True, tag="event"):
    """An ``EventItem`` as the child reads it in a line that did not validate: the event decoded
    as the JSON-lines reader decodes a line (``_hexids.WIRE_DECODER``), an attribute's ``null``
    as NaN (twice the time of ``EventItem``'s decoding: only for such a line)."""

    event: msgspec.Raw


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
    _mono_ns: int  # its duration, in a record of an ended span
    _attributes: dict[str, AttributeValue | None] | None  # None: a NaN or an infinity, as written
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
    _event: Any  # built by another sink's delivery in the server, if any: not read
    _wire: int

    def started(self) -> OperationStarted:
        return operation_started(self, *self._tel)

    def finished(self) -> OperationFinished:
        if self._attributes and None in self._attributes.values():
            _nan_for_null(self._attributes)
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
    _mono_ns: int  # its duration, in a record of an ended span
    _attributes: dict[str, AttributeValue | None] | None  # None: a NaN or an infinity, as written
    _outcome: Outcome
    _error_type: str | None
    _error_message: str | None
    _records: int | None
    _bytes: int | None
    _calls: int | None
    _cut_prefix: int | None
    _cut_failure: int | None
    _event: Any
    _wire: int

    def started(self) -> StepStarted:
        return step_started(self, *self._tel)

    def finished(self) -> StepFinished:
        if self._attributes and None in self._attributes.values():
            _nan_for_null(self._attributes)
        return step_finished(self, *self._tel)


def _nan_for_null(attributes: dict[str, AttributeValue | None]) -> None:
    """Each ``None`` of a record's ``attributes`` (a NaN or an infinity, written as ``null``)
    back to NaN, in place (the record is read once)."""
    for key, value in attributes.items():
        if value is None:
            attributes[key] = _NAN


_ITEMS: Final = list[int | OperationRecord | StepRecord | EventItem]
_LINE: Final = msgspec.json.Decoder(_ITEMS)
_LINE_WITH_NULLS: Final = msgspec.json.Decoder(list[int | OperationRecord | StepRecord | _EventIn])
_Record = OperationRecord | StepRecord


class WireReader:
    """Reads the pipe's lines in order (``events``), holding the spans started and not yet ended
    between them (at most ``OPEN_LIMIT``).

    ``lost_ends`` counts the ends whose start it did not hold (in a line cut short or corrupt,
    or the oldest past the limit): their spans' ``*Finished`` are lost, counted, never taken
    from another span's record. ``invalid_events`` counts the events it could not read in a line
    it read (a hand-built event holding a value outside its field's vocabulary, which ``emit``
    takes as it is): each is left out, the rest of its batch kept; ``invalid_error`` says the
    first one's fault.
    """

    def __init__(self, open_limit: int = OPEN_LIMIT) -> None:
        self._open: dict[int, _Record] = {}
        self._open_limit = open_limit
        self.lost_ends = 0
        self.invalid_events = 0
        self.invalid_error: str | None = None

    def events(self, line: bytes) -> list[Event]:
        """The events of one batch's line; ``msgspec.DecodeError`` (and nothing read from it) if
        it is not one."""
        items: list[Any]  # the items of one of the two decoders
        try:
            items = _LINE.decode(line)
        except msgspec.ValidationError:  # an event with a non-finite attribute, or one not valid
            items = _LINE_WITH_NULLS.decode(line)
        except msgspec.DecodeError as exc:
            items = _escaped_items(line, exc)
        except RecursionError:  # nested deeper than any line of ours: damage, not the child's end
            raise msgspec.DecodeError("the export pipe's line is nested too deep") from None
        for index, item in enumerate(items):
            # Checked before any span is opened or closed: a line refused changes nothing.
            if (item.__class__ is int and item <= 0) or (isinstance(item, _Record) and item._wire < 0):
                raise msgspec.DecodeError(f"not an item of the export pipe: item {index}, {shown(item)}")
        events: list[Event] = []
        append = events.append
        spans = self._open
        for item in items:
            if isinstance(item, int):
                record = spans.pop(item, None)
                if record is None:
                    self.lost_ends += 1
                else:
                    append(record.finished())
            elif isinstance(item, EventItem):
                append(item.event)
            elif isinstance(item, _EventIn):
                try:
                    append(from_wire(WIRE_DECODER.decode(item.event)))
                except msgspec.DecodeError as exc:  # ValidationError too
                    # One event the line's decoder refused: the whole batch was lost for it (a
                    # user's Refused(code="over_quota") took the 99 events beside it along).
                    self.invalid_events += 1
                    if self.invalid_error is None:
                        self.invalid_error = str(exc)
            else:
                number = item._wire
                if not number or spans.pop(number, None) is not None:  # its end (alone, if 0)
                    append(item.finished())
                else:
                    append(item.started())
                    spans[number] = item
                    if len(spans) > self._open_limit:
                        del spans[next(iter(spans))]
        return events

    def whole_events(self, cut: bytes) -> list[Event]:
        """The events of ``cut`` (a line missing its end) up to its last whole item: the line
        closed at one of its last top-level commas (a cut string or item leaves the rest
        undecodable)."""
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
        for end in [len(cut), *commas[::-1][:_CUT_TRIES]]:
            prefix = cut[:end]
            if end == len(cut) and prefix[-1:] != b"]":
                # Its last item may be an end mark cut inside its digits ("123" read as "12"
                # names another span): only a comma after it says it is whole.
                continue
            try:
                return self.events(prefix + b"]")
            except msgspec.DecodeError:
                continue
        return []


def _escaped_items(line: bytes, refused: msgspec.DecodeError) -> list[Any]:
    """The items of a line ``escaped_line`` wrote (msgspec ``refused`` its escaped surrogates);
    ``msgspec.DecodeError`` if it is not one."""
    if b"\\ud" not in line:  # every such line holds an escaped surrogate: another is corrupt
        raise refused
    try:
        return msgspec.convert(json.loads(line), _ITEMS)
    except (ValueError, RecursionError) as exc:
        raise msgspec.DecodeError(f"the export pipe's line is not JSON ({exc})") from None


#: A JSON string, or one of the characters that open, close or separate items.
_TOKENS: Final = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{},]')
#: Item boundaries tried, from the end back, in a line cut short by the parent's death.
_CUT_TRIES: Final = 8
