"""MetricSink: the four instruments of SPEC section 3 and the loop lag, attribute sets, values and units."""

from __future__ import annotations

import inspect
import logging
import sys
import threading
import time
from contextlib import ExitStack
from typing import Any

import anyio
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    Histogram,
    InMemoryMetricReader,
    PeriodicExportingMetricReader,
    Sum,
)

from ckpt_events import Bus, InvalidArgumentError, Refused, Telemetry
from ckpt_events._subscription import BACKLOG_HOLD
from ckpt_events.sinks.otel import MetricSink
from ckpt_events.vocab import METRIC_LOOP_LAG, METRIC_OLDEST_OPEN, METRIC_OPEN_OPERATIONS
from tests.sinks.helpers import histogram_sums, metric_points

P = "nemo.gym.checkpoint."
DURATION = "gym.checkpoint.operation_duration_ms"
RECORDS = "gym.checkpoint.records_total"
BYTES = "gym.checkpoint.bytes_total"
EVENTS = "gym.checkpoint.events_total"

#: The SDK's own limit on its readers (``cardinality_limits``, 2,000 by default): an SDK feature,
#: absent before opentelemetry-sdk 1.45.2, where only the sink's own limit applies.
sdk_reader_limits = pytest.mark.skipif(
    "cardinality_limits" not in inspect.signature(PeriodicExportingMetricReader).parameters,
    reason="this opentelemetry-sdk's readers have no cardinality limit (cardinality_limits, from 1.45.2)",
)


def _key(**attributes: str) -> frozenset[tuple[str, str]]:
    return frozenset(attributes.items())


def _op(operation: str, kind: str, outcome: str = "ok") -> frozenset[tuple[str, str]]:
    return frozenset({(P + "operation", operation), (P + "participant_kind", kind), ("outcome", outcome)})


def _vol(operation: str, kind: str) -> frozenset[tuple[str, str]]:
    return frozenset({(P + "operation", operation), (P + "participant_kind", kind)})


async def _mix(bus: Bus) -> None:
    resources = Telemetry(bus, kind="resources", instance="r0")
    model = Telemetry(bus, kind="model", instance="m0")
    ctl = Telemetry(bus, kind="controller", instance="coordination")
    with ctl.coordinate("prepare", checkpoint_id="c1"):
        with resources.operation("prepare", checkpoint_id="c1"):
            pass
        with model.operation("prepare", checkpoint_id="c1"):
            model.generation_cut("durable_prefix", 5, checkpoint_id="c1")
            model.generation_cut("durable_failure", 2, checkpoint_id="c1")
            model.generation_cut("durable_prefix", 1, checkpoint_id="c1")
    with resources.operation("renew", checkpoint_id="c1"):
        pass
    with ctl.coordinate("commit", checkpoint_id="c1"):
        for records in (3, 4):
            with resources.operation("commit", checkpoint_id="c1") as op:
                op.set(records=records, bytes=100 * records)
        with model.operation("commit", checkpoint_id="c1") as op:
            op.set(records=1, bytes=10)
    with pytest.raises(RuntimeError):
        with resources.operation("restore", checkpoint_id="c1"):
            raise RuntimeError("bad digest")
    with resources.operation("restore", checkpoint_id="c1") as op:
        op.set(records=7, bytes=700)
    for _ in range(3):
        resources.refused("admission_closed", checkpoint_id="c1")
    resources.refused("unauthorized")
    resources.lease_expired("prepared", checkpoint_id="c1")
    model.lease_expired("preparing", checkpoint_id="c1")
    model.prepare_not_ready(12, checkpoint_id="c1")


