"""configure(): the standard set from arguments and environment; the off path; bad values."""

from __future__ import annotations

import importlib.util
import logging
import os
import socket
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ckpt_events import Bus, ConfigurationError, InvalidTypeError, InvalidValueError, Telemetry
from ckpt_events.sinks import configure
from ckpt_events.sinks.jsonl import read_events
from tests.sinks.helpers import metric_points


async def test_nothing_set_subscribes_nothing() -> None:
    """The off path: no arguments, empty environment, emit sites stay off."""
    async with Bus() as bus:
        async with configure(bus, environ={}) as configured:
            assert configured.subscriptions == () and not configured.enabled
            assert not Telemetry(bus, kind="agent", instance="a0").enabled


async def test_jsonl_from_the_environment(tmp_path: Path) -> None:
    """CKPT_EVENTS_JSONL alone subscribes only the JSON-lines sink."""
    path = tmp_path / "e.jsonl"
    async with Bus() as bus:
        async with configure(bus, environ={"CKPT_EVENTS_JSONL": str(path)}) as configured:
            assert [s.name for s in configured.subscriptions] == ["jsonl"]
            Telemetry(bus, kind="agent", instance="a0").refused("unauthorized")
    assert len(list(read_events(path))) == 1


async def test_a_jsonl_path_that_is_a_folder_says_the_fix() -> None:
    """``CKPT_EVENTS_JSONL`` naming a folder said only ``[Errno 21] Is a directory`` (the
    cause, no fix): it now says to give a file's path in that folder, in one line."""
    folder = Path(__file__).parent
    async with Bus() as bus:
        with pytest.raises(ConfigurationError) as caught:
            configure(bus, environ={"CKPT_EVENTS_JSONL": str(folder)})
    message = str(caught.value)
    assert "\n" not in message and "Is a directory" in message, message
    such = str(folder / "events.jsonl")
    assert message.endswith(f"it is a folder: give the path of a file in it, such as {such!r}"), message


async def test_arguments_win_and_default_alone_gives_metrics_but_no_spans() -> None:
    """span_groups="default" subscribes metrics only; the env's span groups are overridden."""
    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    environ = {"CKPT_EVENTS_SPAN_GROUPS": "checkpoint", "OTEL_SERVICE_NAME": "from-env"}
    async with Bus() as bus:
        configured = configure(
            bus,
            span_groups="default",
            span_exporter=exporter,
            metric_readers=[reader],
            service_name="svc",
            environ=environ,
        )
        async with configured:
            assert [s.name for s in configured.subscriptions] == ["otel-metrics"]
            tel = Telemetry(bus, kind="resources", instance="r0")
            with tel.operation("commit", checkpoint_id="c1") as op:
                op.set(records=2, bytes=20)
            await bus.flush()
            points = metric_points(reader)
    assert exporter.get_finished_spans() == ()
    assert set(points) == {
        "gym.checkpoint.operation_duration_ms",
        "gym.checkpoint.records_total",
        "gym.checkpoint.bytes_total",
        "gym.checkpoint.open_operations",
        "gym.checkpoint.oldest_open_s",
    }
    assert configured.meter_provider is not None


async def test_resource_from_environment_and_arguments() -> None:
    """OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES (percent-decoded) reach the spans' resource."""
    exporter = InMemorySpanExporter()
    environ = {"OTEL_SERVICE_NAME": "trainer", "OTEL_RESOURCE_ATTRIBUTES": "team=rl, site=a%2Cb"}
    async with Bus() as bus:
        async with configure(
            bus, span_exporter=exporter, resource_attributes={"run": "7"}, environ=environ
        ) as configured:
            # No metric reader asked for: no meter provider is built, so no metric sink.
            assert [s.name for s in configured.subscriptions] == ["otel-spans"]
            with Telemetry(bus, kind="agent", instance="a0").operation("resume"):
                pass
    (span,) = exporter.get_finished_spans()
    attributes = dict(span.resource.attributes)
    assert attributes["service.name"] == "trainer"
    assert (attributes["team"], attributes["site"], attributes["run"]) == ("rl", "a,b", "7")


