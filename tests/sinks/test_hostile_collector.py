"""A hostile collector (a real socket server of this test's own, on 127.0.0.1) cannot keep a
sink past its deadline, take its memory, or make it retry without backing off; and every span
handed to the sink ends up counted, exported or dropped."""

from __future__ import annotations

import contextlib
import logging
import resource
import socket
import struct
import threading
import time
from collections.abc import Iterator

import anyio
import pytest

from ckpt_events import Bus, Telemetry
from ckpt_events.sinks import configure
from ckpt_events.sinks.otel import OtlpMetricSink, OtlpSpanSink
from ckpt_events.sinks.otlp._export_worker import ExportWorker
from ckpt_events.sinks.otlp._http import CLOSING_CONNECT_TIMEOUT, MAX_REPLY_BYTES, OtlpHttpSender

DEADLINE = 1.0
SLACK = 0.75
SPANS = 600  # more than one export batch (512): one batch in flight, one queued


class Hostile:
    """Accepts connections on 127.0.0.1 and answers each request as ``mode`` says."""

    def __init__(self, mode: str, retry_after: str = "0") -> None:
        self.mode = mode
        self.retry_after = retry_after
        self.requests = 0
        self.sent = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/traces"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _read_request(self, conn: socket.socket) -> bool:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return False
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        length = next(
            (
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            ),
            0,
        )
        while len(rest) < length:
            chunk = conn.recv(65536)
            if not chunk:
                return False
            rest += chunk
        self.requests += 1
        return True

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(5.0)
        try:
            for _ in range(10_000):  # bounded: requests on one kept-alive connection
                if self._stop.is_set() or not self._read_request(conn):
                    return
                if self.mode == "hang":
                    self._stop.wait(60)
                    return
                if self.mode == "reset":
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return
                if self.mode == "slow":
                    for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n":
                        conn.sendall(bytes((byte,)))
                        if self._stop.wait(1.0):
                            return
                    continue
                if self.mode == "not-http":  # a port that answers, in something else
                    conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
                    return
                if self.mode == "huge":
                    conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                    chunk = b"%x\r\n%s\r\n" % (1 << 20, b"x" * (1 << 20))
                    for _ in range(3 * 1024):  # 3 GiB, unless the client stops reading
                        conn.sendall(chunk)
                        self.sent += 1 << 20
                    return
                head = f"HTTP/1.1 503 Service Unavailable\r\nRetry-After: {self.retry_after}\r\n"
                conn.sendall(head.encode() + b"Content-Length: 0\r\n\r\n")
        except OSError:
            return
        finally:
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._listener.close()
        self._accepting.join(2)
        for thread in self._threads:
            thread.join(2)


def _refused_url() -> str:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1/traces"


@pytest.fixture
def hostile(request: pytest.FixtureRequest) -> Iterator[Hostile]:
    server = Hostile(*request.param)
    try:
        yield server
    finally:
        server.close()


async def _emit(bus: Bus, count: int) -> None:
    tel = Telemetry(bus, kind="agent", instance="agent-0")
    for _ in range(count):
        with tel.operation("commit", checkpoint_id="c1"):
            pass
    await anyio.sleep(0.1)  # the first batch leaves for the collector


async def _counted(sink: OtlpSpanSink, emitted: int) -> tuple[int, int]:
    for _ in range(40):  # a cancelled shutdown thread counts within a thread switch
        stats = sink.stats()
        if stats.exported + stats.dropped == emitted:
            break
        await anyio.sleep(0.05)
    return stats.exported, stats.dropped


MODES = [
    ("refuse",),
    ("hang",),
    ("reset",),
    ("slow",),
    ("huge",),
    ("503", "-5"),
    ("503", "nan"),
    ("503", "1e9"),
]


