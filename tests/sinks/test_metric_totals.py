"""MetricTotals: what each event folds into, copies that stay put, the cardinality limit per instrument."""

from __future__ import annotations

import gc
import logging
import tracemalloc
from typing import Any

import msgspec
import pytest

from ckpt_events import (
    CoordinateFinished,
    GenerationCut,
    InvalidTypeError,
    InvalidValueError,
    LeaseExpired,
    OperationFinished,
    OperationStarted,
    PrepareNotReady,
    Refused,
    Stalled,
)
from ckpt_events.sinks import _metric_keys as keys
from ckpt_events.sinks._cardinality import DEFAULT_CARDINALITY_LIMIT
from ckpt_events.sinks._metric_totals import MetricTotals

OVERFLOW = keys.OVERFLOW_KEY
DURATION = "gym.checkpoint.operation_duration_ms"
EVENTS = "gym.checkpoint.events_total"


def _finished(kind: str, operation: str = "commit", span_id: int = 1, **fields: Any) -> OperationFinished:
    return OperationFinished(
        kind=kind,
        instance="i0",
        trace_id=1,
        span_id=span_id,
        start_ns=1_000_000,
        end_ns=3_000_000,
        operation=operation,
        **fields,
    )


def _started(kind: str, span_id: int, operation: str = "prepare") -> OperationStarted:
    return OperationStarted(
        kind=kind, instance="i0", trace_id=1, span_id=span_id, start_ns=1_000_000, operation=operation
    )


def _refused(code: str) -> Refused:
    return Refused(kind="model", instance="m0", time_ns=1, code=code)


def test_each_counted_event_lands_under_its_own_key() -> None:
    """Refusals, cuts (by calls), lease expiries, not-ready and stalls: one key each in the events counter."""
    totals = MetricTotals()
    totals.add(
        [
            _refused("admission_closed"),
            _refused("admission_closed"),
            GenerationCut(kind="model", instance="m0", time_ns=1, disposition="durable_prefix", calls=5),
            LeaseExpired(kind="model", instance="m0", time_ns=1, phase="prepared"),
            PrepareNotReady(kind="agent", instance="a0", time_ns=1, blockers=3),
            Stalled(kind="agent", instance="a0", time_ns=1, operation="prepare", age_s=9.0),
        ]
    )
    records, sizes, counts = totals.sums
    assert counts == {
        (keys.REFUSED, "admission_closed"): 2,
        (keys.CUT, "durable_prefix"): 5,
        (keys.LEASE, "model", "prepared"): 1,
        (keys.NOT_READY, "agent"): 1,
        (keys.STALLED, "agent", "prepare"): 1,
    }
    assert records == sizes == {}
    assert totals.overflow.measurements == 0


def test_operations_fold_durations_volumes_and_loop_lag() -> None:
    """A commit's duration (ms), records, bytes and loop lag; a controller's under kind ``controller``."""
    totals = MetricTotals()
    coordinate = CoordinateFinished(
        kind="controller",
        instance="coordination",
        trace_id=1,
        span_id=9,
        start_ns=0,
        end_ns=5_000_000,
        operation="commit",
        participants=1,
    )
    totals.add([_finished("model", records=3, bytes=30, loop_lag_ms=1.5), coordinate])
    assert {key: point.count for key, point in totals.durations.items()} == {
        (keys.DURATION, "commit", "model", "ok"): 1,
        (keys.DURATION, "commit", "controller", "ok"): 1,
    }
    assert totals.durations[(keys.DURATION, "commit", "model", "ok")].total == 2.0
    assert {key: point.total for key, point in totals.lags.items()} == {(keys.LAG, "model"): 1.5}
    records, sizes, _ = totals.sums
    assert records == {(keys.VOLUME, "commit", "model"): 3}
    assert sizes == {(keys.VOLUME, "commit", "model"): 30}


def test_a_snapshot_does_not_move_with_the_original() -> None:
    """Points and sums are copied: adding afterwards changes the original only."""
    totals = MetricTotals()
    totals.add([_finished("model", records=1), _refused("unauthorized")])
    copy = totals.snapshot()
    totals.add([_finished("model", records=1), _refused("unauthorized")])
    key = (keys.DURATION, "commit", "model", "ok")
    assert (copy.durations[key].count, totals.durations[key].count) == (1, 2)
    assert (copy.sums[2][(keys.REFUSED, "unauthorized")], totals.sums[2][(keys.REFUSED, "unauthorized")]) == (
        1,
        2,
    )
    assert copy.open is not None and totals.open is None


