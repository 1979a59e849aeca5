"""Our metric totals as Prometheus families: ``TotalsCollector``, the ``prometheus_client``
collector the scrape endpoint (``ckpt_events.sinks.prometheus``) renders its page from.

It reads one ``snapshot()`` of a ``TotalsSource`` per scrape and writes each instrument as the
Collector's Prometheus exporter names it (``_prom_names``): histograms with one exemplar (trace
and span id) per bucket, counters, and the open operations as gauges. It serves no request:
the endpoint's registry calls it as its handler (``_scrape_handler``) renders a page.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator
from typing import Any, Final, Protocol, TypeVar

from ckpt_events._public_home import publish
from ckpt_events.sinks import _metric_keys as keys
from ckpt_events.sinks._metric_totals import (
    COUNTERS,
    DEFAULT_BOUNDARIES,
    HISTOGRAMS,
    HistogramPoint,
    MetricTotals,
    merged_histogram,
)
from ckpt_events.sinks._open_work import OpenWorkSnapshot
from ckpt_events.sinks._prom_names import label_name, metric_name, prometheus_type, unit_word
from ckpt_events.sinks._wire_safe import replace_surrogates
from ckpt_events.vocab import OPEN_WORK_INSTRUMENTS, Instrument, InstrumentKind

__all__ = ["TotalsCollector", "TotalsSource", "prometheus_names"]

# Go's shortest form ("5", not "5.0"), as the Collector (client_golang) writes `le`.
_LE: Final = (*(str(int(b)) if float(b).is_integer() else repr(float(b)) for b in DEFAULT_BOUNDARIES), "+Inf")


_REPLACEMENT: Final = "\ufffd"
_P = TypeVar("_P")


class TotalsSource(Protocol):
    """Anything holding cumulative ``MetricTotals``: ``PrometheusSink``, ``OtlpMetricSink``."""

    start_ns: int

    def snapshot(self) -> MetricTotals:
        """A copy of the totals, safe to read while the original keeps counting."""
        ...


def prometheus_names() -> list[tuple[str, str, str, str]]:
    """(OpenTelemetry name, unit, kind, Prometheus family name) of every instrument we export."""
    return [
        (name, unit, prometheus_type(kind), metric_name(name, unit, kind))
        for name, kind, unit, _ in (*HISTOGRAMS, *COUNTERS, *OPEN_WORK_INSTRUMENTS)
    ]


class TotalsCollector:
    """A ``prometheus_client`` collector rendering a source's totals at each scrape.

    A label value UTF-8 cannot carry (a lone surrogate) is written with U+FFFD in its place,
    as our OTLP encoder does, and counted once per label set in ``replaced_values``; label sets
    then written alike are one series, holding their sum.
    """

    def __init__(self, source: TotalsSource) -> None:
        self.source = source
        #: Label values written with U+FFFD for a surrogate (once per label set).
        self.replaced_values = 0
        # One entry per key of the totals: bounded by their cardinality limit per instrument.
        self._labels: dict[tuple[Any, ...], dict[str, str]] = {}
        # Keys whose labels hold U+FFFD: only these can be written like another key.
        self._may_collide: set[tuple[Any, ...]] = set()

    def _labels_of(self, key: tuple[Any, ...]) -> dict[str, str]:
        cached = self._labels.get(key)
        if cached is None:
            attributes = keys.attributes_of(key)
            # The overflow attribute is a boolean: "true", as the Collector's exporter writes it.
            labels = {
                label_name(k): v if isinstance(v, str) else str(v).lower() for k, v in attributes.items()
            }
            # One surrogate (a kind from os.fsdecode, say) failed every scrape from then on:
            # the page is encoded as UTF-8 as a whole.
            cached = self._labels[key] = {k: replace_surrogates(v) for k, v in labels.items()}
            self.replaced_values += sum(cached[k] != v for k, v in labels.items())
            if any(_REPLACEMENT in v for v in cached.values()):
                self._may_collide.add(key)
        return cached

    def _series(
        self, points: dict[tuple[Any, ...], _P], merge: Callable[[_P, _P], _P]
    ) -> Iterator[tuple[dict[str, str], _P]]:
        """(labels, point) per series: keys whose labels are written alike (values differing only
        in what U+FFFD replaced, or in U+FFFD itself) merged into one, as a page must hold each
        label set once (Prometheus keeps one of duplicate samples: 1 refusal of 3)."""
        alike: dict[tuple[tuple[str, str], ...], tuple[dict[str, str], _P]] = {}
        for key, point in points.items():
            labels = self._labels_of(key)
            if key not in self._may_collide:
                yield labels, point
                continue
            written = tuple(labels.items())
            held = alike.get(written)
            alike[written] = (labels, point if held is None else merge(held[1], point))
        yield from alike.values()

    def describe(self) -> list[Any]:
        """Every family ``collect`` may yield, without samples: a registry already holding one
        of these names refuses the collector at ``register`` (``collect`` is not called)."""
        from prometheus_client.metrics_core import Metric

        # Without names, a registry took a second collector, or a user's own metric of the same
        # name, and every page it rendered then had a family twice: Prometheus fails the scrape.
        families = []
        for name, kind, unit, description in (*HISTOGRAMS, *COUNTERS, *OPEN_WORK_INSTRUMENTS):
            family = metric_name(name, unit, kind)
            if kind is InstrumentKind.COUNTER:
                family = family.removesuffix("_total")  # as ``collect`` names a counter's family
            families.append(Metric(family, description, prometheus_type(kind), unit_word(unit)[0]))
        return families

    def collect(self) -> Iterator[Any]:
        """One family per instrument with points, from one snapshot of the totals."""
        from prometheus_client.metrics_core import Metric
        from prometheus_client.samples import Exemplar

        # No _created samples: the Collector's exporter writes none, and the series must match.
        totals = self.source.snapshot()
        for (name, kind, unit, description), histogram in zip(
            HISTOGRAMS, (totals.durations, totals.lags), strict=True
        ):
            if not histogram:
                continue
            family = metric_name(name, unit, kind)
            metric = Metric(family, description, prometheus_type(kind), unit_word(unit)[0])
            for labels, point in self._series(histogram, merged_histogram):
                _add_histogram(metric, family, labels, point, Exemplar)
            yield metric
        for (name, kind, unit, description), sums in zip(COUNTERS, totals.sums, strict=True):
            if not sums:
                continue
            family = metric_name(name, unit, kind)
            base = family.removesuffix("_total")
            metric = Metric(base, description, prometheus_type(kind), unit_word(unit)[0])
            for labels, total in self._series(sums, operator.add):
                metric.add_sample(family, labels, total)
            yield metric
        if totals.open is not None:
            yield from self._open_work(totals.open, Metric)

    def _open_work(self, snapshot: OpenWorkSnapshot, metric_class: Any) -> Iterator[Any]:
        """The open operations, the oldest one's age and the last publish, as gauges."""
        counter, oldest, published = OPEN_WORK_INSTRUMENTS
        # Merged as the SDK would one attribute set: open operations add up, the oldest is the oldest.
        values: tuple[tuple[Instrument, dict[tuple[Any, ...], Any], Callable[[Any, Any], Any]], ...] = (
            (counter, snapshot.open, operator.add),
            (oldest, snapshot.oldest_s, max),
        )
        for (name, kind, unit, description), points, merge in values:
            if not points:
                continue
            family = metric_name(name, unit, kind)
            metric = metric_class(family, description, prometheus_type(kind), unit_word(unit)[0])
            for labels, value in self._series(points, merge):
                metric.add_sample(family, labels, value)
            yield metric
        if snapshot.last_published_ts is not None:
            name, kind, unit, description = published
            family = metric_name(name, unit, kind)
            metric = metric_class(family, description, prometheus_type(kind), unit_word(unit)[0])
            metric.add_sample(family, {}, snapshot.last_published_ts)
            yield metric


def _add_histogram(
    metric: Any, family: str, labels: dict[str, str], point: HistogramPoint, exemplar: Any
) -> None:
    cumulative = 0
    for le, count, event, value in zip(
        _LE, point.buckets, point.exemplars, point.exemplar_values, strict=True
    ):
        cumulative += count
        sample_exemplar = None
        if event is not None:
            sample_exemplar = exemplar(
                {"trace_id": f"{event.trace_id:032x}", "span_id": f"{event.span_id:016x}"},
                value,
                event.end_ns / 1e9,
            )
        metric.add_sample(family + "_bucket", {**labels, "le": le}, cumulative, exemplar=sample_exemplar)
    metric.add_sample(family + "_count", labels, point.count)
    metric.add_sample(family + "_sum", labels, point.total)


# Pickles, reprs and tracebacks name the public module (_public_home.py says why).
publish("ckpt_events.sinks.prometheus", TotalsSource, TotalsCollector, prometheus_names)