@pytest.mark.parametrize("hostile", MODES, indirect=True, ids="-".join)
async def test_shutdown_ends_within_its_deadline_and_counts_every_span(hostile: Hostile) -> None:
    """With the sink's deadline 1 s, leaving ``async with Bus()`` takes at most 1 s + slack;
    exported + dropped is every span emitted (before: 19-128 s, 512 spans counted nowhere)."""
    url = _refused_url() if hostile.mode == "refuse" else hostile.url
    sink = OtlpSpanSink(url, traces_path="", timeout=DEADLINE, linger=0.0, initial_backoff=0.2)
    async with Bus(close_timeout=30) as bus:
        bus.subscribe(sink)
        await _emit(bus, SPANS)
        started = time.monotonic()
    took = time.monotonic() - started
    assert took <= DEADLINE + SLACK, f"{hostile.mode}: closed in {took:.2f} s"
    exported, dropped = await _counted(sink, SPANS)
    assert exported + dropped == SPANS


@pytest.mark.parametrize("hostile", MODES, indirect=True, ids="-".join)
async def test_the_bus_close_deadline_cuts_a_sink_with_a_longer_one_short(hostile: Hostile) -> None:
    """A sink with the default 10 s timeout still lets ``Bus(close_timeout=1)`` close within
    1 s + slack, and every span is counted (before: the sink's uncancellable shutdown held the
    bus 10-20 s, and a trickled reply kept its 512 spans in neither counter)."""
    url = _refused_url() if hostile.mode == "refuse" else hostile.url
    sink = OtlpSpanSink(url, traces_path="", linger=0.0)
    started = 0.0
    async with Bus(close_timeout=DEADLINE) as bus:
        bus.subscribe(sink)
        await _emit(bus, SPANS)
        started = time.monotonic()
    took = time.monotonic() - started
    assert took <= DEADLINE + SLACK, f"closed in {took:.2f} s"
    exported, dropped = await _counted(sink, SPANS)
    assert exported + dropped == SPANS
    assert exported == (SPANS if hostile.mode == "huge" else 0)


@pytest.mark.parametrize("hostile", [("huge",)], indirect=True, ids=["huge"])
def test_a_huge_reply_is_not_read(hostile: Hostile) -> None:
    """A 200 with a 3 GiB chunked body: the send is accepted, at most a few MiB are read, and
    the process's peak memory does not grow by the body (before: 31.7 -> 4,645 MiB)."""
    sender = OtlpHttpSender(hostile.url, content_type="application/x-protobuf", timeout=5.0)
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    result = sender.send(b"\x0a\x00")
    took = time.monotonic() - started
    sender.close()
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before) / 1024
    assert result.accepted and took < 2.0
    assert grown_mib < 64, f"peak memory grew {grown_mib:.0f} MiB"
    time.sleep(0.2)
    assert hostile.sent < 64 * (1 << 20) + MAX_REPLY_BYTES  # the socket's buffers, not the body


@pytest.mark.parametrize("hostile", [("not-http",), ("slow",)], indirect=True, ids="-".join)
def test_a_reply_that_is_not_http_is_not_no_answer(hostile: Hostile) -> None:
    """A port answering in something else (an SSH banner) is said to have replied, not HTTP: it
    was "got no answer" and ``replay`` asked whether a collector listened there. A trickle cut off
    at the timeout (its first bytes unparsable too) still had no answer."""
    sender = OtlpHttpSender(hostile.url, content_type="application/x-protobuf", timeout=0.5, max_retries=0)
    worker = ExportWorker(sender, name="test-export", signal="span", lost="dropped")
    accepted = worker.send(b"\x0a\x00", 1, None)
    sender.stop()
    if hostile.mode == "not-http":
        said = "gave a reply that is not HTTP (BadStatusLine: 'SSH-2.0-OpenSSH_9.6\\r\\n')"
        assert worker.last_failure == said
    else:
        assert worker.last_failure == "got no answer"
    assert (accepted, worker.dropped, worker.failures) == (False, 1, 1)