def test_counters_keep_the_first_sets_and_sum_the_rest_in_one_overflow_series() -> None:
    """Past the limit a new code goes to the overflow key; kept codes count under their own; totals hold."""
    totals = MetricTotals(3)
    totals.add([_refused(f"code-{i}") for i in range(5)])
    totals.add([_refused("code-0"), _refused("code-4"), _refused("code-9")])
    counts = totals.sums[2]
    assert counts == {
        (keys.REFUSED, "code-0"): 2,
        (keys.REFUSED, "code-1"): 1,
        (keys.REFUSED, "code-2"): 1,
        OVERFLOW: 4,
    }
    assert sum(counts.values()) == 8
    assert totals.overflow.by_instrument == {EVENTS: 4}


def test_histograms_volumes_and_open_work_are_capped_per_instrument() -> None:
    """New kinds past the limit: durations, records, bytes, open work each keep ``limit`` sets + overflow."""
    totals = MetricTotals(2)
    kinds = [f"kind-{i}" for i in range(4)]
    totals.add([_started(kind, span_id=i + 1) for i, kind in enumerate(kinds)])
    totals.add([_finished(kind, span_id=100 + i, records=1, bytes=10) for i, kind in enumerate(kinds)])
    assert list(totals.durations) == [
        (keys.DURATION, "commit", "kind-0", "ok"),
        (keys.DURATION, "commit", "kind-1", "ok"),
        OVERFLOW,
    ]
    assert totals.durations[OVERFLOW].count == 2
    records, sizes, _ = totals.sums
    assert records[OVERFLOW] == 2 and sizes[OVERFLOW] == 20 and len(records) == len(sizes) == 3
    snapshot = totals.snapshot().open
    assert snapshot is not None
    assert snapshot.open == {
        (keys.OPEN, "prepare", "kind-0"): 1,
        (keys.OPEN, "prepare", "kind-1"): 1,
        OVERFLOW: 2,
    }
    assert set(snapshot.oldest_s) == set(snapshot.open)
    assert totals.overflow.by_instrument == {
        "gym.checkpoint.open_operations": 2,
        DURATION: 2,
        "gym.checkpoint.records_total": 2,
        "gym.checkpoint.bytes_total": 2,
    }


def test_an_overflowing_open_operation_closes_in_the_overflow_series() -> None:
    """A start counted under overflow is taken off overflow when it finishes (open stays >= 0)."""
    totals = MetricTotals(1)
    totals.add([_started("a", span_id=1), _started("b", span_id=2)])
    totals.add(
        [_finished("b", operation="prepare", span_id=2), _finished("a", operation="prepare", span_id=1)]
    )
    snapshot = totals.snapshot().open
    assert snapshot is not None
    assert snapshot.open == {(keys.OPEN, "prepare", "a"): 0, OVERFLOW: 0}


def test_the_limit_is_logged_once_per_instrument(caplog: pytest.LogCaptureFixture) -> None:
    """One warning naming the owner, the instrument and the limit; later overflows are only counted."""
    totals = MetricTotals(1, owner="PrometheusSink")
    with caplog.at_level(logging.WARNING, logger="ckpt_events.sinks.metrics"):
        for i in range(50):
            totals.add([_refused(f"c{i}")])
    assert len(caplog.records) == 1
    message = caplog.records[0].getMessage()
    assert "PrometheusSink" in message and EVENTS in message and "1 attribute sets" in message
    assert "otel.metric.overflow=true" in message
    assert totals.overflow.measurements == 49


def test_the_default_limit_is_opentelemetrys() -> None:
    """2,000 sets per instrument, as the OpenTelemetry SDK's default; the 2,001st goes to overflow."""
    assert DEFAULT_CARDINALITY_LIMIT == 2_000
    totals = MetricTotals()
    totals.add([_refused(f"c{i}") for i in range(2_001)])
    assert len(totals.sums[2]) == 2_001 and totals.sums[2][OVERFLOW] == 1


@pytest.mark.parametrize(
    ("limit", "error"),
    [
        (0, InvalidValueError),
        (-1, InvalidValueError),
        (True, InvalidTypeError),
        (2.5, InvalidTypeError),
        ("9", InvalidTypeError),
    ],
)
def test_a_bad_limit_is_refused(limit: Any, error: type[Exception]) -> None:
    """Whole numbers >= 1 only, with the argument named."""
    with pytest.raises(error, match="cardinality_limit"):
        MetricTotals(limit)


