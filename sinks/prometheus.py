"""A Prometheus scrape endpoint over our own in-process metric aggregation.

``PrometheusSink`` folds events into the same ``MetricTotals`` that ``OtlpMetricSink`` keeps
(a few dict operations per event under a lock, nothing else on the event loop);
``PrometheusEndpoint`` serves any source with a ``snapshot()`` of those totals on
``http://host:port/metrics``, rendered by ``prometheus-client`` from ``TotalsCollector`` at
scrape time only, in the Prometheus text format or, when the scraper asks for
``application/openmetrics-text``, in OpenMetrics with one exemplar (trace and span id) per
histogram bucket; gzipped when the scraper accepts gzip (Prometheus always does), never else.
Names and labels are the Collector's Prometheus exporter's (``ckpt_events.sinks._prom_names``).
``configure`` builds both for ``OTEL_METRICS_EXPORTER=prometheus``.

The server (``_scrape_server``) reads request heads on one thread and gives a connection a
thread only once its head is complete, at most ``max_concurrent`` at once (more are answered
``503``), and scrapes arriving while a page of their format is rendered share that render: a
head must arrive within ``header_timeout`` and the whole request end within
``timeout``, and a reply the socket does not take at once is written by that one thread as its
peer reads it (cut off at the timeout, counted in ``slow_readers``), so slow or idle peers
cannot hold the scrape's slots. It never touches the event
loop, and reads the totals under the sink's lock only for the copy (microseconds for the few
hundred series a fleet has).
"""

from __future__ import annotations

import errno
import gzip
import ipaddress
import operator
import os
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any, Final, Protocol, Self, TypeVar, cast
from urllib.parse import urlsplit

import anyio.to_thread

from ckpt_events import Bus, ConfigurationError, InvalidTypeError, InvalidValueError
from ckpt_events._errors import check_int, check_number, shown
from ckpt_events._logs import library_logger
from ckpt_events.sinks import _metric_keys as keys
from ckpt_events.sinks._bus_metrics import BusStatsCollector
from ckpt_events.sinks._cardinality import DEFAULT_CARDINALITY_LIMIT
from ckpt_events.sinks._metric_totals import (
    COUNTERS,
    DEFAULT_BOUNDARIES,
    HISTOGRAMS,
    HistogramPoint,
    MetricTotals,
    merged_histogram,
)
from ckpt_events.sinks._open_work import OpenWorkSnapshot
from ckpt_events.sinks._prom_names import label_name, metric_name, prometheus_type, unit_word
from ckpt_events.sinks._scrape_server import ScrapeServer, Unavailable, host_problem, listen_host
from ckpt_events.sinks._wire_safe import replace_surrogates
from ckpt_events.sinks.otlp._http import BUS_LINGER, MAX_TIMEOUT_S
from ckpt_events.vocab import OPEN_WORK_INSTRUMENTS, Instrument, InstrumentKind

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "METRICS_PATH",
    "PrometheusEndpoint",
    "PrometheusSink",
    "TotalsCollector",
    "TotalsSource",
    "prometheus_names",
]


logger: Final = library_logger("ckpt_events.sinks.prometheus")
DEFAULT_HOST: Final = "localhost"  # OTEL_EXPORTER_PROMETHEUS_HOST's default
DEFAULT_PORT: Final = 9464  # OTEL_EXPORTER_PROMETHEUS_PORT's default
METRICS_PATH: Final = "/metrics"
#: The methods the endpoint answers (``Allow``); another method HTTP defines is 405, an unknown one 501.
_ALLOWED_METHODS: Final = "GET, HEAD, OPTIONS"
#: zlib's default: a 6.7 MB page (2,000 kinds) to 131 KB in 83 ms, where 9 (prometheus-client's)
#: takes 168 ms for 124 KB and 1 takes 44 ms for 158 KB.
_GZIP_LEVEL: Final = 6
# Go's shortest form ("5", not "5.0"), as the Collector (client_golang) writes `le`.
_LE: Final = (*(str(int(b)) if float(b).is_integer() else repr(float(b)) for b in DEFAULT_BOUNDARIES), "+Inf")


_REPLACEMENT: Final = "\ufffd"
_P = TypeVar("_P")


class TotalsSource(Protocol):
    """Anything holding cumulative ``MetricTotals``: ``PrometheusSink``, ``OtlpMetricSink``."""

    start_ns: int

    def snapshot(self) -> MetricTotals:
        """A copy of the totals, safe to read while the original keeps counting."""
        ...


