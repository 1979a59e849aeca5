"""ExportWorker: the thread, counters, one warning and bounded stop both OTLP sinks share."""

from __future__ import annotations

import http.server
import logging
import socket
import struct
import threading
import time
from typing import Any

import pytest

from ckpt_events import Bus, InvalidArgumentError, Telemetry
from ckpt_events.benchmarks.rotel import free_port
from ckpt_events.sinks.otel import OtlpMetricSink, OtlpSpanSink
from ckpt_events.sinks.otlp._export_worker import ExportWorker
from ckpt_events.sinks.otlp._http import OtlpHttpSender, SendResult
from tests.sinks.otlp.test_http import _collector


def _dead_endpoint() -> str:
    port = free_port()
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0
    return f"http://127.0.0.1:{port}"


def _said_at_the_first_failure(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The one warning each sink gives at its first failed export (its totals at close left out)."""
    return [
        r
        for r in caplog.records
        if r.name == "ckpt_events.sinks.otel" and r.getMessage().endswith("not logged again")
    ]


def _worker(url: str, **sender: float) -> ExportWorker:
    return ExportWorker(
        OtlpHttpSender(url, content_type="application/x-protobuf", **sender),  # type: ignore[arg-type]
        name="test-export",
        signal="test",
        lost="counted nowhere",
    )


async def _export_to_nowhere(endpoint: str, operations: int) -> tuple[OtlpSpanSink, OtlpMetricSink]:
    """A span and a metric sink to ``endpoint`` (nothing answers there), each flushed after each of
    ``operations`` operations: every export fails, none is retried; the sinks closed with the bus."""
    spans = OtlpSpanSink(endpoint, linger=0.01, max_retries=0)
    metrics = OtlpMetricSink(endpoint, max_retries=0)
    async with Bus() as bus:
        bus.subscribe(spans)
        bus.subscribe(metrics)
        tel = Telemetry(bus, kind="agent", instance="agent-0")
        for n in range(operations):
            with tel.operation("commit", checkpoint_id=f"c{n}"):
                pass
            await bus.flush()
            assert spans.force_flush(5.0) is True  # the export ended (it failed): nothing waits
            assert metrics.force_flush() is False  # its export failed
    return spans, metrics


async def test_each_sink_warns_once_in_its_own_words(caplog: pytest.LogCaptureFixture) -> None:
    """Two failed exports of each signal give one warning each, naming the sink whose stats count them."""
    caplog.set_level(logging.WARNING, logger="ckpt_events.sinks.otel")
    endpoint = _dead_endpoint()
    spans, metrics = await _export_to_nowhere(endpoint, 2)
    assert spans.stats().export_failures == 2
    assert metrics.stats().export_failures >= 2
    warnings = [r.getMessage() for r in caplog.records if r.name == "ckpt_events.sinks.otel"]
    firsts = [w for w in warnings if w.endswith("not logged again")]  # the totals at close aside
    assert len(firsts) == 2
    span_warning, metric_warning = sorted(firsts, key=lambda w: "metric" in w)
    assert span_warning.startswith(f"OTLP span export to {endpoint}/v1/traces refused or unreachable")
    assert span_warning.endswith("spans are dropped and counted in OtlpSpanSink.stats(), not logged again")
    assert metric_warning.startswith(f"OTLP metric export to {endpoint}/v1/metrics refused or unreachable")
    assert metric_warning.endswith("counted in OtlpMetricSink.stats(), not logged again")


async def test_the_close_says_what_was_lost_in_all(caplog: pytest.LogCaptureFixture) -> None:
    """A server that ran for hours said its collector failed once, with no count, and a full
    queue not at all: at close each sink says its totals, the figures its stats() holds."""
    caplog.set_level(logging.WARNING, logger="ckpt_events.sinks.otel")
    endpoint = _dead_endpoint()
    spans, metrics = await _export_to_nowhere(endpoint, 3)
    span_stats, metric_stats = spans.stats(), metrics.stats()
    assert span_stats.dropped == 3 and span_stats.export_failures == 3
    warnings = [r.getMessage() for r in caplog.records if r.name == "ckpt_events.sinks.otel"]
    # The bus closes its sinks side by side: either may speak first.
    totals = sorted(w for w in warnings if "in all" in w or "exports failed" in w)
    assert totals == sorted(
        [
            f"OTLP span export to {endpoint}/v1/traces: 3 spans dropped in all, 0 exported; 3 exports "
            "failed, 0 accepted (last: got no answer); counted in OtlpSpanSink.stats()",
            f"OTLP metric export to {endpoint}/v1/metrics: {metric_stats.export_failures} exports "
            "failed, 0 accepted (last: got no answer); counted in OtlpMetricSink.stats()",
        ]
    )


async def test_a_full_queue_is_said_at_close_though_no_export_failed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Spans the bounded queue could not take were counted and never said (no export failed)."""
    caplog.set_level(logging.WARNING, logger="ckpt_events.sinks.otel")
    with _collector([]) as (url, received):
        spans = OtlpSpanSink(url.removesuffix("/v1/traces"), max_queue=2, linger=5.0)
        async with Bus() as bus:
            bus.subscribe(spans)
            tel = Telemetry(bus, kind="agent", instance="agent-0")
            for n in range(5):
                with tel.operation("commit", checkpoint_id=f"c{n}"):
                    pass
        stats = spans.stats()
    assert (stats.exported, stats.dropped, stats.export_failures) == (2, 3, 0)
    assert received
    warnings = [r.getMessage() for r in caplog.records if r.name == "ckpt_events.sinks.otel"]
    assert warnings == [
        f"OTLP span export to {url}: 3 spans dropped in all, 2 exported; counted in OtlpSpanSink.stats()"
    ]


async def test_a_healthy_close_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """Nothing lost, nothing said: the totals line is for a loss only."""
    caplog.set_level(logging.WARNING, logger="ckpt_events.sinks.otel")
    with _collector([]) as (url, _):
        base = url.removesuffix("/v1/traces")
        async with Bus() as bus:
            bus.subscribe(OtlpSpanSink(base, linger=0.01))
            bus.subscribe(OtlpMetricSink(base))
            with Telemetry(bus, kind="agent", instance="agent-0").operation("commit", checkpoint_id="c1"):
                pass
    assert [r.getMessage() for r in caplog.records if r.name == "ckpt_events.sinks.otel"] == []


def test_an_abandoned_batch_is_counted_once() -> None:
    """After ``abandon`` the thread's late counts for that batch are ignored: dropped once, never exported."""
    worker = _worker("http://127.0.0.1:9")
    worker.count(exported=5, accepted=True)
    worker.abandon(3)
    worker.count(exported=3, accepted=True)
    assert (worker.exported, worker.dropped, worker.exports) == (5, 3, 1)


def test_a_loop_that_sees_closed_ends_without_a_cancel() -> None:
    """A loop waiting on the condition returns at ``request_stop``; the sender is not cancelled."""
    worker = _worker("http://127.0.0.1:9")

    def loop() -> None:
        with worker.wake:
            worker.wake.wait_for(lambda: worker.closed, 30.0)

    worker.start(loop)
    assert worker.is_alive()
    worker.request_stop()
    assert worker.join(time.monotonic() + 5.0, patience=1.0, slack=0.0) is True
    assert not worker.is_alive()
    assert not worker.sender.cancelled


def test_a_send_stuck_in_backoff_is_cancelled_within_the_deadline() -> None:
    """A send waiting out a long backoff ends when ``join`` cancels it, well before the backoff would."""
    worker = _worker(_dead_endpoint(), max_retries=3, initial_backoff=30.0)
    worker.start(lambda: worker.send(b"x", 7, None) and None)
    time.sleep(0.2)  # into the first backoff wait
    started = time.monotonic()
    assert worker.join(started + 1.0, patience=0.5, slack=0.0, resume=True) is True
    assert time.monotonic() - started < 2.0
    assert (worker.dropped, worker.failures, worker.exports) == (7, 1, 0)
    assert not worker.sender.cancelled  # resumed for a last export


class _RaisesOnce(OtlpHttpSender):
    """A real sender whose first send raises as ``http.client`` did on a header it cannot write."""

    raised = False

    def send(self, body: bytes, deadline: float | None = None) -> SendResult:
        if not self.raised:
            self.raised = True
            raise UnicodeEncodeError("latin-1", "\u20ac", 0, 1, "ordinal not in range(256)")
        return super().send(body, deadline)


def test_a_send_that_raises_is_a_counted_failure_and_the_thread_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An exception out of one send counts that batch as dropped and failed, is logged once, and
    the next batch is still exported: the thread used to die with the batch uncounted."""
    caplog.set_level(logging.WARNING, logger="ckpt_events.sinks.otel")
    with _collector([]) as (url, received):
        sender = _RaisesOnce(url, content_type="application/x-protobuf")
        worker = ExportWorker(sender, name="test-export", signal="span", lost="dropped")
        outcomes: list[bool] = []
        worker.start(lambda: outcomes.extend([worker.send(b"a", 3, None), worker.send(b"b", 2, None)]))
        assert worker.join(time.monotonic() + 5.0, patience=1.0, slack=0.0) is True
        sender.stop()
    assert outcomes == [False, True]
    assert (worker.exported, worker.dropped, worker.exports, worker.failures) == (2, 3, 1, 1)
    assert [body for _, body in received] == [b"b"]
    (warning,) = [r for r in caplog.records if r.name == "ckpt_events.sinks.otel"]
    assert "raised UnicodeEncodeError" in warning.getMessage() and warning.exc_info is not None


class _RaisesLoudly(OtlpHttpSender):
    """A real sender whose sends raise an error quoting a credential and a megabyte payload."""

    def send(self, body: bytes, deadline: float | None = None) -> SendResult:
        # The password built here: the traceback quotes this line's source.
        password = "s3" + "cr3t"
        raise RuntimeError(f"POST https://bob:{password}@otel.example/v1/traces: " + "p" * 1_000_000)


def test_a_send_that_raises_is_said_cut_and_redacted(caplog: pytest.LogCaptureFixture) -> None:
    """The failure warning and ``last_failure`` say a raising send in one short line without its
    credential: they held its whole text (1,000,4xx characters, the URL's password in it)."""
    caplog.set_level(logging.WARNING, logger="ckpt_events.sinks.otel")
    with _collector([]) as (url, _):
        sender = _RaisesLoudly(url, content_type="application/x-protobuf")
        worker = ExportWorker(sender, name="test-export", signal="span", lost="dropped")
        worker.start(lambda: [worker.send(b"a", 1, None), worker.send(b"b", 1, None)])
        assert worker.join(time.monotonic() + 5.0, patience=1.0, slack=0.0) is True
        worker.say_total()
        sender.stop()
    assert worker.failures == 2
    last = worker.last_failure or ""
    assert last.startswith("raised RuntimeError: POST https://[REDACTED]@otel.example") and len(last) < 400
    records = [r for r in caplog.records if r.name == "ckpt_events.sinks.otel"]
    assert len(records) == 2  # the first failure, and the total at the end
    for record in records:
        said = record.getMessage()
        assert "s3cr3t" not in said and "\n" not in said and len(said) < 1000
    assert "s3cr3t" not in caplog.text and len(caplog.text) < 10_000


async def test_no_thread_of_ours_outlives_the_sinks_close() -> None:
    """Once the bus has closed both OTLP sinks, no export or watchdog thread is left (the
    watchdogs stayed up to 30 s)."""
    before = set(threading.enumerate())
    with _collector([]) as (url, received):
        spans = OtlpSpanSink(url, traces_path="", linger=0.01)
        metrics = OtlpMetricSink(url, metrics_path="")
        async with Bus() as bus:
            bus.subscribe(spans)
            bus.subscribe(metrics)
            with Telemetry(bus, kind="agent", instance="agent-0").operation("commit", checkpoint_id="c1"):
                pass
            await bus.flush()
            assert spans.force_flush(5.0) is True
        ours = [t.name for t in set(threading.enumerate()) - before if t.name.startswith("ckpt-events-otlp")]
    assert ours == []
    assert spans.stats().exported == 1 and metrics.stats().exports >= 1
    assert len(received) >= 2


async def test_metric_totals_that_cannot_be_encoded_fail_one_export_not_the_thread(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The metric sink's encoding runs on its export thread: an encoder that raises (a bug of
    ours) ended the thread, and no later export happened. It is one failed export, logged
    once; the next one goes out."""
    caplog.set_level(logging.WARNING, logger="ckpt_events.sinks.otel")
    with _collector([]) as (url, received):
        metrics = OtlpMetricSink(url, metrics_path="")
        encode = metrics._encode
        calls = {"n": 0}

        def raises_once(*args: Any) -> bytes:
            calls["n"] += 1
            if calls["n"] == 1:
                raise OverflowError("a total past int64")
            return encode(*args)

        metrics._encode = raises_once  # type: ignore[method-assign]
        async with Bus() as bus:
            bus.subscribe(metrics)
            with Telemetry(bus, kind="agent", instance="agent-0").operation("commit", checkpoint_id="c1"):
                pass
            await bus.flush()
            assert metrics.force_flush() is False
            assert metrics.force_flush() is True
    stats = metrics.stats()
    assert stats.export_failures >= 1 and stats.exports >= 1 and len(received) >= 1
    (warning,) = _said_at_the_first_failure(caplog)
    assert "could not be encoded (OverflowError: a total past int64)" in warning.getMessage()


@pytest.mark.parametrize("bad", ["1", float("nan"), float("inf"), 1e300, True])
def test_a_bad_shutdown_timeout_is_one_precise_error_before_anything_stops(bad: Any) -> None:
    """``shutdown("1")``, ``shutdown(nan)`` or ``shutdown(1e300)`` raised a bare TypeError,
    ValueError or OverflowError half-way through; now InvalidArgumentError before anything
    stops, and a shutdown after it ends the thread as ever. A negative timeout is none left."""
    endpoint = _dead_endpoint()
    before = set(threading.enumerate())
    for sink in (OtlpSpanSink(endpoint, timeout=1), OtlpMetricSink(endpoint, timeout=1)):
        with pytest.raises(InvalidArgumentError, match="timeout must be seconds, at most 3600"):
            sink.shutdown(bad)
        if isinstance(sink, OtlpSpanSink):
            with pytest.raises(InvalidArgumentError, match="timeout must be seconds"):
                sink.force_flush(bad)
        sink.shutdown(-1)
    for thread in set(threading.enumerate()) - before:
        thread.join(1.0)
        assert not thread.is_alive(), thread.name


def test_the_failure_warning_shows_no_credential_of_the_url(caplog: pytest.LogCaptureFixture) -> None:
    """A collector's key in the endpoint's query (``?api_key=...``, as some vendors take it)
    stays out of the export-failure warning, which goes to the app's log."""
    caplog.set_level(logging.WARNING, logger="ckpt_events.sinks.otel")
    url = f"{_dead_endpoint()}/v1/traces?api_key=S3CRET"
    worker = _worker(url, max_retries=0)
    worker.log_failure("refused or unreachable")
    [warning] = [r.getMessage() for r in caplog.records if r.name == "ckpt_events.sinks.otel"]
    assert "S3CRET" not in warning
    assert "api_key=[REDACTED]" in warning


def _answering(status: int, headers: dict[str, str], body: bytes) -> tuple[http.server.HTTPServer, str]:
    """A real server on 127.0.0.1 answering every POST with ``status``, ``headers`` and ``body``."""

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers["content-length"]))
            self.server.posts += 1  # type: ignore[attr-defined]
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.posts = 0  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}"


