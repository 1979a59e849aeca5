"""OtlpSpanSink: spans encoded from events reach a real collector (rotel) in protobuf and JSON;
retries on 503 with backoff; drops counted when the collector is down."""

from __future__ import annotations

import gzip
import http.server
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from ckpt_events import Bus, InvalidTypeError, InvalidValueError, Telemetry, __version__
from ckpt_events.benchmarks.rotel import free_port
from ckpt_events.sinks.otel import OtlpMetricSink, OtlpSpanSink
from ckpt_events.sinks.otlp._span_sink import PROMPT_BURST
from tests.http_servers import serving
from tests.sinks.otlp.test_collector import _wait_for, collector

__all__ = ["collector"]


async def _one_checkpoint(bus: Bus) -> tuple[str, str, str]:
    """A coordinate span, a participant operation reached by traceparent, a step, a failure."""
    ctl = Telemetry(bus, kind="controller", instance="coordination")
    resources = Telemetry(bus, kind="resources", instance="resources-0")
    with ctl.coordinate("commit", checkpoint_id="c-otlp") as co:
        header = co.traceparent()
        with resources.operation("commit", checkpoint_id="c-otlp", traceparent=header) as op:
            with op.step("write") as step:
                step.set(records=3, bytes=300)
            op.set(records=3, bytes=300)
        co.set(participants=1, episodes=3)
    try:
        with resources.operation("restore", checkpoint_id="c-otlp"):
            raise ValueError("disk on fire")
    except ValueError:
        pass
    await bus.flush()
    return f"{co.trace_id:032x}", f"{co.span_id:016x}", f"{op.span_id:016x}"


@pytest.mark.collector
@pytest.mark.parametrize("protocol", ["http/protobuf", "http/json"])
async def test_every_span_reaches_rotel(collector: tuple[str, Path], protocol: str) -> None:
    """Names, attributes, parents, kinds, status and the exception event arrive, in either protocol."""
    endpoint, out = collector
    sink = OtlpSpanSink(
        endpoint, protocol=protocol, resource_attributes={"service.name": "otlp-own"}, linger=0.05
    )
    async with Bus() as bus:
        bus.subscribe(sink)
        trace_hex, coordinate_hex, operation_hex = await _one_checkpoint(bus)
    stats = sink.stats()
    assert (stats.exported, stats.dropped, stats.export_failures) == (4, 0, 0)
    needles = ["otlp-own", "gym.checkpoint.restore", "exception.message"]
    spans = _spans(_wait_for(out, needles))
    assert set(spans) == {
        "gym.checkpoint.coordinate.commit",
        "gym.checkpoint.commit",
        "gym.checkpoint.write",
        "gym.checkpoint.restore",
    }, spans
    assert {spans[name]["Trace ID"] for name in spans if name != "gym.checkpoint.restore"} == {trace_hex}
    coordinate, operation = spans["gym.checkpoint.coordinate.commit"], spans["gym.checkpoint.commit"]
    step, failed = spans["gym.checkpoint.write"], spans["gym.checkpoint.restore"]
    assert (coordinate["ID"], coordinate["Parent ID"], coordinate["Kind"]) == (
        coordinate_hex,
        "",
        "SPAN_KIND_CLIENT",
    )
    assert (operation["ID"], operation["Parent ID"], operation["Kind"]) == (
        operation_hex,
        coordinate_hex,
        "SPAN_KIND_SERVER",
    )
    assert (step["Parent ID"], step["Kind"]) == (operation_hex, "SPAN_KIND_INTERNAL")
    assert "-> nemo.gym.checkpoint.records: Int(3)" in step["text"]
    assert "-> nemo.gym.checkpoint.bytes: Int(300)" in step["text"]
    assert "-> nemo.gym.checkpoint.instance: Str(resources-0)" in operation["text"]
    assert "-> nemo.gym.checkpoint.episodes: Int(3)" in coordinate["text"]
    assert "Status code" not in operation["text"] or "STATUS_CODE_UNSET" in operation["text"]
    assert (failed["Status code"], failed["Status message"]) == (
        "STATUS_CODE_ERROR",
        "ValueError: disk on fire",
    )
    assert "-> exception.type: Str(ValueError)" in failed["text"]


def _spans(text: str) -> dict[str, dict[str, str]]:
    """The spans in rotel's detailed debug log, by name: their fields and text."""
    spans: dict[str, dict[str, str]] = {}
    for chunk in text.split("Span #")[1:]:
        fields = {"text": chunk}
        for line in chunk.splitlines():
            name, colon, value = line.partition(":")
            if colon and name.strip() in (
                "Trace ID",
                "Parent ID",
                "ID",
                "Name",
                "Kind",
                "Status code",
                "Status message",
            ):
                fields.setdefault(name.strip(), value.strip())
        if "Name" in fields:
            spans[fields["Name"]] = fields
    return spans