async def test_a_measurement_the_sdk_refuses_is_refused_by_every_path_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Hand-built events (bus.emit checks no field) with a negative amount, a negative duration
    and a NaN loop lag: our totals summed them (a counter going down, a sum NaN for good) while
    the SDK refused them, and MetricSink's per-batch sum lost a good amount with a bad one
    (bytes 5 + -7: add(-2), refused whole). Every path now keeps the good and counts the bad."""
    import time

    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from ckpt_events import Bus
    from ckpt_events.sinks.otel import MetricSink
    from ckpt_events.sinks.prometheus import PrometheusSink
    from ckpt_events.vocab import Disposition, Operation
    from tests.sinks.helpers import metric_points

    reader = InMemoryMetricReader()
    sdk = MetricSink(MeterProvider(metric_readers=[reader]))
    prometheus = PrometheusSink()
    t = time.time_ns()
    async with Bus() as bus:
        bus.subscribe(sdk)
        bus.subscribe(prometheus)
        bus.emit(OperationFinished("model", "m", 1, 2, t, t + 10**6, Operation.COMMIT, records=10, bytes=5))
        bus.emit(
            OperationFinished(
                "model",
                "m",
                1,
                3,
                t,
                t + 10**6,
                Operation.COMMIT,
                records=-5,
                bytes=-7,
                loop_lag_ms=float("nan"),
            )
        )
        bus.emit(OperationFinished("model", "m", 1, 4, t + 10**6, t, Operation.COMMIT))
        bus.emit(GenerationCut("model", "m", t, Disposition.DURABLE_PREFIX, -2))
    volume = frozenset(
        {("nemo.gym.checkpoint.operation", "commit"), ("nemo.gym.checkpoint.participant_kind", "model")}
    )
    points = metric_points(reader)
    assert points["gym.checkpoint.records_total"][1] == {volume: 10}
    assert points["gym.checkpoint.bytes_total"][1] == {volume: 5}
    assert "gym.checkpoint.events_total" not in points and "gym.checkpoint.loop_lag_ms" not in points
    totals = prometheus.snapshot()
    key = (keys.VOLUME, Operation.COMMIT, "model")
    assert totals.sums == ({key: 10}, {key: 5}, {}) and not totals.lags
    (duration,) = totals.durations.values()
    assert (duration.count, duration.total, duration.min) == (2, 2.0, 1.0)
    assert sdk.stats().invalid == prometheus.invalid == 5
    said = [r.getMessage() for r in caplog.records if "refused the value" in r.getMessage()]
    assert len(said) == 2  # once per sink


def test_an_exemplar_keeps_the_spans_ids_not_its_event() -> None:
    """A bucket's exemplar holds the span's ids and end, never its event: 2,000 kinds x 15
    buckets of operations with 20 KB of attributes each held 628 MiB through their exemplars."""
    totals = MetricTotals()
    durations_ms = (1, 7, 20, 40, 60, 90, 200, 400, 600, 900, 2000, 4000, 6000, 9000, 20000)
    gc.collect()
    # Traced from before the events are built: memory allocated untraced is not seen freed.
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        events = [
            msgspec.structs.replace(
                _finished("k0", span_id=i + 1, attributes={"user.note": f"{i}" + "x" * 100_000}),
                end_ns=1_000_000 + ms * 1_000_000,
            )
            for i, ms in enumerate(durations_ms)
        ]
        totals.add(events)
        del events
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    point = totals.durations[(keys.DURATION, "commit", "k0", "ok")]
    exemplars = [e for e in point.exemplars if e is not None]
    assert len(exemplars) == len(durations_ms)
    assert {e.span_id for e in exemplars} == set(range(1, len(durations_ms) + 1))
    assert all(e.trace_id == 1 and e.end_ns > 1_000_000 for e in exemplars)
    assert held < 200_000, f"{held:,} bytes still held after the events were dropped"


def test_the_limit_warning_points_at_kinds_never_at_steps(caplog: pytest.LogCaptureFixture) -> None:
    """Steps are on no metric, so the warning names the participant kind as the likely cause
    (a kind made of an instance or an id) and says steps are not: "an unbounded kind, step or
    code?" sent users hunting their step names."""
    totals = MetricTotals(2, owner="PrometheusSink")
    with caplog.at_level(logging.WARNING, logger="ckpt_events.sinks.metrics"):
        totals.add([_finished(f"env-{pod}", span_id=pod + 1) for pod in range(5)])
    assert len(caplog.records) == 1
    message = caplog.records[0].getMessage()
    assert "participant kind made of an instance or an id" in message
    assert "steps are on no metric" in message and "step or" not in message
