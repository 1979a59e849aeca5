"""Replay: a JSON-lines log gives the same spans and metric totals as the live run."""

from __future__ import annotations

import logging
import socket
import threading
import time
from pathlib import Path

import anyio
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ckpt_events import Bus, InvalidArgumentError, InvalidValueError
from ckpt_events.sinks.jsonl import JsonLinesSink
from ckpt_events.sinks.jsonl import _replay as replay_module
from ckpt_events.sinks.jsonl._replay import MAX_CORRUPT
from ckpt_events.sinks.otel import MetricSink, OtlpSpanSink, SpanSink
from ckpt_events.sinks.replay import ReplayFailure, replay
from ckpt_events.testing import EventCapture, MemorySink
from tests.participants.cli.otlp_receiver import otlp_receiver
from tests.sinks.helpers import every_event_type, histogram_sums, metric_points
from tests.typecheck import mypy_strict


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


class _RaisesOnBatches:
    """A sink whose ``handle`` raises on the batches numbered in ``raising`` (from 1), and keeps
    the events of the others."""

    def __init__(self, raising: set[int] | None = None) -> None:
        self.raising = raising
        self.calls = 0
        self.events: list[object] = []

    async def handle(self, batch: list[object]) -> None:
        self.calls += 1
        if self.raising is None or self.calls in self.raising:
            raise ValueError(f"batch {self.calls}\nrefused")
        self.events.extend(batch)