@pytest.mark.parametrize("hostile", [("503", "-5"), ("503", "nan"), ("503", "0")], indirect=True, ids=str)
def test_an_odd_retry_after_still_backs_off(hostile: Hostile) -> None:
    """Retry-After -5, nan or 0 waits our own backoff (0.2, 0.4, 0.8 s, jittered): three retries take
    at least 1.1 s (before: a negative or NaN one retried at once, 1,290 requests in 20 s)."""
    sender = OtlpHttpSender(
        hostile.url, content_type="application/x-protobuf", max_retries=3, initial_backoff=0.2
    )
    started = time.monotonic()
    result = sender.send(b"\x0a\x00")
    took = time.monotonic() - started
    sender.close()
    assert (result.accepted, result.attempts, result.status, hostile.requests) == (False, 4, 503, 4)
    assert took >= 1.1


@pytest.mark.parametrize("hostile", [("hang",), ("slow",), ("503", "-5")], indirect=True, ids="-".join)
async def test_the_metric_sink_closes_within_its_deadline(hostile: Hostile) -> None:
    """The metric sink's last export, against the same collectors, ends by its 1 s deadline too
    (before: a join, a second join and an uncancellable last export, each up to its timeout)."""
    sink = OtlpMetricSink(hostile.url, metrics_path="", timeout=DEADLINE, export_interval=0.05)
    async with Bus(close_timeout=30) as bus:
        bus.subscribe(sink)
        await _emit(bus, 50)
        await anyio.sleep(0.2)  # an interval export is under way
        started = time.monotonic()
    took = time.monotonic() - started
    assert took <= DEADLINE + SLACK, f"{hostile.mode}: closed in {took:.2f} s"
    assert sink.stats().exports == 0


@pytest.mark.parametrize("hostile", [("hang",), ("slow",)], indirect=True, ids="-".join)
async def test_configure_closes_its_sinks_side_by_side_within_the_otlp_timeout(hostile: Hostile) -> None:
    """``configure()``'s span and metric sinks, OTLP timeout 1 s, against a hanging collector:
    closing the bus takes 1 s + slack (one after the other they took both timeouts, and the
    bus's own deadline on top: 15 s with the default 10 s)."""
    base = hostile.url.removesuffix("/v1/traces")
    environ = {"OTEL_EXPORTER_OTLP_TIMEOUT": "1000", "OTEL_METRIC_EXPORT_INTERVAL": "100"}
    async with Bus() as bus:
        configured = configure(bus, otlp_endpoint=base, service_name="hostile", environ=environ)
        await _emit(bus, SPANS)
        await anyio.sleep(0.2)  # a metric export is under way too
        started = time.monotonic()
        await configured.aclose()
    took = time.monotonic() - started
    assert took <= DEADLINE + SLACK, f"{hostile.mode}: closed in {took:.2f} s"
    assert isinstance(configured.span_sink, OtlpSpanSink)
    exported, dropped = await _counted(configured.span_sink, SPANS)
    assert (exported, dropped) == (0, SPANS)


@pytest.mark.parametrize("hostile", [("hang",)], indirect=True, ids="-".join)
async def test_the_meter_provider_configure_built_shuts_down_within_the_close_deadline(
    hostile: Hostile,
) -> None:
    """Beside our OTLP sinks, a reader of yours (OpenTelemetry's OTLP/HTTP exporter) on the meter
    provider ``configure`` builds, all against a hanging collector: the close ends by its 2 s
    deadline (before: the sinks took the 2 s, then the provider's shutdown one more second)."""
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    base = hostile.url.removesuffix("/v1/traces")
    exporter = OTLPMetricExporter(endpoint=f"{base}/v1/metrics", timeout=5)
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=100)
    environ = {"OTEL_EXPORTER_OTLP_TIMEOUT": "5000", "OTEL_METRIC_EXPORT_INTERVAL": "100"}
    async with Bus() as bus:
        configured = configure(bus, otlp_endpoint=base, metric_readers=[reader], environ=environ)
        configured.close_timeout = 2.0
        await _emit(bus, SPANS)
        await anyio.sleep(0.3)  # every exporter has a request hanging
        started = time.monotonic()
        await configured.aclose()
        took = time.monotonic() - started
    assert took <= configured.close_timeout + 0.5, f"closed in {took:.2f} s"
    assert configured.meter_provider is not None


