"""The Prometheus scrape endpoint: exposition, exemplars, configure, and hostile scrapers."""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from ckpt_events import (
    Bus,
    ConfigurationError,
    InvalidValueError,
    OperationFinished,
    OperationStarted,
    Refused,
    Telemetry,
)
from ckpt_events.sinks import configure
from ckpt_events.sinks._metric_totals import DEFAULT_BOUNDARIES, MetricTotals
from ckpt_events.sinks.otel import OtlpMetricSink
from ckpt_events.sinks.otel._env import read_otel_env
from ckpt_events.sinks.otlp._metric_encoder import MetricEncoder
from ckpt_events.sinks.prometheus import PrometheusEndpoint, PrometheusSink
from tests.sinks.helpers import ipv6_loopback
from tests.sinks.otlp.test_metric_sink import _event_mix

OPENMETRICS = "application/openmetrics-text; version=1.0.0"
DURATION = "gym_checkpoint_operation_duration_ms_milliseconds"


class Keep:
    def __init__(self) -> None:
        self.events: list[Any] = []

    def handle(self, batch: list[Any]) -> None:
        self.events.extend(batch)


def _get(url: str, accept: str = "") -> tuple[str, str]:
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(request, timeout=10) as reply:
        return reply.headers["Content-Type"], reply.read().decode()


async def _fed() -> tuple[PrometheusSink, list[Any]]:
    sink, keep = PrometheusSink(), Keep()
    async with Bus() as bus:
        bus.subscribe(sink)
        bus.subscribe(keep)
        await _event_mix(bus)
    return sink, keep.events


async def test_text_exposition_agrees_with_the_events() -> None:
    """Count, sum and cumulative buckets per attribute set equal what the events say; counters too."""
    sink, events = await _fed()
    with _endpoint(sink) as endpoint:
        content_type, text = _get(endpoint.url)
    assert content_type.startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert set(families) == {
        DURATION,
        "gym_checkpoint_loop_lag_ms_milliseconds",
        "gym_checkpoint_records",
        "gym_checkpoint_bytes",
        "gym_checkpoint_events",
        # The open-work gauges: every operation of the mix finished, so each is open 0, age 0.
        "gym_checkpoint_open_operations",
        "gym_checkpoint_oldest_open_s_seconds",
    }
    assert {s.value for s in families["gym_checkpoint_open_operations"].samples} == {0}
    commits = [
        (e.end_ns - e.start_ns) / 1e6
        for e in events
        if isinstance(e, OperationFinished) and e.kind == "resources" and e.operation == "commit"
    ]
    labels = {
        "nemo_gym_checkpoint_operation": "commit",
        "nemo_gym_checkpoint_participant_kind": "resources",
        "outcome": "ok",
    }
    samples = [s for s in families[DURATION].samples if {k: s.labels.get(k) for k in labels} == labels]
    by_name: dict[str, list[Any]] = {}
    for s in samples:
        by_name.setdefault(s.name, []).append(s)
    assert by_name[DURATION + "_count"][0].value == len(commits) == 3
    assert by_name[DURATION + "_sum"][0].value == pytest.approx(sum(commits))
    buckets = {s.labels["le"]: s.value for s in by_name[DURATION + "_bucket"]}
    assert list(buckets) == [*(f"{b:g}" for b in DEFAULT_BOUNDARIES), "+Inf"]  # Go's "5", not "5.0"
    for le, value in buckets.items():
        bound = float("inf") if le == "+Inf" else float(le)
        assert value == sum(1 for c in commits if c <= bound)
    records = {
        tuple(sorted(s.labels.items())): s.value
        for s in families["gym_checkpoint_records"].samples
        if s.name == "gym_checkpoint_records_total"
    }
    expected = sum(
        e.records or 0
        for e in events
        if isinstance(e, OperationFinished) and e.kind == "resources" and e.operation == "commit"
    )
    key = (("nemo_gym_checkpoint_operation", "commit"), ("nemo_gym_checkpoint_participant_kind", "resources"))
    assert records[key] == expected == 33
    refused = [
        s.labels
        for s in families["gym_checkpoint_events"].samples
        if s.labels.get("nemo_gym_checkpoint_event") == "refused"
    ]
    assert refused and all(
        set(r) == {"nemo_gym_checkpoint_event", "nemo_gym_checkpoint_code"} for r in refused
    )


async def test_openmetrics_buckets_carry_exemplars_of_their_own_operations() -> None:
    """Each non-empty bucket's exemplar is the slowest operation in it: its trace and span id, value, time."""
    sink, events = await _fed()
    with _endpoint(sink) as endpoint:
        content_type, text = _get(endpoint.url, OPENMETRICS)
    assert content_type.startswith("application/openmetrics-text")
    assert f"# UNIT {DURATION} milliseconds" in text
    finished = {
        (f"{e.trace_id:032x}", f"{e.span_id:016x}"): e
        for e in events
        if hasattr(e, "end_ns") and hasattr(e, "operation")
    }
    seen = 0
    for family in openmetrics_families(text):
        if family.name != DURATION:
            continue
        previous = float("-inf")
        for sample in family.samples:
            if sample.name != DURATION + "_bucket":
                continue
            le = float(sample.labels["le"])
            if sample.exemplar is not None:
                ex = sample.exemplar
                event = finished[(ex.labels["trace_id"], ex.labels["span_id"])]
                assert ex.value == pytest.approx((event.end_ns - event.start_ns) / 1e6)
                assert float(ex.timestamp) == pytest.approx(event.end_ns / 1e9, abs=1e-6)
                lower = previous if previous != float("-inf") else float("-inf")
                assert lower < ex.value <= le or (le == 0.0 and ex.value <= 0.0)
                seen += 1
            previous = le
    assert seen >= 2


