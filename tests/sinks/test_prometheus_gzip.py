"""The scrape endpoint compresses a page with gzip when the scraper asks (Prometheus always does),
never when it does not: checked with real HTTP clients and, where installed, a real Prometheus."""

from __future__ import annotations

import gzip
import socket
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from ckpt_events.sinks.prometheus import PrometheusEndpoint, PrometheusSink
from tests.sinks.prom_server import running_prometheus
from tests.sinks.test_prometheus import _kinds

OPENMETRICS = "application/openmetrics-text; version=1.0.0"
DURATION = "gym_checkpoint_operation_duration_ms_milliseconds"


@contextmanager
def _endpoint() -> Iterator[PrometheusEndpoint]:
    sink = PrometheusSink()
    sink.handle(_kinds(50))
    with PrometheusEndpoint(sink, "127.0.0.1", 0) as endpoint:
        yield endpoint


def _raw(url: str, method: str = "GET", **headers: str) -> tuple[dict[str, str], bytes]:
    """(headers, body as sent): urllib decodes no content coding."""
    request = urllib.request.Request(url, headers=headers, method=method)
    with urllib.request.urlopen(request, timeout=10) as reply:
        return dict(reply.headers.items()), reply.read()


@pytest.mark.parametrize("accept", ["", OPENMETRICS])
def test_gzip_is_sent_when_asked_and_decompresses_to_the_same_page(accept: str) -> None:
    """Accept-Encoding: gzip (as Prometheus sends it) gets the page gzipped, 20 times smaller
    here, which decompresses to the plain page; no Accept-Encoding gets the plain page."""
    with _endpoint() as endpoint:
        plain_headers, plain = _raw(endpoint.url, Accept=accept)
        headers, body = _raw(endpoint.url, Accept=accept, **{"Accept-Encoding": "gzip"})
    assert "Content-Encoding" not in plain_headers
    assert headers["Content-Encoding"] == "gzip"
    assert headers["Content-Type"] == plain_headers["Content-Type"]
    assert headers["Vary"] == plain_headers["Vary"] == "Accept-Encoding"
    assert int(headers["Content-Length"]) == len(body) < len(plain) // 20
    assert gzip.decompress(body) == plain


@pytest.mark.parametrize(
    "accept_encoding, gzipped",
    [
        ("gzip", True),
        ("deflate, GZIP;q=0.5", True),
        ("*", True),
        ("identity", False),
        ("gzip;q=0", False),
        ("gzip;q=0.000, *", False),
        ("br, *;q=0", False),
        ("gzip;q=abc", False),
    ],
)
def test_accept_encoding_is_read_with_its_weights(accept_encoding: str, gzipped: bool) -> None:
    """gzip is chosen where it is acceptable (named or by ``*``) with a weight above 0, never
    where the scraper refused it (``q=0``) or the weight cannot be read."""
    with _endpoint() as endpoint:
        headers, body = _raw(endpoint.url, **{"Accept-Encoding": accept_encoding})
    assert (headers.get("Content-Encoding") == "gzip") is gzipped
    assert body.startswith(b"\x1f\x8b") is gzipped


def test_head_reports_the_gzipped_length_without_the_body() -> None:
    """HEAD answers as GET would: the same encoding and Content-Length, no body."""
    with _endpoint() as endpoint:
        get_headers, body = _raw(endpoint.url, **{"Accept-Encoding": "gzip"})
        head_headers, nothing = _raw(endpoint.url, "HEAD", **{"Accept-Encoding": "gzip"})
    assert nothing == b""
    assert head_headers["Content-Encoding"] == "gzip"
    assert abs(int(head_headers["Content-Length"]) - len(body)) < 64  # gzip's header has a time


def test_httpx_decodes_the_gzipped_page() -> None:
    """A client that asks for gzip by default (httpx) reads the same exposition as one that does not."""
    with _endpoint() as endpoint:
        reply = httpx.get(endpoint.url, timeout=10)
        _, plain = _raw(endpoint.url)
    assert reply.headers["Content-Encoding"] == "gzip"
    assert reply.content == plain


@contextmanager
def _recording_relay(port: int) -> Iterator[tuple[int, list[bytes]]]:
    """A TCP relay on 127.0.0.1 in front of ``port``: (its port, the replies it carried)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    replies: list[bytes] = []
    stop = threading.Event()

    def carry(client: socket.socket) -> None:
        with client, socket.create_connection(("127.0.0.1", port), timeout=5) as upstream:
            client.settimeout(5)
            upstream.sendall(client.recv(65536))  # one request per connection: the endpoint's way
            reply = b""
            while chunk := upstream.recv(65536):  # ends: the endpoint closes after its reply
                reply += chunk
            client.sendall(reply)
            replies.append(reply)

    def accept() -> None:
        while not stop.is_set():  # bounded by the test's end
            try:
                client = listener.accept()[0]
            except TimeoutError:
                continue
            threading.Thread(target=carry, args=(client,), daemon=True).start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield listener.getsockname()[1], replies
    finally:
        stop.set()
        acceptor.join()
        listener.close()


def test_a_real_prometheus_scrapes_the_gzipped_page(tmp_path: Path) -> None:
    """Prometheus asks for gzip, gets it (seen on the wire by a relay) and stores the series."""
    with _endpoint() as endpoint, _recording_relay(endpoint.port) as (port, replies):
        with running_prometheus(tmp_path, [f"127.0.0.1:{port}"]) as prom:
            prom.wait_for('up{job="ckpt"} == 1')
            series = prom.wait_for(f'{DURATION}_count{{nemo_gym_checkpoint_participant_kind="kind-49"}}')
            assert float(series[0]["value"][1]) == 1.0
        assert replies and all(b"\r\nContent-Encoding: gzip\r\n" in reply for reply in replies)
