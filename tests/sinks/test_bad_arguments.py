"""A bad argument to a sink raises the child of InvalidArgumentError it is: a range or a wrong
value is a ``ValueError`` (``InvalidValueError``), the wrong type of object a ``TypeError``
(``InvalidTypeError``)."""

from __future__ import annotations

import inspect
import io
from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ckpt_events import InvalidArgumentError, InvalidTypeError, InvalidValueError
from ckpt_events.sinks import JsonLinesSink, LoggingSink, StallWatch, read_events
from ckpt_events.sinks.otel import OtlpMetricSink, OtlpSpanSink, SpanSink
from ckpt_events.sinks.prometheus import PrometheusEndpoint, PrometheusSink
from ckpt_events.sinks.replay import replay

ENDPOINT = "http://127.0.0.1:9"

#: Each bad argument and the child of InvalidArgumentError it raises.
BAD_ARGUMENTS: dict[str, tuple[Callable[[], object], type[InvalidArgumentError]]] = {
    "span sink linger out of range": (lambda: OtlpSpanSink(ENDPOINT, linger=61), InvalidValueError),
    "span sink linger as a string": (lambda: OtlpSpanSink(ENDPOINT, linger="1"), InvalidTypeError),
    "span sink queue of zero": (lambda: OtlpSpanSink(ENDPOINT, max_queue=0), InvalidValueError),
    "span sink queue as a float": (lambda: OtlpSpanSink(ENDPOINT, max_queue=8.0), InvalidTypeError),
    "span sink batch larger than its queue": (
        lambda: OtlpSpanSink(ENDPOINT, max_export_batch=600, max_queue=100),
        InvalidValueError,
    ),
    "span sink unknown protocol": (lambda: OtlpSpanSink(ENDPOINT, protocol="grpc"), InvalidValueError),
    "sender timeout of zero": (lambda: OtlpSpanSink(ENDPOINT, timeout=0), InvalidValueError),
    "sender endpoint not http": (lambda: OtlpSpanSink("ftp://127.0.0.1/"), InvalidValueError),
    "sender endpoint with a #fragment": (lambda: OtlpSpanSink(ENDPOINT + "#x"), InvalidValueError),
    "sender base endpoint with a ?query": (lambda: OtlpMetricSink(ENDPOINT + "?k=v"), InvalidValueError),
    "sender endpoint with credentials": (lambda: OtlpSpanSink("http://u:p@127.0.0.1:9"), InvalidValueError),
    "sender endpoint with a space": (
        lambda: OtlpSpanSink(ENDPOINT + "/v1/traces x", traces_path=""),
        InvalidValueError,
    ),
    "sender endpoint with a non-ASCII path": (
        lambda: OtlpSpanSink(ENDPOINT + "/v1/tracés", traces_path=""),
        InvalidValueError,
    ),
    "sender endpoint host with an empty label": (lambda: OtlpSpanSink("http://a..b:4318"), InvalidValueError),
    "sender endpoint not a string": (lambda: OtlpSpanSink(42), InvalidTypeError),  # type: ignore[arg-type]
    "sender header Content-Length": (
        lambda: OtlpSpanSink(ENDPOINT, headers={"Content-Length": "5"}),
        InvalidValueError,
    ),
    "sender header content-type": (
        lambda: OtlpMetricSink(ENDPOINT, headers={"content-type": "text/plain"}),
        InvalidValueError,
    ),
    "sender timeout past an hour": (lambda: OtlpSpanSink(ENDPOINT, timeout=1e12), InvalidValueError),
    "metric sender timeout past an hour": (lambda: OtlpMetricSink(ENDPOINT, timeout=3601), InvalidValueError),
    "sender retries negative": (lambda: OtlpSpanSink(ENDPOINT, max_retries=-1), InvalidValueError),
    "sender retries as a float": (lambda: OtlpMetricSink(ENDPOINT, max_retries=1.0), InvalidTypeError),
    "sender backoff negative": (lambda: OtlpSpanSink(ENDPOINT, initial_backoff=-1), InvalidValueError),
    "sender backoff of zero": (lambda: OtlpMetricSink(ENDPOINT, initial_backoff=0), InvalidValueError),
    "SDK span sink export timeout past an hour": (
        lambda: SpanSink(exporter=InMemorySpanExporter(), export_timeout=1e12),
        InvalidValueError,
    ),
    "span sink header value with CR/LF": (
        lambda: OtlpSpanSink(ENDPOINT, headers={"a": "b\r\nX-Injected: 1"}),
        InvalidValueError,
    ),
    "span sink header name not a token": (
        lambda: OtlpSpanSink(ENDPOINT, headers={"a b": "c"}),
        InvalidValueError,
    ),
    "span sink header value not latin-1": (
        lambda: OtlpSpanSink(ENDPOINT, headers={"api-key": "\u20ac"}),
        InvalidValueError,
    ),
    "span sink header value an int": (lambda: OtlpSpanSink(ENDPOINT, headers={"a": 5}), InvalidTypeError),
    "metric sink header value with NUL": (
        lambda: OtlpMetricSink(ENDPOINT, headers={"a": "b\0"}),
        InvalidValueError,
    ),
    "metric interval out of range": (
        lambda: OtlpMetricSink(ENDPOINT, export_interval=0),
        InvalidValueError,
    ),
    "metric interval as None": (
        lambda: OtlpMetricSink(ENDPOINT, export_interval=None),
        InvalidTypeError,
    ),
    "SDK span sink with no exporter": (SpanSink, InvalidValueError),
    "SDK span sink with a non-exporter": (lambda: SpanSink(exporter=object()), InvalidTypeError),
    "SDK span sink resource a dict": (
        lambda: SpanSink(InMemorySpanExporter(), resource={"service.name": "x"}),  # type: ignore[arg-type]
        InvalidTypeError,
    ),
    "SDK span sink redactor not a Redactor": (
        lambda: SpanSink(InMemorySpanExporter(), redactor="none"),  # type: ignore[arg-type]
        InvalidTypeError,
    ),
    "OTLP span sink redactor not a Redactor": (
        lambda: OtlpSpanSink(ENDPOINT, redactor="none"),  # type: ignore[arg-type]
        InvalidTypeError,
    ),
    "JSON lines redactor not a Redactor": (
        lambda: JsonLinesSink(io.BytesIO(), redactor={"token"}),  # type: ignore[arg-type]
        InvalidTypeError,
    ),
    "logging sink redactor not a Redactor": (
        lambda: LoggingSink(redactor="none"),  # type: ignore[arg-type]
        InvalidTypeError,
    ),
    "JSON lines rotation of zero bytes": (
        lambda: JsonLinesSink(io.BytesIO(), max_bytes=0),
        InvalidValueError,
    ),
    "JSON lines backups negative": (lambda: JsonLinesSink(io.BytesIO(), backups=-1), InvalidValueError),
    "JSON lines rotation of a stream": (
        lambda: JsonLinesSink(io.BytesIO(), max_bytes=1024),
        InvalidValueError,
    ),
    "JSON lines target not a path or stream": (lambda: JsonLinesSink(42), InvalidTypeError),
    "reading from a non-source": (lambda: list(read_events(42)), InvalidTypeError),
    "reading from a text stream": (
        lambda: list(read_events(io.StringIO('{"type":"refused"}\n'))),  # type: ignore[arg-type]
        InvalidTypeError,
    ),
    "JSON lines to a text stream": (lambda: JsonLinesSink(io.StringIO()), InvalidTypeError),  # type: ignore[arg-type]
    "replay into a non-sink": (lambda: replay(io.BytesIO(), object()), InvalidTypeError),
    "replay batch of zero": (lambda: replay(io.BytesIO(), LoggingSink(), batch_size=0), InvalidValueError),
    "logging sink level as a string": (lambda: LoggingSink(level="INFO"), InvalidTypeError),
    "stall watch after zero seconds": (lambda: StallWatch(0), InvalidValueError),
    "stall watch after as a string": (lambda: StallWatch("30"), InvalidTypeError),
    "stall watch bus not a Bus": (lambda: StallWatch(30, bus=object()), InvalidTypeError),  # type: ignore[arg-type]
    "scrape endpoint port past 65535": (
        lambda: PrometheusEndpoint(PrometheusSink(), port=70000),
        InvalidValueError,
    ),
    "scrape endpoint port as a string": (
        lambda: PrometheusEndpoint(PrometheusSink(), port="9464"),
        InvalidTypeError,
    ),
    "scrape endpoint of no slots": (
        lambda: PrometheusEndpoint(PrometheusSink(), port=0, max_concurrent=0),
        InvalidValueError,
    ),
    "scrape endpoint timeout of zero": (
        lambda: PrometheusEndpoint(PrometheusSink(), port=0, timeout=0),
        InvalidValueError,
    ),
    "scrape endpoint header timeout NaN": (
        lambda: PrometheusEndpoint(PrometheusSink(), port=0, header_timeout=float("nan")),
        InvalidValueError,
    ),
}


@pytest.mark.parametrize(("call", "child"), BAD_ARGUMENTS.values(), ids=BAD_ARGUMENTS.keys())
async def test_bad_arguments_raise_the_right_child(
    call: Callable[[], Any], child: type[InvalidArgumentError]
) -> None:
    """Each bad argument raises exactly its child, which is also the matching builtin."""
    with pytest.raises(InvalidArgumentError) as info:
        result = call()
        if inspect.isawaitable(result):  # replay is a coroutine: it checks when awaited
            await result
    assert type(info.value) is child
    builtin = ValueError if child is InvalidValueError else TypeError
    assert isinstance(info.value, builtin)
