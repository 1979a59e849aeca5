"""The in-process OTLP path of the server benchmark, for counting its instructions.

``python -m ckpt_events.benchmarks.otlp_instructions REQUESTS URL`` makes ``REQUESTS`` requests'
worth of ``server_app``'s telemetry calls (an operation with two steps and their ``set()``
calls, no unit of work) on a ``Bus`` with ``configure(bus, otlp_endpoint=URL)``: the
``OtlpSpanSink`` and ``OtlpMetricSink`` encode and post them to the collector at ``URL``. The
calls go in batches of ``BATCH`` requests, each delivered by the bus and its spans exported
(``force_flush``) before the next, so that the queue never fills and every span is encoded and
sent. Run it under ``valgrind --tool=callgrind`` with ``REQUESTS`` and with 0, against a
collector in another process: the difference over ``REQUESTS`` is the path's instructions per
request, which the machine's load does not move (docs/benchmarks.md).
"""

from __future__ import annotations

import sys
from typing import Final

import anyio

from ckpt_events import Bus, Telemetry
from ckpt_events.sinks import configure
from ckpt_events.sinks.otel import OtlpMetricSink, OtlpMetricSinkStats, OtlpSpanSink, OtlpSpanSinkStats

__all__ = ["BATCH", "main", "run"]

#: Requests between two deliveries (900 spans: under the span sink's queue of 8,192).
BATCH: Final = 300


async def run(requests: int, endpoint: str) -> tuple[OtlpSpanSinkStats, OtlpMetricSinkStats]:
    """Make ``requests`` requests' calls (one more first, for what only a first one does) and
    return the sinks' counters once the bus has closed them."""
    async with Bus() as bus:
        configured = configure(bus, otlp_endpoint=endpoint, environ={})
        spans, metrics = configured.span_sink, configured.metric_sink
        assert isinstance(spans, OtlpSpanSink) and isinstance(metrics, OtlpMetricSink)
        tel = Telemetry(bus, kind="resources", instance="resources-0")

        def handle(size: int) -> int:
            with tel.operation("commit", checkpoint_id="c1") as op:
                with op.step("export") as step:
                    step.set(records=1)
                with op.step("write") as step:
                    step.set(records=1, bytes=size)
                op.set(records=1, bytes=size)
            return size

        for batch in [1, *[BATCH] * (requests // BATCH), requests % BATCH]:
            for _ in range(batch):
                handle(32)
            await bus.flush()
            spans.force_flush()
    return spans.stats(), metrics.stats()


def main(argv: list[str]) -> int:
    requests, endpoint = int(argv[0]), argv[1]
    spans, metrics = anyio.run(run, requests, endpoint)
    print(f"spans exported {spans.exported}, dropped {spans.dropped}; metric events {metrics.events}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
