"""Typed checkpoint events, an in-process async bus, and an emitter free when unused.

Start here: ``Bus`` (owns delivery to sinks), ``Telemetry`` (what server code calls) and
``CheckpointEvent`` (the union of every event type). Errors derive from ``CkptEventsError``.
The vocabulary (``Kind``, ``Operation``, span and metric names, ...) is ``ckpt_events.vocab``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from ckpt_events._lazy import lazy_attributes

__version__ = "0.3.0"

if TYPE_CHECKING:
    from ckpt_events import vocab
    from ckpt_events._bus import Bus, BusStats, SinkStats, Subscription
    from ckpt_events._bus_thread import BusThread
    from ckpt_events._context_bridge import ContextBridge
    from ckpt_events._controller_spans import CollectionSpan, CoordinateSpan, StageSpan
    from ckpt_events._errors import (
        CkptEventsError,
        ConfigurationError,
        InvalidArgumentError,
        InvalidTypeError,
        InvalidValueError,
        SpanNotStartedError,
        UnknownNameError,
    )
    from ckpt_events._events import (
        CheckpointEvent,
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
    from ckpt_events._redact import Redactor
    from ckpt_events._sink import BaseSink, BlockingSink, ClosableSink, LingeringSink, Sink, WantsEvents
    from ckpt_events._span_handles import OperationSpan, StepSpan
    from ckpt_events._subscription import resolve_interests
    from ckpt_events._telemetry import Telemetry
    from ckpt_events._tracecontext import (
        RemoteParent,
        format_traceparent,
        new_span_id,
        new_trace_id,
        parse_traceparent,
        parse_tracestate,
    )

__all__ = [
    "BaseSink",
    "BlockingSink",
    "Bus",
    "BusStats",
    "BusThread",
    "CheckpointEvent",
    "CkptEventsError",
    "ClosableSink",
    "CollectionFinished",
    "CollectionSpan",
    "CollectionStarted",
    "ConfigurationError",
    "ContextBridge",
    "CoordinateFinished",
    "CoordinateSpan",
    "CoordinateStarted",
    "Event",
    "GenerationCut",
    "InvalidArgumentError",
    "InvalidTypeError",
    "InvalidValueError",
    "LeaseExpired",
    "LingeringSink",
    "OperationFinished",
    "OperationSpan",
    "OperationStarted",
    "PrepareNotReady",
    "Redactor",
    "Refused",
    "RemoteParent",
    "Sink",
    "SinkStats",
    "SpanEvent",
    "SpanNotStartedError",
    "StageFinished",
    "StageSpan",
    "StageStarted",
    "Stalled",
    "StepFinished",
    "StepSpan",
    "StepStarted",
    "Subscription",
    "Telemetry",
    "UnknownNameError",
    "WantsEvents",
    "format_traceparent",
    "new_span_id",
    "new_trace_id",
    "parse_traceparent",
    "parse_tracestate",
    "resolve_interests",
    "vocab",
]

#: Where each public name lives. Imported on first use, so ``import ckpt_events`` (and so
#: ``import ckpt_events.sinks``) costs a dict until a name is read; ``from ckpt_events import
#: Bus`` loads the bus. ``vocab`` is the vocabulary's namespace (a submodule).
_HOMES: Final = {
    "BaseSink": "ckpt_events._sink",
    "BlockingSink": "ckpt_events._sink",
    "Bus": "ckpt_events._bus",
    "BusStats": "ckpt_events._bus",
    "BusThread": "ckpt_events._bus_thread",
    "CheckpointEvent": "ckpt_events._events",
    "CkptEventsError": "ckpt_events._errors",
    "ClosableSink": "ckpt_events._sink",
    "CollectionFinished": "ckpt_events._events",
    "CollectionSpan": "ckpt_events._controller_spans",
    "CollectionStarted": "ckpt_events._events",
    "ConfigurationError": "ckpt_events._errors",
    "ContextBridge": "ckpt_events._context_bridge",
    "CoordinateFinished": "ckpt_events._events",
    "CoordinateSpan": "ckpt_events._controller_spans",
    "CoordinateStarted": "ckpt_events._events",
    "Event": "ckpt_events._events",
    "GenerationCut": "ckpt_events._events",
    "InvalidArgumentError": "ckpt_events._errors",
    "InvalidTypeError": "ckpt_events._errors",
    "InvalidValueError": "ckpt_events._errors",
    "LeaseExpired": "ckpt_events._events",
    "LingeringSink": "ckpt_events._sink",
    "OperationFinished": "ckpt_events._events",
    "OperationSpan": "ckpt_events._span_handles",
    "OperationStarted": "ckpt_events._events",
    "PrepareNotReady": "ckpt_events._events",
    "Redactor": "ckpt_events._redact",
    "Refused": "ckpt_events._events",
    "RemoteParent": "ckpt_events._tracecontext",
    "Sink": "ckpt_events._sink",
    "SinkStats": "ckpt_events._bus",
    "SpanEvent": "ckpt_events._events",
    "SpanNotStartedError": "ckpt_events._errors",
    "StageFinished": "ckpt_events._events",
    "StageSpan": "ckpt_events._controller_spans",
    "StageStarted": "ckpt_events._events",
    "Stalled": "ckpt_events._events",
    "StepFinished": "ckpt_events._events",
    "StepSpan": "ckpt_events._span_handles",
    "StepStarted": "ckpt_events._events",
    "Subscription": "ckpt_events._bus",
    "Telemetry": "ckpt_events._telemetry",
    "UnknownNameError": "ckpt_events._errors",
    "WantsEvents": "ckpt_events._sink",
    "format_traceparent": "ckpt_events._tracecontext",
    "new_span_id": "ckpt_events._tracecontext",
    "new_trace_id": "ckpt_events._tracecontext",
    "parse_traceparent": "ckpt_events._tracecontext",
    "parse_tracestate": "ckpt_events._tracecontext",
    "resolve_interests": "ckpt_events._subscription",
    "vocab": "ckpt_events.vocab",
}

#: Names that moved to ``ckpt_events.vocab`` in 0.3.0: still read here until 0.4.0, with a
#: ``DeprecationWarning`` naming the new home. (``PREPARE_ORDER``, ``RESUME_ORDER``,
#: ``RETIRE_GROUPS`` and ``ErrorCode.http_status`` left the core: they are the harness's rules.)
_MOVED: Final = dict.fromkeys(
    (
        "ATTR_PREFIX",
        "COLLECTION_END_ATTRS",
        "COLLECTION_SPANS",
        "CONTROLLER_INSTANCE",
        "COORDINATE_END_ATTRS",
        "COORDINATE_SPANS",
        "DEFAULT_REDACT_KEYS",
        "INSTRUMENTS",
        "METRIC_BYTES",
        "METRIC_EVENTS",
        "METRIC_LAST_PUBLISHED",
        "METRIC_LOOP_LAG",
        "METRIC_OLDEST_OPEN",
        "METRIC_OPEN_OPERATIONS",
        "METRIC_OPERATION_DURATION",
        "METRIC_RECORDS",
        "OPEN_WORK_INSTRUMENTS",
        "OPERATION_END_ATTRS",
        "OPERATION_SPANS",
        "REDACTED",
        "SAFE_NAME",
        "SPAN_GROUPS",
        "SPAN_GROUP_PRESETS",
        "STAGE_SPANS",
        "STEP_END_ATTRS",
        "STEP_SPANS",
        "Attr",
        "CollectionAction",
        "CountedEvent",
        "Disposition",
        "ErrorCode",
        "FieldAttrs",
        "Instrument",
        "InstrumentKind",
        "Kind",
        "Operation",
        "Outcome",
        "Phase",
        "SpanKind",
        "Step",
        "attr",
        "coerce",
        "resolve_span_groups",
        "span_kind_of",
        "span_name",
        "span_name_of",
    ),
    "ckpt_events.vocab",
)

# Hidden from type checkers, which read the imports above: a module __getattr__ made every
# misspelt name (`from ckpt_events import Bsu`) an Any that mypy --strict let through.
if TYPE_CHECKING:
    # The names moved to vocab, still read here (with a DeprecationWarning) until 0.4.0, typed
    # as before: a user's type check does not fail on them before they leave.
    from ckpt_events.vocab import ATTR_PREFIX as ATTR_PREFIX
    from ckpt_events.vocab import COLLECTION_END_ATTRS as COLLECTION_END_ATTRS
    from ckpt_events.vocab import COLLECTION_SPANS as COLLECTION_SPANS
    from ckpt_events.vocab import CONTROLLER_INSTANCE as CONTROLLER_INSTANCE
    from ckpt_events.vocab import COORDINATE_END_ATTRS as COORDINATE_END_ATTRS
    from ckpt_events.vocab import COORDINATE_SPANS as COORDINATE_SPANS
    from ckpt_events.vocab import DEFAULT_REDACT_KEYS as DEFAULT_REDACT_KEYS
    from ckpt_events.vocab import INSTRUMENTS as INSTRUMENTS
    from ckpt_events.vocab import METRIC_BYTES as METRIC_BYTES
    from ckpt_events.vocab import METRIC_EVENTS as METRIC_EVENTS
    from ckpt_events.vocab import METRIC_LAST_PUBLISHED as METRIC_LAST_PUBLISHED
    from ckpt_events.vocab import METRIC_LOOP_LAG as METRIC_LOOP_LAG
    from ckpt_events.vocab import METRIC_OLDEST_OPEN as METRIC_OLDEST_OPEN
    from ckpt_events.vocab import METRIC_OPEN_OPERATIONS as METRIC_OPEN_OPERATIONS
    from ckpt_events.vocab import METRIC_OPERATION_DURATION as METRIC_OPERATION_DURATION
    from ckpt_events.vocab import METRIC_RECORDS as METRIC_RECORDS
    from ckpt_events.vocab import OPEN_WORK_INSTRUMENTS as OPEN_WORK_INSTRUMENTS
    from ckpt_events.vocab import OPERATION_END_ATTRS as OPERATION_END_ATTRS
    from ckpt_events.vocab import OPERATION_SPANS as OPERATION_SPANS
    from ckpt_events.vocab import REDACTED as REDACTED
    from ckpt_events.vocab import SAFE_NAME as SAFE_NAME
    from ckpt_events.vocab import SPAN_GROUP_PRESETS as SPAN_GROUP_PRESETS
    from ckpt_events.vocab import SPAN_GROUPS as SPAN_GROUPS
    from ckpt_events.vocab import STAGE_SPANS as STAGE_SPANS
    from ckpt_events.vocab import STEP_END_ATTRS as STEP_END_ATTRS
    from ckpt_events.vocab import STEP_SPANS as STEP_SPANS
    from ckpt_events.vocab import Attr as Attr
    from ckpt_events.vocab import CollectionAction as CollectionAction
    from ckpt_events.vocab import CountedEvent as CountedEvent
    from ckpt_events.vocab import Disposition as Disposition
    from ckpt_events.vocab import ErrorCode as ErrorCode
    from ckpt_events.vocab import FieldAttrs as FieldAttrs
    from ckpt_events.vocab import Instrument as Instrument
    from ckpt_events.vocab import InstrumentKind as InstrumentKind
    from ckpt_events.vocab import Kind as Kind
    from ckpt_events.vocab import Operation as Operation
    from ckpt_events.vocab import Outcome as Outcome
    from ckpt_events.vocab import Phase as Phase
    from ckpt_events.vocab import SpanKind as SpanKind
    from ckpt_events.vocab import Step as Step
    from ckpt_events.vocab import attr as attr
    from ckpt_events.vocab import coerce as coerce
    from ckpt_events.vocab import resolve_span_groups as resolve_span_groups
    from ckpt_events.vocab import span_kind_of as span_kind_of
    from ckpt_events.vocab import span_name as span_name
    from ckpt_events.vocab import span_name_of as span_name_of

if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_attributes(__name__, _HOMES, globals(), moved=_MOVED)
# The helpers are not names of this package (dir() lists the namespace).
del TYPE_CHECKING, lazy_attributes
