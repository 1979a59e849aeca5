"""The OpenTelemetry environment: every standard variable configure() honours, and bad values."""

from __future__ import annotations

import importlib.util

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ckpt_events import Bus, ConfigurationError, Telemetry
from ckpt_events.sinks import configure
from ckpt_events.sinks.otel import OtlpSpanSink
from ckpt_events.sinks.otel._env import read_otel_env, sample_ratio_from_env
from tests.sinks.helpers import metric_points

BASE = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}


def _endpoint(sink: object) -> str:
    assert isinstance(sink, OtlpSpanSink)
    return sink.sender.url


async def test_sdk_disabled_subscribes_nothing() -> None:
    """OTEL_SDK_DISABLED=true: an endpoint is set, yet nothing is subscribed and sites stay off."""
    async with Bus() as bus:
        configured = configure(bus, environ={**BASE, "OTEL_SDK_DISABLED": "true"})
        assert configured.subscriptions == ()
        assert not Telemetry(bus, kind="agent", instance="a0").enabled


@pytest.mark.parametrize(
    ("environ", "endpoint"),
    [
        (BASE, "http://127.0.0.1:4318/v1/traces"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:9/custom"}, "http://127.0.0.1:9/custom"),
        (
            {**BASE, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:9/custom"},
            "http://127.0.0.1:9/custom",
        ),
    ],
)
async def test_trace_endpoint_rules(environ: dict[str, str], endpoint: str) -> None:
    """The base gets /v1/traces appended; a per-signal endpoint is used as is and wins."""
    async with Bus() as bus:
        async with configure(bus, environ=environ) as configured:
            assert configured.span_sink is not None
            assert _endpoint(configured.span_sink) == endpoint


def test_metrics_endpoint_alone_asks_for_metrics_only() -> None:
    """OTEL_EXPORTER_OTLP_METRICS_ENDPOINT alone: an OTLP metric exporter, used as is, no traces."""
    settings = read_otel_env({"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://127.0.0.1:9/m"})
    assert settings.traces == () and settings.metrics == ("otlp",)
    assert settings.metrics_otlp is not None and settings.metrics_otlp.endpoint == "http://127.0.0.1:9/m"


async def test_headers_timeout_compression_come_from_environ() -> None:
    """Per-signal headers/timeout/compression win over the base ones and reach the exporter."""
    environ = {
        **BASE,
        "OTEL_EXPORTER_OTLP_HEADERS": "a=1,b=base",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "b=traces%20only",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "2500",
        "OTEL_EXPORTER_OTLP_COMPRESSION": "none",
        "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "gzip",
    }
    settings = read_otel_env(environ)
    assert settings.traces_otlp is not None and settings.metrics_otlp is not None
    assert settings.traces_otlp.headers == {"b": "traces only"}
    assert settings.metrics_otlp.headers == {"a": "1", "b": "base"}
    assert settings.traces_otlp.timeout_s == 2.5
    assert (settings.traces_otlp.compression, settings.metrics_otlp.compression) == ("gzip", "none")
    async with Bus() as bus:
        async with configure(bus, environ=environ) as configured:
            sink = configured.span_sink
            assert isinstance(sink, OtlpSpanSink)
            assert sink.sender._headers["b"] == "traces only" and "a" not in sink.sender._headers
            assert (sink.sender.timeout, sink.sender.compression) == (2.5, "gzip")
            assert sink.sender._headers["Content-Encoding"] == "gzip"


async def test_console_and_given_exporter_keep_opentelemetry() -> None:
    """OTEL_TRACES_EXPORTER=otlp,console: our sink for OTLP and a SpanSink for the console."""
    environ = {**BASE, "OTEL_TRACES_EXPORTER": "otlp,console", "OTEL_METRICS_EXPORTER": "none"}
    async with Bus() as bus:
        async with configure(bus, environ=environ) as configured:
            own, console = configured.span_sinks
            assert isinstance(own, OtlpSpanSink)
            assert isinstance(console.exporter, ConsoleSpanExporter)  # type: ignore[union-attr]
            assert [s.name for s in configured.subscriptions] == ["otel-spans", "otel-spans-console"]


async def test_bsp_variables_map_onto_the_span_sink() -> None:
    """OTEL_BSP_* become the span sink's linger, batch, buffer and export timeout."""
    exporter = InMemorySpanExporter()
    environ = {
        "OTEL_BSP_SCHEDULE_DELAY": "250",
        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "2",
        "OTEL_BSP_MAX_QUEUE_SIZE": "2",
        "OTEL_BSP_EXPORT_TIMEOUT": "7000",
    }
    async with Bus() as bus:
        async with configure(bus, span_exporter=exporter, environ=environ) as configured:
            sink = configured.span_sink
            assert sink is not None
            assert (sink.linger, sink.max_export_batch, sink.export_timeout) == (0.25, 2, 7.0)
            tel = Telemetry(bus, kind="agent", instance="a0")
            for _ in range(5):  # no await between: the 2-event buffer overflows
                with tel.operation("resume"):
                    pass
            (stats,) = [s for s in bus.stats().sinks if s.name == "otel-spans"]
            assert stats.dropped == 3
    assert len(exporter.get_finished_spans()) == 2


def test_a_batch_larger_than_the_queue_is_refused_naming_both() -> None:
    """OTEL_BSP_MAX_EXPORT_BATCH_SIZE above OTEL_BSP_MAX_QUEUE_SIZE: one line naming both and their
    values (OpenTelemetry's SDK refuses it too; our span sink only exported such a queue at linger)."""
    environ = {**BASE, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "600", "OTEL_BSP_MAX_QUEUE_SIZE": "100"}
    with pytest.raises(ConfigurationError) as info:
        read_otel_env(environ)
    message = str(info.value)
    assert "OTEL_BSP_MAX_EXPORT_BATCH_SIZE=600" in message
    assert "OTEL_BSP_MAX_QUEUE_SIZE=100" in message
    assert "\n" not in message
    equal = read_otel_env({**environ, "OTEL_BSP_MAX_QUEUE_SIZE": "600"})
    assert (equal.batch.max_export_batch, equal.batch.max_buffer) == (600, 600)


async def test_a_batch_larger_than_the_default_queue_is_refused() -> None:
    """Only the batch size set, above the OTLP span sink's default queue (8,192): refused naming the
    batch variable, the queue's default and the variable to raise it with."""
    environ = {**BASE, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "10000", "OTEL_METRICS_EXPORTER": "none"}
    async with Bus() as bus:
        with pytest.raises(ConfigurationError) as info:
            configure(bus, environ=environ)
        message = str(info.value)
        assert "OTEL_BSP_MAX_EXPORT_BATCH_SIZE=10000" in message
        assert "OTEL_BSP_MAX_QUEUE_SIZE" in message and "8192" in message
        assert "\n" not in message
        async with configure(bus, environ={**environ, "OTEL_BSP_MAX_QUEUE_SIZE": "10000"}) as configured:
            sink = configured.span_sink
            assert isinstance(sink, OtlpSpanSink)
            assert (sink.max_export_batch, sink.max_queue) == (10000, 10000)


@pytest.mark.parametrize(
    ("sampler", "arg", "ratio"),
    [
        ("always_on", None, 1.0),
        ("always_off", None, 0.0),
        ("parentbased_always_off", None, 0.0),
        ("parentbased_always_on", "0.2", 1.0),
        ("traceidratio", "0.25", 0.25),
        ("parentbased_traceidratio", "0.5", 0.5),
        (None, None, 1.0),
    ],
)
async def test_sampler_variables_give_the_ratio(sampler: str | None, arg: str | None, ratio: float) -> None:
    """OTEL_TRACES_SAMPLER / _ARG become Configured.sample_ratio (what Telemetry takes)."""
    environ = {}
    if sampler is not None:
        environ["OTEL_TRACES_SAMPLER"] = sampler
    if arg is not None:
        environ["OTEL_TRACES_SAMPLER_ARG"] = arg
    assert sample_ratio_from_env(environ) == ratio
    async with Bus() as bus:
        async with configure(bus, environ=environ) as configured:
            assert configured.sample_ratio == ratio


async def test_given_providers_are_used_not_built() -> None:
    """tracer_provider: spans go through its processors with its resource; meter_provider: used, not shut."""
    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tracer_provider = TracerProvider(resource=Resource.create({"service.name": "the-app"}))
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    meter_provider = MeterProvider(metric_readers=[reader])
    async with Bus() as bus:
        async with configure(
            bus, tracer_provider=tracer_provider, meter_provider=meter_provider, environ=BASE
        ) as configured:
            assert configured.meter_provider is None
            with Telemetry(bus, kind="model", instance="m0").operation("commit", checkpoint_id="c1"):
                pass
            await bus.flush()
            assert "gym.checkpoint.operation_duration_ms" in metric_points(reader)
    (span,) = exporter.get_finished_spans()
    assert span.name == "gym.checkpoint.commit"
    assert span.resource.attributes["service.name"] == "the-app"
    assert metric_points(reader)  # the caller's provider is still alive
    meter_provider.shutdown()
    tracer_provider.shutdown()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("OTEL_SDK_DISABLED", "yes"),
        ("OTEL_TRACES_EXPORTER", "zipkin"),
        ("OTEL_METRICS_EXPORTER", "zipkin"),
        ("OTEL_TRACES_EXPORTER", "prometheus"),
        ("OTEL_EXPORTER_PROMETHEUS_PORT", "99999"),
        ("CKPT_EVENTS_PROMETHEUS_PORTS", "0"),
        ("CKPT_EVENTS_PROMETHEUS_PORTS", "four"),
        ("CKPT_EVENTS_PROMETHEUS_PORTS", "1025"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/xml"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "thrift"),
        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "collector:4318"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "novalue"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=%E2%82%AC"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "a=b%0D%0AX: 1"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "a b=c"),
        ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "a=%00"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "soon"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "99999999999999"),
        ("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "3600001"),
        ("OTEL_BSP_EXPORT_TIMEOUT", "3600001"),
        ("OTEL_BSP_SCHEDULE_DELAY", "99999999"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "999999999999999"),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "zstd"),
        ("OTEL_BSP_SCHEDULE_DELAY", "-1"),
        ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "0"),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "many"),
        ("OTEL_BSP_EXPORT_TIMEOUT", "0"),
        ("OTEL_TRACES_SAMPLER", "jaeger_remote"),
        ("OTEL_TRACES_SAMPLER_ARG", "1.5"),
        ("OTEL_PROPAGATORS", "tracecontext,b3"),
        ("OTEL_RESOURCE_ATTRIBUTES", "justakey"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "0"),
        ("OTEL_METRIC_EXPORT_TIMEOUT", "0"),
        ("OTEL_METRIC_EXPORT_TIMEOUT", "3600001"),
    ],
)
def test_bad_values_name_the_variable_on_one_line(name: str, value: str) -> None:
    """Every bad value: ConfigurationError naming the variable, on one line."""
    environ = {**BASE, name: value}
    if name == "OTEL_TRACES_SAMPLER_ARG":
        environ["OTEL_TRACES_SAMPLER"] = "traceidratio"
    with pytest.raises(ConfigurationError, match=name) as info:
        read_otel_env(environ)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("port", "ports", "said"),
    [("0", "4", r"which is 0 \(any free port\)"), ("65534", "4", "past port 65535")],
)
def test_a_prometheus_port_range_must_be_a_range_of_ports(port: str, ports: str, said: str) -> None:
    """CKPT_EVENTS_PROMETHEUS_PORTS counts ports from OTEL_EXPORTER_PROMETHEUS_PORT: port 0 has no
    range, and one past 65535 no last port; each is one line naming the variable."""
    environ = {**BASE, "OTEL_EXPORTER_PROMETHEUS_PORT": port, "CKPT_EVENTS_PROMETHEUS_PORTS": ports}
    with pytest.raises(ConfigurationError, match=f"^CKPT_EVENTS_PROMETHEUS_PORTS='{ports}' .*{said}"):
        read_otel_env(environ)
    assert read_otel_env({**BASE, "CKPT_EVENTS_PROMETHEUS_PORTS": "4"}).prometheus_ports == 4