async def test_every_instrument_attribute_set_and_value(
    ckpt_metric_reader: InMemoryMetricReader, ckpt_metric_sink: MetricSink
) -> None:
    """Durations, volumes and counted events land with exact keys, values and units."""
    async with Bus() as bus:
        bus.subscribe(ckpt_metric_sink)
        await _mix(bus)
        await bus.flush()
    points = metric_points(ckpt_metric_reader)
    assert set(points) == {DURATION, RECORDS, BYTES, EVENTS, METRIC_OPEN_OPERATIONS, METRIC_OLDEST_OPEN}
    # Everything finished: every (operation, kind) seen has 0 open, and an oldest age of 0.
    opened = {key - {("outcome", "ok"), ("outcome", "error")} for key in points[DURATION][1]}
    assert points[METRIC_OPEN_OPERATIONS] == ("{operation}", dict.fromkeys(opened, 0))
    assert points[METRIC_OLDEST_OPEN] == ("s", dict.fromkeys(opened, 0.0))
    unit, durations = points[DURATION]
    assert unit == "ms"
    assert durations == {
        _op("prepare", "controller"): 1,
        _op("commit", "controller"): 1,
        _op("prepare", "resources"): 1,
        _op("prepare", "model"): 1,
        _op("renew", "resources"): 1,
        _op("commit", "resources"): 2,
        _op("commit", "model"): 1,
        _op("restore", "resources", "error"): 1,
        _op("restore", "resources"): 1,
    }
    assert all(v >= 0 for v in histogram_sums(ckpt_metric_reader).values())
    assert points[RECORDS] == (
        "1",
        {_vol("commit", "resources"): 7, _vol("commit", "model"): 1, _vol("restore", "resources"): 7},
    )
    assert points[BYTES] == (
        "By",
        {_vol("commit", "resources"): 700, _vol("commit", "model"): 10, _vol("restore", "resources"): 700},
    )
    e = P + "event"
    assert points[EVENTS] == (
        "1",
        {
            _key(**{e: "refused", P + "code": "admission_closed"}): 3,
            _key(**{e: "refused", P + "code": "unauthorized"}): 1,
            _key(**{e: "generation_cut", P + "disposition": "durable_prefix"}): 6,
            _key(**{e: "generation_cut", P + "disposition": "durable_failure"}): 2,
            _key(**{e: "lease_expired", P + "participant_kind": "resources", P + "phase": "prepared"}): 1,
            _key(**{e: "lease_expired", P + "participant_kind": "model", P + "phase": "preparing"}): 1,
            _key(**{e: "prepare_not_ready", P + "participant_kind": "model"}): 1,
        },
    )


