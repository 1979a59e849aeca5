"""Open-work metrics: an operation held open shows as open with a growing oldest age, in
OpenTelemetry's SDK and through our OTLP metric sink into a real collector (rotel)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import anyio
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from ckpt_events import Bus, Telemetry
from ckpt_events.sinks._open_work import MAX_OPEN, OpenWork
from ckpt_events.sinks.otel import MetricSink, OtlpMetricSink
from ckpt_events.sinks.prometheus import PrometheusSink
from ckpt_events.vocab import METRIC_LAST_PUBLISHED, METRIC_OLDEST_OPEN, METRIC_OPEN_OPERATIONS
from tests.sinks.helpers import metric_points
from tests.sinks.otlp.test_collector import _wait_for, collector

__all__ = ["collector"]

P = "nemo.gym.checkpoint."
PREPARE_ENV = frozenset({(P + "operation", "prepare"), (P + "participant_kind", "environment")})
PREPARE_CTL = frozenset({(P + "operation", "prepare"), (P + "participant_kind", "controller")})


async def test_a_held_prepare_is_open_and_ages_then_closes() -> None:
    """While held: one open, age growing; after: 0 open, age 0; a publish sets the last-published time."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    async with Bus() as bus:
        bus.subscribe(MetricSink(provider))
        ctl = Telemetry(bus, kind="controller", instance="coordination")
        env = Telemetry(bus, kind="environment", instance="environment-0")
        with ctl.coordinate("prepare", checkpoint_id="c1"), env.operation("prepare", checkpoint_id="c1"):
            await bus.flush()
            first = metric_points(reader)
            await anyio.sleep(0.3)
            second = metric_points(reader)
        with ctl.collection("checkpoint", checkpoint_id="c1") as collection:
            with ctl.collection("publish", checkpoint_id="c1", parent=collection):
                pass
        await bus.flush()
        after = metric_points(reader)
    assert first[METRIC_OPEN_OPERATIONS][1] == {PREPARE_ENV: 1, PREPARE_CTL: 1}
    assert second[METRIC_OLDEST_OPEN][1][PREPARE_ENV] >= first[METRIC_OLDEST_OPEN][1][PREPARE_ENV] + 0.25
    assert after[METRIC_OPEN_OPERATIONS][1] == {PREPARE_ENV: 0, PREPARE_CTL: 0}
    assert after[METRIC_OLDEST_OPEN][1] == {PREPARE_ENV: 0.0, PREPARE_CTL: 0.0}
    ((attributes, published),) = after[METRIC_LAST_PUBLISHED][1].items()
    assert attributes == frozenset() and abs(published - time.time()) < 5
    provider.shutdown()


