"""Checkpoint metrics aggregated in-process and written as OTLP metric export requests.

``MetricTotals.add(batch)`` folds events into cumulative state: one explicit-bucket histogram
per attribute set of ``gym.checkpoint.operation_duration_ms`` (OpenTelemetry's default
boundaries, count, sum, min, max) and an integer sum per attribute set of each counter.
``MetricEncoder`` writes a snapshot as an ``ExportMetricsServiceRequest`` in protobuf (by
hand, as the span encoder does) or OTLP/JSON (msgspec), cumulative temporality, with the
instrument names, units and attribute sets of ``MetricSink``.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from ckpt_events import (
    METRIC_BYTES,
    METRIC_EVENTS,
    METRIC_LOOP_LAG,
    METRIC_OPERATION_DURATION,
    METRIC_RECORDS,
    CoordinateFinished,
    GenerationCut,
    LeaseExpired,
    OperationFinished,
    PrepareNotReady,
    Refused,
    __version__,
)
from sinks import _metric_keys as keys
from sinks.otlp._span_encoder import SCOPE_NAME
from sinks.otlp._wire import DOUBLE, FIXED64, field, json_attributes, key_value

__all__ = ["COUNTERS", "DEFAULT_BOUNDARIES", "HISTOGRAMS", "HistogramPoint", "MetricEncoder", "MetricTotals"]

#: OpenTelemetry's default explicit bucket boundaries (the SDK's histogram aggregation).
DEFAULT_BOUNDARIES: Final = (0.0, 5.0, 10.0, 25.0, 50.0, 75.0, 100.0, 250.0, 500.0, 750.0, 1000.0,
                             2500.0, 5000.0, 7500.0, 10000.0)  # fmt: skip
#: (name, unit, description) of each counter, in export order; the histogram comes first.
COUNTERS: Final = (
    (METRIC_RECORDS, "1", "Records written by commit or read by restore"),
    (METRIC_BYTES, "By", "Bytes written by commit or read by restore"),
    (METRIC_EVENTS, "1", "Counted checkpoint events"),
)
#: (name, unit, description) of each histogram, in export order: durations, then loop lag.
HISTOGRAMS: Final = (
    (METRIC_OPERATION_DURATION, "ms", "Duration of a checkpoint operation"),
    (METRIC_LOOP_LAG, "ms", "A participant's worst event-loop lag during an operation"),
)
_CUMULATIVE: Final = 2  # AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
_TIMES: Final = struct.Struct("<BQBQ")  # start_time_unix_nano (2) and time_unix_nano (3), fixed64
_bisect_left: Final = bisect.bisect_left


class HistogramPoint:
    """One attribute set's cumulative histogram: count, sum, min, max and bucket counts."""

    __slots__ = ("buckets", "count", "max", "min", "total")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0
        self.min = float("inf")
        self.max = float("-inf")
        self.buckets = [0] * (len(DEFAULT_BOUNDARIES) + 1)

    def record(self, value: float) -> None:
        """Add one value (a bucket holds values up to and including its upper boundary)."""
        self.count += 1
        self.total += value
        # Comparisons, not min()/max() (11 ns against 87 each): this runs on the event loop
        # for every operation, and means the same (the current value wins a tie or a NaN).
        if value < self.min:  # noqa: PLR1730
            self.min = value
        if value > self.max:  # noqa: PLR1730
            self.max = value
        self.buckets[_bisect_left(DEFAULT_BOUNDARIES, value)] += 1

    def copy(self) -> HistogramPoint:
        """A snapshot of this point."""
        point = HistogramPoint()
        point.count, point.total, point.min, point.max = self.count, self.total, self.min, self.max
        point.buckets = list(self.buckets)
        return point


