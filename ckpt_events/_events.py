"""Typed checkpoint events: one frozen, tagged msgspec Struct per event.

Spans travel as a pair of events (``*Started`` when the span opens, ``*Finished`` when it
closes); a span sink needs only the ``*Finished`` ones, which carry both timestamps. Counted
events are single points. ``CheckpointEvent`` is the union of all of them, so msgspec's JSON
of an event decodes back into its typed event::

    msgspec.json.decode(msgspec.json.encode(event), type=CheckpointEvent)

(The JSON-lines sink writes the ids as W3C hex strings instead; ``ckpt_events.sinks.read_events`` reads
them back.)

Schema evolution follows msgspec's rules: new fields get defaults; nothing is renamed or
retyped.
"""

from __future__ import annotations

from typing import Any, Final, TypeAlias

import msgspec

from ckpt_events._public_home import publish
from ckpt_events._vocab import (
    COLLECTION_SPANS,
    COORDINATE_SPANS,
    OPERATION_SPANS,
    STAGE_SPANS,
    STEP_SPANS,
    CollectionAction,
    Disposition,
    ErrorCode,
    Operation,
    Outcome,
    Phase,
    SpanKind,
)

__all__ = [
    "CheckpointEvent",
    "CollectionFinished",
    "CollectionStarted",
    "CoordinateFinished",
    "CoordinateStarted",
    "Event",
    "GenerationCut",
    "LeaseExpired",
    "OperationFinished",
    "OperationStarted",
    "PrepareNotReady",
    "Refused",
    "SpanEvent",
    "Stalled",
    "StageFinished",
    "StageStarted",
    "StepFinished",
    "StepStarted",
    "span_kind_of",
    "span_name_of",
]

#: Values a user-supplied extra attribute may take (OpenTelemetry's scalar attribute types).
AttributeValue: TypeAlias = str | bool | int | float

#: An event's ``repr`` shows at most this many characters of a string (a field's or an extra
#: attribute's), and of any one field: msgspec's own repr of an event holding a 1 MB attribute
#: was 1,000,412 characters, in a log line, a traceback or a test failure.
REPR_STRING_CHARS: Final = 200
REPR_FIELD_CHARS: Final = 1000


# Field order is part of the design: required fields first, then the defaulted tail, so the
# emitter can build an event positionally (msgspec matches keywords against fields one by
# one: a 21-field event costs ~1.6 us by keyword and ~0.12 us by position, measured here).
# Keywords work too, in any order; JSON decoding is by name.


class Event(msgspec.Struct, frozen=True, tag_field="type", gc=False):
    """Who reported an event. Every concrete event also has ``checkpoint_id: str | None`` and
    ``worker: int | None`` (the worker process of a multi-worker participant), last but for a
    span event's ``tracestate``."""

    #: A participant kind: a ``Kind`` constant's value or a user's own (``"judge"``); an event
    #: read back from a log holds a plain ``str``, so compare with ``==``.
    kind: str
    instance: str

    def __repr__(self) -> str:
        """msgspec's repr (``Refused(kind='model', ...)``), each long value cut with a marker
        saying how much was cut (``'xxx'...(+999800 chars)``). Equality, hashing, encoding and
        the fields are msgspec's, untouched."""
        fields = ", ".join(f"{name}={_repr_cut(getattr(self, name))}" for name in self.__struct_fields__)
        return f"{type(self).__name__}({fields})"

    def __rich_repr__(self) -> list[tuple[str, Any]]:
        """Rich's protocol (``rich.print(event)``, ``rich.pretty.pretty_repr``): each field as
        msgspec yields it, but a value ``repr`` would cut stands in with the same cut text (rich
        printed a 2 MB attribute whole: 4,000,536 characters)."""
        return [(name, _rich_value(getattr(self, name))) for name in self.__struct_fields__]