def test_the_slowest_in_a_bucket_is_its_exemplar_until_it_is_a_minute_old() -> None:
    """A faster operation does not replace the held exemplar; once the held one is over 60 s old, any does."""
    from ckpt_events.sinks._metric_totals import HistogramPoint

    class Op:
        def __init__(self, end_s: float, span: int) -> None:
            self.end_ns, self.trace_id, self.span_id = int(end_s * 1e9), 1, span
            self.sampled = True

    point = HistogramPoint()
    point.record(20.0, Op(1, 1))
    point.record(12.0, Op(2, 2))  # same bucket (10, 25], faster: kept out
    assert point.exemplars[3].span_id == 1
    point.record(24.0, Op(3, 3))  # slower: replaces
    assert point.exemplars[3].span_id == 3 and point.exemplar_values[3] == 24.0
    point.record(11.0, Op(64, 4))  # faster, but the held one is 61 s old: replaces
    assert point.exemplars[3].span_id == 4
    point.record(3.0)  # no exemplar given: counted only
    assert point.buckets[1] == 1 and point.exemplars[1] is None


async def test_an_exemplar_is_never_a_sampled_out_trace() -> None:
    """Every operation is counted whatever the sampling, but an exemplar links to a trace the
    collector holds: at ``sample_ratio=0.01`` the held exemplar was a sampled-out trace's (1 of
    1 at ratio 0, and at 0.01 nearly always), a link to no trace."""
    from prometheus_client.samples import Exemplar

    sink, keep = PrometheusSink(), Keep()
    async with Bus() as bus:
        bus.subscribe(sink)
        bus.subscribe(keep)
        dropped = Telemetry(bus, kind="resources", instance="r0", sample_ratio=0.0)
        kept = Telemetry(bus, kind="resources", instance="r1", sample_ratio=1.0)
        for i in range(40):
            with dropped.operation("commit", checkpoint_id=f"d{i}"):
                pass
            with dropped.operation("restore", checkpoint_id=f"d{i}"):
                pass
            with kept.operation("restore", checkpoint_id=f"k{i}"):
                pass
    sampled = {f"{e.trace_id:032x}" for e in keep.events if isinstance(e, OperationFinished) and e.sampled}
    assert len(sampled) == 40
    with _endpoint(sink) as endpoint:
        _, text = _get(endpoint.url, OPENMETRICS)
    counts: dict[str, float] = {}
    exemplars: dict[str, list[Exemplar]] = {"commit": [], "restore": []}
    for family in openmetrics_families(text):
        for sample in family.samples:
            operation = sample.labels.get("nemo_gym_checkpoint_operation")
            if family.name != DURATION or operation is None:
                continue
            if sample.name == DURATION + "_count":
                counts[operation] = sample.value
            if sample.exemplar is not None:
                exemplars[operation].append(sample.exemplar)
    assert counts == {"commit": 40, "restore": 80}  # counted whatever the sampling
    assert exemplars["commit"] == []  # no commit was sampled: no exemplar
    assert exemplars["restore"] and {e.labels["trace_id"] for e in exemplars["restore"]} <= sampled