@pytest.mark.parametrize("signal", ["", "METRICS_", "TRACES_"])
def test_grpc_without_the_extra_names_the_variable_that_asked(signal: str) -> None:
    """OTEL_EXPORTER_OTLP_METRICS_PROTOCOL=grpc without the extra was an error naming
    OTEL_EXPORTER_OTLP_PROTOCOL, which was not set: the variable that asked is named."""
    if importlib.util.find_spec("opentelemetry.exporter.otlp.proto.grpc") is not None:
        pytest.skip("the grpc extra is installed")
    name = f"OTEL_EXPORTER_OTLP_{signal}PROTOCOL"
    with pytest.raises(ConfigurationError, match=rf"^{name}='grpc' .*ckpt-events\[grpc\]") as info:
        read_otel_env({**BASE, name: "grpc"})
    assert "\n" not in str(info.value)


def test_propagators_tracecontext_and_baggage_are_accepted() -> None:
    """OTEL_PROPAGATORS=tracecontext,baggage is accepted (baggage ignored)."""
    read_otel_env({"OTEL_PROPAGATORS": "tracecontext,baggage"})


def test_a_header_that_cannot_be_sent_says_how_to_percent_encode() -> None:
    """A header value outside latin-1 is refused at configure(), saying what is valid and how to
    send the percent-encoded text itself (it used to kill the export thread at the first export)."""
    with pytest.raises(ConfigurationError, match="OTEL_EXPORTER_OTLP_HEADERS") as info:
        read_otel_env({**BASE, "OTEL_EXPORTER_OTLP_HEADERS": "x-team=rl,api-key=%E2%82%AC"})
    assert "'api-key'" in str(info.value) and "latin-1" in str(info.value) and "%25" in str(info.value)
    settings = read_otel_env({**BASE, "OTEL_EXPORTER_OTLP_HEADERS": "api-key=%25E2%2582%25AC"})
    assert settings.traces_otlp is not None and settings.traces_otlp.headers == {"api-key": "%E2%82%AC"}