class MetricTotals:
    """Cumulative totals since creation, keyed by the flat keys of ``sinks._metric_keys``."""

    def __init__(self) -> None:
        self.durations: dict[tuple[Any, ...], HistogramPoint] = {}
        self.lags: dict[tuple[Any, ...], HistogramPoint] = {}
        # One dict per counter, in the order of COUNTERS: records, bytes, events.
        self.sums: tuple[dict[tuple[Any, ...], int], ...] = ({}, {}, {})

    def add(self, batch: list[Any]) -> None:
        """Fold ``batch`` in (the same points ``MetricSink`` records for it)."""
        durations = self.durations
        records, sizes, counts = self.sums
        volume_operations = keys.VOLUME_OPERATIONS
        for event in batch:
            cls = event.__class__
            if cls is Refused:
                key: tuple[Any, ...] = (keys.REFUSED, event.code)
                counts[key] = counts.get(key, 0) + 1
            elif cls is OperationFinished:
                operation, kind = event.operation, event.kind
                key = (keys.DURATION, operation, kind, event.outcome)
                point = durations.get(key)
                if point is None:
                    point = durations[key] = HistogramPoint()
                point.record((event.end_ns - event.start_ns) / 1e6)
                if event.loop_lag_ms is not None:
                    key = (keys.LAG, kind)
                    point = self.lags.get(key)
                    if point is None:
                        point = self.lags[key] = HistogramPoint()
                    point.record(event.loop_lag_ms)
                if operation in volume_operations:
                    rows, size = event.records, event.bytes
                    if rows is not None or size is not None:
                        key = (keys.VOLUME, operation, kind)
                        if rows is not None:
                            records[key] = records.get(key, 0) + rows
                        if size is not None:
                            sizes[key] = sizes.get(key, 0) + size
            elif cls is CoordinateFinished:
                key = (keys.DURATION, event.operation, keys.CONTROLLER, event.outcome)
                point = durations.get(key)
                if point is None:
                    point = durations[key] = HistogramPoint()
                point.record((event.end_ns - event.start_ns) / 1e6)
            elif cls is GenerationCut:
                key = (keys.CUT, event.disposition)
                counts[key] = counts.get(key, 0) + event.calls
            elif cls is LeaseExpired:
                key = (keys.LEASE, event.kind, event.phase)
                counts[key] = counts.get(key, 0) + 1
            elif cls is PrepareNotReady:
                key = (keys.NOT_READY, event.kind)
                counts[key] = counts.get(key, 0) + 1

    def snapshot(self) -> MetricTotals:
        """A copy to encode while the original keeps counting."""
        copy = MetricTotals()
        copy.durations = {key: point.copy() for key, point in self.durations.items()}
        copy.lags = {key: point.copy() for key, point in self.lags.items()}
        copy.sums = tuple(dict(sums) for sums in self.sums)
        return copy

    def __bool__(self) -> bool:
        return bool(self.durations) or bool(self.lags) or any(self.sums)