@pytest.mark.parametrize("step_s", [-3600, 3600])
async def test_a_wall_clock_step_leaves_the_oldest_age_true(
    step_s: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The oldest age runs on the monotonic clock: a prepare open 0.2 s, the wall clock stepped an
    hour back or forward since it began, is 0.2 s old (not 0, which hid it, nor an hour, which paged)."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    async with Bus() as bus:
        bus.subscribe(MetricSink(provider))
        env = Telemetry(bus, kind="environment", instance="environment-0")
        with env.operation("prepare", checkpoint_id="c1"):
            await bus.flush()
            wall = time.time_ns
            monkeypatch.setattr(time, "time_ns", lambda: wall() + step_s * 10**9)
            await anyio.sleep(0.2)
            age = metric_points(reader)[METRIC_OLDEST_OPEN][1][PREPARE_ENV]
    provider.shutdown()
    assert 0.2 <= age < 2.0


def test_the_tracker_is_bounded() -> None:
    """Past MAX_OPEN open operations (their ends lost), more are counted as untracked, not stored."""
    from ckpt_events import OperationStarted
    from ckpt_events.vocab import Kind, Operation

    work = OpenWork()
    started = [
        OperationStarted(Kind.MODEL, "m", 1, span_id, 0, Operation.COMMIT) for span_id in range(MAX_OPEN + 5)
    ]
    work.add(started)
    snapshot = work.snapshot(10**9)
    assert snapshot.untracked == 5
    assert sum(snapshot.open.values()) == MAX_OPEN


def test_changes_are_optional_and_the_state_is_the_same_without() -> None:
    """``deltas=False`` (MetricTotals, which reads snapshots only) returns None and keeps the same counts."""
    from ckpt_events import OperationFinished, OperationStarted
    from ckpt_events.vocab import Kind, Operation

    batch = [
        OperationStarted(Kind.MODEL, "m", 1, 1, 0, Operation.COMMIT),
        OperationStarted(Kind.AGENT, "a", 1, 2, 0, Operation.COMMIT),
        OperationFinished(Kind.MODEL, "m", 1, 1, 0, 5, Operation.COMMIT),
    ]
    with_changes, without = OpenWork(), OpenWork()
    assert with_changes.add(batch) == {("open", "commit", "model"): 0, ("open", "commit", "agent"): 1}
    assert without.add(batch, deltas=False) is None
    assert without.snapshot(10) == with_changes.snapshot(10)


def test_new_kinds_past_the_limit_are_open_under_the_overflow_key() -> None:
    """The (operation, kind) sets kept are capped by the owner's Overflow; the rest share its key."""
    from ckpt_events import OperationStarted
    from ckpt_events.sinks._cardinality import Overflow
    from ckpt_events.sinks._metric_keys import OVERFLOW_KEY
    from ckpt_events.vocab import Operation

    work = OpenWork(Overflow(2))
    changes = work.add([OperationStarted(f"k{i}", "i", 1, i, 0, Operation.PREPARE) for i in range(5)])
    assert changes is not None and changes[OVERFLOW_KEY] == 3 and len(changes) == 3
    assert work.overflow.by_instrument == {"gym.checkpoint.open_operations": 3}


@pytest.mark.collector
async def test_the_open_prepares_age_grows_at_the_collector(collector: tuple[str, Path]) -> None:
    """Two exports while a prepare is held: rotel receives oldest_open_s growing, then 0 open."""
    endpoint, out = collector
    sink = OtlpMetricSink(endpoint, resource_attributes={"service.name": "open-work"})
    ages: list[float] = []
    async with Bus() as bus:
        bus.subscribe(sink)
        env = Telemetry(bus, kind="environment", instance="environment-0")
        with env.operation("prepare", checkpoint_id="c1"):
            for _ in range(2):
                await bus.flush()
                assert await anyio.to_thread.run_sync(sink.force_flush)
                text = _wait_for(out, ["gym.checkpoint.oldest_open_s"] * (len(ages) + 1))
                found = re.findall(
                    r"-> Name: gym\.checkpoint\.oldest_open_s.*?^Value: (\S+)$", text, re.S | re.M
                )
                assert len(found) > len(ages), text
                ages.append(float(found[-1]))
                await anyio.sleep(0.4)
    assert ages[1] >= ages[0] + 0.3, ages
    text = _wait_for(out, ["open-work"])
    assert "gym.checkpoint.open_operations" in text and "IsMonotonic: false" in text


async def test_leaked_handles_past_the_bound_are_counted_and_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Operations entered and never left fill the tracker; later starts are not in the gauges,
    which then undercount: each metric sink counts them in its stats and warns once. Was:
    counted by PrometheusSink alone, and by no sink said (MetricSink's gauges froze at 10,000)."""
    leaked = MAX_OPEN + 3
    reader = InMemoryMetricReader()
    metric_sink = MetricSink(MeterProvider(metric_readers=[reader]))
    prometheus_sink = PrometheusSink()
    # Nothing listens on port 9 (discard): its one export at close fails at once, and is not the point.
    otlp_sink = OtlpMetricSink("http://127.0.0.1:9", timeout=1.0, export_interval=3600, max_retries=0)
    async with Bus() as bus:
        bus.subscribe(metric_sink)
        bus.subscribe(prometheus_sink)
        bus.subscribe(otlp_sink)
        tel = Telemetry(bus, kind="environment", instance="environment-0")
        for i in range(leaked):
            tel.operation("commit", checkpoint_id=f"c{i}").__enter__()  # never left: a leak
        with tel.operation("restore", checkpoint_id="r1"):
            pass
        await bus.flush()
    assert metric_sink.stats().untracked == leaked + 1 - MAX_OPEN
    assert prometheus_sink.untracked == leaked + 1 - MAX_OPEN
    assert otlp_sink.stats().untracked == leaked + 1 - MAX_OPEN
    warnings = [r.getMessage() for r in caplog.records if "the most it tracks" in r.getMessage()]
    assert len(warnings) == 3, warnings
    assert {w.split(":")[0] for w in warnings} == {"MetricSink", "PrometheusSink", "OtlpMetricSink"}
    assert all(f"{MAX_OPEN:,} operations open" in w and "untracked" in w for w in warnings)