async def test_otlp_protobuf_exemplars_decode_with_opentelemetry_proto() -> None:
    """OpenTelemetry's own classes read our HistogramDataPoint.exemplars: ids, value, time."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    keep = Keep()
    async with Bus() as bus:
        bus.subscribe(keep)
        await _event_mix(bus)
    totals = MetricTotals()
    totals.add(keep.events)
    request = ExportMetricsServiceRequest.FromString(
        MetricEncoder({"service.name": "s"}).protobuf(totals, 1, 2)
    )
    finished = {
        (e.trace_id.to_bytes(16, "big"), e.span_id.to_bytes(8, "big")): e
        for e in keep.events
        if hasattr(e, "operation") and hasattr(e, "end_ns")
    }
    metric = request.resource_metrics[0].scope_metrics[0].metrics[0]
    assert metric.name == "gym.checkpoint.operation_duration_ms"
    decoded = 0
    for point in metric.histogram.data_points:
        assert 1 <= len(point.exemplars) <= sum(1 for n in point.bucket_counts if n)
        for ex in point.exemplars:
            event = finished[(ex.trace_id, ex.span_id)]
            assert ex.as_double == pytest.approx((event.end_ns - event.start_ns) / 1e6)
            assert ex.time_unix_nano == event.end_ns
            decoded += 1
    assert decoded >= len(metric.histogram.data_points)


async def test_configure_serves_prometheus_alone_and_beside_otlp() -> None:
    """prometheus alone subscribes a PrometheusSink; with otlp, the endpoint reads the OtlpMetricSink."""
    env = {
        "OTEL_METRICS_EXPORTER": "prometheus",
        "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
        "OTEL_EXPORTER_PROMETHEUS_PORT": "0",
    }
    async with Bus() as bus:
        configured = configure(bus, environ=env)
        assert [s.name for s in configured.subscriptions] == ["prometheus"]
        assert configured.prometheus is not None and isinstance(configured.prometheus.source, PrometheusSink)
        await _event_mix(bus)
        await bus.flush()
        url = configured.prometheus.url
        assert "gym_checkpoint_events_total{" in _get(url)[1]
        await configured.aclose()
    with pytest.raises(urllib.error.URLError):
        _get(url)  # closed with the Configured: the port is released
    both = {
        **env,
        "OTEL_METRICS_EXPORTER": "otlp,prometheus",
        "OTEL_TRACES_EXPORTER": "none",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
    }
    async with Bus() as bus:
        configured = configure(bus, environ=both)
        assert configured.prometheus is not None
        assert isinstance(configured.prometheus.source, OtlpMetricSink)
        assert [s.name for s in configured.subscriptions] == ["otel-metrics"]  # one aggregation
        configured.metric_sinks[0].sender.cancel()  # type: ignore[union-attr]  # nobody at :9
        configured.close_timeout = 2.0
        await configured.aclose()


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _codes(n: int) -> Iterator[Any]:
    """``n`` refusals, each a new code, built as they are asked for."""
    for i in range(n):
        # Refused is built as bus.emit gets it: an event's fields are not checked there.
        yield Refused(kind="model", instance="m0", time_ns=i, code=f"code-{i:06d}")  # type: ignore[arg-type]


def _kinds(n: int) -> Iterator[Any]:
    """An operation's start and finish for each of ``n`` new kinds, built as they are asked for."""
    for i in range(n):
        ident = {"kind": f"kind-{i}", "instance": "i0", "trace_id": 1, "span_id": i + 1, "start_ns": 1}
        yield OperationStarted(**ident, operation="prepare")  # type: ignore[arg-type]
        yield OperationFinished(**ident, end_ns=2_000_000, operation="prepare")  # type: ignore[arg-type]


async def _flood(events: Iterator[Any]) -> tuple[PrometheusSink, str, int]:
    """(the sink, its page, RSS growth in bytes) after ``events`` went through ``bus.emit``.

    Each event is built as it is emitted: a list of them built before the baseline and freed
    before the measurement made the growth read 27 MiB less than the sink took (-27 MiB for
    200,000 codes, -5 MiB for 100,000 kinds): a sink keeping every event read +2.2 MiB, now +35."""
    sink = PrometheusSink()
    with _endpoint(sink) as endpoint:
        _get(endpoint.url)  # the parser and the server warmed up before the baseline
        gc.collect()
        before = _rss()
        async with Bus() as bus:
            subscription = bus.subscribe(sink)
            for n, event in enumerate(events, 1):
                bus.emit(event)
                if n % 20_000 == 0:
                    await bus.flush()
            await bus.flush()
            assert subscription.stats().dropped == 0
        _, page = _get(endpoint.url)
        gc.collect()
        grown = _rss() - before
        print(f"RSS grew {grown / 2**20:.1f} MiB")
        return sink, page, grown


async def test_200k_new_codes_keep_the_page_under_2_mb_and_memory_flat() -> None:
    """Issue #29: 200,000 distinct refusal codes through bus.emit; page < 2 MB, RSS growth < 100 MiB.

    Before the cardinality limit: a 21.6 MB page and +162 MiB (20.7 MB, +211 MiB in the issue).
    With it: 0.22 MB and +4 to +5 MiB: 2,000 codes and the overflow series.
    """
    sink, page, grown = await _flood(_codes(200_000))
    assert len(page.encode()) < 2_000_000
    assert grown < 100 * 2**20, f"RSS grew {grown / 2**20:.0f} MiB"
    assert sink.overflowed == 198_000
    overflow = [line for line in page.splitlines() if "otel_metric_overflow" in line]
    assert overflow == ['gym_checkpoint_events_total{otel_metric_overflow="true"} 198000.0']


async def test_new_kinds_past_the_limit_do_not_grow_the_page() -> None:
    """10,000 or 100,000 new kinds: the same page (2,000 sets a histogram, 18 lines each), flat memory."""
    pages = []
    for n in (10_000, 100_000):
        _, page, grown = await _flood(_kinds(n))
        assert grown < 100 * 2**20, f"{n} kinds: RSS grew {grown / 2**20:.0f} MiB"
        overflow = [line for line in page.splitlines() if "otel_metric_overflow" in line]
        assert f'{DURATION}_count{{otel_metric_overflow="true"}} {n - 2_000}.0' in overflow
        assert 'gym_checkpoint_open_operations{otel_metric_overflow="true"} 0.0' in overflow
        pages.append(len(page.encode()))
    assert abs(pages[1] - pages[0]) < 100  # only the overflow series' counts have more digits