class _Flaky(http.server.BaseHTTPRequestHandler):
    """Answers 503 (Retry-After: 0) to the first ``failures`` posts, then 200."""

    failures = 2
    seen: list[int] = []

    def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
        self.rfile.read(int(self.headers["Content-Length"]))
        self.seen.append(len(self.seen))
        status = 503 if len(self.seen) <= self.failures else 200
        self.send_response(status)
        if status == 503:
            self.send_header("Retry-After", "0")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""


@pytest.fixture
def flaky() -> Iterator[tuple[str, list[int]]]:
    """A loopback server answering 503 twice, then 200."""
    seen: list[int] = []
    handler = type("Handler", (_Flaky,), {"seen": seen})
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


async def test_503_is_retried_then_accepted(flaky: tuple[str, list[int]]) -> None:
    """Two 503 answers are retried (Retry-After honoured); the third attempt delivers every span."""
    endpoint, seen = flaky
    sink = OtlpSpanSink(endpoint, linger=0.01, initial_backoff=0.01)
    async with Bus() as bus:
        bus.subscribe(sink)
        await _one_checkpoint(bus)
    stats = sink.stats()
    assert len(seen) == 3
    assert (stats.exported, stats.dropped, stats.retries, stats.exports) == (4, 0, 2, 1)


async def test_spans_are_dropped_and_counted_when_the_collector_is_down() -> None:
    """Nothing listens: the retries give up and every span is counted as dropped."""
    port = free_port()
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0
    sink = OtlpSpanSink(f"http://127.0.0.1:{port}", linger=0.01, max_retries=2, initial_backoff=0.01)
    async with Bus() as bus:
        bus.subscribe(sink)
        await _one_checkpoint(bus)
        # While running, the export is retried (closing, a refused one is not: its own test).
        with anyio.fail_after(5):
            while sink.stats().export_failures == 0:
                await anyio.sleep(0.01)
    stats = sink.stats()
    assert (stats.exported, stats.dropped, stats.export_failures, stats.retries) == (0, 4, 1, 2)


async def test_a_full_queue_drops_and_counts() -> None:
    """Events beyond ``max_queue`` are dropped at once and counted; the rest still go out."""
    # A collector that never answers keeps the full batch's export in flight: a closed port
    # refused it at once, and its two spans were counted with the two the queue refused.
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(16)  # connections complete in the backlog; nothing is ever read
        sink = OtlpSpanSink(
            f"http://127.0.0.1:{hole.getsockname()[1]}",
            max_queue=2,
            timeout=0.5,
            max_retries=0,
            prompt_interval=None,
        )
        assert sink.max_export_batch == 2  # the default 512 fits the queue: a batch fills it
        async with Bus() as bus:
            bus.subscribe(sink)
            await _one_checkpoint(bus)
            assert sink.stats().dropped == 2  # four spans, room for two
    assert sink.stats().dropped == 4


async def test_a_lone_span_goes_out_after_the_linger_without_a_flush() -> None:
    """One span into an empty queue is exported once the linger passes, with no flush or close
    (the worker slept on an empty queue with no deadline, so a quiet server never exported)."""
    seen: list[int] = []
    handler = type("Handler", (_Flaky,), {"seen": seen, "failures": 0})
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    sink = OtlpSpanSink(f"http://127.0.0.1:{server.server_address[1]}", linger=0.05)
    try:
        async with Bus() as bus:
            bus.subscribe(sink)
            with Telemetry(bus, kind="agent", instance="agent-0").operation("commit", checkpoint_id="c1"):
                pass
            # Wait for the sink's count, not the server's: the server sees the post before the
            # sink has read the answer and counted it.
            with anyio.fail_after(5):
                while not sink.stats().exported:
                    await anyio.sleep(0.02)
            assert sink.stats().exported == 1 and len(seen) == 1
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


class _CountingSpanSink(OtlpSpanSink):
    """Counts the batches the bus hands over."""

    batches = 0

    def handle(self, batch: list[Any]) -> None:
        self.batches += 1
        super().handle(batch)


