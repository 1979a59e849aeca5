"""The name and attributes of a finished event's span, one rule for every span exporter.

``SpanSink`` builds OpenTelemetry ``ReadableSpan``s and the OTLP encoder writes wire bytes
straight from events; both give a span the same name and the same attributes (names and
values), taken from the tables in ``ckpt_events``.
"""

from __future__ import annotations

from typing import Any, Final

from ckpt_events import (
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
    CollectionFinished,
    CoordinateFinished,
    FieldAttrs,
    OperationFinished,
    Redactor,
    StageFinished,
    StepFinished,
)

__all__ = ["FINISHED", "span_name_and_attributes"]

FINISHED: Final = (OperationFinished, StepFinished, CoordinateFinished, StageFinished, CollectionFinished)


def span_name_and_attributes(event: Any, redactor: Redactor) -> tuple[str, dict[str, Any]] | None:
    """``(name, attributes)`` of ``event``'s span, or ``None`` for an event with no span (renew)."""
    cls = event.__class__
    if cls is OperationFinished:
        name = OPERATION_SPANS.get(event.operation)
        if name is None:  # renew: counted in metrics, no span
            return None
        attributes = _identity(event)
        _put(attributes, event, OPERATION_END_ATTRS[event.operation])
    elif cls is StepFinished:
        name = STEP_SPANS[event.step]
        attributes = {}
        _put(attributes, event, STEP_END_ATTRS[event.step])
    elif cls is CoordinateFinished:
        name = COORDINATE_SPANS[event.operation]
        attributes = _identity(event)
        if event.participants is not None:
            attributes[Attr.PARTICIPANTS] = event.participants
        _put(attributes, event, COORDINATE_END_ATTRS[event.operation])
    elif cls is StageFinished:
        name = STAGE_SPANS[event.stage]
        attributes = {}
        if event.participants is not None:
            attributes[Attr.PARTICIPANTS] = event.participants
    elif cls is CollectionFinished:
        name = COLLECTION_SPANS[event.action]
        attributes = {}
        if event.checkpoint_id is not None:
            attributes[Attr.ID] = event.checkpoint_id
        _put(attributes, event, COLLECTION_END_ATTRS[event.action])
    else:
        return None
    if event.worker is not None:  # a multi-worker participant's process (spans only, never metrics)
        attributes[Attr.WORKER] = event.worker
    extra = event.attributes
    if extra:
        # Ours win over a user attribute of the same name; the rule redacts theirs.
        attributes = {**redactor.apply(extra), **attributes}
    return name, attributes


def _identity(event: Any) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        # str(): a plain string whether the field holds the enum member or its value.
        Attr.PARTICIPANT_KIND: str(event.kind),
        Attr.INSTANCE: event.instance,
        Attr.OUTCOME: str(event.outcome),
    }
    if event.checkpoint_id is not None:
        attributes[Attr.ID] = event.checkpoint_id
    return attributes


def _put(attributes: dict[str, Any], event: Any, fields: FieldAttrs) -> None:
    for field, key in fields:
        value = getattr(event, field)
        if value is not None:
            # Enum members go out as plain strings.
            attributes[key] = str(value) if isinstance(value, str) else value