def test_operations_started_past_the_open_bound_are_counted_as_untracked() -> None:
    """Past 10,000 open operations a start is not tracked by the open-work gauges: counted in
    ``untracked``, where nothing said the gauges undercount."""
    from ckpt_events.sinks._open_work import MAX_OPEN

    sink = PrometheusSink()
    sink.handle(
        [
            OperationStarted(
                kind="model", instance="m0", trace_id=1, span_id=i + 1, start_ns=1, operation="prepare"
            )  # type: ignore[arg-type]
            for i in range(MAX_OPEN + 2)
        ]
    )
    assert sink.untracked == 2
    assert (
        sink.snapshot().open is not None
        and sink.snapshot().open.open[("open", "prepare", "model")] == MAX_OPEN
    )


async def test_configure_passes_the_cardinality_limit_on() -> None:
    """``metric_cardinality_limit`` reaches the sink configure builds; a bad one is a ConfigurationError."""
    env = {
        "OTEL_METRICS_EXPORTER": "prometheus",
        "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
        "OTEL_EXPORTER_PROMETHEUS_PORT": "0",
    }
    async with Bus() as bus:
        with pytest.raises(ConfigurationError, match="metric_cardinality_limit"):
            configure(bus, environ=env, metric_cardinality_limit=0)
        configured = configure(bus, environ=env, metric_cardinality_limit=2)
        for event in _codes(5):
            bus.emit(event)
        await bus.flush()
        assert configured.prometheus is not None
        page = _get(configured.prometheus.url)[1]
        await configured.aclose()
    assert page.count("gym_checkpoint_events_total{") == 3
    assert 'gym_checkpoint_events_total{otel_metric_overflow="true"} 3.0' in page


