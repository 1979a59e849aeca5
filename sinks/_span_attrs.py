"""The name and attributes of a finished event's span, one rule for every span exporter.

``SpanSink`` builds OpenTelemetry ``ReadableSpan``s and the OTLP encoder writes wire bytes
straight from events; both give a span the same name and the same attributes (names and
values), taken from the tables in ``ckpt_events``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import msgspec

from ckpt_events import (
    CollectionFinished,
    CoordinateFinished,
    OperationFinished,
    Redactor,
    StageFinished,
    StepFinished,
    parse_tracestate,
)
from ckpt_events._public_home import publish
from ckpt_events.vocab import (
    COLLECTION_END_ATTRS,
    COLLECTION_SPANS,
    COORDINATE_END_ATTRS,
    COORDINATE_SPANS,
    OPERATION_END_ATTRS,
    OPERATION_SPANS,
    STAGE_SPANS,
    STEP_END_ATTRS,
    STEP_SPANS,
    Attr,
    FieldAttrs,
    Outcome,
)

__all__ = [
    "DEFAULT_ATTRIBUTE_COUNT_LIMIT",
    "ERROR_TYPE_OTHER",
    "FINISHED",
    "NAMING_FIELDS",
    "AttributeLimits",
    "SpanPlan",
    "limited_span",
    "plans_by_name",
    "span_name_and_attributes",
    "span_plan",
    "span_tracestate",
]

#: The specification's default ``AttributeCountLimit`` (``OTEL_ATTRIBUTE_COUNT_LIMIT``).
DEFAULT_ATTRIBUTE_COUNT_LIMIT: Final = 128

#: ``error.type`` of a failed span whose exception type is unknown (an event built without one):
#: the semantic conventions' fallback, rather than a type it did not have.
ERROR_TYPE_OTHER: Final = "_OTHER"
_ERROR: Final = Outcome.ERROR.value

FINISHED: Final = (OperationFinished, StepFinished, CoordinateFinished, StageFinished, CollectionFinished)

#: A span's name and the (event field, attribute) pairs it carries, in order.
SpanPlan = tuple[str, FieldAttrs]

# A participant's identity, then what each span adds: the rule, as one table per event class
# keyed by the field that names the span (an operation, step, stage or action).
_IDENTITY: Final[FieldAttrs] = (
    ("kind", Attr.PARTICIPANT_KIND),
    ("instance", Attr.INSTANCE),
    ("outcome", Attr.OUTCOME),
    ("checkpoint_id", Attr.ID),
)
_PARTICIPANTS: Final[FieldAttrs] = (("participants", Attr.PARTICIPANTS),)
_PLANS: Final[dict[type, tuple[str, dict[Any, SpanPlan]]]] = {
    OperationFinished: (
        "operation",
        {op: (name, _IDENTITY + OPERATION_END_ATTRS[op]) for op, name in OPERATION_SPANS.items()},
    ),
    StepFinished: ("step", {step: (name, STEP_END_ATTRS[step]) for step, name in STEP_SPANS.items()}),
    CoordinateFinished: (
        "operation",
        {
            op: (name, _IDENTITY + _PARTICIPANTS + COORDINATE_END_ATTRS[op])
            for op, name in COORDINATE_SPANS.items()
        },
    ),
    StageFinished: ("stage", {stage: (name, _PARTICIPANTS) for stage, name in STAGE_SPANS.items()}),
    CollectionFinished: (
        "action",
        {
            action: (name, (("checkpoint_id", Attr.ID), *COLLECTION_END_ATTRS[action]))
            for action, name in COLLECTION_SPANS.items()
        },
    ),
}
#: The field whose value names a span, per finished event class (the key of its plan).
NAMING_FIELDS: Final[dict[type, str]] = {cls: field for cls, (field, _) in _PLANS.items()}


#: The plan of a step or stage named by the user (a step ``upload``, a kind ``judge``), from
#: the open tables' rule: ``gym.checkpoint.<step>`` with ``records`` and ``bytes``, and
#: ``gym.checkpoint.coordinate.prepare.<kind>``. Cached per name (at most ``_LEARNED_MAX``).
_OPEN_PLANS: Final[dict[type, Callable[[str], SpanPlan]]] = {
    StepFinished: lambda step: (STEP_SPANS[step], STEP_END_ATTRS[step]),
    StageFinished: lambda stage: (STAGE_SPANS[stage], _PARTICIPANTS),
}
_LEARNED: Final[dict[tuple[type, str], SpanPlan]] = {}
_LEARNED_MAX: Final = 1024


def span_plan(event: Any) -> SpanPlan | None:
    """``(name, fields)`` of ``event``'s span, or ``None`` for an event with no span (renew).

    ``fields`` are the ``(event field, attribute)`` pairs, in order: a field holding ``None``
    is left out and a ``str`` subclass (an enum member) goes out as a plain ``str``. A
    ``worker`` and the user's ``attributes`` come on top (``span_name_and_attributes``).
    A step or stage of the user's own gets the open tables' plan.
    """
    cls = event.__class__
    found = _PLANS.get(cls)
    if found is None:
        return None
    field, plans = found
    value = getattr(event, field)
    plan = plans.get(value)
    if plan is None and cls in _OPEN_PLANS:
        plan = _LEARNED.get((cls, value))
        if plan is None:
            plan = _OPEN_PLANS[cls](value)
            if len(_LEARNED) < _LEARNED_MAX:
                _LEARNED[cls, value] = plan
    return plan


#: ``span_tracestate``'s answers by the event's value (bounded: emptied when full). A trace's
#: spans share one tracestate, so most lookups hit and a header is checked once, not per span.
_TRACESTATES: Final[dict[str, str | None]] = {}
_TRACESTATES_MAX: Final = 1024


def span_tracestate(event: Any) -> str | None:
    """The W3C ``tracestate`` to put on ``event``'s exported span (``Span.trace_state``), or
    ``None``: none came with its trace, or it is not one (``parse_tracestate``'s rules).

    Our handles hand on a normalised one; an event built by hand, or read from a log someone
    edited, may hold anything, and a malformed value sent on would have the collector (or the
    SDK's ``TraceState``) refuse or drop it, so it is checked here, once per value.
    """
    value = event.tracestate
    if value is None or value.__class__ is not str:
        return None
    try:
        return _TRACESTATES[value]
    except KeyError:
        pass
    state = parse_tracestate(value)
    if len(_TRACESTATES) >= _TRACESTATES_MAX:
        _TRACESTATES.clear()
    _TRACESTATES[value] = state
    return state


def plans_by_name() -> dict[str, tuple[type, str, Any, FieldAttrs]]:
    """The rule read backwards, for readers of exported spans: span name -> (event class, the
    field that names the span, that field's value, the span's (event field, attribute) pairs)."""
    return {
        name: (cls, field, member, fields)
        for cls, (field, plans) in _PLANS.items()
        for member, (name, fields) in plans.items()
    }


def span_name_and_attributes(event: Any, redactor: Redactor) -> tuple[str, dict[str, Any]] | None:
    """``(name, attributes)`` of ``event``'s span, or ``None`` for an event with no span (renew).

    A failed one (outcome ``error``) also carries ``error.type``: its exception's qualified
    type, the one its ``exception`` event names, or ``_OTHER`` when the event has none; unless
    the user's attributes give one (theirs is kept, redacted as the rest)."""
    plan = span_plan(event)
    if plan is None:
        return None
    name, fields = plan
    attributes: dict[str, Any] = {}
    _put(attributes, event, fields)
    if event.worker is not None:  # a multi-worker participant's process (spans only, never metrics)
        attributes[Attr.WORKER] = event.worker
    extra = event.attributes
    # The semantic conventions' recording of errors on spans; a user's own error.type (a code of
    # their domain, as the conventions allow) is theirs to keep.
    if event.outcome == _ERROR and not (extra and Attr.ERROR_TYPE in extra):
        attributes[Attr.ERROR_TYPE] = event.error_type or ERROR_TYPE_OTHER
    if extra:
        # Ours win over a user attribute of the same name; the rule redacts theirs.
        attributes = {**redactor.apply(extra), **attributes}
    return name, attributes


class AttributeLimits(msgspec.Struct, frozen=True):
    """OpenTelemetry's span attribute limits (``OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT``,
    ``OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT`` and their generic ``OTEL_ATTRIBUTE_*`` fallbacks).

    ``value_length``: a string value (an attribute's, the exception event's) is cut to that many
    characters (``None``: no limit, the specification's default). ``count``: the most attributes
    a span keeps (default 128, the specification's); ours are kept first, then the user's in the
    order given, and the rest are dropped and counted in the span's dropped attributes count.
    """

    value_length: int | None = None
    count: int = DEFAULT_ATTRIBUTE_COUNT_LIMIT

    def cut(self, text: str) -> str:
        """``text`` within ``value_length``."""
        limit = self.value_length
        return text if limit is None or len(text) <= limit else text[:limit]


def limited_span(
    event: Any, redactor: Redactor, limits: AttributeLimits
) -> tuple[str, dict[str, Any], int] | None:
    """``(name, attributes, dropped)`` of ``event``'s span within ``limits`` (``dropped``: the
    attributes left out past the count), or ``None`` for an event with no span."""
    made = span_name_and_attributes(event, redactor)
    if made is None:
        return None
    name, attributes = made
    dropped = 0
    if len(attributes) > limits.count:
        own = [key for _, key in span_plan(event)[1] if key in attributes]  # type: ignore[index]
        if event.worker is not None:
            own.append(Attr.WORKER)
        if Attr.ERROR_TYPE in attributes and event.outcome == _ERROR:
            own.append(Attr.ERROR_TYPE)
        keep = set(own[: limits.count])
        for key in attributes:
            if len(keep) >= limits.count:
                break
            keep.add(key)
        kept = {key: value for key, value in attributes.items() if key in keep}
        dropped = len(attributes) - len(kept)
        attributes = kept
    if limits.value_length is not None:
        cut = limits.cut
        attributes = {
            key: cut(value) if isinstance(value, str) else value for key, value in attributes.items()
        }
    return name, attributes, dropped


def _put(attributes: dict[str, Any], event: Any, fields: FieldAttrs) -> None:
    for field, key in fields:
        value = getattr(event, field)
        if value is not None:
            # Enum members go out as plain strings.
            attributes[key] = str(value) if isinstance(value, str) else value


# Pickles, reprs and tracebacks name the public module (_public_home.py says why).
publish("ckpt_events.sinks.otel", AttributeLimits)
