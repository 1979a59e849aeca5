"""``MetricSink``: the four checkpoint instruments of SPEC section 3 and the loop lag, fed from events.

The SDK's per-call cost is about 10-17 us, so counters are summed per attribute set within
a batch and reach the SDK once per set. Histogram values cannot be summed; each is recorded.
Attribute values are bounded vocabularies: never an id or an instance.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any, Final

import msgspec
from opentelemetry.metrics import CallbackOptions, Counter, Histogram, Meter, MeterProvider, Observation

from ckpt_events import (
    CoordinateFinished,
    GenerationCut,
    InvalidTypeError,
    LeaseExpired,
    OperationFinished,
    PrepareNotReady,
    Refused,
    Stalled,
    __version__,
)
from ckpt_events.sinks import _metric_keys as keys
from ckpt_events.sinks._open_work import GAUGES, OPEN_COUNTER, OpenWork
from ckpt_events.vocab import (
    INSTRUMENTS,
    METRIC_BYTES,
    METRIC_EVENTS,
    METRIC_LOOP_LAG,
    METRIC_OPERATION_DURATION,
    METRIC_RECORDS,
    InstrumentKind,
)

__all__ = ["MetricSink", "MetricSinkStats"]

_INSTRUMENTS: Final = {instrument.name: instrument for instrument in INSTRUMENTS}


def _histogram(meter: Meter, name: str) -> Histogram:
    """The histogram ``name`` with the unit and description of the core's instrument table."""
    instrument = _INSTRUMENTS[name]
    assert instrument.kind is InstrumentKind.HISTOGRAM, instrument
    return meter.create_histogram(name, unit=instrument.unit, description=instrument.description)


def _counter(meter: Meter, name: str) -> Counter:
    """The counter ``name`` with the unit and description of the core's instrument table."""
    instrument = _INSTRUMENTS[name]
    assert instrument.kind is InstrumentKind.COUNTER, instrument
    return meter.create_counter(name, unit=instrument.unit, description=instrument.description)


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
_STALLED: Final = keys.STALLED


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
            raise InvalidTypeError(
                f"meter_provider must be an OpenTelemetry MeterProvider, not {meter_provider!r}"
            )
        self.meter_provider = meter_provider
        meter = get_meter("ckpt_events", __version__)
        self._duration = _histogram(meter, METRIC_OPERATION_DURATION)
        self._records = _counter(meter, METRIC_RECORDS)
        self._bytes = _counter(meter, METRIC_BYTES)
        self._events = _counter(meter, METRIC_EVENTS)
        self._loop_lag = _histogram(meter, METRIC_LOOP_LAG)
        name, _, unit, description = OPEN_COUNTER
        self._open_operations = meter.create_up_down_counter(name, unit=unit, description=description)
        self._open_work = OpenWork()
        for (name, _, unit, description), observe in zip(
            GAUGES, (self._observe_oldest, self._observe_published), strict=True
        ):
            meter.create_observable_gauge(name, callbacks=[observe], unit=unit, description=description)
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
            elif cls is Stalled:
                key = (_STALLED, event.kind, event.operation)
                counts[key] = counts.get(key, 0) + 1
        deltas = self._open_work.add(batch)
        if deltas is not None:
            # Also a zero: the series exists from the first operation on, so "open > 0" has data.
            for key, delta in deltas.items():
                self._open_operations.add(delta, attributes(key))
            calls += len(deltas)
        for counter, sums in ((self._records, records), (self._bytes, sizes), (self._events, counts)):
            add = counter.add
            for key, total in sums.items():
                add(total, attributes(key))
            calls += len(sums)
        self._seen += len(batch)
        self._sdk_calls += calls

    def _observe_oldest(self, options: CallbackOptions) -> Iterable[Observation]:
        snapshot = self._open_work.snapshot(time.time_ns())
        return [Observation(age, self._attributes(key)) for key, age in snapshot.oldest_s.items()]

    def _observe_published(self, options: CallbackOptions) -> Iterable[Observation]:
        published = self._open_work.snapshot(time.time_ns()).last_published_ts
        return [] if published is None else [Observation(published, {})]

    async def aclose(self) -> None:
        """Nothing to release: the meter provider belongs to whoever made it."""

    def stats(self) -> MetricSinkStats:
        """Events seen and SDK calls made so far."""
        return MetricSinkStats(events=self._seen, sdk_calls=self._sdk_calls)