class SpanEvent(Event, frozen=True, gc=False):
    """A span's identity: W3C trace id (128 bit), span id (64 bit) and start time.

    Concrete span events add ``parent_span_id`` (``None`` for a root), ``parent_remote``
    (the parent lives in another process: it came in through a ``traceparent`` header),
    ``sampled`` (the root's sampling decision) and, last, ``tracestate``: the W3C
    ``tracestate`` that came with the trace's ``traceparent`` (normalised by
    ``parse_tracestate``; ``None`` without one, and in a log written before the field), which
    the span sinks put on the exported span (its ``trace_state``) for the vendors that read it.
    """

    trace_id: int
    span_id: int
    start_ns: int


class _Finished(SpanEvent, frozen=True, gc=False):
    end_ns: int


class OperationStarted(SpanEvent, frozen=True, gc=False, tag="operation_started"):
    """A participant began ``operation`` (span ``gym.checkpoint.<operation>``)."""

    operation: Operation
    checkpoint_id: str | None = None
    parent_span_id: int | None = None
    parent_remote: bool = False
    sampled: bool = True
    worker: int | None = None
    tracestate: str | None = None


class OperationFinished(_Finished, frozen=True, gc=False, tag="operation_finished"):
    """A participant finished ``operation``; unset attributes stay ``None``."""

    operation: Operation
    checkpoint_id: str | None = None
    parent_span_id: int | None = None
    parent_remote: bool = False
    sampled: bool = True
    outcome: Outcome = Outcome.OK
    error_type: str | None = None
    error_message: str | None = None
    attributes: dict[str, AttributeValue] | None = None
    phase: Phase | None = None
    blockers: int | None = None
    records: int | None = None
    bytes: int | None = None
    episodes: int | None = None
    rollouts: int | None = None
    #: When the request reached the participant's app (Unix ns); the span's start is when
    #: its handler began, so the two apart are the time queued inside the participant.
    received_ns: int | None = None
    #: The participant's worst event-loop lag (ms) measured while the operation ran; None
    #: when not measured for the whole of it (no monitor, or it was not sampling throughout).
    loop_lag_ms: float | None = None
    worker: int | None = None
    tracestate: str | None = None


class StepStarted(SpanEvent, frozen=True, gc=False, tag="step_started"):
    """A step began under an operation span (its ``parent_span_id``)."""

    step: str
    checkpoint_id: str | None = None
    parent_span_id: int | None = None
    parent_remote: bool = False
    sampled: bool = True
    worker: int | None = None
    tracestate: str | None = None


class StepFinished(_Finished, frozen=True, gc=False, tag="step_finished"):
    """A step finished; ``calls`` and ``cut_*`` belong to ``generation_cut``."""

    step: str
    checkpoint_id: str | None = None
    parent_span_id: int | None = None
    parent_remote: bool = False
    sampled: bool = True
    outcome: Outcome = Outcome.OK
    error_type: str | None = None
    error_message: str | None = None
    attributes: dict[str, AttributeValue] | None = None
    records: int | None = None
    bytes: int | None = None
    calls: int | None = None
    cut_durable_prefix: int | None = None
    cut_durable_failure: int | None = None
    worker: int | None = None
    tracestate: str | None = None


class CoordinateStarted(SpanEvent, frozen=True, gc=False, tag="coordinate_started"):
    """The controller began ``gym.checkpoint.coordinate.<operation>``."""

    operation: Operation
    checkpoint_id: str | None = None
    parent_span_id: int | None = None
    parent_remote: bool = False
    sampled: bool = True
    worker: int | None = None
    tracestate: str | None = None


class CoordinateFinished(_Finished, frozen=True, gc=False, tag="coordinate_finished"):
    """The controller finished a coordinate operation."""

    operation: Operation
    checkpoint_id: str | None = None
    parent_span_id: int | None = None
    parent_remote: bool = False
    sampled: bool = True
    outcome: Outcome = Outcome.OK
    error_type: str | None = None
    error_message: str | None = None
    attributes: dict[str, AttributeValue] | None = None
    participants: int | None = None
    prepared: bool | None = None
    stopped_at: str | None = None
    episodes: int | None = None
    rollouts: int | None = None
    worker: int | None = None
    tracestate: str | None = None
    #: The monotonic clock (ns) read beside ``start_ns``: a bare coordinator's checkpoint spans
    #: several of these roots, each stamped on the wall clock as it began, so a wall clock
    #: stepped between them (NTP, a VM resumed) moves their stamps apart; the time that passed
    #: between two of one process is read on this clock. ``None`` in a log written before the
    #: field (after ``tracestate``, so older logs read it as ``None``).
    monotonic_start_ns: int | None = None