def prometheus_names() -> list[tuple[str, str, str, str]]:
    """(OpenTelemetry name, unit, kind, Prometheus family name) of every instrument we export."""
    return [
        (name, unit, prometheus_type(kind), metric_name(name, unit, kind))
        for name, kind, unit, _ in (*HISTOGRAMS, *COUNTERS, *OPEN_WORK_INSTRUMENTS)
    ]


class PrometheusSink:
    """A bus sink keeping the checkpoint metrics' cumulative totals for a scrape endpoint.

    Records what ``OtlpMetricSink`` records for the same events (it is the same aggregation),
    and exports nothing by itself: hand it to ``PrometheusEndpoint``. Each instrument keeps at
    most ``cardinality_limit`` label sets (OpenTelemetry's 2,000 by default); samples of sets
    first seen after that go to its one ``otel_metric_overflow="true"`` series, counted in
    ``overflowed`` and logged once.
    """

    interests: Final = keys.INTERESTS
    blocking: Final = False  # handle() only folds counts
    linger: Final = BUS_LINGER

    def __init__(self, *, cardinality_limit: int = DEFAULT_CARDINALITY_LIMIT) -> None:
        self.start_ns = time.time_ns()
        self._totals = MetricTotals(cardinality_limit, owner="PrometheusSink")
        self._lock = threading.Lock()
        self._owner = os.getpid()
        self._said_forked = False

    def handle(self, batch: list[Any]) -> None:
        """Fold ``batch`` into the totals; in a process forked from the one that made the sink,
        say once that the endpoint serving them (made with it, in that process) does not."""
        if not self._said_forked and os.getpid() != self._owner:
            self._say_forked()
        with self._lock:
            self._totals.add(batch)

    def _say_forked(self) -> None:
        # configure() at import under gunicorn --preload: the master binds the port and serves
        # its own (empty) totals; 4 workers' 400 commits scraped as none, and nothing said so.
        self._said_forked = True
        logger.warning(
            "PrometheusSink: this process (pid %d) was forked from the one that made it (pid %d), "
            "whose scrape endpoint does not serve what this process counts: call configure() in "
            "each process after the fork (instrument() does it in each worker's lifespan; not at "
            "import under gunicorn --preload)",
            os.getpid(),
            self._owner,
        )

    def snapshot(self) -> MetricTotals:
        """A copy of the totals so far."""
        with self._lock:
            return self._totals.snapshot()

    @property
    def overflowed(self) -> int:
        """Measurements recorded in an instrument's overflow series, its label sets being full."""
        with self._lock:
            return self._totals.overflow.measurements

    @property
    def invalid(self) -> int:
        """Measurements refused as OpenTelemetry's SDK refuses them (a negative amount or
        duration, a non-finite or negative loop lag: an event built by hand), logged once."""
        with self._lock:
            return self._totals.invalid.measurements

    @property
    def untracked(self) -> int:
        """Operations started while ``MAX_OPEN`` (10,000) were open already: not in
        ``gym_checkpoint_open_operations`` nor ``..._oldest_open_s_seconds``, which undercount."""
        with self._lock:
            return self._totals.open_work.untracked


