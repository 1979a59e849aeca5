"""Checkpoint metrics written as OTLP metric export requests, from our own cumulative totals.

``MetricEncoder`` writes a ``MetricTotals`` snapshot (``ckpt_events.sinks._metric_totals``) as
an ``ExportMetricsServiceRequest`` in protobuf (by hand, as the span encoder does) or OTLP/JSON
(msgspec), cumulative temporality, with the instrument names, units and attribute sets of
``MetricSink``; an instrument's overflow series carries the boolean attribute
``otel.metric.overflow=true``, as the OpenTelemetry SDK writes it. Keys whose attributes are
written alike (a lone surrogate becomes U+FFFD) go out as one point holding their sum, as the
Prometheus page writes them.
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

import msgspec

from ckpt_events import __version__
from ckpt_events.sinks import _metric_keys as keys
from ckpt_events.sinks._metric_totals import (
    COUNTERS,
    DEFAULT_BOUNDARIES,
    HISTOGRAMS,
    HistogramPoint,
    MetricTotals,
    merged_histogram,
)
from ckpt_events.sinks._open_work import GAUGES, OPEN_COUNTER, OpenWorkSnapshot
from ckpt_events.sinks._wire_safe import INT64_MAX, INT64_MIN, replace_surrogates
from ckpt_events.sinks.otlp import _tags as tags
from ckpt_events.sinks.otlp._span_encoder import SCOPE_NAME
from ckpt_events.sinks.otlp._wire import DOUBLE, FIXED64, field, json_attributes, key_value
from ckpt_events.vocab import Instrument

__all__ = ["MetricEncoder"]

_P = TypeVar("_P")

_CUMULATIVE: Final = 2  # AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
_TIMES: Final = struct.Struct("<BQBQ")  # a data point's start and end time, fixed64 each
_CUMULATIVE_HISTOGRAM: Final = bytes((tags.HISTOGRAM_TEMPORALITY, _CUMULATIVE))
_CUMULATIVE_MONOTONIC_SUM: Final = bytes((tags.SUM_TEMPORALITY, _CUMULATIVE, tags.SUM_IS_MONOTONIC, 1))
_AS_INT: Final = bytes((tags.NUMBER_POINT_AS_INT,))
_AS_DOUBLE: Final = bytes((tags.NUMBER_POINT_AS_DOUBLE,))
#: A non-monotonic cumulative sum (the up-down counter): is_monotonic left at false.
_CUMULATIVE_SUM: Final = bytes((tags.SUM_TEMPORALITY, _CUMULATIVE))
_EXEMPLAR_TIME: Final = bytes((tags.EXEMPLAR_TIME,))
_EXEMPLAR_AS_DOUBLE: Final = bytes((tags.EXEMPLAR_AS_DOUBLE,))
_COUNT: Final = bytes((tags.HISTOGRAM_POINT_COUNT,))
_SUM: Final = bytes((tags.HISTOGRAM_POINT_SUM,))
_MIN: Final = bytes((tags.HISTOGRAM_POINT_MIN,))
_MAX: Final = bytes((tags.HISTOGRAM_POINT_MAX,))


class MetricEncoder:
    """Encodes ``MetricTotals`` snapshots as OTLP metric export requests of one resource."""

    def __init__(self, resource_attributes: Mapping[str, object]) -> None:
        self.resource_attributes = dict(resource_attributes)
        self._resource = field(
            tags.RESOURCE_METRICS_RESOURCE,
            b"".join(
                field(tags.RESOURCE_ATTRIBUTES, key_value(k, v)) for k, v in self.resource_attributes.items()
            ),
        )
        self._scope = field(
            tags.SCOPE_METRICS_SCOPE,
            field(tags.SCOPE_NAME_FIELD, SCOPE_NAME.encode())
            + field(tags.SCOPE_VERSION, __version__.encode()),
        )
        # One entry per key of the totals: bounded by their cardinality limit per instrument.
        self._attributes: dict[tuple[Any, ...], dict[str, str | bool]] = {}
        #: Attribute texts UTF-8 cannot hold (a lone surrogate in an instance name), written
        #: with U+FFFD: the point is kept, under a name that is still readable.
        self.invalid_values = 0
        # Keys whose attributes hold U+FFFD: only these can be written like another key.
        self._may_collide: set[tuple[Any, ...]] = set()
        self._json_resource = {"attributes": json_attributes(self.resource_attributes)}
        self._json_scope = {"name": SCOPE_NAME, "version": __version__}

    def _attrs(self, key: tuple[Any, ...]) -> dict[str, str | bool]:
        cached = self._attributes.get(key)
        if cached is None:
            cached = keys.attributes_of(key)
            replaced = {
                name: replace_surrogates(value) if isinstance(value, str) else value
                for name, value in cached.items()
            }
            self.invalid_values += sum(replaced[name] != value for name, value in cached.items())
            cached = self._attributes[key] = replaced
            if any(isinstance(value, str) and "\ufffd" in value for value in replaced.values()):
                self._may_collide.add(key)
        return cached

    def _unique(
        self, points: dict[tuple[Any, ...], _P], merge: Callable[[_P, _P], _P]
    ) -> dict[tuple[Any, ...], _P]:
        """``points`` with keys written alike merged into the first of them (``points`` itself
        when none are): a metric's points must have distinct attribute sets, and a collector
        keeps one of duplicates (1 refusal of 3, where the Prometheus page said 3)."""
        alike: dict[tuple[tuple[str, str | bool], ...], tuple[Any, ...]] = {}
        merged: dict[tuple[Any, ...], _P] | None = None
        for key, point in points.items():
            attributes = self._attrs(key)
            if key not in self._may_collide:
                continue
            first = alike.setdefault(tuple(attributes.items()), key)
            if first is not key:
                if merged is None:
                    merged = dict(points)
                merged[first] = merge(merged[first], point)
                del merged[key]
        return points if merged is None else merged

    def _unique_totals(
        self, totals: MetricTotals
    ) -> tuple[
        list[dict[tuple[Any, ...], HistogramPoint]], list[dict[tuple[Any, ...], int]], OpenWorkSnapshot | None
    ]:
        """The histograms, the counters and the open work of ``totals``, one point per attribute set."""
        histograms = [self._unique(points, merged_histogram) for points in (totals.durations, totals.lags)]
        sums = [self._unique(points, operator.add) for points in totals.sums]
        snapshot = totals.open
        if snapshot is not None:
            # As the SDK would one attribute set: open operations add up, the oldest is the oldest.
            snapshot = msgspec.structs.replace(
                snapshot,
                open=self._unique(snapshot.open, operator.add),
                oldest_s=self._unique(snapshot.oldest_s, max),
            )
        return histograms, sums, snapshot

    # -- protobuf ----------------------------------------------------------------------------

    def protobuf(self, totals: MetricTotals, start_ns: int, now_ns: int) -> bytes:
        """An ``ExportMetricsServiceRequest`` with every point of ``totals``."""
        times = _TIMES.pack(tags.POINT_START_TIME, start_ns, tags.POINT_TIME, now_ns)
        histograms, counters, snapshot = self._unique_totals(totals)
        metrics: list[bytes] = []
        for meta, histogram in zip(HISTOGRAMS, histograms, strict=True):
            if histogram:
                points = b"".join(
                    field(tags.HISTOGRAM_DATA_POINTS, self._histogram_point(key, point, times))
                    for key, point in histogram.items()
                )
                metrics.append(
                    self._metric(meta, field(tags.METRIC_HISTOGRAM, points + _CUMULATIVE_HISTOGRAM))
                )
        for meta, sums in zip(COUNTERS, counters, strict=True):
            if sums:
                points = self._int_points(sums, times)
                metrics.append(self._metric(meta, field(tags.METRIC_SUM, points + _CUMULATIVE_MONOTONIC_SUM)))
        if snapshot is not None:
            metrics.extend(self._open_protobuf(snapshot, times))
        scope_metrics = field(
            tags.RESOURCE_METRICS_SCOPE_METRICS,
            self._scope + b"".join(field(tags.SCOPE_METRICS_METRICS, metric) for metric in metrics),
        )
        return field(tags.METRICS_REQUEST_RESOURCE_METRICS, self._resource + scope_metrics)

    def _open_protobuf(self, snapshot: OpenWorkSnapshot, times: bytes) -> list[bytes]:
        # The up-down counter is a non-monotonic cumulative sum (no is_monotonic field); the
        # gauges are Gauge data (Metric field 5) of double points (NumberDataPoint field 4).
        metrics: list[bytes] = []
        if snapshot.open:
            points = self._int_points(snapshot.open, times)
            metrics.append(self._metric(OPEN_COUNTER, field(tags.METRIC_SUM, points + _CUMULATIVE_SUM)))
        oldest_meta, published_meta = GAUGES
        if snapshot.oldest_s:
            points = b"".join(
                field(
                    tags.GAUGE_DATA_POINTS,
                    self._attributes_pb(tags.NUMBER_POINT_ATTRIBUTES, key)
                    + times
                    + _AS_DOUBLE
                    + DOUBLE.pack(age),
                )
                for key, age in snapshot.oldest_s.items()
            )
            metrics.append(self._metric(oldest_meta, field(tags.METRIC_GAUGE, points)))
        if snapshot.last_published_ts is not None:
            point = field(
                tags.GAUGE_DATA_POINTS, times + _AS_DOUBLE + DOUBLE.pack(snapshot.last_published_ts)
            )
            metrics.append(self._metric(published_meta, field(tags.METRIC_GAUGE, point)))
        return metrics

    def _open_json(self, snapshot: OpenWorkSnapshot, start: str, now: str) -> list[dict[str, Any]]:
        metrics: list[dict[str, Any]] = []
        name, _, unit, description = OPEN_COUNTER
        oldest_meta, published_meta = GAUGES
        if snapshot.open:
            points = [
                {
                    "attributes": json_attributes(self._attrs(key)),
                    "startTimeUnixNano": start,
                    "timeUnixNano": now,
                    **_json_number(n),
                }
                for key, n in snapshot.open.items()
            ]
            data = {"dataPoints": points, "aggregationTemporality": _CUMULATIVE, "isMonotonic": False}
            metrics.append({"name": name, "unit": unit, "description": description, "sum": data})
        gauges: tuple[tuple[Instrument, list[tuple[dict[str, str | bool], float]]], ...] = (
            (oldest_meta, [(self._attrs(key), age) for key, age in snapshot.oldest_s.items()]),
            (published_meta, [] if (ts := snapshot.last_published_ts) is None else [({}, ts)]),
        )
        for (name, _, unit, description), values in gauges:
            if values:
                gauge_points = [
                    {"attributes": json_attributes(attributes), "timeUnixNano": now, "asDouble": value}
                    for attributes, value in values
                ]
                gauge = {"dataPoints": gauge_points}
                metrics.append({"name": name, "unit": unit, "description": description, "gauge": gauge})
        return metrics

    def _int_points(self, values: Mapping[tuple[Any, ...], int], times: bytes) -> bytes:
        """A Sum's ``NumberDataPoint``s, one a key: ``as_int`` (two's complement), or ``as_double``
        for a total int64 cannot hold."""
        return b"".join(
            field(
                tags.SUM_DATA_POINTS,
                self._attributes_pb(tags.NUMBER_POINT_ATTRIBUTES, key)
                + times
                + (
                    _AS_INT + FIXED64.pack(value % (1 << 64))
                    if INT64_MIN <= value <= INT64_MAX
                    # Each amount is below 2**63, but a total of several need not be: wrapped,
                    # bytes_total past 2**63 went out negative (a monotonic counter falling).
                    else _AS_DOUBLE + DOUBLE.pack(value)
                ),
            )
            for key, value in values.items()
        )

    def _attributes_pb(self, tag: int, key: tuple[Any, ...]) -> bytes:
        return b"".join(field(tag, key_value(k, v)) for k, v in self._attrs(key).items())

    @staticmethod
    def _metric(meta: Instrument, data: bytes) -> bytes:
        name, _, unit, description = meta
        return (
            field(tags.METRIC_NAME, name.encode())
            + field(tags.METRIC_DESCRIPTION, description.encode())
            + field(tags.METRIC_UNIT, unit.encode())
            + data
        )

    def _histogram_point(self, key: tuple[Any, ...], point: HistogramPoint, times: bytes) -> bytes:
        buckets = b"".join(FIXED64.pack(n) for n in point.buckets)
        bounds = b"".join(DOUBLE.pack(b) for b in DEFAULT_BOUNDARIES)
        return (
            self._attributes_pb(tags.HISTOGRAM_POINT_ATTRIBUTES, key)
            + times
            + _COUNT
            + FIXED64.pack(point.count)
            + _SUM
            + DOUBLE.pack(point.total)
            + field(tags.HISTOGRAM_POINT_BUCKETS, buckets)
            + field(tags.HISTOGRAM_POINT_BOUNDS, bounds)
            + _exemplars_pb(point)
            + _MIN
            + DOUBLE.pack(point.min)
            + _MAX
            + DOUBLE.pack(point.max)
        )

    # -- JSON --------------------------------------------------------------------------------

    def json(self, totals: MetricTotals, start_ns: int, now_ns: int) -> bytes:
        """The same request in OTLP/JSON."""
        # No exemplars here: rotel's JSON decoder drops a histogram whose points carry any
        # (measured, with hex, base64 or no ids); protobuf, the default, carries them.
        # Counts as JSON numbers: rotel's decoder drops string counts and asInt (protobuf's JSON
        # mapping accepts both, as the OpenTelemetry Collector does); timestamps as strings.
        start, now = str(start_ns), str(now_ns)
        histograms, counters, snapshot = self._unique_totals(totals)
        metrics: list[dict[str, Any]] = []
        for (name, _, unit, description), histogram in zip(HISTOGRAMS, histograms, strict=True):
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
        for (name, _, unit, description), sums in zip(COUNTERS, counters, strict=True):
            if sums:
                number_points = [
                    {
                        "attributes": json_attributes(self._attrs(key)),
                        "startTimeUnixNano": start,
                        "timeUnixNano": now,
                        **_json_number(total),
                    }
                    for key, total in sums.items()
                ]
                data = {
                    "dataPoints": number_points,
                    "aggregationTemporality": _CUMULATIVE,
                    "isMonotonic": True,
                }
                metrics.append({"name": name, "unit": unit, "description": description, "sum": data})
        if snapshot is not None:
            metrics.extend(self._open_json(snapshot, start, now))
        request = {
            "resourceMetrics": [
                {
                    "resource": self._json_resource,
                    "scopeMetrics": [{"scope": self._json_scope, "metrics": metrics}],
                }
            ]
        }
        return msgspec.json.encode(request)


def _json_number(value: int) -> dict[str, int | float]:
    """A ``NumberDataPoint``'s value in OTLP/JSON: ``asInt``, or ``asDouble`` past int64 (a
    collector drops an ``asInt`` it cannot parse as one, and with it the point)."""
    if INT64_MIN <= value <= INT64_MAX:
        return {"asInt": value}
    return {"asDouble": float(value)}


def _exemplars_pb(point: HistogramPoint) -> bytes:
    """``HistogramDataPoint.exemplars`` (field 8), one ``Exemplar`` per bucket that has one:
    time_unix_nano (2, fixed64), as_double (3), span_id (4) and trace_id (5), big-endian bytes."""
    out = []
    for event, value in zip(point.exemplars, point.exemplar_values, strict=True):
        if event is not None:
            exemplar = (
                _EXEMPLAR_TIME
                + FIXED64.pack(event.end_ns)
                + _EXEMPLAR_AS_DOUBLE
                + DOUBLE.pack(value)
                + field(tags.EXEMPLAR_SPAN_ID, event.span_id.to_bytes(8, "big"))
                + field(tags.EXEMPLAR_TRACE_ID, event.trace_id.to_bytes(16, "big"))
            )
            out.append(field(tags.HISTOGRAM_POINT_EXEMPLARS, exemplar))
    return b"".join(out)