async def test_instrument_kinds_and_no_high_cardinality_attributes(
    ckpt_metric_reader: InMemoryMetricReader, ckpt_metric_sink: MetricSink
) -> None:
    """One histogram and three monotonic sums; no id, instance or rollout on any point."""
    async with Bus() as bus:
        bus.subscribe(ckpt_metric_sink)
        await _mix(bus)
        await bus.flush()
    data = ckpt_metric_reader.get_metrics_data()
    metrics = {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert isinstance(metrics[DURATION].data, Histogram)
    for name in (RECORDS, BYTES, EVENTS):
        assert isinstance(metrics[name].data, Sum) and metrics[name].data.is_monotonic
    for metric in metrics.values():
        for point in metric.data.data_points:
            assert not {P + "id", P + "instance", "checkpoint_id", "instance"} & set(point.attributes)
            assert all(type(v) is str for v in point.attributes.values())


async def test_counters_are_summed_per_attribute_set_within_a_batch(
    ckpt_metric_reader: InMemoryMetricReader, ckpt_metric_sink: MetricSink
) -> None:
    """A batch of 1000 refusals reaches the SDK as one add."""
    async with Bus() as bus:
        tel = Telemetry(bus, kind="agent", instance="a0")
        bus.subscribe(ckpt_metric_sink)
        for _ in range(1000):  # emitted before the bus delivers: one batch
            tel.refused("admission_closed")
        await bus.flush()
    stats = ckpt_metric_sink.stats()
    assert stats.events == 1000 and stats.sdk_calls == 1
    (_, points) = metric_points(ckpt_metric_reader)[EVENTS]
    assert points == {_key(**{P + "event": "refused", P + "code": "admission_closed"}): 1000}


async def test_metrics_do_not_depend_on_span_groups_or_sampling(
    ckpt_metric_reader: InMemoryMetricReader, ckpt_metric_sink: MetricSink
) -> None:
    """A sampled-out trace is still measured."""
    async with Bus() as bus:
        bus.subscribe(ckpt_metric_sink)
        tel = Telemetry(bus, kind="agent", instance="a0", sample_ratio=0.0)
        with tel.operation("resume", checkpoint_id="c1"):
            pass
        await bus.flush()
    assert metric_points(ckpt_metric_reader)[DURATION][1] == {_op("resume", "agent"): 1}


def test_metric_sink_needs_a_meter_provider() -> None:
    """Anything without get_meter is rejected."""
    with pytest.raises(InvalidArgumentError):
        MetricSink(object())  # type: ignore[arg-type]
    provider = MeterProvider()
    try:
        assert MetricSink(provider).stats().events == 0
    finally:
        provider.shutdown()


async def test_loop_lag_is_a_histogram_per_participant_kind(
    ckpt_metric_reader: InMemoryMetricReader, ckpt_metric_sink: MetricSink
) -> None:
    """An operation's loop_lag_ms is recorded on gym.checkpoint.loop_lag_ms by participant kind only."""
    async with Bus() as bus:
        bus.subscribe(ckpt_metric_sink)
        resources = Telemetry(bus, kind="resources", instance="r0")
        for lag in (2.5, 7.5):
            with resources.operation("commit", checkpoint_id="c1") as op:
                op.set(loop_lag_ms=lag)
        with resources.operation("resume", checkpoint_id="c1"):
            pass  # no lag measured: nothing recorded
        await bus.flush()
    data = ckpt_metric_reader.get_metrics_data()
    (metric,) = [
        m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
        if m.name == METRIC_LOOP_LAG
    ]  # fmt: skip
    assert isinstance(metric.data, Histogram) and metric.unit == "ms"
    (point,) = metric.data.data_points
    assert dict(point.attributes) == {P + "participant_kind": "resources"}
    assert point.count == 2 and point.sum == 10.0 and point.max == 7.5


def _codes(n: int) -> list[Refused]:
    # Built as bus.emit gets them: an event's fields are not checked there.
    return [Refused(kind="model", instance="m0", time_ns=1, code=f"code-{i}") for i in range(n)]  # type: ignore[arg-type]


async def test_new_codes_past_the_limit_share_the_sdks_overflow_point() -> None:
    """5,000 new codes: 2,000 points of their own, one ``otel.metric.overflow=True`` point with the rest."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    sink = MetricSink(provider)
    async with Bus() as bus:
        bus.subscribe(sink)
        for event in _codes(5_000):
            bus.emit(event)
    _, points = metric_points(reader)[EVENTS]
    assert len(points) == 2_001
    assert points[frozenset({("otel.metric.overflow", True)})] == 3_000
    assert sum(points.values()) == 5_000
    # Each new code counted in overflowed, their sums one SDK call per batch (two batches of
    # 4,096 and 904: 2,000 kept codes, then one overflow add each); was 5,000 calls, one per code.
    assert sink.stats().overflowed == 3_000
    assert sink.stats().sdk_calls == 2_002
    provider.shutdown()


class _Timed:
    """A MetricSink whose ``handle`` is timed, as the bus's watch times it: the loop it holds."""

    interests = MetricSink.interests

    def __init__(self, sink: MetricSink) -> None:
        self.sink = sink
        self.took = 0.0

    def handle(self, batch: list[Any]) -> None:
        started = time.perf_counter()
        self.sink.handle(batch)
        self.took += time.perf_counter() - started


#: Operations (and refusals) per round: the first round of the flood fills the limit.
_ROUND = 2_000


async def _round(bus: Bus, timed: _Timed, start: int, *, flood: bool) -> float:
    """``_ROUND`` commits, each with a refusal: a new participant kind and code each (a flood),
    or the four kinds and codes of normal traffic; the time MetricSink held the loop for them."""
    kinds = [Telemetry(bus, kind=f"kind-{n}", instance="i0") for n in range(4)]
    for n in range(start, start + _ROUND):
        tel = Telemetry(bus, kind=f"kind-{n}", instance="i0") if flood else kinds[n % 4]
        with tel.operation("commit", checkpoint_id="c") as op:
            op.set(records=3, bytes=100)
        code = f"code-{n if flood else n % 4}"
        bus.emit(Refused(kind="model", instance="m0", time_ns=1, code=code))  # type: ignore[arg-type]
    took = timed.took
    await bus.flush()
    return timed.took - took


async def test_a_flood_of_new_names_past_the_limit_costs_what_normal_traffic_does() -> None:
    """A new kind and code per operation, past the 2,000-set limit, hold the loop under 2x as
    long as normal traffic of the same events (was 2.7x: each overflowing key's sum was its own
    SDK add of ~10 us, 3 per operation); best of 5 rounds side by side, and every count exact."""
    readers = [InMemoryMetricReader(), InMemoryMetricReader()]
    providers = [MeterProvider(metric_readers=[reader]) for reader in readers]
    sinks = [_Timed(MetricSink(provider)) for provider in providers]
    flood: list[float] = []
    normal: list[float] = []
    async with Bus() as flood_bus, Bus() as normal_bus:
        flood_bus.subscribe(sinks[0])
        normal_bus.subscribe(sinks[1])
        # Not timed: the SDK's first sight of 2,000 new sets per instrument (~150 ms, its own).
        await _round(flood_bus, sinks[0], 0, flood=True)
        await _round(normal_bus, sinks[1], 0, flood=False)
        for n in range(1, 6):
            flood.append(await _round(flood_bus, sinks[0], n * _ROUND, flood=True))
            normal.append(await _round(normal_bus, sinks[1], n * _ROUND, flood=False))
    ratio = min(flood) / min(normal)
    said = f"flood {min(flood) * 1e3:.1f} ms, normal {min(normal) * 1e3:.1f} ms a round: {ratio:.2f}x"
    assert ratio < 2, said
    ops = 6 * _ROUND
    overflow = frozenset({("otel.metric.overflow", True)})
    for reader in readers:
        points = metric_points(reader)
        assert sum(points[DURATION][1].values()) == ops
        assert sum(points[RECORDS][1].values()) == 3 * ops and sum(points[BYTES][1].values()) == 100 * ops
        assert sum(points[EVENTS][1].values()) == ops
    flooded = metric_points(readers[0])
    past = ops - 2_000
    for name, each in ((DURATION, 1), (RECORDS, 3), (BYTES, 100), (EVENTS, 1)):
        assert len(flooded[name][1]) == 2_001 and flooded[name][1][overflow] == each * past
    # Each overflowing set counted once per instrument: duration, records, bytes, events, open.
    assert sinks[0].sink.stats().overflowed == 5 * past and sinks[1].sink.stats().overflowed == 0
    for provider in providers:
        provider.shutdown()


@sdk_reader_limits
def test_a_lower_sdk_limit_wins() -> None:
    """The SDK reader's own limit (2,000 in opentelemetry-sdk >= 1.45.2) caps a MetricSink allowed more."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    sink = MetricSink(provider, cardinality_limit=3_000)
    sink.handle(_codes(2_500))
    assert len(metric_points(reader)[EVENTS][1]) == 2_001 and sink.stats().overflowed == 0
    provider.shutdown()


@sdk_reader_limits
def test_the_readers_configure_builds_take_its_limit() -> None:
    """``metric_cardinality_limit`` is also the limit of the SDK readers configure builds, so raising it
    is not undone by the SDK's default."""
    from opentelemetry.sdk.metrics._internal.instrument import _Counter, _Histogram

    from ckpt_events.sinks.otel._env import read_otel_env
    from ckpt_events.sinks.otel._pipeline import metric_readers_for

    (reader,) = metric_readers_for(
        read_otel_env({"OTEL_METRICS_EXPORTER": "console"}), cardinality_limit=3_000
    )
    try:
        # The SDK's own table (no public getter): what its storage reads for each new stream.
        limits = reader._instrument_class_cardinality_limit  # type: ignore[attr-defined]
        assert limits[_Counter] == limits[_Histogram] == 3_000
    finally:
        reader.shutdown()


def test_a_bad_cardinality_limit_is_refused(ckpt_meter_provider: MeterProvider) -> None:
    """Whole numbers >= 1 only."""
    with pytest.raises(InvalidArgumentError, match="cardinality_limit"):
        MetricSink(ckpt_meter_provider, cardinality_limit=0)


async def test_a_collection_in_another_thread_never_fails_the_open_work_gauges(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A reader collecting in its own thread (a periodic reader's) while batches open and close
    operations reads the gauges whole: their callback iterated the open operations as the bus's
    thread changed them ("dictionary changed size during iteration", the gauge missing)."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    caplog.set_level(logging.ERROR, logger="opentelemetry.sdk.metrics")
    stop = threading.Event()

    def collect() -> None:
        while not stop.is_set():
            reader.get_metrics_data()

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # thread switches as often as possible, where the race is
    collector = threading.Thread(target=collect)
    try:
        async with Bus() as bus:
            bus.subscribe(MetricSink(provider))
            tel = Telemetry(bus, kind="model", instance="m0")
            with ExitStack() as held:
                for _ in range(2000):  # a long iteration for the callback
                    held.enter_context(tel.operation("commit", checkpoint_id="c1"))
                await bus.flush()
                collector.start()
                deadline = time.monotonic() + 0.5  # failed within 0.15 s, five runs of five
                while time.monotonic() < deadline and not caplog.records:
                    with ExitStack() as churn:
                        for _ in range(500):
                            churn.enter_context(tel.operation("commit", checkpoint_id="c1"))
                        await bus.flush()
                    await bus.flush()
    finally:
        stop.set()
        if collector.is_alive():
            collector.join()
        sys.setswitchinterval(switch)
        provider.shutdown()
    assert [r.getMessage() for r in caplog.records] == []


async def test_a_shut_down_meter_provider_counts_what_it_would_lose(caplog: pytest.LogCaptureFixture) -> None:
    """Events reaching a meter provider of yours after you shut it down are counted as dropped
    and logged once: its instruments take them and no reader ever sees them. They went
    nowhere, with no word and stats() as if recorded."""
    caplog.set_level(logging.WARNING, logger="ckpt_events.sinks.otel")
    provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    sink = MetricSink(provider)
    async with Bus() as bus:
        bus.subscribe(sink)
        tel = Telemetry(bus, kind="agent", instance="a0")
        with tel.operation("commit", checkpoint_id="c1"):
            pass
        await bus.flush()
        provider.shutdown()
        for index in range(2):
            with tel.operation("commit", checkpoint_id=f"c{index + 2}"):
                pass
            tel.refused("stale_attempt")
            await bus.flush()
    stats = sink.stats()
    assert (stats.events, stats.dropped) == (8, 6)
    (record,) = [r for r in caplog.records if r.name == "ckpt_events.sinks.otel"]
    assert "MeterProvider was shut down" in record.getMessage()


async def test_a_meter_provider_shut_down_before_the_sink_is_built_is_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A provider already shut down when the sink is built (the lifespan that shut it down,
    run again): one line of ours, not the SDK's "A shutdown MeterProvider can not provide a
    Meter" too, and every event counted as dropped."""
    caplog.set_level(logging.WARNING)
    provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    provider.shutdown()
    sink = MetricSink(provider)
    async with Bus() as bus:
        bus.subscribe(sink)
        with Telemetry(bus, kind="agent", instance="a0").operation("commit", checkpoint_id="c1"):
            pass
    assert (sink.stats().events, sink.stats().dropped) == (2, 2)
    (record,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "MetricSink: the MeterProvider was shut down" in record.getMessage()


async def test_a_flood_lets_the_loop_run_between_batches_and_loses_no_count() -> None:
    """20,000 operations emitted in one loop turn reach the sink in 10 batches of 4,096 events,
    each held here at least BACKLOG_HOLD (a MetricSink's full batch takes 30-75 ms loaded):
    another task gets the loop between them (before: not once until the last, the loop held
    450-730 ms for a flood of 16 batches), and every count and histogram value arrives."""
    reader = InMemoryMetricReader()
    sink = MetricSink(MeterProvider(metric_readers=[reader]))
    handled: list[int] = []
    ticks_at: list[int] = []
    async with Bus() as bus:
        tel = Telemetry(bus, kind="resources", instance="r0")
        bus.subscribe(sink)
        original = sink.handle

        def counted(batch: list[Any]) -> None:
            original(batch)
            time.sleep(BACKLOG_HOLD)  # as long as a loaded server's batch takes, at least
            handled.append(len(batch))

        sink.handle = counted  # type: ignore[method-assign]  # counts the batches, the sink itself runs

        async def ticker() -> None:
            for _ in range(100_000):  # bounded: ends once the flood is handled
                await anyio.lowlevel.checkpoint()
                ticks_at.append(len(handled))
                if sum(handled) >= 40_000:
                    return

        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            for _ in range(20_000):
                with tel.operation("commit", checkpoint_id="c1") as op:
                    op.set(records=3, bytes=10)
        await bus.flush()
    assert sum(handled) == 40_000 and len(handled) == 10
    # The ticker ran while some batches were handled and others were still waiting.
    assert len({n for n in ticks_at if 0 < n < len(handled)}) >= len(handled) - 2, ticks_at[-20:]
    points = metric_points(reader)
    assert points[DURATION][1] == {_op("commit", "resources"): 20_000}
    assert points[RECORDS][1] == {_vol("commit", "resources"): 60_000}
    assert points[BYTES][1] == {_vol("commit", "resources"): 200_000}