class TotalsCollector:
    """A ``prometheus_client`` collector rendering a source's totals at each scrape.

    A label value UTF-8 cannot carry (a lone surrogate) is written with U+FFFD in its place,
    as our OTLP encoder does, and counted once per label set in ``replaced_values``; label sets
    then written alike are one series, holding their sum.
    """

    def __init__(self, source: TotalsSource) -> None:
        self.source = source
        #: Label values written with U+FFFD for a surrogate (once per label set).
        self.replaced_values = 0
        # One entry per key of the totals: bounded by their cardinality limit per instrument.
        self._labels: dict[tuple[Any, ...], dict[str, str]] = {}
        # Keys whose labels hold U+FFFD: only these can be written like another key.
        self._may_collide: set[tuple[Any, ...]] = set()

    def _labels_of(self, key: tuple[Any, ...]) -> dict[str, str]:
        cached = self._labels.get(key)
        if cached is None:
            attributes = keys.attributes_of(key)
            # The overflow attribute is a boolean: "true", as the Collector's exporter writes it.
            labels = {
                label_name(k): v if isinstance(v, str) else str(v).lower() for k, v in attributes.items()
            }
            # One surrogate (a kind from os.fsdecode, say) failed every scrape from then on:
            # the page is encoded as UTF-8 as a whole.
            cached = self._labels[key] = {k: replace_surrogates(v) for k, v in labels.items()}
            self.replaced_values += sum(cached[k] != v for k, v in labels.items())
            if any(_REPLACEMENT in v for v in cached.values()):
                self._may_collide.add(key)
        return cached

    def _series(
        self, points: dict[tuple[Any, ...], _P], merge: Callable[[_P, _P], _P]
    ) -> Iterator[tuple[dict[str, str], _P]]:
        """(labels, point) per series: keys whose labels are written alike (values differing only
        in what U+FFFD replaced, or in U+FFFD itself) merged into one, as a page must hold each
        label set once (Prometheus keeps one of duplicate samples: 1 refusal of 3)."""
        alike: dict[tuple[tuple[str, str], ...], tuple[dict[str, str], _P]] = {}
        for key, point in points.items():
            labels = self._labels_of(key)
            if key not in self._may_collide:
                yield labels, point
                continue
            written = tuple(labels.items())
            held = alike.get(written)
            alike[written] = (labels, point if held is None else merge(held[1], point))
        yield from alike.values()

    def describe(self) -> list[Any]:
        """Every family ``collect`` may yield, without samples: a registry already holding one
        of these names refuses the collector at ``register`` (``collect`` is not called)."""
        from prometheus_client.metrics_core import Metric

        # Without names, a registry took a second collector, or a user's own metric of the same
        # name, and every page it rendered then had a family twice: Prometheus fails the scrape.
        families = []
        for name, kind, unit, description in (*HISTOGRAMS, *COUNTERS, *OPEN_WORK_INSTRUMENTS):
            family = metric_name(name, unit, kind)
            if kind is InstrumentKind.COUNTER:
                family = family.removesuffix("_total")  # as ``collect`` names a counter's family
            families.append(Metric(family, description, prometheus_type(kind), unit_word(unit)[0]))
        return families

    def collect(self) -> Iterator[Any]:
        """One family per instrument with points, from one snapshot of the totals."""
        from prometheus_client.metrics_core import Metric
        from prometheus_client.samples import Exemplar

        # No _created samples: the Collector's exporter writes none, and the series must match.
        totals = self.source.snapshot()
        for (name, kind, unit, description), histogram in zip(
            HISTOGRAMS, (totals.durations, totals.lags), strict=True
        ):
            if not histogram:
                continue
            family = metric_name(name, unit, kind)
            metric = Metric(family, description, prometheus_type(kind), unit_word(unit)[0])
            for labels, point in self._series(histogram, merged_histogram):
                _add_histogram(metric, family, labels, point, Exemplar)
            yield metric
        for (name, kind, unit, description), sums in zip(COUNTERS, totals.sums, strict=True):
            if not sums:
                continue
            family = metric_name(name, unit, kind)
            base = family.removesuffix("_total")
            metric = Metric(base, description, prometheus_type(kind), unit_word(unit)[0])
            for labels, total in self._series(sums, operator.add):
                metric.add_sample(family, labels, total)
            yield metric
        if totals.open is not None:
            yield from self._open_work(totals.open, Metric)

    def _open_work(self, snapshot: OpenWorkSnapshot, metric_class: Any) -> Iterator[Any]:
        """The open operations, the oldest one's age and the last publish, as gauges."""
        counter, oldest, published = OPEN_WORK_INSTRUMENTS
        # Merged as the SDK would one attribute set: open operations add up, the oldest is the oldest.
        values: tuple[tuple[Instrument, dict[tuple[Any, ...], Any], Callable[[Any, Any], Any]], ...] = (
            (counter, snapshot.open, operator.add),
            (oldest, snapshot.oldest_s, max),
        )
        for (name, kind, unit, description), points, merge in values:
            if not points:
                continue
            family = metric_name(name, unit, kind)
            metric = metric_class(family, description, prometheus_type(kind), unit_word(unit)[0])
            for labels, value in self._series(points, merge):
                metric.add_sample(family, labels, value)
            yield metric
        if snapshot.last_published_ts is not None:
            name, kind, unit, description = published
            family = metric_name(name, unit, kind)
            metric = metric_class(family, description, prometheus_type(kind), unit_word(unit)[0])
            metric.add_sample(family, {}, snapshot.last_published_ts)
            yield metric


def _add_histogram(
    metric: Any, family: str, labels: dict[str, str], point: HistogramPoint, exemplar: Any
) -> None:
    cumulative = 0
    for le, count, event, value in zip(
        _LE, point.buckets, point.exemplars, point.exemplar_values, strict=True
    ):
        cumulative += count
        sample_exemplar = None
        if event is not None:
            sample_exemplar = exemplar(
                {"trace_id": f"{event.trace_id:032x}", "span_id": f"{event.span_id:016x}"},
                value,
                event.end_ns / 1e9,
            )
        metric.add_sample(family + "_bucket", {**labels, "le": le}, cumulative, exemplar=sample_exemplar)
    metric.add_sample(family + "_count", labels, point.count)
    metric.add_sample(family + "_sum", labels, point.total)


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