@contextlib.contextmanager
def _not_accepting() -> Iterator[str]:
    """A port whose listen backlog is full: a connect to it hangs (its SYNs are dropped), as to
    a collector's host that is down behind a firewall."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        fillers = [socket.socket() for _ in range(4)]
        try:
            for filler in fillers:
                filler.setblocking(False)
                filler.connect_ex(("127.0.0.1", port))
            time.sleep(0.1)
            with socket.socket() as probe:
                probe.settimeout(0.5)
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    pytest.skip("this kernel accepts past a full listen backlog")
            yield f"http://127.0.0.1:{port}"
        finally:
            for filler in fillers:
                filler.close()


@pytest.mark.parametrize("mode", ["refuse", "no-accept"])
async def test_closing_does_not_wait_for_a_collector_that_takes_no_connection(mode: str) -> None:
    """configure()'s span and metric sinks with their default 10 s close: a collector refusing
    connections is given up at once, one whose connect hangs after CLOSING_CONNECT_TIMEOUT; every
    span is counted as dropped (before: 7.3 s of backoff with nothing listening, 10.6 s hanging)."""
    with contextlib.ExitStack() as stack:
        base = _refused_url().removesuffix("/v1/traces") if mode == "refuse" else None
        if base is None:
            base = stack.enter_context(_not_accepting())
        async with Bus() as bus:
            configured = configure(bus, otlp_endpoint=base, environ={})
            await _emit(bus, 20)
            started = time.monotonic()
            await configured.aclose()
            took = time.monotonic() - started
    limit = 1.0 if mode == "refuse" else CLOSING_CONNECT_TIMEOUT + 1.0
    assert took < limit, f"{mode}: closed in {took:.2f} s"
    assert configured.span_sink is not None and configured.metric_sink is not None
    spans = configured.span_sink.stats()
    assert (spans.exported, spans.dropped) == (0, 20)
    assert configured.metric_sink.stats().export_failures >= 1


@pytest.mark.parametrize("export_process", [False, True], ids=["in-process", "export-process"])
@pytest.mark.parametrize("hostile", [("hang",)], indirect=True, ids="-".join)
async def test_a_close_that_cuts_a_hung_collector_short_says_it_took_the_connection(
    hostile: Hostile, export_process: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """``configure()`` at its default 10 s OTLP timeout, ``close_timeout`` 1 s, a collector that
    takes the connection and never answers: the close ends by its deadline, says the spans it
    did not send, and says the collector took the connection. The close's cancel of the request
    in flight was said "refused or unreachable" (in the export process at every close_timeout,
    the default's 10 s included, since it closes in half its budget), sending users looking for
    a collector that is not listening."""
    caplog.set_level(logging.WARNING, logger="ckpt_events.sinks")
    base = hostile.url.removesuffix("/v1/traces")
    async with Bus() as bus:
        configured = configure(bus, otlp_endpoint=base, export_process=export_process, environ={})
        configured.close_timeout = DEADLINE
        await _emit(bus, SPANS)
        await anyio.sleep(0.3)  # the first batch's request hangs
        started = time.monotonic()
        await configured.aclose()
        took = time.monotonic() - started
    assert took <= DEADLINE + SLACK, f"closed in {took:.2f} s"
    said = [r.getMessage() for r in caplog.records]
    first = [m for m in said if "OTLP span export" in m and "not logged again" in m]
    assert len(first) == 1 and "took the connection but gave no reply" in first[0], said
    assert not any("unreachable" in m for m in said), said
    assert any(f"{SPANS} spans dropped in all, 0 exported" in m for m in said), said
