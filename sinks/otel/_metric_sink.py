"""``MetricSink``: the four checkpoint instruments of SPEC section 3 and the loop lag, fed from events.

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
    METRIC_LOOP_LAG,
    METRIC_OPERATION_DURATION,
    METRIC_RECORDS,
    CoordinateFinished,
    GenerationCut,
    InvalidArgumentError,
    LeaseExpired,
    OperationFinished,
    PrepareNotReady,
    Refused,
    __version__,
)
from sinks import _metric_keys as keys

__all__ = ["MetricSink", "MetricSinkStats"]

_VOLUME_OPERATIONS: Final = keys.VOLUME_OPERATIONS
_INTERESTS: Final = keys.INTERESTS
_CONTROLLER: Final = keys.CONTROLLER
_DURATION: Final = keys.DURATION
_VOLUME: Final = keys.VOLUME
_LAG: Final = keys.LAG
_REFUSED: Final = keys.REFUSED
_CUT: Final = keys.CUT
_LEASE: Final = keys.LEASE
_NOT_READY: Final = keys.NOT_READY


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
        meter = get_meter("ckpt_events", __version__)
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
        self._loop_lag = meter.create_histogram(
            METRIC_LOOP_LAG, unit="ms", description="A participant's worst event-loop lag during an operation"
        )
        # Attribute mappings are built once per distinct flat key and reused: the sets are few.
        self._cache: dict[tuple[Any, ...], dict[str, str]] = {}
        self._seen = 0
        self._sdk_calls = 0

    def _attributes(self, key: tuple[Any, ...]) -> dict[str, str]:
        """The attribute mapping of a flat key: (tag, value, ...) as built in ``handle``."""
        cached = self._cache.get(key)
        if cached is None:
            # Plain str values (not enum members), as any exporter expects.
            cached = self._cache[key] = keys.attributes_of(key)
        return cached

    def handle(self, batch: list[Any]) -> None:
        """Record a batch: histogram values one by one, counters summed per attribute set."""
        record = self._duration.record
        cache = self._cache
        attributes = self._attributes
        records: dict[tuple[Any, ...], int] = {}
        sizes: dict[tuple[Any, ...], int] = {}
        counts: dict[tuple[Any, ...], int] = {}
        calls = 0
        # Flat tuple keys, tested by class identity in order of frequency: per-event cost
        # here is what the batching saves on, so it stays a few dict operations.
        for event in batch:
            cls = event.__class__
            if cls is Refused:
                key: tuple[Any, ...] = (_REFUSED, event.code)
                counts[key] = counts.get(key, 0) + 1
            elif cls is OperationFinished:
                operation, kind = event.operation, event.kind
                key = (_DURATION, operation, kind, event.outcome)
                record((event.end_ns - event.start_ns) / 1e6, cache.get(key) or attributes(key))
                calls += 1
                if event.loop_lag_ms is not None:
                    key = (_LAG, kind)
                    self._loop_lag.record(event.loop_lag_ms, cache.get(key) or attributes(key))
                    calls += 1
                if operation in _VOLUME_OPERATIONS:
                    key = (_VOLUME, operation, kind)
                    if event.records is not None:
                        records[key] = records.get(key, 0) + event.records
                    if event.bytes is not None:
                        sizes[key] = sizes.get(key, 0) + event.bytes
            elif cls is CoordinateFinished:
                key = (_DURATION, event.operation, _CONTROLLER, event.outcome)
                record((event.end_ns - event.start_ns) / 1e6, cache.get(key) or attributes(key))
                calls += 1
            elif cls is GenerationCut:
                key = (_CUT, event.disposition)
                counts[key] = counts.get(key, 0) + event.calls
            elif cls is LeaseExpired:
                key = (_LEASE, event.kind, event.phase)
                counts[key] = counts.get(key, 0) + 1
            elif cls is PrepareNotReady:
                key = (_NOT_READY, event.kind)
                counts[key] = counts.get(key, 0) + 1
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
