"""``MetricSink``: the four checkpoint instruments of SPEC section 3, fed from events.

The SDK's per-call cost is about 10-17 us, so counters are summed per attribute set within
a batch and reach the SDK once per set. Histogram values cannot be summed; each is recorded.
Attribute values are bounded vocabularies: never an id or an instance.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec
from opentelemetry.metrics import MeterProvider

from ckpt_events import (
    METRIC_BYTES,
    METRIC_EVENTS,
    METRIC_OPERATION_DURATION,
    METRIC_RECORDS,
    CoordinateFinished,
    CountedEvent,
    GenerationCut,
    InvalidArgumentError,
    Kind,
    LeaseExpired,
    Operation,
    OperationFinished,
    PrepareNotReady,
    Refused,
    attr,
)

__all__ = ["MetricSink", "MetricSinkStats"]

A_OPERATION: Final = attr("operation")
A_KIND: Final = attr("participant_kind")
A_OUTCOME: Final = "outcome"  # unprefixed, as in the original system
A_EVENT: Final = attr("event")
A_CODE: Final = attr("code")
A_PHASE: Final = attr("phase")
A_DISPOSITION: Final = attr("disposition")

_VOLUME_OPERATIONS: Final = frozenset({Operation.COMMIT, Operation.RESTORE})
_INTERESTS: Final = (
    OperationFinished,
    CoordinateFinished,
    LeaseExpired,
    PrepareNotReady,
    Refused,
    GenerationCut,
)

Attributes = tuple[tuple[str, str], ...]


class MetricSinkStats(msgspec.Struct, frozen=True):
    """Counters of one ``MetricSink``: events seen and SDK calls made for them."""

    events: int
    sdk_calls: int


class MetricSink:
    """A bus sink recording checkpoint metrics on instruments of ``meter_provider``.

    Independent of span groups: while subscribed it records every operation duration
    (participants and controller), commit/restore volumes and the counted events.
    """

    interests: Final = _INTERESTS

    def __init__(self, meter_provider: MeterProvider) -> None:
        get_meter = getattr(meter_provider, "get_meter", None)
        if not callable(get_meter):
            raise InvalidArgumentError(
                f"meter_provider must be an OpenTelemetry MeterProvider, not {meter_provider!r}"
            )
        self.meter_provider = meter_provider
        meter = get_meter("ckpt_events", "0.1.0")
        self._duration = meter.create_histogram(
            METRIC_OPERATION_DURATION, unit="ms", description="Duration of a checkpoint operation"
        )
        self._records = meter.create_counter(
            METRIC_RECORDS, unit="1", description="Records written by commit or read by restore"
        )
        self._bytes = meter.create_counter(
            METRIC_BYTES, unit="By", description="Bytes written by commit or read by restore"
        )
        self._events = meter.create_counter(METRIC_EVENTS, unit="1", description="Counted checkpoint events")
        # Attribute mappings are built once per distinct set and reused: the set is small.
        self._attribute_cache: dict[Attributes, dict[str, str]] = {}
        self._seen = 0
        self._sdk_calls = 0

    def _attributes(self, key: Attributes) -> dict[str, str]:
        cached = self._attribute_cache.get(key)
        if cached is None:
            # Plain str values (not enum members), as any exporter expects.
            cached = self._attribute_cache[key] = {name: str(value) for name, value in key}
        return cached

    def handle(self, batch: list[Any]) -> None:
        """Record a batch: histogram values one by one, counters summed per attribute set."""
        record = self._duration.record
        attributes = self._attributes
        records: dict[Attributes, int] = {}
        sizes: dict[Attributes, int] = {}
        counts: dict[Attributes, int] = {}
        calls = 0
        for event in batch:
            cls = event.__class__
            if cls is OperationFinished:
                operation = event.operation
                record(
                    (event.end_ns - event.start_ns) / 1e6,
                    attributes(((A_OPERATION, operation), (A_KIND, event.kind), (A_OUTCOME, event.outcome))),
                )
                calls += 1
                if operation in _VOLUME_OPERATIONS:
                    key: Attributes = ((A_OPERATION, operation), (A_KIND, event.kind))
                    if event.records is not None:
                        records[key] = records.get(key, 0) + event.records
                    if event.bytes is not None:
                        sizes[key] = sizes.get(key, 0) + event.bytes
            elif cls is CoordinateFinished:
                record(
                    (event.end_ns - event.start_ns) / 1e6,
                    attributes(
                        (
                            (A_OPERATION, event.operation),
                            (A_KIND, Kind.CONTROLLER),
                            (A_OUTCOME, event.outcome),
                        )
                    ),
                )
                calls += 1
            else:
                counted = _counted(event)
                if counted is not None:
                    counted_key, amount = counted
                    counts[counted_key] = counts.get(counted_key, 0) + amount
        for counter, sums in ((self._records, records), (self._bytes, sizes), (self._events, counts)):
            add = counter.add
            for key, total in sums.items():
                add(total, attributes(key))
            calls += len(sums)
        self._seen += len(batch)
        self._sdk_calls += calls

    async def aclose(self) -> None:
        """Nothing to release: the meter provider belongs to whoever made it."""

    def stats(self) -> MetricSinkStats:
        """Events seen and SDK calls made so far."""
        return MetricSinkStats(events=self._seen, sdk_calls=self._sdk_calls)


def _counted(event: Any) -> tuple[Attributes, int] | None:
    """The ``events_total`` attribute set and amount of one counted event (``None``: not one)."""
    match event:
        case Refused(code=code):
            return ((A_EVENT, CountedEvent.REFUSED), (A_CODE, code)), 1
        case GenerationCut(disposition=disposition, calls=calls):
            return ((A_EVENT, CountedEvent.GENERATION_CUT), (A_DISPOSITION, disposition)), calls
        case LeaseExpired(kind=kind, phase=phase):
            return ((A_EVENT, CountedEvent.LEASE_EXPIRED), (A_KIND, kind), (A_PHASE, phase)), 1
        case PrepareNotReady(kind=kind):
            return ((A_EVENT, CountedEvent.PREPARE_NOT_READY), (A_KIND, kind)), 1
    return None