async def test_the_bus_gathers_a_busy_servers_spans_into_few_batches() -> None:
    """Spans emitted over many loop turns (one request each) reach the sink in a few batches, not
    one per turn (each a wake-up of its delivery task); the bus linger is at most the export linger,
    and every span is still handed over."""
    sink = _CountingSpanSink(f"http://127.0.0.1:{free_port()}", max_retries=0, timeout=2.0)
    assert 0 < sink.linger <= sink.export_linger
    assert OtlpSpanSink(f"http://127.0.0.1:{free_port()}", linger=0.0).linger == 0
    async with Bus() as bus:
        sub = bus.subscribe(sink)
        assert sub.linger == sink.linger
        tel = Telemetry(bus, kind="agent", instance="agent-0")
        for _ in range(20):
            with tel.operation("commit", checkpoint_id="c1") as op, op.step("write"):
                pass
            await anyio.sleep(0)
        await bus.flush()
        assert sink.batches <= 3
    stats = sink.stats()
    assert stats.exported + stats.dropped == 40


@pytest.fixture
def accepting() -> Iterator[tuple[str, list[int]]]:
    """A loopback server answering 200 to every post; the list grows by one per post."""
    seen: list[int] = []
    handler = type("Handler", (_Flaky,), {"seen": seen, "failures": 0})
    with serving(handler) as server:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen


async def test_a_finished_operation_is_exported_at_once_whatever_the_linger(
    accepting: tuple[str, list[int]],
) -> None:
    """An operation and its step go out in one request as soon as the bus hands them over (10 ms),
    under a 5 s linger and with no flush (before: after the linger, or never if SIGKILL came first)."""
    endpoint, seen = accepting
    sink = OtlpSpanSink(endpoint, linger=5.0)
    assert (sink.linger, sink.prompt_interval) == (0.01, 0.2)
    async with Bus() as bus:
        bus.subscribe(sink)
        tel = Telemetry(bus, kind="resources", instance="resources-0")
        took = []
        for n in range(1, PROMPT_BURST + 1):
            # Back to back, as a checkpoint's prepare and commit come: the burst lets each go.
            with tel.operation("commit", checkpoint_id="c1") as op, op.step("write"):
                pass
            ended = time.monotonic()
            with anyio.fail_after(5):
                while sink.stats().exported < 2 * n:
                    await anyio.sleep(0.002)
            took.append(time.monotonic() - ended)
        assert len(seen) == PROMPT_BURST and sink.stats().exported == 2 * PROMPT_BURST
        # ~15 ms here (bus linger and the post); generous for a loaded machine.
        assert min(took) < 0.1 and max(took) < 1.0, took


async def test_a_stream_of_operations_still_goes_in_batches(accepting: tuple[str, list[int]]) -> None:
    """Operations ending every millisecond for 0.3 s make a request per ``prompt_interval`` at
    most (after the burst), each holding many spans: the prompt export cuts the linger, it does
    not send span by span."""
    endpoint, seen = accepting
    sink = OtlpSpanSink(endpoint, linger=5.0)
    async with Bus() as bus:
        bus.subscribe(sink)
        tel = Telemetry(bus, kind="resources", instance="resources-0")
        start = time.monotonic()
        operations = 0
        while time.monotonic() - start < 0.3:
            with tel.operation("commit", checkpoint_id="c1") as op, op.step("write"):
                pass
            operations += 1
            await anyio.sleep(0.001)
        spent = time.monotonic() - start
    assert sink.stats().exported == 2 * operations and sink.prompt_interval is not None
    assert len(seen) <= spent / sink.prompt_interval + PROMPT_BURST + 2, (len(seen), spent)
    assert 2 * operations / len(seen) >= 10, (operations, len(seen))


def test_prompt_interval_is_checked_as_the_linger_is() -> None:
    """A bad ``prompt_interval`` is refused with the error a bad ``linger`` gets."""
    endpoint = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(InvalidValueError, match="prompt_interval"):
        OtlpSpanSink(endpoint, prompt_interval=-1)
    with pytest.raises(InvalidTypeError, match="prompt_interval"):
        OtlpSpanSink(endpoint, prompt_interval="soon")  # type: ignore[arg-type]
    assert OtlpSpanSink(endpoint, prompt_interval=0).prompt_interval == 0
    assert OtlpSpanSink(endpoint, prompt_interval=None).prompt_interval is None


async def test_prompt_interval_none_keeps_to_the_batch_schedule(accepting: tuple[str, list[int]]) -> None:
    """With ``prompt_interval=None`` a finished operation waits out the linger, as before."""
    endpoint, seen = accepting
    sink = OtlpSpanSink(endpoint, linger=0.5, prompt_interval=None)
    async with Bus() as bus:
        bus.subscribe(sink)
        with Telemetry(bus, kind="agent", instance="agent-0").operation("commit", checkpoint_id="c1"):
            pass
        await anyio.sleep(0.3)
        assert sink.stats().exported == 0 and not seen
        with anyio.fail_after(5):
            while not sink.stats().exported:
                await anyio.sleep(0.02)