@pytest.mark.parametrize("name", ["OTEL_RESOURCE_ATTRIBUTES", "OTEL_EXPORTER_OTLP_HEADERS"])
def test_percent_encoding_that_is_not_utf8_is_refused(name: str) -> None:
    """``team=%FF`` (not UTF-8) became the value U+FFFD without a word: one line naming the
    variable and the entry (a header's value redacted: it is a credential, often); percent-encoded
    UTF-8 still decodes."""
    entry = "'team=%FF'" if name == "OTEL_RESOURCE_ATTRIBUTES" else r"'team=\[REDACTED\]'"
    with pytest.raises(ConfigurationError, match=f"{name}=.*{entry}.*not UTF-8") as info:
        read_otel_env({**BASE, name: "site=a,team=%FF"})
    assert "\n" not in str(info.value)
    settings = read_otel_env({**BASE, name: "team=r%C3%A9seau"})
    otlp = settings.traces_otlp
    assert otlp is not None
    decoded = settings.resource_attributes if name == "OTEL_RESOURCE_ATTRIBUTES" else otlp.headers
    assert decoded == {"team": "réseau"}


def test_a_header_repeated_in_another_case_is_sent_once_the_last_winning() -> None:
    """``Authorization=Bearer old,authorization=Bearer new`` sent both headers (HTTP names are
    case-insensitive; a collector took either); the last one wins, as for an exact repeat."""
    headers = "Authorization=Bearer old,x-team=rl,authorization=Bearer new,X-Team=ml"
    settings = read_otel_env({**BASE, "OTEL_EXPORTER_OTLP_HEADERS": headers})
    assert settings.traces_otlp is not None
    assert settings.traces_otlp.headers == {"authorization": "Bearer new", "X-Team": "ml"}


