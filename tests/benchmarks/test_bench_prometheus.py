"""``bench_prometheus``: the endpoint's on and off rounds fold alike, and "on / off" has a verdict
that can fail (SPEC 9, "Prometheus": the endpoint adds nothing per event)."""

from __future__ import annotations

from typing import Any

from ckpt_events.benchmarks import bench_prometheus
from ckpt_events.benchmarks.bench_sinks import _metric_mix
from ckpt_events.benchmarks.spread import Ratio
from ckpt_events.sinks.prometheus import PrometheusSink


def _folded(sink: PrometheusSink) -> tuple[Any, ...]:
    totals = sink.snapshot()
    durations = {key: (point.count, point.total) for key, point in totals.durations.items()}
    return totals.sums, durations


def test_the_on_and_off_rounds_fold_the_same_events() -> None:
    """Only the "on" sink was warmed (its first chunk folded twice, untimed), and on / off read
    0.468: a round is the same events into a sink warmed alike, scraped or not."""
    events = _metric_mix(20)
    chunks = [events[i : i + 100] for i in range(0, len(events), 100)]
    scrapes = [0]
    _, off = bench_prometheus._round(chunks, False, scrapes)
    _, on = bench_prometheus._round(chunks, True, scrapes)
    assert scrapes[0] >= 1  # the "on" round was scraped
    assert _folded(on) == _folded(off)
    assert _folded(off) != _folded(PrometheusSink())


def test_on_over_off_fails_when_the_endpoint_costs_per_event() -> None:
    """No measurable difference or faster passes; every round slower, or one round alone, fails."""
    assert bench_prometheus.on_within_off(Ratio([0.97, 1.01, 1.04]))
    assert bench_prometheus.on_within_off(Ratio([0.90, 0.93, 0.95]))
    assert not bench_prometheus.on_within_off(Ratio([1.03, 1.06, 1.10]))
    assert not bench_prometheus.on_within_off(Ratio([1.01]))