async def test_a_taken_port_is_one_line_naming_the_variables() -> None:
    """Binding a port already in use raises ConfigurationError naming host, port and the variables."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {
            "OTEL_METRICS_EXPORTER": "prometheus",
            "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
            "OTEL_EXPORTER_PROMETHEUS_PORT": str(port),
        }
        async with Bus() as bus:
            with pytest.raises(
                ConfigurationError, match=rf"127\.0\.0\.1:{port}.*OTEL_EXPORTER_PROMETHEUS_PORT"
            ):
                configure(bus, environ=env)


async def test_a_range_whose_every_port_is_taken_names_a_reload_and_its_fix() -> None:
    """Every port of ``CKPT_EVENTS_PROMETHEUS_PORTS`` taken is also what a graceful reload (gunicorn's
    HUP starts the new workers before the old ones exit) meets with a range of exactly N: the line
    says so and how to size the range, not only that the setting is below the worker count."""
    for _ in range(50):  # two consecutive free ports, both held here (bounded tries)
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            first.listen()
            port = first.getsockname()[1]
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
                second.listen()
                env = {
                    "OTEL_METRICS_EXPORTER": "prometheus",
                    "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
                    "OTEL_EXPORTER_PROMETHEUS_PORT": str(port),
                    "CKPT_EVENTS_PROMETHEUS_PORTS": "2",
                }
                async with Bus() as bus:
                    with pytest.raises(ConfigurationError) as raised:
                        configure(bus, environ=env)
                line = str(raised.value)
                assert "\n" not in line
                assert f"127.0.0.1:{port}-{port + 1}" in line
                assert "reload" in line
                assert "twice the number of worker processes" in line
                return
    raise AssertionError("no two consecutive free ports")


def test_a_label_value_with_a_lone_surrogate_is_written_with_a_replacement_character() -> None:
    """A kind UTF-8 cannot carry (``os.fsdecode`` of a bad byte) keeps every scrape answering: U+FFFD
    in its place, counted once; before, each scrape reset its connection from then on."""
    sink = PrometheusSink()
    ident = {"kind": "judge\udc80", "instance": "i0", "trace_id": 1, "span_id": 1, "start_ns": 1}
    sink.handle([OperationFinished(**ident, end_ns=2_000_000, operation="commit")])  # type: ignore[arg-type]
    with _endpoint(sink) as endpoint:
        for accept in ("", OPENMETRICS):
            assert 'participant_kind="judge\ufffd"' in _get(endpoint.url, accept)[1]
        assert endpoint.replaced_values == 1


def test_values_that_differ_only_where_replaced_are_one_series_with_their_sums() -> None:
    """Three kinds and codes that differ only in undecodable bytes (``x\\udc80``, ``x\\udc81``)
    or in U+FFFD itself are written alike: they were three series with one label set, which
    Prometheus takes as duplicate samples, keeping one (1 refusal of 3). Now one series each,
    holding the three's sum, and every family's label sets are unique."""
    sink = PrometheusSink()
    events: list[Any] = []
    for i, word in enumerate(("x\udc80", "x\udc81", "x\ufffd")):
        events.append(Refused(kind="model", instance="m0", time_ns=i, code=word))  # type: ignore[arg-type]
        ident = {"kind": word, "instance": "i0", "trace_id": 1, "span_id": i + 1, "start_ns": 1}
        events.append(OperationStarted(**ident, operation="commit"))  # type: ignore[arg-type]
        finished = OperationFinished(**ident, end_ns=(i + 1) * 3_000_000, operation="commit", records=2)  # type: ignore[arg-type]
        events.append(finished)
    sink.handle(events)
    with _endpoint(sink) as endpoint:
        for accept in ("", OPENMETRICS):
            page = _get(endpoint.url, accept)[1]
            parse = openmetrics_families if accept else text_string_to_metric_families
            for family in parse(page):
                label_sets = [(s.name, tuple(sorted(s.labels.items()))) for s in family.samples]
                assert len(label_sets) == len(set(label_sets)), family.name
            assert 'nemo_gym_checkpoint_code="x\ufffd",nemo_gym_checkpoint_event="refused"} 3.0' in page
            assert f'{DURATION}_count{{nemo_gym_checkpoint_operation="commit",' in page
        families = {f.name: f for f in text_string_to_metric_families(_get(endpoint.url)[1])}
        count = [s for s in families[DURATION].samples if s.name == DURATION + "_count"]
        assert [(s.labels["nemo_gym_checkpoint_participant_kind"], s.value) for s in count] == [
            ("x\ufffd", 3)
        ]
        total = [s.value for s in families[DURATION].samples if s.name == DURATION + "_sum"]
        assert total == [pytest.approx(2.999999 + 5.999999 + 8.999999)]
        records = [s.value for s in families["gym_checkpoint_records"].samples]
        assert records == [6]
        assert [s.value for s in families["gym_checkpoint_open_operations"].samples] == [0]


def test_a_registry_already_holding_one_of_our_names_refuses_the_collector() -> None:
    """``register`` raises naming the clash (a user's own metric, or a second collector) rather
    than rendering a family twice, which fails every Prometheus scrape of that registry."""
    from prometheus_client import CollectorRegistry, Counter, generate_latest

    from ckpt_events.sinks.prometheus import TotalsCollector

    sink = PrometheusSink()
    sink.handle(list(_kinds(1)))
    registry = CollectorRegistry()
    Counter("gym_checkpoint_records", "the user's own", registry=registry)
    with pytest.raises(ValueError, match="gym_checkpoint_records_total"):
        registry.register(TotalsCollector(sink))
    registry = CollectorRegistry()
    registry.register(TotalsCollector(sink))
    with pytest.raises(ValueError, match=DURATION):
        registry.register(TotalsCollector(sink))
    families = [f.name for f in text_string_to_metric_families(generate_latest(registry).decode())]
    assert families.count(DURATION) == 1


def test_a_page_that_cannot_be_rendered_is_a_500_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    """A render that raises (a totals source of the caller's failing; a count bus.emit took
    unchecked as None once did it, now refused at the fold) answers 500, counted, the first one
    logged; it killed the scrape thread with a traceback and no answer each time."""

    class Failing(PrometheusSink):
        def snapshot(self) -> MetricTotals:
            raise TypeError("unsupported operand type(s) for +: 'int' and 'NoneType'")

    with _endpoint(Failing()) as endpoint, caplog.at_level("ERROR", logger="ckpt_events.sinks.prometheus"):
        for _ in range(2):
            with pytest.raises(urllib.error.HTTPError) as info:
                _get(endpoint.url)
            assert info.value.code == 500
            info.value.close()
        assert endpoint.failed == 2
    assert [r.message.split(";")[0] for r in caplog.records] == [
        f"a request to 127.0.0.1:{endpoint.port} failed"
    ]


def test_another_path_is_404() -> None:
    """Only /metrics is served; the query string is ignored."""
    with _endpoint(PrometheusSink()) as endpoint:
        base = endpoint.url.removesuffix("/metrics")
        with pytest.raises(urllib.error.HTTPError) as info:
            _get(base + "/other")
        assert info.value.code == 404
        assert b"/metrics" in info.value.read()
        info.value.close()
        assert _get(endpoint.url + "?x=1")[0].startswith("text/plain")


def _head(reply: bytes) -> tuple[bytes, dict[bytes, bytes], bytes]:
    """(status line, headers by lower-case name, body) of a raw HTTP reply."""
    head, _, body = reply.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    headers = {
        name.strip().lower(): value.strip() for name, _, value in (line.partition(b":") for line in lines)
    }
    return status, headers, body


def test_head_is_served_and_other_methods_are_405_with_allow() -> None:
    """HEAD, which every HTTP server must support (RFC 9110 9.1), was 501 as any method but GET:
    it is now GET's status and headers without the body; OPTIONS says what is allowed, a known
    method that is not allowed is 405 with ``Allow`` (a 405 must carry it), an unknown one 501."""
    sink = PrometheusSink()
    sink.handle(list(_codes(3)))
    with _endpoint(sink) as endpoint:
        page = _raw(endpoint.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, body = _head(_raw(endpoint.port, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n"))
        got_status, got_headers, got_body = _head(page)
        assert (status, body) == (b"HTTP/1.0 200 OK", b"")
        assert headers[b"content-length"] == got_headers[b"content-length"] == str(len(got_body)).encode()
        assert headers[b"content-type"] == got_headers[b"content-type"]
        status, _, body = _head(_raw(endpoint.port, b"HEAD /other HTTP/1.1\r\n\r\n"))
        assert (status, body) == (b"HTTP/1.0 404 Not Found", b"")
        status, headers, _ = _head(_raw(endpoint.port, b"OPTIONS /metrics HTTP/1.1\r\n\r\n"))
        assert status == b"HTTP/1.0 200 OK" and headers[b"allow"] == b"GET, HEAD, OPTIONS"
        for method in (b"POST", b"PUT", b"DELETE", b"PATCH", b"TRACE", b"CONNECT"):
            status, headers, _ = _head(
                _raw(endpoint.port, method + b" /metrics HTTP/1.1\r\nContent-Length: 1\r\n\r\nx")
            )
            assert status.startswith(b"HTTP/1.0 405 "), (method, status)
            assert headers[b"allow"] == b"GET, HEAD, OPTIONS"
        status, _, _ = _head(_raw(endpoint.port, b"BREW /metrics HTTP/1.1\r\n\r\n"))
        assert status.startswith(b"HTTP/1.0 501 ")


def _raw(port: int, request: bytes) -> bytes:
    """The whole reply to ``request`` sent on its own connection, read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    return reply


@pytest.mark.parametrize(
    ("request_line", "status"),
    [
        (b"G\x16\x03\x01 \x02\x00 x y", b"400"),  # garbage with a line end (past a letter)
        (b"GET /metrics HTTP/2.0", b"505"),
        (b"PRI * HTTP/2.0", b"505"),  # an HTTP/2 client's preface on this HTTP/1 port
        (b"GET /metrics HTTP/x", b"400"),
        (b"GET", b"400"),
        (b"POST /metrics", b"400"),  # an HTTP/0.9 line with a method 0.9 never had
    ],
)
def test_a_malformed_request_line_is_answered_with_a_status_line(request_line: bytes, status: bytes) -> None:
    """http.server answers a request line it cannot parse as HTTP/0.9 would: an HTML page with
    no status line and no headers, which a client reads as garbage (curl: 'Received HTTP/0.9');
    each now gets ``HTTP/1.0 <status>``."""
    with _endpoint(PrometheusSink()) as endpoint:
        reply = _raw(endpoint.port, request_line + b"\r\n\r\n")
    assert reply.startswith(b"HTTP/1.0 " + status + b" "), reply[:80]


def test_an_unparsable_accept_version_gets_the_text_format() -> None:
    """``Accept`` with a version prometheus-client cannot compare is answered in the text format,
    not with a reset connection and a traceback on stderr."""
    with _endpoint(PrometheusSink()) as endpoint:
        for accept in ("application/openmetrics-text; version=abc", "text/plain; version=1.x"):
            assert _get(endpoint.url, accept)[0].startswith("text/plain; version=0.0.4")
        assert _get(endpoint.url, OPENMETRICS)[0].startswith("application/openmetrics-text")


def test_a_slow_reader_is_cut_off_and_does_not_hold_up_others() -> None:
    """A client that never finishes its request is answered 408 and closed after the timeout; a
    scrape meanwhile answers."""
    with _endpoint(PrometheusSink(), timeout=0.5) as endpoint:
        with socket.create_connection(("127.0.0.1", endpoint.port), timeout=5) as slow:
            slow.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never the blank line
            started = time.monotonic()
            _get(endpoint.url)
            assert time.monotonic() - started < 1.0
            assert slow.recv(1024).startswith(b"HTTP/1.1 408 ")
            assert slow.recv(1024) == b""  # the server hung up on it
            assert time.monotonic() - started < 3.0
            assert endpoint.timed_out == 1


def test_concurrent_scrapes_share_one_render() -> None:
    """Eight scrapes arriving while a page is rendered wait for it and get its bytes: the render
    is Python under the GIL, and eight of a 6.9 MB page at once (2,000 kinds) cost the app's
    event loop 160 to 290 ms of lag and the process +330 MiB; now one render, one copy."""
    calls = []

    class Slow(PrometheusSink):
        def snapshot(self) -> MetricTotals:
            calls.append(1)
            time.sleep(1.0)  # a large page's render, long enough for all eight to arrive
            return super().snapshot()

    sink = Slow()
    sink.handle(list(_kinds(10)))
    with _endpoint(sink) as endpoint:
        with ThreadPoolExecutor(8) as pool:  # asyncio.to_thread has 6 workers on 2 cores
            pages = list(pool.map(_get, [endpoint.url] * 8))
        assert len(calls) == 1, f"{len(calls)} renders for 8 concurrent scrapes"
        assert len(set(pages)) == 1 and 'participant_kind="kind-9"' in pages[0][1]
        assert _get(endpoint.url, OPENMETRICS)[1].endswith("# EOF\n")  # each format its own render
        assert len(calls) == 2
        _get(endpoint.url)  # a scrape after the shared one ended renders afresh
        assert len(calls) == 3


def test_a_scrape_waiting_for_a_render_past_its_timeout_is_a_503_with_retry_after() -> None:
    """A scrape that joined a render still under way at its own deadline is answered 503 with
    Retry-After then, counted in ``refused``: its wait, a TimeoutError, was taken for the
    scraper going away, and the connection was closed with no answer at all. "Then": it waited
    its 1 s at least, and was answered before the render it joined ended (its 2.5 s), read
    side by side rather than against a fixed ceiling a busy host passes."""
    import httpx

    class Slow(PrometheusSink):
        def snapshot(self) -> MetricTotals:
            began.set()
            time.sleep(2.5)  # a render well past the endpoint's 1 s timeout
            rendered.append(time.monotonic())
            return super().snapshot()

    results: dict[str, Any] = {}
    rendered: list[float] = []
    began = threading.Event()

    def scrape(name: str, url: str, delay: float) -> None:
        time.sleep(delay)
        started = time.monotonic()
        try:
            reply = httpx.get(url, timeout=10.0)
            ended = time.monotonic()
            results[name] = (reply.status_code, reply.headers.get("Retry-After"), ended - started, ended)
        except httpx.TransportError as exc:
            ended = time.monotonic()
            results[name] = (repr(exc), None, ended - started, ended)

    with _endpoint(Slow(), timeout=1.0) as endpoint, ThreadPoolExecutor(2) as pool:
        first = pool.submit(scrape, "first", endpoint.url, 0.0)
        assert began.wait(10)  # the first scrape's render is under way: the second joins it
        pool.submit(scrape, "waiting", endpoint.url, 0.0).result(timeout=10)
        first.result(timeout=10)
        status, retry_after, took, ended = results["waiting"]
        assert (status, retry_after) == (503, "1"), results
        assert took > 0.8, f"answered after {took:.2f} s, its timeout being 1 s"
        assert results["first"][0] == 200 and ended < rendered[0], (results, rendered)
        assert endpoint.refused == 1 and endpoint.failed == 0


_STORM = """
import asyncio, sys, threading, time, urllib.error, urllib.request, httpx
def steady(url, stop, codes):
    # A scraper as Prometheus is: its request goes out as it connects (http.client, one thread).
    for _ in range(10_000):  # bounded: stopped when the storm's scrapes have all ended
        if stop.is_set():
            return
        try:
            with urllib.request.urlopen(url, timeout=10) as reply:
                reply.read()
                codes.append(reply.status)
        except urllib.error.HTTPError as exc:
            exc.close()
            codes.append(exc.code)
        except OSError:
            codes.append(0)
        stop.wait(0.02)
async def main(url):
    statuses, durations = [], []
    async def scrape(client):
        started = time.monotonic()
        try:
            statuses.append((await client.get(url)).status_code)
        except httpx.TransportError:
            statuses.append(0)  # a reset connection is an answer too, not a hang
        durations.append(time.monotonic() - started)
    stop, steady_codes = threading.Event(), []
    beside = threading.Thread(target=steady, args=(url, stop, steady_codes))
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits, timeout=10.0) as client:
        beside.start()
        try:
            await asyncio.gather(*(scrape(client) for _ in range(1000)))
        finally:
            stop.set()
            beside.join()
    print(statuses.count(200), statuses.count(503), statuses.count(0), len(statuses), max(durations),
          steady_codes.count(200), len(steady_codes))
asyncio.run(main(sys.argv[1]))
"""


async def test_a_thousand_concurrent_scrapes_never_stall_the_event_loop() -> None:
    """1,000 scrapes at once from another process: each answered (200, 503 past the bound, or
    closed if it sent no request head in time) within 10 s, pages served throughout, while the
    participant's loop keeps folding events with a small lag.

    The storm's 1,000 httpx requests cost its one process ~1.5 ms of CPU each: on a loaded
    machine it connects, then writes its heads seconds later. The server rightly treats a
    connection with no head as idle (displaced after 0.1 s once 128 from one address wait,
    closed at ``header_timeout``), and once all 1,000 were closed so, 0 got 200. So the pages
    served during the storm are counted with a scraper beside it that sends its request as it
    connects, as Prometheus does; and every storm scrape that got neither 200 nor 503 must be
    one the server dropped before its head came (``displaced``, ``timed_out``)."""
    import subprocess
    import sys

    sink = PrometheusSink()
    async with Bus() as bus:
        bus.subscribe(sink)
        await _event_mix(bus)
        with _endpoint(sink) as endpoint:
            storm = subprocess.Popen(
                [sys.executable, "-c", _STORM, endpoint.url], stdout=subprocess.PIPE, text=True
            )
            worst = 0.0
            for _ in range(100_000):  # bounded: the storm ends within its timeouts
                if storm.poll() is not None:
                    break
                before = time.monotonic()
                await asyncio.sleep(0.005)
                worst = max(worst, time.monotonic() - before - 0.005)
                await _event_mix(bus)  # the loop keeps working meanwhile
            out, _ = storm.communicate(timeout=30)
            ok, unavailable, reset, total, slowest, steady_ok, steady = out.split()
            assert int(total) == 1000 and int(ok) + int(unavailable) + int(reset) == 1000
            assert float(slowest) < 10.0
            # A reset is a connection closed with no head: never one the server had a request of.
            assert int(reset) <= endpoint.displaced + endpoint.timed_out, (reset, endpoint.displaced)
            # Pages were rendered and sent during the storm, at least the slots' worth (8).
            assert int(ok) + int(steady_ok) >= 8, (ok, steady_ok, steady)
            assert worst < 0.2, f"event-loop lag {worst * 1000:.0f} ms during the scrape storm"
            print(
                f"\n1000 scrapes: {ok} ok, {unavailable} 503, {reset} reset ({endpoint.displaced} "
                f"displaced, {endpoint.timed_out} timed out); beside them {steady_ok} of {steady} ok; "
                f"worst loop lag {worst * 1000:.1f} ms; slowest answer {float(slowest):.2f} s"
            )


class _endpoint:  # noqa: N801  # used as a context manager, like a function
    def __init__(self, sink: Any, **options: Any) -> None:
        self.endpoint = PrometheusEndpoint(sink, "127.0.0.1", 0, **options)

    def __enter__(self) -> PrometheusEndpoint:
        return self.endpoint

    def __exit__(self, *exc: object) -> None:
        self.endpoint.close()


@pytest.mark.skipif(not ipv6_loopback(), reason="this machine has no IPv6 loopback (::1) to bind")
@pytest.mark.parametrize("host", ["::1", "[::1]"])
async def test_an_ipv6_loopback_host_is_served_bare_or_bracketed(host: str) -> None:
    """OTEL_EXPORTER_PROMETHEUS_HOST=::1 or [::1] (as in a URL) binds ::1 and is scraped there; the
    bracketed one was handed to bind() as is, refused as 'Name or service not known'."""
    env = {
        "OTEL_METRICS_EXPORTER": "prometheus",
        "OTEL_EXPORTER_PROMETHEUS_HOST": host,
        "OTEL_EXPORTER_PROMETHEUS_PORT": "0",
    }
    async with Bus() as bus:
        async with configure(bus, environ=env) as configured:
            endpoint = configured.prometheus
            assert endpoint is not None
            assert endpoint.host == "::1"
            assert endpoint.url == f"http://[::1]:{endpoint.port}/metrics"
            for event in _codes(1):
                bus.emit(event)
            await bus.flush()
            assert "gym_checkpoint_events_total{" in _get(endpoint.url)[1]
    with PrometheusEndpoint(PrometheusSink(), host, 0) as direct:  # the argument takes both too
        assert direct.url == f"http://[::1]:{direct.port}/metrics"


@pytest.mark.parametrize(
    ("host", "bound", "reached"),
    [("", "0.0.0.0", "127.0.0.1"), ("0.0.0.0", "0.0.0.0", "127.0.0.1"), ("::", "::", "[::1]")],
)
def test_every_interface_is_served_at_a_url_a_local_scraper_can_use(
    host: str, bound: str, reached: str
) -> None:
    """``host=""`` (every interface, to the OS) gave ``url`` ``http://:PORT/metrics``, which no
    client takes; a wildcard address's url now names this machine's loopback of its family."""
    import httpx

    if bound == "::" and not ipv6_loopback():
        pytest.skip("this machine has no IPv6 loopback (::1) to reach '::' by")
    with PrometheusEndpoint(PrometheusSink(), host, 0) as endpoint:
        assert endpoint.host == bound
        assert endpoint.url == f"http://{reached}:{endpoint.port}/metrics"
        assert httpx.get(endpoint.url, timeout=5.0).status_code == 200


@pytest.mark.parametrize(
    ("host", "why"),
    [
        ("[127.0.0.1]", "brackets"),
        ("[::1", "brackets"),
        ("localhost:9464", "OTEL_EXPORTER_PROMETHEUS_PORT"),
        ("::1::2", "IPv6"),
        ("local host", "space"),
        ("a" * 100_000, "253"),
    ],
)
def test_a_host_neither_a_name_nor_an_address_is_one_line_naming_the_variable(host: str, why: str) -> None:
    """Brackets around anything but an IPv6 address, or a ':' in a host that is not one (a port in
    the host): ConfigurationError naming the variable, before anything is bound."""
    env = {"OTEL_METRICS_EXPORTER": "prometheus", "OTEL_EXPORTER_PROMETHEUS_HOST": host}
    with pytest.raises(ConfigurationError, match="OTEL_EXPORTER_PROMETHEUS_HOST") as info:
        read_otel_env(env)
    assert why in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(InvalidValueError, match="host"):
        PrometheusEndpoint(PrometheusSink(), host, 0)


@pytest.mark.parametrize("host", ["127.0.0.1\n", "x\x00y", "\t", "a" * 100_000])
def test_a_host_no_address_can_have_is_refused_in_one_short_line(host: str) -> None:
    """A control character, a space or a name past DNS's 253 characters: InvalidValueError in one
    line of bounded length, before anything is bound; a newline split the bind error in two, NUL
    was a bare TypeError, and a 100,000-character host was quoted whole (100 KB of message)."""
    with pytest.raises(InvalidValueError, match="host") as info:
        PrometheusEndpoint(PrometheusSink(), host, 0)
    assert "\n" not in str(info.value) and len(str(info.value)) < 400, str(info.value)[:500]


def test_a_format_refused_with_q_0_is_not_served() -> None:
    """``Accept`` weighting OpenMetrics 0 (RFC 9110 12.4.2: not acceptable) gets the text format;
    prometheus-client ignores weights, so such a scraper was served the very format it refused."""
    with _endpoint(PrometheusSink()) as endpoint:
        for accept in (
            "application/openmetrics-text;q=0, text/plain",
            "application/openmetrics-text; version=1.0.0; q=0.0",
            "text/plain;q=0.5, application/openmetrics-text;version=1.0.0;Q=0",
        ):
            assert _get(endpoint.url, accept)[0].startswith("text/plain; version=0.0.4"), accept
        weighted = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.2"
        assert _get(endpoint.url, weighted)[0].startswith("application/openmetrics-text")