class StageStarted(SpanEvent, frozen=True, gc=False, tag="stage_started"):
    """One prepare stage began (``gym.checkpoint.coordinate.prepare.<stage>``)."""

    stage: str
    checkpoint_id: str | None = None
    parent_span_id: int | None = None
    parent_remote: bool = False
    sampled: bool = True
    worker: int | None = None
    tracestate: str | None = None


class StageFinished(_Finished, frozen=True, gc=False, tag="stage_finished"):
    """One prepare stage finished, also for a stage with no members."""

    stage: str
    checkpoint_id: str | None = None
    parent_span_id: int | None = None
    parent_remote: bool = False
    sampled: bool = True
    outcome: Outcome = Outcome.OK
    error_type: str | None = None
    error_message: str | None = None
    attributes: dict[str, AttributeValue] | None = None
    participants: int | None = None
    worker: int | None = None
    tracestate: str | None = None


class CollectionStarted(SpanEvent, frozen=True, gc=False, tag="collection_started"):
    """Rollout collection began a checkpoint or a restore."""

    action: CollectionAction
    checkpoint_id: str | None = None
    parent_span_id: int | None = None
    parent_remote: bool = False
    sampled: bool = True
    worker: int | None = None
    tracestate: str | None = None


class CollectionFinished(_Finished, frozen=True, gc=False, tag="collection_finished"):
    """Rollout collection finished ``gym.checkpoint.collection.<action>``."""

    action: CollectionAction
    checkpoint_id: str | None = None
    parent_span_id: int | None = None
    parent_remote: bool = False
    sampled: bool = True
    outcome: Outcome = Outcome.OK
    error_type: str | None = None
    error_message: str | None = None
    attributes: dict[str, AttributeValue] | None = None
    in_flight: int | None = None
    stop: bool | None = None
    published: bool | None = None
    rows: int | None = None
    restarts: int | None = None
    worker: int | None = None
    tracestate: str | None = None


class _Point(Event, frozen=True, gc=False):
    time_ns: int


class LeaseExpired(_Point, frozen=True, gc=False, tag="lease_expired"):
    """A participant's lease ran out in ``phase``; it resumed on its own (an abort)."""

    phase: Phase
    checkpoint_id: str | None = None
    worker: int | None = None


class PrepareNotReady(_Point, frozen=True, gc=False, tag="prepare_not_ready"):
    """A prepare reached its deadline with ``blockers`` episodes still blocking."""

    blockers: int
    checkpoint_id: str | None = None
    worker: int | None = None


class Refused(_Point, frozen=True, gc=False, tag="refused"):
    """A request was refused with a protocol error ``code``."""

    code: ErrorCode
    checkpoint_id: str | None = None
    worker: int | None = None


class GenerationCut(_Point, frozen=True, gc=False, tag="generation_cut"):
    """A cut round ended ``calls`` in-flight generations with ``disposition``."""

    disposition: Disposition
    calls: int
    checkpoint_id: str | None = None
    worker: int | None = None


class Stalled(_Point, frozen=True, gc=False, tag="stalled"):
    """``operation`` of this participant has been open ``age_s`` seconds, past the stall threshold.

    ``phase`` is the participant's phase the operation was started in, when known.
    """

    operation: Operation
    age_s: float
    phase: Phase | None = None
    checkpoint_id: str | None = None
    worker: int | None = None


CheckpointEvent: TypeAlias = (
    OperationStarted
    | OperationFinished
    | StepStarted
    | StepFinished
    | CoordinateStarted
    | CoordinateFinished
    | StageStarted
    | StageFinished
    | CollectionStarted
    | CollectionFinished
    | LeaseExpired
    | PrepareNotReady
    | Refused
    | GenerationCut
    | Stalled
)

