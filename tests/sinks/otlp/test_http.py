"""One OTLP/HTTP sender (``ckpt_events.sinks.otlp._http``) against a real HTTP server on 127.0.0.1:
compression, retries as the OTLP spec says, a final status, bad arguments."""

from __future__ import annotations

import gzip
import http.server
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from ckpt_events import InvalidTypeError, InvalidValueError, __version__
from ckpt_events.sinks.otlp._http import (
    OtlpHttpSender,
    check_protocol,
    resource_with_service_name,
    signal_sender,
)
from tests.http_servers import serving


@contextmanager
def _collector(statuses: list[int]) -> Iterator[tuple[str, list[tuple[dict[str, str], bytes]]]]:
    """A server answering each POST with the next of ``statuses`` (then 200); yields its URL and
    what it received (headers, body)."""
    received: list[tuple[dict[str, str], bytes]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # kept alive, as the sender expects

        def do_POST(self) -> None:  # noqa: N802
            received.append((dict(self.headers), self.rfile.read(int(self.headers["content-length"]))))
            status = statuses.pop(0) if statuses else 200
            self.send_response(status)
            self.send_header("Retry-After", "0")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: Any) -> None:
            pass

    with serving(Handler) as server:
        yield f"http://127.0.0.1:{server.server_port}/v1/traces", received


def test_a_retryable_status_is_retried_then_accepted_and_the_body_is_gzipped() -> None:
    """503 and 429 are tried again after a backoff; the 2xx that follows is accepted."""
    with _collector([503, 429]) as (url, received):
        sender = OtlpHttpSender(
            url,
            content_type="application/json",
            headers={"x-team": "rl"},
            compression="gzip",
            initial_backoff=0.01,
        )
        try:
            result = sender.send(b'{"resourceSpans":[]}')
        finally:
            sender.close()
    assert (result.accepted, result.attempts, result.status) == (True, 3, 200)
    assert len(received) == 3
    headers, body = received[-1]
    assert gzip.decompress(body) == b'{"resourceSpans":[]}'
    assert headers["Content-Type"] == "application/json" and headers["Content-Encoding"] == "gzip"
    assert headers["x-team"] == "rl"


def test_another_status_is_final() -> None:
    """A 400 is not retried: one attempt, not accepted."""
    with _collector([400]) as (url, received):
        sender = OtlpHttpSender(url, content_type="application/x-protobuf", initial_backoff=0.01)
        try:
            result = sender.send(b"\x0a\x00")
        finally:
            sender.close()
    assert (result.accepted, result.attempts, result.status) == (False, 1, 400)
    assert [body for _, body in received] == [b"\x0a\x00"]


def test_retries_stop_after_max_retries() -> None:
    """A collector that stays busy gets max_retries + 1 attempts, then the send gives up."""
    with _collector([503] * 10) as (url, received):
        sender = OtlpHttpSender(url, content_type="application/json", max_retries=2, initial_backoff=0.01)
        try:
            result = sender.send(b"{}")
        finally:
            sender.close()
    assert (result.accepted, result.attempts, result.status) == (False, 3, 503)
    assert len(received) == 3


def test_https_to_a_plain_http_collector_says_the_tls_handshake_failed() -> None:
    """``https://`` to a collector serving plain HTTP: the handshake fails and the result says so
    (it was "got no answer", and replay asked whether a collector listened there)."""
    with _collector([]) as (url, received):
        sender = OtlpHttpSender(
            url.replace("http://", "https://"), content_type="application/x-protobuf", max_retries=0
        )
        try:
            result = sender.send(b"\x0a\x00")
        finally:
            sender.stop()
    assert (result.accepted, result.status, received) == (False, None, [])
    assert result.unreadable is not None and result.unreadable.startswith("failed the TLS handshake (SSL")


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"url": "collector:4318"}, InvalidValueError),
        ({"compression": "zstd"}, InvalidValueError),
        ({"timeout": True}, InvalidTypeError),
        ({"timeout": 0}, InvalidValueError),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, Any], error: type[Exception]) -> None:
    """A URL that is not http(s), an unknown compression, a timeout that is not > 0 seconds."""
    options = {"url": "http://127.0.0.1:4318/v1/traces", "content_type": "application/json", **kwargs}
    with pytest.raises(error):
        OtlpHttpSender(options.pop("url"), **options)


def test_a_signal_sender_joins_its_path_and_the_resource_names_a_service() -> None:
    """The signal's path goes after the base URL (none: the URL as is); content type by protocol."""
    common: dict[str, Any] = {"headers": None, "timeout": 1.0, "compression": "none", "max_retries": 0}
    traces = signal_sender(
        "http://c:4318/", "/v1/traces", protocol="http/json", initial_backoff=1.0, **common
    )
    exact = signal_sender("http://c:4318/x", "", protocol="http/protobuf", initial_backoff=1.0, **common)
    assert (traces.url, traces._headers["Content-Type"]) == ("http://c:4318/v1/traces", "application/json")
    assert (exact.url, exact._headers["Content-Type"]) == ("http://c:4318/x", "application/x-protobuf")
    with pytest.raises(InvalidValueError, match="http/json"):
        check_protocol("grpc")
    sdk = {"telemetry.sdk.language": "python", "telemetry.sdk.name": "ckpt_events"}
    sdk["telemetry.sdk.version"] = __version__
    assert resource_with_service_name(None) == {"service.name": "unknown_service", **sdk}
    assert resource_with_service_name({"service.name": "s", "n": 1}) == {"service.name": "s", **sdk, "n": 1}
    theirs = {"telemetry.sdk.name": "opentelemetry", "telemetry.sdk.version": "1.0"}
    assert resource_with_service_name(theirs) == {"service.name": "unknown_service", **sdk, **theirs}


@pytest.mark.parametrize(
    ("url", "headers"),
    [
        ("https://user:S3CRET@collector:4318/v1/traces", {}),
        ("http://127.0.0.1:4318/v1/traces", {"Authorization": "Bearer S3CRET\u20ac"}),  # not latin-1
        ("http://127.0.0.1:4318/v1/traces", {"Authorization": b"Bearer S3CRET"}),  # bytes, not str
    ],
)
def test_a_refused_endpoint_or_header_is_not_echoed_with_its_credential(
    url: str, headers: dict[str, Any]
) -> None:
    """The sender's one-line error names the endpoint or header and what is wrong, never the
    password or the header's value: the error is printed and logged."""
    with pytest.raises((InvalidValueError, InvalidTypeError)) as info:
        OtlpHttpSender(url, content_type="application/x-protobuf", headers=headers)
    assert "S3CRET" not in str(info.value)
    with pytest.raises((InvalidValueError, InvalidTypeError)) as info:
        signal_sender(
            url.rsplit("/v1", 1)[0],
            "/v1/traces",
            protocol="http/protobuf",
            headers=headers,
            timeout=1.0,
            compression="none",
            max_retries=0,
            initial_backoff=0.1,
        )
    assert "S3CRET" not in str(info.value)