async def test_a_service_name_in_resource_attributes_wins_over_the_environment() -> None:
    """``resource_attributes={"service.name": ...}`` is an argument, so it wins over
    ``OTEL_SERVICE_NAME`` (arguments first, as ``Resource.create(attributes)`` has it); before,
    the variable replaced it: the spans went out as ``from-env``."""
    exporter = InMemorySpanExporter()
    environ = {"OTEL_SERVICE_NAME": "from-env", "OTEL_RESOURCE_ATTRIBUTES": "service.name=from-attrs"}
    async with Bus() as bus:
        async with configure(
            bus, span_exporter=exporter, resource_attributes={"service.name": "from-args"}, environ=environ
        ):
            with Telemetry(bus, kind="agent", instance="a0").operation("resume"):
                pass
    (span,) = exporter.get_finished_spans()
    assert span.resource.attributes["service.name"] == "from-args"


async def test_the_resource_reads_environ_not_the_process_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With ``environ=``, the process's ``OTEL_RESOURCE_ATTRIBUTES`` is not read (before:
    ``Resource.create``'s detector added its pairs, ``%FF`` decoded to U+FFFD where ``environ``
    refuses it); the arguments, ``environ``'s pairs and the SDK's own attributes stay."""
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod,team=%FF,site=x")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-process")
    exporter = InMemorySpanExporter()
    environ = {"OTEL_RESOURCE_ATTRIBUTES": "site=a"}
    async with Bus() as bus:
        async with configure(bus, span_exporter=exporter, resource_attributes={"run": "7"}, environ=environ):
            with Telemetry(bus, kind="agent", instance="a0").operation("resume"):
                pass
    (span,) = exporter.get_finished_spans()
    attributes = dict(span.resource.attributes)
    assert "deployment.environment" not in attributes and "team" not in attributes
    assert (attributes["site"], attributes["run"], attributes["service.name"]) == ("a", "7", "ckpt-events")
    assert attributes["telemetry.sdk.name"] == "opentelemetry"


async def test_endpoint_builds_otlp_http_exporters() -> None:
    """An endpoint gives our OTLP/HTTP span sink, a metric exporter and the default span groups."""
    from ckpt_events.sinks.otel import OtlpSpanSink

    async with Bus() as bus:
        configured = configure(
            bus,
            environ={
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9/",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                "OTEL_METRIC_EXPORT_INTERVAL": "60000",
            },
        )
        assert configured.span_sink is not None
        assert isinstance(configured.span_sink, OtlpSpanSink)
        assert configured.span_sink.sender.url == "http://127.0.0.1:9/v1/traces"
        assert configured.span_sink.span_groups >= {"checkpoint", "job"}
        # Nothing was emitted, so closing has nothing to send to the (closed) port.
        configured.close_timeout = 2.0
        await configured.aclose()
        await configured.aclose()


@pytest.mark.parametrize(
    ("extra", "timeout"),
    [
        ({"OTEL_METRIC_EXPORT_TIMEOUT": "500"}, 0.5),
        ({"OTEL_METRIC_EXPORT_TIMEOUT": "500", "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "700"}, 0.7),
        ({}, 10.0),
    ],
)
async def test_the_metric_export_timeout_bounds_the_otlp_metric_export(
    extra: dict[str, str], timeout: float
) -> None:
    """OTEL_METRIC_EXPORT_TIMEOUT was ignored (the request took 10 s) and never checked: it is
    our OTLP metric sink's request timeout unless an OTLP timeout variable gives one."""
    from ckpt_events.sinks.otel import OtlpMetricSink

    environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_TRACES_EXPORTER": "none", **extra}
    async with Bus() as bus:
        async with configure(bus, environ=environ) as configured:
            (sink,) = configured.metric_sinks
            assert isinstance(sink, OtlpMetricSink) and sink.timeout == timeout
            configured.close_timeout = 2.0
        with pytest.raises(ConfigurationError, match="OTEL_METRIC_EXPORT_TIMEOUT='soon'"):
            configure(bus, environ={**environ, "OTEL_METRIC_EXPORT_TIMEOUT": "soon"})


