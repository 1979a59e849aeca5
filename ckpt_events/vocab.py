"""The vocabulary of checkpoint telemetry: every name a span, a metric or an event is made of.

One namespace for the tables dashboards and sinks are built from, so the top of
``ckpt_events`` stays what server code calls (``Bus``, ``Telemetry``, the events)::

    from ckpt_events.vocab import Kind, Operation, STEP_SPANS

- **Closed** (the protocol; a typo is an ``UnknownNameError`` naming the valid values):
  ``Operation``, ``Phase``, ``Outcome``, ``CountedEvent``, ``Disposition``,
  ``CollectionAction``, ``ErrorCode``, ``SpanKind``. ``coerce(Operation, "commit")`` turns a
  string into its member.
- **Open** (the user's): participant kinds and steps are any name of ``NAME_RULE``'s shape
  (1-64 characters of ``a-z``, ``0-9``, ``_`` and ``-``, starting with a letter or a digit);
  ``Kind`` and ``Step`` name the original system's. ``kind_name``/``step_name`` check a name.
  The tables keyed by them (``STAGE_SPANS``, ``STEP_SPANS``, ``STEP_END_ATTRS``) answer for
  any name: ``STEP_SPANS["upload"] == "gym.checkpoint.upload"``, and a user's step carries
  ``records`` and ``bytes`` when set.
- **Names built from them**: ``span_name``, ``attr`` and ``Attr``, the ``*_SPANS`` and
  ``*_END_ATTRS`` tables, the ``METRIC_*`` names and ``INSTRUMENTS``, ``span_name_of`` and
  ``span_kind_of`` for an event; span groups (``SPAN_GROUPS``, ``resolve_span_groups``) and the
  default redaction (``DEFAULT_REDACT_KEYS``, ``REDACTED``).

The harness's rules (which kind prepares first, the HTTP status of a code) are not here:
they belong to ``ckpt_events.participants.kinds`` and ``ckpt_events.participants.errors``.
"""

from __future__ import annotations

from ckpt_events._events import span_kind_of, span_name_of
from ckpt_events._redact import DEFAULT_REDACT_KEYS, REDACTED
from ckpt_events._span_groups import SPAN_GROUP_PRESETS, SPAN_GROUPS, resolve_span_groups
from ckpt_events._vocab import (
    ATTR_PREFIX,
    COLLECTION_END_ATTRS,
    COLLECTION_SPANS,
    CONTROLLER_INSTANCE,
    COORDINATE_END_ATTRS,
    COORDINATE_SPANS,
    INSTRUMENTS,
    METRIC_BYTES,
    METRIC_EVENTS,
    METRIC_LAST_PUBLISHED,
    METRIC_LOOP_LAG,
    METRIC_OLDEST_OPEN,
    METRIC_OPEN_OPERATIONS,
    METRIC_OPERATION_DURATION,
    METRIC_RECORDS,
    NAME_RULE,
    OPEN_WORK_INSTRUMENTS,
    OPERATION_END_ATTRS,
    OPERATION_SPANS,
    SAFE_NAME,
    SPAN_PREFIX,
    STAGE_SPANS,
    STEP_END_ATTRS,
    STEP_SPANS,
    Attr,
    CollectionAction,
    CountedEvent,
    Disposition,
    ErrorCode,
    FieldAttrs,
    Instrument,
    InstrumentKind,
    Kind,
    OpenTable,
    Operation,
    Outcome,
    Phase,
    SpanKind,
    Step,
    attr,
    coerce,
    kind_name,
    span_name,
    step_name,
)

__all__ = [
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
    "NAME_RULE",
    "OPEN_WORK_INSTRUMENTS",
    "OPERATION_END_ATTRS",
    "OPERATION_SPANS",
    "REDACTED",
    "SAFE_NAME",
    "SPAN_GROUPS",
    "SPAN_GROUP_PRESETS",
    "SPAN_PREFIX",
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
    "OpenTable",
    "Operation",
    "Outcome",
    "Phase",
    "SpanKind",
    "Step",
    "attr",
    "coerce",
    "kind_name",
    "resolve_span_groups",
    "span_kind_of",
    "span_name",
    "span_name_of",
    "step_name",
]
