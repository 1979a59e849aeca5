"""What a scrape gets: the endpoint's request handler over a ``prometheus_client`` registry.

``scrape_handler(registry)`` is the ``BaseHTTPRequestHandler`` class ``ScrapeServer``
(``_scrape_server``) runs for each request of ``PrometheusEndpoint``
(``ckpt_events.sinks.prometheus``): ``/metrics`` answered to ``GET`` and ``HEAD``, other paths
404, other methods 405 or 501; the format chosen from ``Accept`` (weights and versions read
first), gzip from ``Accept-Encoding``; and scrapes of a format whose page is being rendered
share that render.
"""

from __future__ import annotations

import gzip
import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import Any, Final
from urllib.parse import urlsplit

from ckpt_events.sinks._scrape_server import Unavailable

__all__ = ["METRICS_PATH", "scrape_handler"]

METRICS_PATH: Final = "/metrics"
#: The methods the endpoint answers (``Allow``); another method HTTP defines is 405, an unknown one 501.
_ALLOWED_METHODS: Final = "GET, HEAD, OPTIONS"
#: zlib's default: a 6.7 MB page (2,000 kinds) to 131 KB in 83 ms, where 9 (prometheus-client's)
#: takes 168 ms for 124 KB and 1 takes 44 ms for 158 KB.
_GZIP_LEVEL: Final = 6


class _Render:
    """One page being rendered, and what the scrapes waiting for it get."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.body = b""
        self.failed: BaseException | None = None


class _SharedRenders:
    """Scrapes asking for a format whose page is being rendered wait for that render and get its
    bytes: rendering is Python under the GIL, and eight renders of a 6.9 MB page at once (2,000
    kinds) cost the app's event loop 160 to 290 ms of lag and the process +330 MiB. A waiting
    scrape gets totals as of the render it joined, at most one render old, or ``Unavailable``
    (503) if that render has not ended by the scrape's own deadline."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[str, _Render] = {}

    def page(self, variant: str, render: Any, deadline: float) -> bytes:
        """The page ``variant`` (its content type and coding): rendered by ``render()``, or by
        the render of that variant under way if it ends by ``deadline`` (``time.monotonic()``)."""
        with self._lock:
            shared = self._running.get(variant)
            if shared is None:
                mine = self._running[variant] = _Render()
        if shared is not None:
            # Until this scrape's own deadline, then 503: a TimeoutError here is an OSError, taken
            # for the scraper going away, and the connection was closed with no answer.
            if not shared.done.wait(max(deadline - time.monotonic(), 0.0)):
                raise Unavailable("the render this scrape joined did not end by its deadline")
            if shared.failed is not None:
                raise RuntimeError("the render this scrape waited for failed") from shared.failed
            return shared.body
        try:
            mine.body = render()
        except BaseException as exc:
            mine.failed = exc
            raise
        finally:
            with self._lock:
                del self._running[variant]
            mine.done.set()
        return mine.body


def _weight(parameters: list[str]) -> float:
    """The ``q`` among an Accept item's parameters (1 without one); 0 where it cannot be read."""
    for parameter in parameters:
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "q":
            try:
                return float(value)
            except ValueError:
                return 0.0
    return 1.0


def _readable_version(parameters: list[str]) -> bool:
    """Whether an Accept item's ``version`` parameter, if any, is a release number (``1.0.0``)."""
    for parameter in parameters:
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "version":
            return all(part.isdigit() and part.isascii() for part in value.strip().split("."))
    return True


def _acceptable(accept: str) -> str:
    """``accept`` without its media ranges weighted 0 or with a version that is no release number:
    prometheus-client reads no weights, so ``application/openmetrics-text;q=0`` got the format it
    refuses (RFC 9110 12.4.2); up to 0.22.1 it read no version either (``version=abc`` got
    OpenMetrics), from 0.23 it raised on one, and the text format was the answer."""
    return ",".join(
        item
        for item in accept.split(",")
        if _weight(item.split(";")[1:]) > 0 and _readable_version(item.split(";")[1:])
    )