@pytest.mark.parametrize("name", ["Content-Length", "transfer-encoding", "content-type", "Content-Encoding"])
def test_a_header_the_sender_sets_itself_is_refused(name: str) -> None:
    """``Content-Length=5`` sent 5 bytes of each body (and counted the spans exported);
    ``content-type`` went out beside the real one: each is one line naming what sets it."""
    with pytest.raises(ConfigurationError, match=f"OTEL_EXPORTER_OTLP_HEADERS.*'{name}' is the sender's own"):
        read_otel_env({**BASE, "OTEL_EXPORTER_OTLP_HEADERS": f"x-team=rl,{name}=5"})


def test_the_longest_timeouts_are_taken() -> None:
    """An hour of request timeout, a minute of linger and a day of metric interval are in range."""
    settings = read_otel_env(
        {
            **BASE,
            "OTEL_EXPORTER_OTLP_TIMEOUT": "3600000",
            "OTEL_BSP_SCHEDULE_DELAY": "60000",
            "OTEL_METRIC_EXPORT_INTERVAL": "86400000",
        }
    )
    assert settings.traces_otlp is not None and settings.traces_otlp.timeout_s == 3600.0
    assert (settings.batch.linger_s, settings.metric_interval_ms) == (60.0, 86_400_000)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("OTEL_TRACES_EXPORTER", "otlp,none"),
        ("OTEL_TRACES_EXPORTER", "none, console"),
        ("OTEL_METRICS_EXPORTER", "prometheus,NONE"),
    ],
)
def test_none_beside_another_exporter_is_refused_not_taken_for_none(name: str, value: str) -> None:
    """``none`` with another exporter turned the signal off without a word, the ``otlp`` asked for
    beside it dropped (OpenTelemetry's SDK refuses such a list too): one line naming the variable."""
    with pytest.raises(ConfigurationError, match=rf"^{name}=.*none cannot be combined") as info:
        read_otel_env({**BASE, name: value})
    assert "\n" not in str(info.value)
    alone = read_otel_env({**BASE, name: " None "})  # alone, in any case: the signal is off
    assert (alone.traces if name == "OTEL_TRACES_EXPORTER" else alone.metrics) == ()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Bearer%20S3CRET%0A"),  # a token file's newline
        ("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Bearer S3CRET,x-tenant"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "Authorization: Bearer S3CRET"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Bearer S3CRET,x=%FF"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Bearer S3CRET,bad name=x"),
        ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "api-key=S3CRET%E2%82%AC"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "S3CRET"),  # the key alone, its name forgotten
        ("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=ab,S3CRET"),  # a key with a comma in it
        ("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "x-api-key%3DS3CRET"),  # its '=' percent-encoded
        # Written as curl has it, its base64 '=' padding read as the '=' of a pair: the name was
        # 'Authorization: Basic S3CRET', said whole as the name that is not a token.
        ("OTEL_EXPORTER_OTLP_HEADERS", "Authorization: Basic S3CRET=="),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://user:S3CRET@collector:4318"),
        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://:S3CRET@collector:4318/v1/traces"),
    ],
)
def test_a_bad_value_never_shows_the_credential_it_holds(name: str, value: str) -> None:
    """An error about a headers variable or an endpoint is printed and logged: it names the
    variable and what is wrong, and shows no header value, nor a URL's user and password."""
    with pytest.raises(ConfigurationError, match=name) as info:
        read_otel_env({**BASE, name: value})
    assert "S3CRET" not in str(info.value)


