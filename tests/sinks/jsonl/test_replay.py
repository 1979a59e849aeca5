"""Replay: a JSON-lines log gives the same spans and metric totals as the live run."""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ckpt_events import Bus, InvalidArgumentError
from ckpt_events.sinks.jsonl import JsonLinesSink
from ckpt_events.sinks.otel import MetricSink, SpanSink
from ckpt_events.sinks.replay import replay
from ckpt_events.testing import MemorySink
from tests.sinks.helpers import every_event_type, histogram_sums, metric_points


def _shape(spans: tuple[ReadableSpan, ...]) -> list[tuple[object, ...]]:
    return sorted(
        (
            s.name,
            s.context.trace_id,
            s.context.span_id,
            None if s.parent is None else (s.parent.span_id, s.parent.is_remote),
            s.start_time,
            s.end_time,
            tuple(sorted(s.attributes.items())),
            s.status.status_code,
        )
        for s in spans
    )


async def test_replay_gives_the_same_spans_and_metric_totals(tmp_path: Path) -> None:
    """Spans (ids, parents, times, attributes) and metric points match the live sinks."""
    path = tmp_path / "run.jsonl"
    live_spans, live_reader = InMemorySpanExporter(), InMemoryMetricReader()
    live_provider = MeterProvider(metric_readers=[live_reader])
    async with Bus() as bus:
        bus.subscribe(JsonLinesSink(path))
        bus.subscribe(SpanSink(live_spans))
        bus.subscribe(MetricSink(live_provider))
        await every_event_type(bus)
    replay_spans, replay_reader = InMemorySpanExporter(), InMemoryMetricReader()
    replay_provider = MeterProvider(metric_readers=[replay_reader])
    try:
        result = await replay(path, SpanSink(replay_spans), MetricSink(replay_provider), batch_size=3)
        assert result.corrupt == ()
        assert result.events == len(path.read_bytes().splitlines())
        assert live_spans.get_finished_spans()
        assert _shape(replay_spans.get_finished_spans()) == _shape(live_spans.get_finished_spans())
        assert metric_points(replay_reader) == metric_points(live_reader)
        assert histogram_sums(replay_reader) == pytest.approx(histogram_sums(live_reader))
    finally:
        live_provider.shutdown()
        replay_provider.shutdown()


async def test_replay_into_a_bus_and_past_corrupt_lines(tmp_path: Path) -> None:
    """A bus target gets every event; corrupt lines are skipped and returned."""
    path = tmp_path / "run.jsonl"
    async with Bus() as bus:
        bus.subscribe(JsonLinesSink(path))
        await every_event_type(bus)
    good = path.read_bytes()
    path.write_bytes(good + b"{broken\n")
    memory = MemorySink()
    async with Bus() as bus:
        bus.subscribe(memory)
        result = await replay(path, bus)
    assert len(memory.events) == result.events == len(good.splitlines())
    assert [c.line for c in result.corrupt] == [result.events + 1]


async def test_replay_rejects_non_sinks(tmp_path: Path) -> None:
    """A target without handle() and a bad batch size raise InvalidArgumentError."""
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"")
    with pytest.raises(InvalidArgumentError):
        await replay(path, object())
    with pytest.raises(InvalidArgumentError):
        await replay(path, MemorySink(), batch_size=0)


async def test_a_sink_with_bad_interests_is_refused_like_on_the_bus(tmp_path: Path) -> None:
    """Replay resolves interests as the bus does: non-event classes are a precise error."""

    class Confused:
        interests = (int,)

        def handle(self, batch: list[object]) -> None:
            pass

    log = tmp_path / "empty.jsonl"
    log.write_bytes(b"")
    with pytest.raises(InvalidArgumentError, match="event classes"):
        await replay(log, Confused())