async def _one_span_to(endpoint: str) -> OtlpSpanSink:
    sink = OtlpSpanSink(endpoint, headers={"Authorization": "Bearer T0KEN"}, linger=0.0, timeout=2.0)
    async with Bus() as bus:
        bus.subscribe(sink)
        with Telemetry(bus, kind="agent", instance="agent-0").operation("commit", checkpoint_id="c1"):
            pass
    return sink


async def test_a_refusal_says_the_status_and_the_collectors_reason(caplog: pytest.LogCaptureFixture) -> None:
    """A 400 with the collector's google.rpc.Status is one warning naming the status and its
    message (it said "refused or unreachable (last status 400)", as if nothing answered)."""
    caplog.set_level(logging.WARNING, logger="ckpt_events.sinks.otel")
    server, endpoint = _answering(400, {"Content-Type": "application/x-protobuf"}, b"\x08\x03\x12\x07bad ids")
    try:
        sink = await _one_span_to(endpoint)
    finally:
        server.shutdown()
        server.server_close()
    stats = sink.stats()
    assert (stats.exported, stats.dropped, stats.export_failures, stats.retries) == (0, 1, 1, 0)
    assert stats.last_failure == "answered 400: 'bad ids'"
    (warning,) = [r.getMessage() for r in _said_at_the_first_failure(caplog)]
    assert f"{endpoint}/v1/traces answered 400: 'bad ids'; spans are dropped" in warning
    assert "unreachable" not in warning and "T0KEN" not in warning


