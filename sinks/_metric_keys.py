"""The checkpoint metrics' attribute sets, shared by ``MetricSink`` and ``OtlpMetricSink``.

Both sinks turn an event into a flat key ``(tag, value, ...)`` and the key into the same
attribute mapping, so the two record exactly the same points. Values are low-cardinality
vocabularies (operation, kind, outcome, code, disposition, phase): never an id or instance.
Kinds are the user's open words (steps are on no metric), so each instrument keeps at most a
cardinality limit of them (``ckpt_events.sinks._cardinality``); the rest share ``OVERFLOW_KEY``, whose one
attribute is OpenTelemetry's ``otel.metric.overflow=true``.
"""

from __future__ import annotations

from typing import Any, Final

from ckpt_events import (
    CollectionFinished,
    CoordinateFinished,
    CoordinateStarted,
    GenerationCut,
    LeaseExpired,
    OperationFinished,
    OperationStarted,
    PrepareNotReady,
    Refused,
    Stalled,
)
from ckpt_events.vocab import Attr, CountedEvent, Kind, Operation

__all__ = [
    "CONTROLLER",
    "CUT",
    "DURATION",
    "INTERESTS",
    "LAG",
    "LEASE",
    "NOT_READY",
    "OPEN",
    "OVERFLOW",
    "OVERFLOW_ATTRIBUTE",
    "OVERFLOW_KEY",
    "REFUSED",
    "STALLED",
    "VOLUME",
    "VOLUME_OPERATIONS",
    "attributes_of",
]

VOLUME_OPERATIONS: Final = frozenset({Operation.COMMIT, Operation.RESTORE})
INTERESTS: Final = (
    OperationFinished,
    CoordinateFinished,
    LeaseExpired,
    PrepareNotReady,
    Refused,
    GenerationCut,
    Stalled,
    # Open work: what started and has not finished yet, and when a checkpoint was published.
    OperationStarted,
    CoordinateStarted,
    CollectionFinished,
)

CONTROLLER: Final = Kind.CONTROLLER.value
# Tags of the flat keys, and the attribute names of the values that follow each tag.
# Counted-event tags are the ``nemo.gym.checkpoint.event`` values.
DURATION: Final = "duration"
VOLUME: Final = "volume"
LAG: Final = "loop_lag"
REFUSED: Final = CountedEvent.REFUSED.value
CUT: Final = CountedEvent.GENERATION_CUT.value
LEASE: Final = CountedEvent.LEASE_EXPIRED.value
NOT_READY: Final = CountedEvent.PREPARE_NOT_READY.value
STALLED: Final = CountedEvent.STALLED.value
#: Open operations and the oldest one's age (``ckpt_events.sinks._open_work``).
OPEN: Final = "open"
#: The series of every attribute set past an instrument's cardinality limit: one key for all of
#: them, its one attribute the OpenTelemetry SDK's own overflow set (a boolean, as the SDK
#: writes it, so our points and an SDK's overflow point are one series).
OVERFLOW: Final = "overflow"
OVERFLOW_KEY: Final = (OVERFLOW,)
OVERFLOW_ATTRIBUTE: Final = "otel.metric.overflow"
_KEYS: Final[dict[str, tuple[str, ...]]] = {
    DURATION: (Attr.OPERATION, Attr.PARTICIPANT_KIND, Attr.METRIC_OUTCOME),
    VOLUME: (Attr.OPERATION, Attr.PARTICIPANT_KIND),
    LAG: (Attr.PARTICIPANT_KIND,),
    REFUSED: (Attr.CODE,),
    CUT: (Attr.DISPOSITION,),
    LEASE: (Attr.PARTICIPANT_KIND, Attr.PHASE),
    NOT_READY: (Attr.PARTICIPANT_KIND,),
    STALLED: (Attr.PARTICIPANT_KIND, Attr.OPERATION),
    OPEN: (Attr.OPERATION, Attr.PARTICIPANT_KIND),
}
_EVENT_TAGS: Final = frozenset({REFUSED, CUT, LEASE, NOT_READY, STALLED})


def attributes_of(key: tuple[Any, ...]) -> dict[str, str | bool]:
    """The attribute mapping of a flat key ``(tag, value, ...)``: plain ``str`` values, but
    ``{"otel.metric.overflow": True}`` for ``OVERFLOW_KEY``."""
    tag, *values = key
    if tag == OVERFLOW:
        return {OVERFLOW_ATTRIBUTE: True}
    names = _KEYS[tag]
    attributes: dict[str, str | bool] = {name: str(value) for name, value in zip(names, values, strict=True)}
    if tag in _EVENT_TAGS:
        attributes = {Attr.EVENT: tag, **attributes}
    return attributes