async def test_a_delta_temporality_preference_is_refused_by_our_cumulative_sink() -> None:
    """OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE=delta was taken without a word, and our
    OTLP/HTTP metric sink sent cumulative points: refused, naming it; cumulative is taken, and
    so is delta beside a meter provider of yours (its exporters decide); a typo is refused."""
    from opentelemetry.sdk.metrics import MeterProvider

    name = "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE"
    environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_TRACES_EXPORTER": "none"}
    async with Bus() as bus:
        for value in ("delta", "LowMemory", "soon"):
            with pytest.raises(ConfigurationError, match=f"(?i)^{name}='{value}'") as info:
                configure(bus, environ={**environ, name: value})
            assert "\n" not in str(info.value) and bus.stats().sinks == ()
        async with configure(bus, environ={**environ, name: "cumulative"}) as configured:
            assert len(configured.metric_sinks) == 1
            configured.close_timeout = 2.0
        provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
        async with configure(bus, meter_provider=provider, environ={**environ, name: "delta"}) as configured:
            assert len(configured.metric_sinks) == 1
        provider.shutdown()


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/xml",
            },
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "localhost:4318"}, "OTEL_EXPORTER_OTLP_ENDPOINT"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:99999"}, "OTEL_EXPORTER_OTLP_ENDPOINT"),
        ({"OTEL_METRIC_EXPORT_INTERVAL": "soon"}, "OTEL_METRIC_EXPORT_INTERVAL"),
        ({"OTEL_METRIC_EXPORT_INTERVAL": "-5"}, "OTEL_METRIC_EXPORT_INTERVAL"),
        ({"CKPT_EVENTS_SPAN_GROUPS": "default,chekpoint"}, "CKPT_EVENTS_SPAN_GROUPS"),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_RESOURCE_ATTRIBUTES": "novalue"},
            "OTEL_RESOURCE_ATTRIBUTES",
        ),
    ],
)
async def test_invalid_values_name_the_variable(environ: dict[str, str], named: str) -> None:
    """Each bad setting raises ConfigurationError naming its variable, and subscribes nothing."""
    async with Bus() as bus:
        with pytest.raises(ConfigurationError, match=named):
            configure(bus, environ=environ)
        assert bus.stats().sinks == ()


@pytest.mark.skipif(
    importlib.util.find_spec("opentelemetry.exporter.otlp.proto.grpc") is not None,
    reason="the grpc extra is installed here: OTEL_EXPORTER_OTLP_PROTOCOL=grpc is served",
)
async def test_grpc_without_its_extra_names_the_variable_and_the_extra() -> None:
    """Was a case of the test above, which failed wherever the grpc extra is installed."""
    environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    async with Bus() as bus:
        needs = "OTEL_EXPORTER_OTLP_PROTOCOL.*grpc needs opentelemetry-exporter-otlp-proto-grpc"
        with pytest.raises(ConfigurationError, match=needs):
            configure(bus, environ=environ)
        assert bus.stats().sinks == ()


async def test_invalid_arguments_name_the_argument(tmp_path: Path) -> None:
    """Bad arguments name the argument."""
    async with Bus() as bus:
        with pytest.raises(ConfigurationError, match="otlp_endpoint"):
            configure(bus, otlp_endpoint="ftp://x", environ={})
        with pytest.raises(ConfigurationError, match="metric_export_interval_ms"):
            configure(bus, metric_export_interval_ms=0, environ={})
        with pytest.raises(ConfigurationError, match="jsonl_path"):
            configure(bus, jsonl_path=tmp_path / "missing-dir" / "e.jsonl", environ={})


