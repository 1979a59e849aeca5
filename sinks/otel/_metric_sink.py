"""``MetricSink``: the four checkpoint instruments of SPEC section 3 and the loop lag, fed from events.

The SDK's per-call cost is about 10-17 us, so counters are summed per attribute set within
a batch and reach the SDK once per set (the sets past the limit once together). Histogram
values cannot be summed; each is recorded.
Attribute values are low-cardinality vocabularies: never an id or an instance. Kinds are open
(steps are on no metric), so each instrument passes at most ``cardinality_limit`` attribute sets
to the SDK and the rest as the SDK's own overflow set (``ckpt_events.sinks._cardinality``): our own limit, as
the SDK enforces one only from opentelemetry-sdk 1.45.2 (and ours bounds what we cache).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any, Final

import msgspec
from opentelemetry.metrics import (
    CallbackOptions,
    Counter,
    Histogram,
    Meter,
    MeterProvider,
    NoOpMeter,
    Observation,
)

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
from ckpt_events._errors import shown
from ckpt_events._logs import library_logger
from ckpt_events._public_home import publish
from ckpt_events.sinks import _metric_keys as keys
from ckpt_events.sinks._cardinality import (
    DEFAULT_CARDINALITY_LIMIT,
    OVERFLOW_ATTRIBUTES,
    AttributeSets,
    InvalidMeasurements,
    Overflow,
)
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

logger: Final = library_logger("ckpt_events.sinks.otel")

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
_INF: Final = float("inf")
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
    """Counters of one ``MetricSink``: events seen and SDK calls made for them; ``overflowed``
    recordings given an instrument's overflow set (``otel.metric.overflow=true``), it having
    ``cardinality_limit`` attribute sets already (a counter's per set and batch, summed)."""

    events: int
    sdk_calls: int
    overflowed: int = 0
    #: Measurements refused as the SDK refuses them (a negative amount or duration, a
    #: non-finite or negative loop lag: an event built by hand), counted and logged once.
    invalid: int = 0
    #: Events not recorded because the meter provider was shut down (its instruments take
    #: measurements then, and no reader sees them), counted and logged once.
    dropped: int = 0
    #: Operations started while ``MAX_OPEN`` (10,000) were open already (handles never left,
    #: ends lost): not in the open-work gauges, which undercount; the first one logged.
    untracked: int = 0


class MetricSink:
    """A bus sink recording checkpoint metrics on instruments of ``meter_provider``.

    Independent of span groups: while subscribed it records every operation duration
    (participants and controller), commit/restore volumes and the counted events.

    Each instrument gets at most ``cardinality_limit`` attribute sets (OpenTelemetry's 2,000 by
    default), then the overflow set ``{"otel.metric.overflow": True}``, the SDK's own, counted in
    ``stats().overflowed`` and logged once. An SDK that caps too (opentelemetry-sdk >= 1.45.2:
    its reader's ``cardinality_limits``, default 2,000) applies its limit on top: the lower wins.
    """

    interests: Final = _INTERESTS

    def __init__(
        self, meter_provider: MeterProvider, *, cardinality_limit: int = DEFAULT_CARDINALITY_LIMIT
    ) -> None:
        get_meter = getattr(meter_provider, "get_meter", None)
        if not callable(get_meter):
            raise InvalidTypeError(
                f"meter_provider must be an OpenTelemetry MeterProvider, not {shown(meter_provider)}"
            )
        self.meter_provider = meter_provider
        self._overflow = Overflow(cardinality_limit, owner="MetricSink")
        self._invalid = InvalidMeasurements(owner="MetricSink")
        # A provider shut down already (a lifespan that shut it down, run again) gives the SDK's
        # no-op meter with a warning of its own; ours says it once, at the first batch dropped.
        meter = (
            NoOpMeter("ckpt_events", __version__)
            if _was_shut_down(meter_provider)
            else get_meter("ckpt_events", __version__)
        )
        self._duration = _histogram(meter, METRIC_OPERATION_DURATION)
        self._records = _counter(meter, METRIC_RECORDS)
        self._bytes = _counter(meter, METRIC_BYTES)
        self._events = _counter(meter, METRIC_EVENTS)
        self._loop_lag = _histogram(meter, METRIC_LOOP_LAG)
        name, _, unit, description = OPEN_COUNTER
        self._open_operations = meter.create_up_down_counter(name, unit=unit, description=description)
        self._open_work = OpenWork(self._overflow)
        # The gauges' callbacks run in the reader's thread (a periodic reader's, a scrape) while
        # batches change the open work: iterating it unlocked failed them ("dictionary changed
        # size during iteration") and the SDK dropped the gauges from that collection.
        self._open_lock = threading.Lock()
        for (name, _, unit, description), observe in zip(
            GAUGES, (self._observe_oldest, self._observe_published), strict=True
        ):
            meter.create_observable_gauge(name, callbacks=[observe], unit=unit, description=description)
        # Attribute mappings are built once per distinct flat key and reused, per instrument
        # (at most the limit each). Plain str values (not enum members), as any exporter expects.
        overflow = self._overflow
        self._duration_sets = AttributeSets(METRIC_OPERATION_DURATION, overflow)
        self._lag_sets = AttributeSets(METRIC_LOOP_LAG, overflow)
        self._volume_sets = (AttributeSets(METRIC_RECORDS, overflow), AttributeSets(METRIC_BYTES, overflow))
        self._event_sets = AttributeSets(METRIC_EVENTS, overflow)
        # Open work's keys are capped by OpenWork itself (the same Overflow): a plain cache.
        self._open_attributes: dict[tuple[Any, ...], dict[str, str | bool]] = {}
        self._seen = 0
        self._sdk_calls = 0
        self._dropped = 0

    def _open_attributes_of(self, key: tuple[Any, ...]) -> dict[str, str | bool]:
        """The attribute mapping of an open-work key (``OpenWork`` keeps at most the limit)."""
        cached = self._open_attributes.get(key)
        if cached is None:
            cached = self._open_attributes[key] = keys.attributes_of(key)
        return cached

    def handle(self, batch: list[Any]) -> None:
        """Record a batch: histogram values one by one, counters summed per attribute set."""
        if _was_shut_down(self.meter_provider):
            self._drop(batch)
            return
        record = self._duration.record
        durations = self._duration_sets.kept
        duration_attributes = self._duration_sets.attributes
        records: dict[tuple[Any, ...], int] = {}
        sizes: dict[tuple[Any, ...], int] = {}
        counts: dict[tuple[Any, ...], int] = {}
        calls = 0
        invalid = self._invalid
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
                # The SDK refuses a negative or non-finite value, and a negative counter amount
                # (a hand-built event): checked per event, as our totals do, so one bad amount
                # summed into a batch's does not take the good ones down with it.
                value = (event.end_ns - event.start_ns) / 1e6
                if value >= 0.0:
                    record(value, durations.get(key) or duration_attributes(key))
                    calls += 1
                else:
                    invalid.refuse(METRIC_OPERATION_DURATION, value)
                lag = event.loop_lag_ms
                if lag is not None:
                    if 0.0 <= lag < _INF:
                        key = (_LAG, kind)
                        lags = self._lag_sets
                        self._loop_lag.record(lag, lags.kept.get(key) or lags.attributes(key))
                        calls += 1
                    else:
                        invalid.refuse(METRIC_LOOP_LAG, lag)
                if operation in _VOLUME_OPERATIONS:
                    key = (_VOLUME, operation, kind)
                    rows, size = event.records, event.bytes
                    if rows is not None:
                        if rows >= 0:
                            records[key] = records.get(key, 0) + rows
                        else:
                            invalid.refuse(METRIC_RECORDS, rows)
                    if size is not None:
                        if size >= 0:
                            sizes[key] = sizes.get(key, 0) + size
                        else:
                            invalid.refuse(METRIC_BYTES, size)
            elif cls is CoordinateFinished:
                key = (_DURATION, event.operation, _CONTROLLER, event.outcome)
                value = (event.end_ns - event.start_ns) / 1e6
                if value >= 0.0:
                    record(value, durations.get(key) or duration_attributes(key))
                    calls += 1
                else:
                    invalid.refuse(METRIC_OPERATION_DURATION, value)
            elif cls is GenerationCut:
                if event.calls >= 0:  # a NaN or a negative is refused
                    key = (_CUT, event.disposition)
                    counts[key] = counts.get(key, 0) + event.calls
                else:
                    invalid.refuse(METRIC_EVENTS, event.calls)
            elif cls is LeaseExpired:
                key = (_LEASE, event.kind, event.phase)
                counts[key] = counts.get(key, 0) + 1
            elif cls is PrepareNotReady:
                key = (_NOT_READY, event.kind)
                counts[key] = counts.get(key, 0) + 1
            elif cls is Stalled:
                key = (_STALLED, event.kind, event.operation)
                counts[key] = counts.get(key, 0) + 1
        # Once per batch, not per event: the open-work deltas and the counters' sums.
        calls += self._add_open_work(batch)
        calls += self._add_sums(records, sizes, counts)
        self._seen += len(batch)
        self._sdk_calls += calls

    def _drop(self, batch: list[Any]) -> None:
        """Count a batch the shut-down provider would lose; the first one is logged."""
        if not self._dropped:
            logger.warning(
                "MetricSink: the %s was shut down; events are counted in MetricSink.stats().dropped, "
                "not recorded (keep it up until the bus is closed), and not logged again",
                type(self.meter_provider).__name__,
            )
        self._seen += len(batch)
        self._dropped += len(batch)

    def _add_open_work(self, batch: list[Any]) -> int:
        """Add the batch's change of open operations per key; the SDK calls made."""
        with self._open_lock:
            deltas = self._open_work.add(batch)
        if deltas is None:
            return 0
        # Also a zero: the series exists from the first operation on, so "open > 0" has data.
        for key, delta in deltas.items():
            self._open_operations.add(delta, self._open_attributes_of(key))
        return len(deltas)

    def _add_sums(
        self,
        records: dict[tuple[Any, ...], int],
        sizes: dict[tuple[Any, ...], int],
        counts: dict[tuple[Any, ...], int],
    ) -> int:
        """Add a batch's sums (records, bytes, counted events) per attribute set; the SDK calls made.

        The keys past the limit share the overflow set, so their sums reach the SDK as one call
        per counter and batch (each key still counted in ``overflowed``): a call per key took a
        flood of new kinds or codes from one call per counter and batch to one per event (~10 us).
        """
        calls = 0
        records_sets, bytes_sets = self._volume_sets
        for counter, sums, sets in (
            (self._records, records, records_sets),
            (self._bytes, sizes, bytes_sets),
            (self._events, counts, self._event_sets),
        ):
            add = counter.add
            kept = sets.kept
            overflowed: int | None = None
            for key, total in sums.items():
                attributes = kept.get(key) or sets.attributes(key)
                if attributes is OVERFLOW_ATTRIBUTES:
                    overflowed = total if overflowed is None else overflowed + total
                else:
                    add(total, attributes)
                    calls += 1
            if overflowed is not None:
                add(overflowed, OVERFLOW_ATTRIBUTES)
                calls += 1
        return calls

    def _observe_oldest(self, options: CallbackOptions) -> Iterable[Observation]:
        with self._open_lock:
            snapshot = self._open_work.snapshot(time.time_ns())
        return [Observation(age, self._open_attributes_of(key)) for key, age in snapshot.oldest_s.items()]

    def _observe_published(self, options: CallbackOptions) -> Iterable[Observation]:
        with self._open_lock:
            published = self._open_work.snapshot(time.time_ns()).last_published_ts
        return [] if published is None else [Observation(published, {})]

    async def aclose(self) -> None:
        """Nothing to release: the meter provider belongs to whoever made it."""

    def stats(self) -> MetricSinkStats:
        """Events seen and SDK calls made so far."""
        return MetricSinkStats(
            events=self._seen,
            sdk_calls=self._sdk_calls,
            overflowed=self._overflow.measurements,
            invalid=self._invalid.measurements,
            dropped=self._dropped,
            untracked=self._open_work.untracked,
        )


def _was_shut_down(meter_provider: MeterProvider) -> bool:
    """Whether ``meter_provider`` is the SDK's and was shut down, so what is recorded on its
    instruments is lost. The SDK says so only in a private flag (recording after shutdown is
    silent); read per batch, never guessed at: another provider, or an SDK that renamed the
    flag, is taken as live."""
    return getattr(meter_provider, "_shutdown", None) is True


# Pickles, reprs and tracebacks name the public module (_public_home.py says why).
publish("ckpt_events.sinks.otel", MetricSink, MetricSinkStats)