@pytest.mark.parametrize("elsewhere", ["loopback", "off-box"])
async def test_a_redirect_is_not_followed_and_the_warning_says_where_it_pointed(
    caplog: pytest.LogCaptureFixture, elsewhere: str
) -> None:
    """A 307 to another port, or to a host off this machine, is not followed (the spans and the
    bearer token stay here); the warning names the redirect's target, its credential redacted,
    and what to do (it said "refused or unreachable (last status 307)")."""
    caplog.set_level(logging.WARNING, logger="ckpt_events.sinks.otel")
    target, target_url = _answering(200, {}, b"")
    where = target_url if elsewhere == "loopback" else "http://collector.example.com:4318"
    server, endpoint = _answering(307, {"Location": f"{where}/v1/traces?api_key=S3CRET"}, b"")
    try:
        sink = await _one_span_to(endpoint)
    finally:
        for each in (server, target):
            each.shutdown()
            each.server_close()
    assert target.posts == 0  # type: ignore[attr-defined]
    stats = sink.stats()
    assert (stats.exported, stats.dropped, stats.export_failures) == (0, 1, 1)
    shown_target = f"'{where}/v1/traces?api_key=[REDACTED]'"
    assert stats.last_failure == f"answered 307, a redirect to {shown_target}"
    (warning,) = [r.getMessage() for r in _said_at_the_first_failure(caplog)]
    assert f"answered 307, a redirect to {shown_target}, which is not followed: set the endpoint" in warning
    assert "S3CRET" not in warning and "T0KEN" not in warning and "\n" not in warning