async def test_the_off_switch_wins_over_arguments(tmp_path: Path) -> None:
    """CKPT_EVENTS_DISABLED=true: a jsonl_path argument and an endpoint, yet nothing subscribed."""
    environ = {"CKPT_EVENTS_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    async with Bus() as bus:
        async with configure(bus, jsonl_path=tmp_path / "e.jsonl", environ=environ) as configured:
            assert configured.subscriptions == ()
            assert not Telemetry(bus, kind="agent", instance="a0").enabled
    assert not (tmp_path / "e.jsonl").exists()


async def test_the_off_switch_refuses_a_bad_value() -> None:
    """CKPT_EVENTS_DISABLED takes true or false; anything else names the variable."""
    async with Bus() as bus:
        with pytest.raises(ConfigurationError, match="CKPT_EVENTS_DISABLED"):
            configure(bus, environ={"CKPT_EVENTS_DISABLED": "yes"})
        async with configure(bus, environ={"CKPT_EVENTS_DISABLED": "false"}) as configured:
            assert not configured.enabled


ENDPOINT = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
#: Bad values that escaped as a raw Python error, or as a sink's error naming its own argument.
RAW_ERRORS: dict[str, tuple[str, dict[str, Any]]] = {
    "endpoint variable with an unclosed [": (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        {"environ": {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://[::1:1"}},
    ),
    "endpoint argument with an unclosed [": (
        "otlp_endpoint",
        {"otlp_endpoint": "http://[::1", "environ": {}},
    ),
    "endpoint variable with a #fragment": (
        "OTEL_EXPORTER_OTLP_ENDPOINT.*#fragment",
        {"environ": {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318#x"}},
    ),
    "base endpoint variable with a ?query": (
        "OTEL_EXPORTER_OTLP_ENDPOINT.*query",
        {"environ": {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318?key=1"}},
    ),
    "endpoint argument with a ?query": (
        "otlp_endpoint.*query",
        {"otlp_endpoint": "http://127.0.0.1:4318?key=1", "environ": {}},
    ),
    "traces endpoint variable with credentials": (
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT.*credentials",
        {"environ": {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://u:p@127.0.0.1:4318/v1/traces"}},
    ),
    "endpoint variable with a space in its path": (
        "OTEL_EXPORTER_OTLP_ENDPOINT.*space",
        {"environ": {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318/my otlp"}},
    ),
    "traces endpoint variable with a non-ASCII path": (
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT.*non-ASCII",
        {"environ": {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/tracés"}},
    ),
    "endpoint variable with a host label over 63 characters": (
        "OTEL_EXPORTER_OTLP_ENDPOINT.*host name",
        {"environ": {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{'x' * 64}.example:4318"}},
    ),
    "endpoint variable on port 0": (
        "OTEL_EXPORTER_OTLP_ENDPOINT.*invalid port",
        {"environ": {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:0"}},
    ),
    "schedule delay past a minute": (
        "OTEL_BSP_SCHEDULE_DELAY",
        {"environ": {**ENDPOINT, "OTEL_BSP_SCHEDULE_DELAY": "99999999"}},
    ),
    "metric interval variable past a day": (
        "OTEL_METRIC_EXPORT_INTERVAL",
        {"environ": {**ENDPOINT, "OTEL_METRIC_EXPORT_INTERVAL": "999999999999999"}},
    ),
    "metric interval argument past a day": (
        "metric_export_interval_ms",
        {"metric_export_interval_ms": 10**12, "environ": ENDPOINT},
    ),
    "resource attributes as a list of pairs": (
        "resource_attributes",
        {"resource_attributes": [("a", "b")], "environ": ENDPOINT},
    ),
    "span groups as an int": ("span_groups", {"span_groups": 5, "environ": ENDPOINT}),
    "service instance id as an int": ("service_instance_id", {"service_instance_id": 7, "environ": ENDPOINT}),
    "service instance id empty": ("service_instance_id", {"service_instance_id": "", "environ": ENDPOINT}),
    "service instance id blank": ("service_instance_id", {"service_instance_id": "  ", "environ": ENDPOINT}),
    "a jsonl path with a NUL byte": ("jsonl_path", {"jsonl_path": "events\0.jsonl", "environ": {}}),
    "a jsonl variable with a NUL byte": (
        "CKPT_EVENTS_JSONL",
        {"environ": {"CKPT_EVENTS_JSONL": "e\0.jsonl"}},
    ),
}


@pytest.mark.parametrize(("named", "arguments"), RAW_ERRORS.values(), ids=RAW_ERRORS.keys())
async def test_bad_values_are_the_same_configuration_error_in_both_modes(
    named: str, arguments: dict[str, Any]
) -> None:
    """Each is a ConfigurationError naming the argument or variable, the same with the sinks in
    this process and in an export process (checked before a child is started)."""
    messages = []
    async with Bus() as bus:
        for export_process in (False, True):
            with pytest.raises(ConfigurationError, match=named) as info:
                configure(bus, export_process=export_process, **arguments)
            messages.append(str(info.value))
        assert bus.stats().sinks == ()
    assert messages[0] == messages[1]


async def test_otel_parts_beside_a_provider_of_yours_or_of_the_wrong_kind_are_refused() -> None:
    """``span_exporter=`` beside ``tracer_provider=`` (and ``metric_readers=`` beside
    ``meter_provider=``) were dropped without a word; an exporter class, a string of readers or a
    reader of another kind failed later with a raw AttributeError or at shutdown. Each is one
    ConfigurationError naming the argument and where the part goes instead."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider

    cases: list[tuple[dict[str, Any], str]] = [
        (
            {"tracer_provider": TracerProvider(), "span_exporter": InMemorySpanExporter()},
            r"span_exporter= goes to the tracer provider configure\(\) builds; with tracer_provider=, add",
        ),
        (
            {"meter_provider": MeterProvider(), "metric_readers": [InMemoryMetricReader()]},
            r"metric_readers= go to the meter provider configure\(\) builds; with meter_provider=, give",
        ),
        (
            {"span_exporter": InMemorySpanExporter},
            "span_exporter must be an OpenTelemetry SpanExporter instance",
        ),
        ({"span_exporter": "x"}, "span_exporter must be an OpenTelemetry SpanExporter instance"),
        ({"metric_readers": "x"}, "metric_readers must be a list of MetricReader instances, not 'x'"),
        ({"metric_readers": [1]}, "metric_readers must hold MetricReader instances, not 1"),
    ]
    for arguments, message in cases:
        async with Bus() as bus:
            with pytest.raises(ConfigurationError, match=message):
                configure(bus, environ={}, **arguments)


async def test_a_reader_registered_elsewhere_is_a_configuration_error() -> None:
    """The SDK's bare ``Exception`` ("has been registered already in other MeterProvider")."""
    from opentelemetry.sdk.metrics import MeterProvider

    reader = InMemoryMetricReader()
    theirs = MeterProvider(metric_readers=[reader])
    try:
        async with Bus() as bus:
            with pytest.raises(ConfigurationError, match="metric_readers: .*registered"):
                configure(bus, environ={}, metric_readers=[reader])
    finally:
        theirs.shutdown()


async def test_a_cancelled_close_still_stops_the_prometheus_endpoint() -> None:
    """A close cancelled by its owner (a Ctrl-C, a failing sibling) still stops the scrape thread
    and frees its port; it left both for the life of the process, a second aclose() a no-op."""
    environ = {
        "OTEL_METRICS_EXPORTER": "prometheus",
        "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
        "OTEL_EXPORTER_PROMETHEUS_PORT": "0",
    }
    async with Bus() as bus:
        with anyio.CancelScope() as scope:
            async with configure(bus, environ=environ) as configured:
                assert configured.prometheus is not None
                port = configured.prometheus.port
                scope.cancel()
    assert not [t for t in threading.enumerate() if t.name == f"ckpt-events-prometheus-{port}"]
    with socket.socket() as again:
        again.bind(("127.0.0.1", port))


async def test_a_cancelled_close_still_shuts_the_meter_provider_down(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A close cancelled before it reached the meter provider left the SDK's periodic reader
    thread exporting for the life of the process (a console exporter here)."""
    before = set(threading.enumerate())
    environ = {"OTEL_METRICS_EXPORTER": "console", "OTEL_METRIC_EXPORT_INTERVAL": "60000"}
    async with Bus() as bus:
        with anyio.CancelScope() as scope:
            async with configure(bus, environ=environ) as configured:
                assert configured.meter_provider is not None
                assert [t for t in set(threading.enumerate()) - before if "Metric" in t.name]
                scope.cancel()
    assert not [t for t in set(threading.enumerate()) - before if t.is_alive() and "Metric" in t.name]


async def test_a_second_close_meanwhile_waits_for_the_first(tmp_path: Path) -> None:
    """A second ``aclose()`` while the first is under way (a lifespan's and a ``finally``'s)
    returns once everything is closed (before: at once, the sinks still subscribed and the SDK's
    metric reader still running, so the file read after it could lack the last events)."""
    before = set(threading.enumerate())
    log = tmp_path / "events.jsonl"
    environ = {"OTEL_METRICS_EXPORTER": "console", "OTEL_METRIC_EXPORT_INTERVAL": "60000"}
    async with Bus() as bus:
        configured = configure(bus, jsonl_path=log, environ=environ)
        with Telemetry(bus, kind="agent", instance="agent-0").operation("commit", checkpoint_id="c1"):
            pass
        async with anyio.create_task_group() as tg:
            tg.start_soon(configured.aclose)
            await anyio.sleep(0)  # the first close is under way
            await configured.aclose()
            assert all(sub.closed for sub in configured.subscriptions)
            assert not [t for t in set(threading.enumerate()) - before if t.is_alive() and "Metric" in t.name]
            assert len(list(read_events(log))) == 2


async def test_a_close_past_its_deadline_ends_the_exports_and_counts_their_drops() -> None:
    """A collector that takes the connection and never answers: ``aclose()`` ends by its
    ``close_timeout`` with the spans counted as dropped and the export threads gone. The sinks
    ran on to their own request timeout (10 s) after it returned, the spans neither exported
    nor dropped, and the bus's close waited out its own deadline on top."""
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(16)  # connections complete in the backlog; nothing is ever read
        environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{hole.getsockname()[1]}"}
        before = set(threading.enumerate())
        async with Bus(close_timeout=30.0) as bus:
            configured = configure(bus, environ=environ)
            configured.close_timeout = 1.0
            tel = Telemetry(bus, kind="agent", instance="agent-0")
            for n in range(3):
                with tel.operation("commit", checkpoint_id=f"c{n}"):
                    pass
            started = anyio.current_time()
            await configured.aclose()
            took = anyio.current_time() - started
            assert configured.span_sink is not None
            stats = configured.span_sink.stats()
            assert (stats.exported, stats.dropped) == (0, 3)
            assert all(sub.stats().pending == 0 for sub in configured.subscriptions)
            left = set(threading.enumerate()) - before
            # AnyIO's idle worker threads are its pool's, not ours.
            assert not [t for t in left if t.is_alive() and not t.name.startswith("AnyIO worker")]
            closing = anyio.current_time()
        assert took < 2.5
        assert anyio.current_time() - closing < 1.0  # nothing left for the bus to wait on


@pytest.mark.parametrize(
    ("seconds", "error"),
    [(float("nan"), InvalidValueError), (-1.0, InvalidValueError), ("5", InvalidTypeError)],
)
async def test_a_bad_close_timeout_is_refused_naming_it(seconds: object, error: type[Exception]) -> None:
    """``close_timeout`` is checked when set (``serve`` and ``instrument()`` set it after
    ``configure``): a NaN was a bare ``ValueError`` at the close, a negative one an error naming
    the bus's flush timeout."""
    async with Bus() as bus:
        async with configure(bus, environ={"OTEL_METRICS_EXPORTER": "console"}) as configured:
            with pytest.raises(error, match=r"^close_timeout must be a number of seconds >= 0"):
                configured.close_timeout = seconds  # type: ignore[assignment]
            assert configured.close_timeout == 10.0


MULTIPROC_WARNING = "ckpt-events: PROMETHEUS_MULTIPROC_DIR is set, but ckpt-events writes none of its metrics"


@pytest.mark.parametrize(
    ("extra", "readers", "warned"),
    [
        ({}, False, True),  # a multiprocess page and our metrics nowhere: said
        ({"PROMETHEUS_MULTIPROC_DIR": " "}, False, False),  # empty: not multiprocess mode
        ({"OTEL_METRICS_EXPORTER": "none"}, False, False),  # none on purpose
        ({"OTEL_METRICS_EXPORTER": "prometheus", "OTEL_EXPORTER_PROMETHEUS_PORT": "0"}, False, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}, False, False),  # metrics go over OTLP
        ({"OTEL_SDK_DISABLED": "true"}, False, False),
        ({}, True, False),  # a reader of the caller's: where it goes is not known here
    ],
)
async def test_a_multiprocess_dir_without_metric_export_is_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, extra: dict[str, str], readers: bool, warned: bool
) -> None:
    """``PROMETHEUS_MULTIPROC_DIR`` set and no metric export: one warning line naming the ways
    out (our series are never in prometheus-client's multiprocess files); silent otherwise."""
    environ = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), **extra}
    metric_readers = [InMemoryMetricReader()] if readers else None
    with caplog.at_level("WARNING", logger="ckpt_events.sinks"):
        async with Bus() as bus:
            async with configure(bus, environ=environ, metric_readers=metric_readers):
                pass
    said = [r.getMessage() for r in caplog.records if MULTIPROC_WARNING in r.getMessage()]
    assert len(said) == (1 if warned else 0), said
    if warned:
        (line,) = said
        assert "\n" not in line
        assert "CKPT_EVENTS_PROMETHEUS_PORTS=N" in line and "OTEL_METRICS_EXPORTER=none" in line


async def test_a_multiprocess_dir_is_said_once_with_an_export_process(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With an export process the child, which reads this environment, says it; the parent does
    not say it again (it did: two lines per worker)."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    for name in [name for name in os.environ if name.startswith(("OTEL_", "CKPT_EVENTS_"))]:
        monkeypatch.delenv(name)
    with caplog.at_level("WARNING", logger="ckpt_events.sinks"):
        async with Bus() as bus:
            async with configure(bus, jsonl_path=tmp_path / "events.jsonl", export_process=True):
                pass
    said = [r for r in caplog.records if MULTIPROC_WARNING in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]
    assert getattr(said[0], "export_process", None) is not None


async def test_our_meter_provider_shut_down_by_your_code_is_counted_and_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``configured.meter_provider.shutdown()`` called by your code: what reaches it after is
    counted in ``MetricSink.stats().dropped`` and said in one line, and our close does not shut
    it down again (the SDK's "shutdown can only be called once" was a second line)."""
    caplog.set_level(logging.WARNING)
    async with Bus() as bus:
        configured = configure(bus, metric_readers=[InMemoryMetricReader()], environ={})
        async with configured:
            tel = Telemetry(bus, kind="resources", instance="r0")
            with tel.operation("commit", checkpoint_id="c1"):
                pass
            await bus.flush()
            assert configured.meter_provider is not None
            configured.meter_provider.shutdown()
            with tel.operation("commit", checkpoint_id="c2"):
                pass
            await bus.flush()
    assert configured.metric_sink is not None
    stats = configured.metric_sink.stats()
    assert (stats.events, stats.dropped) == (4, 2)
    (record,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "MeterProvider was shut down" in record.getMessage()


@pytest.mark.parametrize("leave", ["aclose", "async with"])
async def test_closing_before_the_bus_ever_started_delivers_and_closes_every_sink(
    tmp_path: Path, leave: str
) -> None:
    """A server whose startup failed before its bus started: ``configured.aclose()`` (or leaving
    ``async with configure(...)``) returned at once having delivered nothing and closed nothing
    (the file open with 0 lines, the spans unexported, the meter provider shut down before its
    records came, so they were dropped later). Now it delivers and closes them; the bus's later
    close has nothing left to do."""
    path = tmp_path / "events.jsonl"
    spans, reader = InMemorySpanExporter(), InMemoryMetricReader()
    bus = Bus()
    configured = configure(bus, jsonl_path=path, span_exporter=spans, metric_readers=[reader])
    with Telemetry(bus, kind="environment", instance="env-0").operation("commit", checkpoint_id="c1"):
        pass
    if leave == "aclose":
        await configured.aclose()
    else:
        async with configured:
            pass
    assert len(list(read_events(path))) == 2
    assert [span.name for span in spans.get_finished_spans()] != []
    assert metric_points(reader) != {}
    assert configured.jsonl_sink is not None and configured.jsonl_sink._closed
    assert all(row.delivered == row.emitted and row.pending == 0 for row in bus.stats().sinks)
    await bus.aclose()
    assert len(list(read_events(path))) == 2