class MetricEncoder:
    """Encodes ``MetricTotals`` snapshots as OTLP metric export requests of one resource."""

    def __init__(self, resource_attributes: Mapping[str, object]) -> None:
        self.resource_attributes = dict(resource_attributes)
        self._resource = field(
            0x0A, b"".join(field(0x0A, key_value(k, v)) for k, v in self.resource_attributes.items())
        )
        self._scope = field(0x0A, field(0x0A, SCOPE_NAME.encode()) + field(0x12, __version__.encode()))
        self._attributes: dict[tuple[Any, ...], dict[str, str]] = {}
        self._json_resource = {"attributes": json_attributes(self.resource_attributes)}
        self._json_scope = {"name": SCOPE_NAME, "version": __version__}

    def _attrs(self, key: tuple[Any, ...]) -> dict[str, str]:
        cached = self._attributes.get(key)
        if cached is None:
            cached = self._attributes[key] = keys.attributes_of(key)
        return cached

    # -- protobuf ----------------------------------------------------------------------------

    def protobuf(self, totals: MetricTotals, start_ns: int, now_ns: int) -> bytes:
        """An ``ExportMetricsServiceRequest`` with every point of ``totals``."""
        times = _TIMES.pack(0x11, start_ns, 0x19, now_ns)
        metrics: list[bytes] = []
        for meta, histogram in zip(HISTOGRAMS, (totals.durations, totals.lags), strict=True):
            if histogram:
                points = b"".join(
                    field(0x0A, self._histogram_point(key, point, times)) for key, point in histogram.items()
                )
                metrics.append(self._metric(meta, field(0x4A, points + b"\x10\x02")))
        for meta, sums in zip(COUNTERS, totals.sums, strict=True):
            if sums:
                points = b"".join(
                    field(
                        0x0A,
                        self._attributes_pb(0x3A, key) + times + b"\x31" + FIXED64.pack(total % (1 << 64)),
                    )
                    for key, total in sums.items()
                )
                metrics.append(self._metric(meta, field(0x3A, points + b"\x10\x02\x18\x01")))
        scope_metrics = field(0x12, self._scope + b"".join(field(0x12, metric) for metric in metrics))
        return field(0x0A, self._resource + scope_metrics)

    def _attributes_pb(self, tag: int, key: tuple[Any, ...]) -> bytes:
        return b"".join(field(tag, key_value(k, v)) for k, v in self._attrs(key).items())

    @staticmethod
    def _metric(meta: tuple[str, str, str], data: bytes) -> bytes:
        name, unit, description = meta
        return (
            field(0x0A, name.encode()) + field(0x12, description.encode()) + field(0x1A, unit.encode()) + data
        )

    def _histogram_point(self, key: tuple[Any, ...], point: HistogramPoint, times: bytes) -> bytes:
        buckets = b"".join(FIXED64.pack(n) for n in point.buckets)
        bounds = b"".join(DOUBLE.pack(b) for b in DEFAULT_BOUNDARIES)
        return (
            self._attributes_pb(0x4A, key)
            + times
            + b"\x21" + FIXED64.pack(point.count)
            + b"\x29" + DOUBLE.pack(point.total)
            + field(0x32, buckets)
            + field(0x3A, bounds)
            + b"\x59" + DOUBLE.pack(point.min)
            + b"\x61" + DOUBLE.pack(point.max)
        )  # fmt: skip

    # -- JSON --------------------------------------------------------------------------------

    def json(self, totals: MetricTotals, start_ns: int, now_ns: int) -> bytes:
        """The same request in OTLP/JSON."""
        # Counts as JSON numbers: rotel's decoder drops string counts and asInt (protobuf's JSON
        # mapping accepts both, as the OpenTelemetry Collector does); timestamps as strings.
        start, now = str(start_ns), str(now_ns)
        metrics: list[dict[str, Any]] = []
        for (name, unit, description), histogram in zip(
            HISTOGRAMS, (totals.durations, totals.lags), strict=True
        ):
            if not histogram:
                continue
            points = [
                {
                    "attributes": json_attributes(self._attrs(key)),
                    "startTimeUnixNano": start,
                    "timeUnixNano": now,
                    "count": point.count,
                    "sum": point.total,
                    "bucketCounts": point.buckets,
                    "explicitBounds": list(DEFAULT_BOUNDARIES),
                    "min": point.min,
                    "max": point.max,
                }
                for key, point in histogram.items()
            ]
            data = {"dataPoints": points, "aggregationTemporality": _CUMULATIVE}
            metrics.append({"name": name, "unit": unit, "description": description, "histogram": data})
        for (name, unit, description), sums in zip(COUNTERS, totals.sums, strict=True):
            if sums:
                number_points = [
                    {
                        "attributes": json_attributes(self._attrs(key)),
                        "startTimeUnixNano": start,
                        "timeUnixNano": now,
                        "asInt": total,
                    }
                    for key, total in sums.items()
                ]
                data = {
                    "dataPoints": number_points,
                    "aggregationTemporality": _CUMULATIVE,
                    "isMonotonic": True,
                }
                metrics.append({"name": name, "unit": unit, "description": description, "sum": data})
        request = {
            "resourceMetrics": [
                {
                    "resource": self._json_resource,
                    "scopeMetrics": [{"scope": self._json_scope, "metrics": metrics}],
                }
            ]
        }
        return msgspec.json.encode(request)