def _partial_collector(body: bytes, content_type: str) -> tuple[http.server.HTTPServer, threading.Thread]:
    """A loopback server answering every post 200 with ``body`` (a partial success)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            """Quiet."""

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    return server, thread


#: ``partial_success {rejected_spans: 3, error_message: "bad spans"}`` in each encoding.
PARTIAL = {
    "http/protobuf": (b"\x0a\x0d\x08\x03\x12\x09bad spans", "application/x-protobuf"),
    "http/json": (b'{"partialSuccess":{"rejectedSpans":"3","errorMessage":"bad spans"}}', "application/json"),
}


@pytest.mark.parametrize("protocol", sorted(PARTIAL))
async def test_spans_a_partial_success_rejects_are_dropped_counted_and_logged_once(
    protocol: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A 200 whose partial success rejects 3 spans: those are dropped (not exported), named in
    ``last_failure`` and logged once, the others exported; they were all counted as exported."""
    server, thread = _partial_collector(*PARTIAL[protocol])
    caplog.set_level("WARNING", logger="ckpt_events.sinks.otel")
    try:
        sink = OtlpSpanSink(f"http://127.0.0.1:{server.server_address[1]}", protocol=protocol, timeout=2)
        async with Bus() as bus:
            bus.subscribe(sink)
            tel = Telemetry(bus, kind="agent", instance="agent-0")
            for round_ in range(2):
                for _ in range(5):
                    with tel.operation("commit", checkpoint_id=f"c{round_}"):
                        pass
                await bus.flush()
                assert sink.force_flush(2)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    stats = sink.stats()
    assert (stats.exported, stats.dropped, stats.export_failures) == (4, 6, 0), stats
    assert stats.last_failure == "rejected 3 spans: 'bad spans'"
    warnings = [r.getMessage() for r in caplog.records if r.name == "ckpt_events.sinks.otel"]
    first, total = warnings  # the one at the first rejection, and the total at close
    assert "rejected 3 spans (partial success: 'bad spans')" in first, warnings
    assert total.endswith(": 6 spans dropped in all, 4 exported; counted in OtlpSpanSink.stats()"), warnings


class _Keeping(http.server.BaseHTTPRequestHandler):
    """Answers 200 to every post and keeps its body (gunzipped) by path."""

    bodies: dict[str, list[bytes]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        self.bodies.setdefault(self.path, []).append(body)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


async def test_the_resource_names_our_encoders_as_its_telemetry_sdk() -> None:
    """Spans and metrics of the sinks built directly carry the semantic conventions'
    ``telemetry.sdk.*`` (ours, as SpanSink's resource carries OpenTelemetry's); the caller's win."""
    bodies: dict[str, list[bytes]] = {}
    with serving(type("Handler", (_Keeping,), {"bodies": bodies})) as server:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        spans = OtlpSpanSink(endpoint, linger=0.01)
        metrics = OtlpMetricSink(
            endpoint, resource_attributes={"service.name": "s", "telemetry.sdk.version": "9"}
        )
        async with Bus() as bus:
            bus.subscribe(spans)
            bus.subscribe(metrics)
            tel = Telemetry(bus, kind="resources", instance="resources-0")
            with tel.operation("commit", checkpoint_id="c1"):
                pass
    traces, sent_metrics = ExportTraceServiceRequest(), ExportMetricsServiceRequest()
    traces.ParseFromString(bodies["/v1/traces"][0])
    sent_metrics.ParseFromString(bodies["/v1/metrics"][-1])
    [span_resource] = [MessageToDict(r.resource) for r in traces.resource_spans]
    [metric_resource] = [MessageToDict(r.resource) for r in sent_metrics.resource_metrics]
    sdk = {"telemetry.sdk.language": "python", "telemetry.sdk.name": "ckpt_events"}
    assert _pairs(span_resource) == {
        "service.name": "unknown_service",
        **sdk,
        "telemetry.sdk.version": __version__,
    }
    assert _pairs(metric_resource) == {"service.name": "s", **sdk, "telemetry.sdk.version": "9"}


def _pairs(resource: dict[str, Any]) -> dict[str, str]:
    return {pair["key"]: pair["value"]["stringValue"] for pair in resource["attributes"]}