async def test_a_raising_target_is_isolated_logged_once_and_listed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A target whose handle raises ends nothing: the others get every event, it is logged once,
    and ``failed`` names it with its first error in one line and what it did not take. Was: the
    first raise ended the replay, and the good sink after it got none of the 15 events."""
    path = tmp_path / "run.jsonl"
    async with Bus() as bus:
        bus.subscribe(JsonLinesSink(path))
        await every_event_type(bus)
    lines = len(path.read_bytes().splitlines())
    broken, good = _RaisesOnBatches(), MemorySink()
    caplog.set_level(logging.ERROR, logger="ckpt_events.sinks.jsonl")
    result = await replay(path, broken, good, batch_size=3)
    assert len(good.events) == result.events == lines
    batches = -(-lines // 3)
    first = "ValueError: batch 1 refused"  # its two lines in one
    assert result.failed == (ReplayFailure(0, "_RaisesOnBatches", first, lines, batches),)
    logged = [r for r in caplog.records if r.name == "ckpt_events.sinks.jsonl"]
    assert [r.getMessage() for r in logged] == [
        "replay target 0 (_RaisesOnBatches) failed to handle a batch of 3 events; its failures are "
        "counted in ReplayResult.failed and not logged again"
    ]
    assert logged[0].exc_info is not None


async def test_a_target_that_raised_still_gets_its_later_batches(tmp_path: Path) -> None:
    """As on the bus, a target that raised is handed what follows: only the batch that raised is
    counted as failed, and a replay with no failure says so with an empty ``failed``."""
    path = tmp_path / "run.jsonl"
    async with Bus() as bus:
        bus.subscribe(JsonLinesSink(path))
        await every_event_type(bus)
    lines = len(path.read_bytes().splitlines())
    once = _RaisesOnBatches({1})
    result = await replay(path, MemorySink(), once, batch_size=3)
    assert (once.calls, len(once.events)) == (-(-lines // 3), lines - 3)
    assert result.failed == (ReplayFailure(1, "_RaisesOnBatches", "ValueError: batch 1 refused", 3, 1),)
    assert (await replay(path, MemorySink())).failed == ()


async def test_replay_onto_a_bus_running_in_another_thread(tmp_path: Path) -> None:
    """A bus whose loop runs in another thread (``EventCapture``'s, the ``ckpt_capture``
    fixture's) gets every event and no failure. Was: its flush raised "flush on the event loop's
    thread", every event was listed as failed and logged with a traceback, though delivered."""
    path = tmp_path / "run.jsonl"
    async with Bus() as bus:
        bus.subscribe(JsonLinesSink(path))
        await every_event_type(bus)
    lines = len(path.read_bytes().splitlines())
    with EventCapture() as capture:
        result = await replay(path, capture.bus, batch_size=3)
        assert (result.events, result.failed) == (lines, ())
        await capture.flush()
        assert len(capture.sink.events) == lines


async def test_replay_onto_a_bus_not_running_is_refused(tmp_path: Path) -> None:
    """A closed bus or one never started is refused in one line, before reading the log. Was:
    a closed bus dropped every event and the result said all were replayed; a bus never started
    held them unhandled, and dropped what its buffers could not hold."""
    path = tmp_path / "run.jsonl"
    async with Bus() as bus:
        bus.subscribe(JsonLinesSink(path))
        await every_event_type(bus)
    with pytest.raises(InvalidValueError, match=r"closed.*async with Bus\(\)"):
        await replay(path, bus)
    assert bus.stats().dropped_after_close == 0
    unstarted = Bus()
    unstarted.subscribe(MemorySink())
    with pytest.raises(InvalidValueError, match=r"not started.*async with Bus\(\)"):
        await replay(path, unstarted)
    await unstarted.aclose()


async def test_replay_onto_a_bus_drops_nothing_its_buffers_cannot_hold_at_once(tmp_path: Path) -> None:
    """A bus whose sink's buffer is smaller than a replay batch still gets every event: replay
    flushes before a buffer fills. Was: 2 of 15 reached the sink, the rest dropped, and the result
    said every event was replayed with no failure."""
    path = tmp_path / "run.jsonl"
    async with Bus() as bus:
        bus.subscribe(JsonLinesSink(path))
        await every_event_type(bus)
    lines = len(path.read_bytes().splitlines())
    memory = MemorySink()
    async with Bus(buffer_size=2) as small:
        small.subscribe(memory)
        small.subscribe(MemorySink(), buffer_size=1)
        result = await replay(path, small)
        assert [s.dropped for s in small.stats().sinks] == [0, 0]
    assert len(memory.events) == result.events == lines


async def test_a_log_of_damage_is_counted_not_held(tmp_path: Path) -> None:
    """``corrupt`` keeps the first ``MAX_CORRUPT`` lines that did not decode and
    ``corrupt_lines`` counts them all, so memory stays bounded whatever the log holds. Was: every
    one was kept: a 37 MB log of broken lines held 560 MB."""
    path = tmp_path / "damaged.jsonl"
    async with Bus() as bus:
        bus.subscribe(JsonLinesSink(path))
        await every_event_type(bus)
    good = path.read_bytes()
    broken = MAX_CORRUPT + 5
    path.write_bytes(b"{broken\n" * broken + good)
    memory = MemorySink()
    result = await replay(path, memory)
    assert len(memory.events) == result.events == len(good.splitlines())
    assert result.corrupt_lines == broken
    assert [c.line for c in result.corrupt] == list(range(1, MAX_CORRUPT + 1))


def test_mypy_strict_refuses_a_target_that_is_no_sink_and_takes_every_sink(
    tmp_path: Path, mypy_cache: Path
) -> None:
    """``replay``'s targets are typed as what it accepts (a sink or a ``Bus``): a path given as
    a target (``replay(log, "copy.jsonl")``, which raises ``InvalidTypeError``) is a type error,
    where ``*targets: Any`` let it through; sinks of every shape and a bus still check."""
    errors = mypy_strict(
        """
        from typing import Any

        from ckpt_events import Bus
        from ckpt_events.sinks.jsonl import JsonLinesSink
        from ckpt_events.sinks.replay import replay
        from ckpt_events.testing import MemorySink


        class Mine:
            async def handle(self, batch: list[Any]) -> None:
                pass


        async def main(bus: Bus) -> None:
            await replay("events.jsonl", MemorySink(), Mine(), JsonLinesSink("copy.jsonl"), bus)
            await replay("events.jsonl", "copy.jsonl")
        """,
        tmp_path,
        mypy_cache,
    )
    assert len(errors) == 1
    assert 'user.py:17: error: Argument 2 to "replay" has incompatible type "str"' in errors[0]


def _long_log(path: Path, count: int) -> Path:
    """``count`` finished top-level spans, one line each."""
    line = (
        '{{"type":"coordinate_finished","kind":"controller","instance":"coordination","trace_id":{t},'
        '"span_id":{s},"start_ns":{a},"end_ns":{b},"operation":"commit"}}\n'
    )
    path.write_text(
        "".join(line.format(t=i + 1, s=i + 1, a=1_000_000 + i, b=5_000_000 + i) for i in range(count))
    )
    return path


async def test_a_long_log_to_an_otlp_collector_loses_no_span(tmp_path: Path) -> None:
    """60,000 spans read far faster than a collector on 127.0.0.1 takes them: an OtlpSpanSink's
    queue (8,192) dropped 44,640 of them. Replay now waits until each batch is exported: none."""
    log = _long_log(tmp_path / "long.jsonl", 60_000)
    with otlp_receiver() as received:
        sink = OtlpSpanSink(received.url)
        try:
            result = await replay(log, sink)
            stats = sink.stats()
        finally:
            sink.shutdown()
    assert result.events == 60_000
    assert (stats.dropped, stats.exported) == (0, 60_000)


async def test_a_long_log_through_a_batch_span_processor_loses_no_span(tmp_path: Path) -> None:
    """SpanSink over OpenTelemetry's BatchSpanProcessor (a queue of 2,048): 44,640 of 60,000 spans
    were dropped by the processor while SpanSink counted all exported. Each part replay hands
    over (SpanSink's max_export_batch, 512) is now exported before the next: all 60,000 are."""
    log = _long_log(tmp_path / "long.jsonl", 60_000)
    exporter = InMemorySpanExporter()
    processor = BatchSpanProcessor(exporter)
    try:
        await replay(log, SpanSink(processor=processor))
        processor.force_flush()
        assert len(exporter.get_finished_spans()) == 60_000
    finally:
        processor.shutdown()


async def test_a_long_log_onto_a_bus_with_an_otlp_sink_loses_no_span(tmp_path: Path) -> None:
    """Onto a Bus whose OtlpSpanSink exports to 127.0.0.1: 46,176 of 60,000 spans were dropped by
    the sink's queue, the bus's own buffers dropping none. Now none."""
    log = _long_log(tmp_path / "long.jsonl", 60_000)
    with otlp_receiver() as received:
        sink = OtlpSpanSink(received.url)
        async with Bus() as bus:
            bus.subscribe(sink)
            await replay(log, bus)
            stats = sink.stats()
    assert (stats.dropped, stats.exported) == (0, 60_000)


async def test_a_sink_that_does_not_export_in_time_is_waited_for_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A collector that takes connections and never answers: the first wait ends by the sink's
    timeout (0.3 s), and the rest of the log (20 batches) is handed over without waiting, said
    once, not 20 waits of 0.3 s."""
    log = _long_log(tmp_path / "long.jsonl", 2_000)
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        sink = OtlpSpanSink(f"http://127.0.0.1:{port}", timeout=0.3, max_retries=0)
        try:
            start = time.monotonic()
            result = await replay(log, sink, batch_size=100)
            took = time.monotonic() - start
        finally:
            sink.shutdown(timeout=0.3)
    assert result.events == 2_000
    assert took < 2.0, took
    said = [r.getMessage() for r in caplog.records if "within its timeout" in r.getMessage()]
    assert said == [
        "replay: OtlpSpanSink did not say it exported what it was handed within its timeout; the "
        "rest of the log is handed to it without waiting (what it drops, it counts)"
    ]


class _StuckFlush(MemorySink):
    """Takes every batch; its ``force_flush`` blocks until ``release`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.flushes = 0

    def force_flush(self) -> bool:
        self.flushes += 1
        return self.release.wait(30)


class _AsyncFlush(MemorySink):
    """An async ``force_flush``, counted."""

    def __init__(self) -> None:
        super().__init__()
        self.flushes = 0

    async def force_flush(self) -> bool:
        self.flushes += 1
        return True


async def test_a_force_flush_that_never_returns_is_given_up_on_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sink's own force_flush that blocks (no timeout of its own) holds the replay at most
    FLUSH_WAIT (0.2 s here), once; the rest of the log still reaches it."""
    monkeypatch.setattr(replay_module, "FLUSH_WAIT", 0.2)
    log = _long_log(tmp_path / "long.jsonl", 1_000)
    sink = _StuckFlush()
    try:
        with anyio.fail_after(5):
            result = await replay(log, sink, batch_size=100)
    finally:
        sink.release.set()
    assert (result.events, len(sink.events), sink.flushes) == (1_000, 1_000, 1)


async def test_an_async_force_flush_is_awaited(tmp_path: Path) -> None:
    """An async force_flush is awaited after each batch (called in a thread, it gave a coroutine
    never awaited)."""
    log = _long_log(tmp_path / "long.jsonl", 1_000)
    sink = _AsyncFlush()
    result = await replay(log, sink, batch_size=100)
    assert (result.events, len(sink.events), sink.flushes) == (1_000, 1_000, 10)
