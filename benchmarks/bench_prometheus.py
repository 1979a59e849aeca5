"""Cost per event of our metric aggregation with the Prometheus scrape endpoint off and on.

The same checkpoint mix as the sinks benchmark (``bench_sinks._metric_mix``) is folded into a
``PrometheusSink`` in batches of 4096, in paired rounds: off (no endpoint) and on (an endpoint
on 127.0.0.1 scraped in OpenMetrics, with exemplars, ten times a second by a thread of this
process: ten times Prometheus's usual rate, and in-process so the GIL is shared). The scrape
renders from a snapshot; the request path only folds, so the two should be close.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from ckpt_events.benchmarks import report
from ckpt_events.benchmarks.bench_sinks import RESOURCE, _direct_metrics, _metric_mix
from ckpt_events.sinks.prometheus import PrometheusEndpoint, PrometheusSink

DEFAULT_JSON = Path(__file__).parent / "results" / "prometheus.json"
OPENMETRICS = "application/openmetrics-text; version=1.0.0"


def _feed(sink: PrometheusSink, chunks: list[list[Any]]) -> float:
    started = time.perf_counter()
    for chunk in chunks:
        sink.handle(chunk)
    return time.perf_counter() - started


def _scraper(url: str, stop: threading.Event, counts: list[int]) -> None:
    request = urllib.request.Request(url, headers={"Accept": OPENMETRICS})
    while not stop.wait(0.1):  # ends when the benchmark sets stop
        with urllib.request.urlopen(request, timeout=10) as reply:
            reply.read()
        counts[0] += 1


def _sdk(events: list[Any]) -> float:
    """The same events as one OpenTelemetry SDK call per measurement (InMemoryMetricReader)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    provider = MeterProvider(metric_readers=[InMemoryMetricReader()], resource=RESOURCE)
    meter = provider.get_meter("bench")
    started = time.perf_counter()
    _direct_metrics(meter, events)
    elapsed = time.perf_counter() - started
    provider.shutdown()
    return elapsed


def run(quick: bool = False) -> dict[str, Any]:
    """Paired rounds off/on; returns the figures and the table's rows."""
    events = _metric_mix(400 if quick else 2_000)
    chunks = [events[i : i + 4096] for i in range(0, len(events), 4096)]
    rounds = 5 if quick else 15
    off: list[float] = []
    on: list[float] = []
    scrapes = [0]
    sdk: list[float] = []
    for _ in range(rounds):
        sdk.append(_sdk(events))
        off.append(_feed(PrometheusSink(), chunks))
        sink = PrometheusSink()
        endpoint = PrometheusEndpoint(sink, "127.0.0.1", 0)
        _feed(sink, chunks[:1])  # something to render from the first scrape on
        stop = threading.Event()
        scraper = threading.Thread(target=_scraper, args=(endpoint.url, stop, scrapes))
        scraper.start()
        time.sleep(0.15)  # at least one scrape in flight or done before timing
        try:
            on.append(_feed(sink, chunks))
        finally:
            stop.set()
            scraper.join(10)
            endpoint.close()
    per_off = min(off) / len(events) * 1e6
    per_on = min(on) / len(events) * 1e6
    ratio = report.paired_ratio(on, off)
    vs_sdk = report.paired_ratio(on, sdk)
    rows = [
        ("metrics aggregation: us per event, scrape endpoint off", per_off, "", None),
        ("metrics aggregation: us per event, scrape endpoint on (10 scrapes/s)", per_on, "", None),
        ("metrics aggregation: on / off, paired rounds", ratio, "", None),
        (
            "metrics aggregation, endpoint on / OpenTelemetry SDK direct calls",
            vs_sdk,
            "<= 0.25",
            vs_sdk <= 0.25,
        ),
        ("metrics: us per event, OpenTelemetry SDK direct calls", min(sdk) / len(events) * 1e6, "peer", None),
    ]
    return {
        "quick": quick,
        "events": len(events),
        "rounds": rounds,
        "us_per_event_off": per_off,
        "us_per_event_on": per_on,
        "ratio_on_off": ratio,
        "ratio_on_vs_sdk": vs_sdk,
        "scrapes": scrapes[0],
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--quick", action="store_true", help="smaller runs")
    parser.add_argument(
        "--json", type=report.output_path, default=DEFAULT_JSON, help="where to write the results"
    )
    args = parser.parse_args(argv)
    with report.failure_in_one_line("prometheus"):
        result = run(quick=args.quick)
        rows = result.pop("rows")
        report.publish(
            "ckpt-events: the Prometheus scrape endpoint's cost on the event path", rows, args.json, result
        )
        return 0


if __name__ == "__main__":
    sys.exit(main())