async def _one_span_export(endpoint: str, timeout: float) -> OtlpSpanSink:
    """A span sink to ``endpoint`` that exports one operation's span once, not retried, within
    ``timeout``; returned after its export ended (failed, here) and its bus closed."""
    spans = OtlpSpanSink(endpoint, linger=0.01, max_retries=0, timeout=timeout)
    async with Bus() as bus:
        bus.subscribe(spans)
        tel = Telemetry(bus, kind="agent", instance="agent-0")
        with tel.operation("commit", checkpoint_id="c1"):
            pass
        await bus.flush()
        assert spans.force_flush(5.0) is True  # the export ended (it failed)
    return spans


async def test_a_collector_that_takes_the_connection_and_never_answers_is_not_called_unreachable(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A collector that takes the connection and never answers (hung, or a proxy holding the
    request) was warned about as "refused or unreachable", which sent users looking for one that
    is not listening. It is said as it is now; a port nothing listens on is still "refused"."""
    caplog.set_level(logging.WARNING, logger="ckpt_events.sinks.otel")
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # the kernel takes connections; nothing reads or answers
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
        spans = await _one_span_export(endpoint, timeout=0.3)
    (warning,) = [r.getMessage() for r in _said_at_the_first_failure(caplog)]
    assert warning.startswith(
        f"OTLP span export to {endpoint}/v1/traces took the connection but gave no reply in time"
    ), warning
    assert "unreachable" not in warning and spans.stats().export_failures == 1


@pytest.mark.parametrize("reset", [False, True])
async def test_a_collector_that_closes_the_connection_unanswered_is_not_called_unreachable(
    reset: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A server that takes the connection, reads the request and closes it (or resets it)
    without a reply, on a connection opened for the request, was warned about as "refused or
    unreachable"; it is said as it is now."""
    caplog.set_level(logging.WARNING, logger="ckpt_events.sinks.otel")
    with socket.socket() as closing:
        closing.bind(("127.0.0.1", 0))
        closing.listen()
        closing.settimeout(5.0)
        endpoint = f"http://127.0.0.1:{closing.getsockname()[1]}"

        def close_one() -> None:
            taken, _ = closing.accept()
            with taken:
                taken.settimeout(5.0)
                taken.recv(65536)
                if reset:
                    taken.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

        closer = threading.Thread(target=close_one)
        closer.start()
        spans = await _one_span_export(endpoint, timeout=2.0)
        closer.join(5.0)
    (warning,) = [r.getMessage() for r in _said_at_the_first_failure(caplog)]
    assert warning.startswith(
        f"OTLP span export to {endpoint}/v1/traces took the connection and closed it without a reply"
    ), warning
    assert "unreachable" not in warning and spans.stats().export_failures == 1
    assert spans.stats().last_failure == "took the connection and closed it without a reply"