#: Every concrete event class, in the order of the union.
EVENT_TYPES: Final[tuple[type[Event], ...]] = CheckpointEvent.__args__
STARTED_TYPES: Final = (OperationStarted, StepStarted, CoordinateStarted, StageStarted, CollectionStarted)
FINISHED_TYPES: Final = (
    OperationFinished,
    StepFinished,
    CoordinateFinished,
    StageFinished,
    CollectionFinished,
)
POINT_TYPES: Final = (LeaseExpired, PrepareNotReady, Refused, GenerationCut, Stalled)


def span_name_of(event: Event) -> str | None:
    """The span a ``*Finished`` event closes (``gym.checkpoint.commit``, ...), else ``None``.

    ``None`` also for ``renew``, which has no span. Sinks and reports name spans by this.
    """
    match event:
        case OperationFinished(operation=operation):
            return OPERATION_SPANS.get(operation)
        case StepFinished(step=step):
            return STEP_SPANS[step]
        case CoordinateFinished(operation=operation):
            return COORDINATE_SPANS[operation]
        case StageFinished(stage=stage):
            return STAGE_SPANS[stage]
        case CollectionFinished(action=action):
            return COLLECTION_SPANS[action]
        case _:
            return None


#: Coordinate operations whose span calls the participants directly (prepare calls them
#: through its stages, which are the client spans).
_FAN_OUT: Final = frozenset(
    {
        Operation.COMMIT,
        Operation.RESTORE,
        Operation.RESUME,
        Operation.RETIRE,
        Operation.FORGET,
        Operation.RENEW,
    }
)


def span_kind_of(event: Event) -> SpanKind:
    """The span kind of a ``*Finished`` event's span.

    SERVER: a participant's operation reached over HTTP (its parent came in by
    ``traceparent``); CLIENT: the controller's span that makes the calls (a prepare stage,
    or a fanned-out coordinate operation); INTERNAL: everything else (steps, collection).
    """
    match event:
        case OperationFinished(parent_remote=True):
            return SpanKind.SERVER
        case StageFinished():
            return SpanKind.CLIENT
        case CoordinateFinished(operation=operation) if operation in _FAN_OUT:
            return SpanKind.CLIENT
        case _:
            return SpanKind.INTERNAL


class _Cut:
    """Stands in for a long value in ``__rich_repr__``: its repr is the value's cut repr."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _rich_value(value: object) -> object:
    """The value itself when ``_repr_cut`` would leave it whole (rich then lays it out as it
    does any value), else a ``_Cut`` holding the cut repr."""
    if isinstance(value, str):
        return value if len(value) <= REPR_STRING_CHARS else _Cut(_repr_cut(value))
    if not isinstance(value, dict):
        return value
    text = _repr_cut(value)
    long_strings = any(isinstance(s, str) and len(s) > REPR_STRING_CHARS for kv in value.items() for s in kv)
    return _Cut(text) if long_strings or len(text) > REPR_FIELD_CHARS else value


def _repr_cut(value: object) -> str:
    """``repr(value)``, a long string cut to REPR_STRING_CHARS (before its repr is made: a 1 MB
    one is not copied), a dict's strings each so, and the whole cut to REPR_FIELD_CHARS."""
    if isinstance(value, str) and len(value) > REPR_STRING_CHARS:
        return f"{value[:REPR_STRING_CHARS]!r}...(+{len(value) - REPR_STRING_CHARS} chars)"
    if isinstance(value, dict):
        text = "{" + ", ".join(f"{_repr_cut(k)}: {_repr_cut(v)}" for k, v in value.items()) + "}"
    else:
        text = repr(value)
    if len(text) > REPR_FIELD_CHARS:
        text = f"{text[:REPR_FIELD_CHARS]}...(+{len(text) - REPR_FIELD_CHARS} chars)"
    return text


# Pickles, reprs and tracebacks name the public module (_public_home.py says why).
publish(
    "ckpt_events",
    CollectionFinished,
    CollectionStarted,
    CoordinateFinished,
    CoordinateStarted,
    Event,
    GenerationCut,
    LeaseExpired,
    OperationFinished,
    OperationStarted,
    PrepareNotReady,
    Refused,
    SpanEvent,
    StageFinished,
    StageStarted,
    Stalled,
    StepFinished,
    StepStarted,
)
publish("ckpt_events.vocab", span_kind_of, span_name_of)