def _handler(registry: Any) -> type[BaseHTTPRequestHandler]:
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


class PrometheusEndpoint:
    """``http://host:port/metrics`` serving ``source``'s totals until ``close``.

    A context manager, plain or async (``with``/``async with``: closed at the end), as the other
    servers are. ``port=0`` picks a free port (read ``port``); ``ports=N`` takes the first free one
    of ``port`` to ``port + N - 1`` (a port per worker process of one app). ``host`` is a name
    or an address, an IPv6 one bare or in brackets (``::1``, ``[::1]``; ``host`` holds it bare);
    ``""`` is every interface, as to the OS (``host`` holds ``0.0.0.0``), and a wildcard's ``url``
    names this machine's loopback (``127.0.0.1``, ``[::1]``). Binding fails with
    ``ConfigurationError`` naming the address; brackets around anything else, a ``:`` in a host
    that is not an IPv6 address (``localhost:9464``), a port outside 0-65535, ``max_concurrent``
    below 1 or a timeout that is not a number of seconds in (0, 3600] raise ``InvalidValueError``
    (``InvalidTypeError``: not a str or a number) before anything is bound. ``max_concurrent``
    scrapes run at once; a connection must send its request head within ``header_timeout`` and
    read its whole reply within ``timeout`` (both from its accept), else it is closed; a slot is
    held while a page is rendered, never while a peer reads it. Given a ``bus``, the page also
    says what became of the events each of its sinks was offered
    (``ckpt_events_sink_events_total{sink, outcome}``: delivered, dropped, failed, abandoned;
    ``configure()`` passes its bus).
    """

    def __init__(
        self,
        source: TotalsSource,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        *,
        max_concurrent: int = 8,
        timeout: float = 5.0,
        header_timeout: float = 2.0,
        bus: Bus | None = None,
        ports: int = 1,
    ) -> None:
        # Unchecked, max_concurrent=0 answered every scrape 503 and timeout=0 closed every
        # connection unanswered, for the life of the endpoint; port=70000 was an OverflowError.
        port_message = f"port must be a TCP port number from 0 to 65535, not {shown(port)}"
        if check_int(port, port_message) > 65535:
            raise InvalidValueError(port_message)
        ports_message = f"ports must be an int from 1 to {65536 - port} for port {port}, not {shown(ports)}"
        if check_int(ports, ports_message, minimum=1) > 65536 - port or (ports > 1 and port == 0):
            raise InvalidValueError(ports_message)
        check_int(
            max_concurrent, f"max_concurrent must be an int >= 1, not {shown(max_concurrent)}", minimum=1
        )
        if not isinstance(host, str):
            raise InvalidTypeError(f"host must be a str, not {shown(host)}")
        problem = host_problem(host)
        if problem is not None:
            raise InvalidValueError(f"host {shown(host)} {problem}; put the port in port")
        # "" is 0.0.0.0 to bind(): named so, it shows in ``host`` and the errors below (":9464").
        host = listen_host(host) or "0.0.0.0"
        for name, seconds in (("timeout", timeout), ("header_timeout", header_timeout)):
            check_number(
                seconds,
                f"{name} must be seconds in (0, {MAX_TIMEOUT_S:g}], not {shown(seconds)}",
                high=MAX_TIMEOUT_S,
                low_open=True,
            )
        try:
            from prometheus_client import CollectorRegistry
        except ImportError:
            raise ConfigurationError(
                "OTEL_METRICS_EXPORTER=prometheus needs prometheus-client: "
                "pip install 'ckpt-events[prometheus]'"
            ) from None
        self.source = source
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = TotalsCollector(source)
        # Cast: prometheus-client before 0.24 typed register() with its Collector ABC, which ours
        # satisfy at runtime (collect, describe) without deriving from it; from 0.24 a Protocol.
        self.registry.register(cast("Collector", self.collector))
        if bus is not None:  # what each of its sinks lost, beside what they counted
            self.registry.register(cast("Collector", BusStatsCollector(bus)))
        self._server = self._bind(host, port, ports, max_concurrent, header_timeout, timeout)
        self.host = host
        self.port: int = self._server.server_address[1]
        self._closed = False
        self._thread = threading.Thread(
            target=self._server.serve_forever,  # woken by work, no poll: an idle server sleeps
            name=f"ckpt-events-prometheus-{self.port}",
            daemon=True,
        )
        self._thread.start()

    def _bind(
        self, host: str, port: int, ports: int, max_concurrent: int, header_timeout: float, timeout: float
    ) -> ScrapeServer:
        """The server on the first of ``ports`` ports from ``port`` that is free: each worker
        process of one app (uvicorn ``--workers``, gunicorn) configures its own endpoint, and
        one port stopped the whole server at the second worker's startup."""
        for candidate in range(port, port + ports):
            try:
                return ScrapeServer(
                    (host, candidate),
                    _handler(self.registry),
                    max_concurrent,
                    header_timeout=header_timeout,
                    timeout=timeout,
                )
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE and candidate < port + ports - 1:
                    continue  # another worker's (or another server's): the next one
                failure = exc
                break
        where = f"{host}:{port}" if ports == 1 else f"{host}:{port}-{port + ports - 1}"
        if failure.errno != errno.EADDRINUSE:
            fix = "set OTEL_EXPORTER_PROMETHEUS_HOST/OTEL_EXPORTER_PROMETHEUS_PORT to a free address"
        elif ports == 1:
            fix = (
                "set OTEL_EXPORTER_PROMETHEUS_PORT to a free port; under uvicorn --workers N or "
                "gunicorn -w N, set CKPT_EVENTS_PROMETHEUS_PORTS=N too, a port per worker process "
                "('Several worker processes' in docs/fastapi.md)"
            )
        else:
            fix = (
                f"every one is in use: CKPT_EVENTS_PROMETHEUS_PORTS must be at least the number of "
                f"worker processes, and the {ports} ports from OTEL_EXPORTER_PROMETHEUS_PORT free"
            )
        raise ConfigurationError(
            f"cannot serve Prometheus metrics on {where} ({failure.strerror or failure}); {fix}"
        ) from None

    @property
    def url(self) -> str:
        """The metrics URL; for a wildcard host (``0.0.0.0``, ``::``), at this machine's loopback
        of its family: no client can reach "every interface" (``http://:9464`` was no URL at all)."""
        host = self.host
        bound = ipaddress.ip_address(self._server.server_address[0].partition("%")[0])
        if bound.is_unspecified:
            host = "::1" if bound.version == 6 else "127.0.0.1"
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}{METRICS_PATH}"

    @property
    def refused(self) -> int:
        """Connections answered 503 (with ``Retry-After: 1``): ``max_concurrent`` scrapes were
        running, no thread could be started for one, every place for a connection waiting for
        its request head was taken by one that had just arrived, or the render a scrape joined
        had not ended by that scrape's ``timeout``."""
        return self._server.refused

    @property
    def timed_out(self) -> int:
        """Connections closed for not sending a request head within ``header_timeout``."""
        return self._server.timed_out

    @property
    def displaced(self) -> int:
        """Connections without a complete request head closed to make room for a new one, once
        as many waited as the endpoint holds (128 from one address, 256 in all): the peer sees the
        connection reset, having sent nothing in time, as an idle peer or a CPU-starved client."""
        return self._server.displaced

    @property
    def serving(self) -> int:
        """Scrapes holding one of the endpoint's slots now (rendering, or sending the start of
        their reply): 0 once every scrape's reply is written or handed on. A peer sees its reply
        begin a moment before its slot is free again."""
        return self._server.serving

    @property
    def slow_readers(self) -> int:
        """Replies cut off because their peer did not read them to the end within ``timeout``
        of its connecting, or was the longest still reading when 32 others were: a peer that
        reads slowly or not at all, never holding a scrape's slot meanwhile."""
        return self._server.slow_readers

    @property
    def failed(self) -> int:
        """Scrapes answered 500: rendering the page raised (the first one is logged, with its
        traceback, on ``ckpt_events.sinks.prometheus``)."""
        return self._server.failed

    @property
    def accept_failures(self) -> int:
        """Connections the endpoint could not accept (out of descriptors, say): each retried
        after a pause, never in a loop (the first is logged)."""
        return self._server.accept_failures

    @property
    def replaced_values(self) -> int:
        """Label values written with U+FFFD for a lone surrogate (``TotalsCollector``'s count)."""
        return self.collector.replaced_values

    def close(self) -> None:
        """Stop serving and release the port. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5.0)

    async def aclose(self) -> None:
        """``close`` off the event loop (it waits for the serving thread)."""
        await anyio.to_thread.run_sync(self.close)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