def test_an_entry_without_an_equals_sign_is_named_by_its_place() -> None:
    """An entry of a headers variable with no ``=`` may be the credential itself (a key pasted
    without its header's name, or the end of one with a comma in it): it was shown whole, so the
    error said which entry by showing it; now it is redacted and named by its place."""
    with pytest.raises(ConfigurationError) as info:
        read_otel_env({**BASE, "OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=t1, S3CRET"})
    assert str(info.value) == (
        "OTEL_EXPORTER_OTLP_HEADERS='x-tenant=[REDACTED],[REDACTED]' is not valid; use key=value "
        "pairs separated by commas (bad entry 2 of 2: '[REDACTED]')"
    )


def test_a_header_name_that_is_not_a_token_is_said_up_to_its_first_bad_character() -> None:
    """The name is shown up to and with its first character a name may not hold, the rest
    redacted: what is wrong is still seen (a space, a ':', a '/'), and no credential."""
    for raw, said in [
        ("bad name=x", "'bad [REDACTED]'"),
        ("x/y=1", "'x/[REDACTED]'"),
        ("x-key:=1", "'x-key:'"),
    ]:
        with pytest.raises(ConfigurationError) as info:
            read_otel_env({**BASE, "OTEL_EXPORTER_OTLP_HEADERS": raw})
        assert f"header name {said} is not an HTTP token" in str(info.value), str(info.value)
