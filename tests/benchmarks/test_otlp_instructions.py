"""The counting script of the in-process OTLP path sends every span and folds every event."""

from __future__ import annotations

import http.server

from ckpt_events.benchmarks.otlp_instructions import BATCH, run
from tests.http_servers import serving


class _Collector(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


async def test_every_request_is_encoded_and_sent_none_dropped() -> None:
    """A batch and a half of requests (and the first one): 3 spans and 2 metric events each, all exported."""
    requests = BATCH + BATCH // 2
    with serving(_Collector) as server:
        spans, metrics = await run(requests, f"http://127.0.0.1:{server.server_address[1]}")
    assert (spans.exported, spans.dropped, spans.export_failures) == (3 * (requests + 1), 0, 0)
    assert (metrics.events, metrics.export_failures) == (2 * (requests + 1), 0)