def _accepts_gzip(accept_encoding: str) -> bool:
    """Whether an ``Accept-Encoding`` value admits gzip: named (or ``x-gzip``), else covered by
    ``*``, with a weight above 0 (RFC 9110 12.5.3). A weight that cannot be read refuses it:
    the plain page is always acceptable, a page the scraper cannot decode is not."""
    weights: dict[str, float] = {}
    for item in accept_encoding.split(","):
        coding, *parameters = (part.strip() for part in item.split(";"))
        weight = _weight(parameters)
        if coding:
            weights.setdefault(coding.lower(), weight)
    for coding in ("gzip", "x-gzip", "*"):
        if coding in weights:
            return weights[coding] > 0
    return False


def scrape_handler(registry: Any) -> type[BaseHTTPRequestHandler]:
    """The handler class answering scrapes with pages ``registry`` renders (one per endpoint:
    its renders are shared by that endpoint's scrapes only)."""
    from prometheus_client.exposition import choose_encoder

    renders = _SharedRenders()

    class Handler(BaseHTTPRequestHandler):
        # http.server's default, HTTP/0.9, answered a request line it could not parse (garbage,
        # "HTTP/2.0", an HTTP/2 preface) with a bare HTML page: no status line, no headers.
        default_request_version = "HTTP/1.0"

        def do_GET(self) -> None:  # the http.server hook name
            self._answer(send_body=True)

        def do_HEAD(self) -> None:
            # Every HTTP server must support HEAD (RFC 9110 9.1): it was 501 as any method but GET.
            self._answer(send_body=False)

        def do_OPTIONS(self) -> None:
            self._reply(200, "text/plain; charset=utf-8", b"", send_body=True, allow=True)

        def do_POST(self) -> None:
            self._not_allowed()

        def do_PUT(self) -> None:
            self._not_allowed()

        def do_DELETE(self) -> None:
            self._not_allowed()

        def do_PATCH(self) -> None:
            self._not_allowed()

        def do_TRACE(self) -> None:
            self._not_allowed()

        def do_CONNECT(self) -> None:
            self._not_allowed()

        def _not_allowed(self) -> None:
            # A method HTTP defines is 405 with Allow (RFC 9110 15.5.6); an unknown one stays 501.
            body = f"method not allowed: {_ALLOWED_METHODS}\n".encode()
            self._reply(405, "text/plain; charset=utf-8", body, send_body=True, allow=True)

        def _answer(self, *, send_body: bool) -> None:
            if urlsplit(self.path).path != METRICS_PATH:
                body = f"not found: metrics are at {METRICS_PATH}\n".encode()
                self._reply(404, "text/plain; charset=utf-8", body, send_body=send_body)
                return
            try:
                encoder, content_type = choose_encoder(_acceptable(self.headers.get("Accept", "")))
            except TypeError:
                # prometheus-client compares an unparsable version ("version=abc") with numbers:
                # the scrape thread died with a traceback and no answer. Accept is a preference.
                encoder, content_type = choose_encoder("")
            deadline = self.request.deadline  # the _Prefetched the server hands every handler
            # Prometheus always asks for gzip: a page of 2,000 kinds is 6.7 MB plain, 131 KB gzipped.
            if _accepts_gzip(self.headers.get("Accept-Encoding", "")):
                body = renders.page(
                    content_type + "; gzip", lambda: gzip.compress(encoder(registry), _GZIP_LEVEL), deadline
                )
                self._reply(200, content_type, body, send_body=send_body, coding="gzip")
            else:
                body = renders.page(content_type, lambda: encoder(registry), deadline)
                self._reply(200, content_type, body, send_body=send_body, coding="identity")

        def _reply(
            self,
            status: int,
            content_type: str,
            body: bytes,
            *,
            send_body: bool,
            allow: bool = False,
            coding: str | None = None,
        ) -> None:
            """``coding``: the page's content coding, for a reply whose coding was chosen by
            the request's Accept-Encoding (``Vary`` tells caches so); ``None`` for others."""
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            if coding is not None:
                if coding != "identity":
                    self.send_header("Content-Encoding", coding)
                self.send_header("Vary", "Accept-Encoding")
            if allow:
                self.send_header("Allow", _ALLOWED_METHODS)
            self.end_headers()
            if send_body:
                self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # one line per scrape on stderr would drown a participant's log

    return Handler
