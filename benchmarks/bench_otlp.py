"""OTLP export benchmarks: our encoder against OpenTelemetry's, and the whole path to a collector.

* encode: CPU per span to turn finished events into an OTLP/HTTP protobuf body, ours
  (``SpanEncoder``, straight from events) vs ``SpanSink`` building ``ReadableSpan``s and
  OpenTelemetry's ``encode_spans(...).SerializeToString()``; and OpenTelemetry's encoding
  alone (spans prebuilt); our JSON body for reference.
* to rotel (when the ``rotel`` package is installed): process CPU per span (emitting,
  bus, sink, encoding, HTTP; the collector is another process) for emit + ``OtlpSpanSink``
  vs the OpenTelemetry SDK (tracer, ``BatchSpanProcessor``, ``OTLPSpanExporter``).
* paced, to rotel: a commit every millisecond for a while, as a busy fleet emits them: CPU per
  span and requests with the prompt export of finished operations (the default) against the
  batch schedule alone (``prompt_interval=None`` and the bus's 50 ms linger: as before it).

``python -m ckpt_events.benchmarks.bench_otlp [--quick]`` prints the table; ``run`` returns the rows.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import anyio
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from ckpt_events import Bus, Redactor, Telemetry
from ckpt_events.sinks.otel import OtlpSpanSink, SpanSink
from ckpt_events.sinks.otlp import SpanEncoder

from . import report, rotel
from .bench_sinks import CHUNK, _direct_spans, _emit_spans

RESOURCE_ATTRIBUTES = {"service.name": "bench"}


class _Keep:
    def __init__(self) -> None:
        self.events: list[Any] = []

    def handle(self, batch: list[Any]) -> None:
        self.events.extend(batch)


async def _finished_events(operations: int) -> list[Any]:
    keep = _Keep()
    async with Bus() as bus:
        bus.subscribe(keep, buffer_size=1 << 20)
        tel = Telemetry(bus, kind="resources", instance="resources-0")
        for done in range(0, operations, CHUNK):
            _emit_spans(tel, min(CHUNK, operations - done))
            await bus.flush()
    return [event for event in keep.events if type(event).__name__.endswith("Finished")]


def _best(fn: Any, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


def bench_encode(operations: int, rounds: int) -> dict[str, Any]:
    """CPU per span of each encoding, best of ``rounds``, in 512-span requests."""
    events = anyio.run(_finished_events, operations)
    batches = [events[i : i + 512] for i in range(0, len(events), 512)]
    encoder = SpanEncoder(RESOURCE_ATTRIBUTES, Redactor())
    exporter = InMemorySpanExporter()
    sink = SpanSink(exporter, resource=Resource(RESOURCE_ATTRIBUTES), blocking=False)
    for batch in batches:
        sink.handle(batch)
    prebuilt = exporter.get_finished_spans()
    span_batches = [prebuilt[i : i + 512] for i in range(0, len(prebuilt), 512)]

    def ours() -> None:
        for batch in batches:
            encoder.protobuf(batch)

    def ours_json() -> None:
        for batch in batches:
            encoder.json(batch)

    def theirs() -> None:
        for batch in batches:
            exporter.clear()
            sink.handle(batch)
            encode_spans(exporter.get_finished_spans()).SerializeToString()

    def theirs_encode_only() -> None:
        for spans in span_batches:
            encode_spans(spans).SerializeToString()

    n = len(events)
    per = {
        name: _best(fn, rounds) / n * 1e6
        for name, fn in (
            ("ours_protobuf", ours),
            ("ours_json", ours_json),
            ("span_sink_and_otel_encoder", theirs),
            ("otel_encoder_only", theirs_encode_only),
        )
    }
    return {"spans": n, "us_per_span": per, "ratio": per["ours_protobuf"] / per["span_sink_and_otel_encoder"]}


async def _ours_to(endpoint: str, operations: int) -> float:
    # The same queue bound as the SDK's processor below: a burst faster than the export
    # thread is queued, not dropped, on both sides.
    sink = OtlpSpanSink(endpoint, resource_attributes=RESOURCE_ATTRIBUTES, max_queue=1 << 16)
    start = time.process_time()
    async with Bus() as bus:
        bus.subscribe(sink)
        tel = Telemetry(bus, kind="resources", instance="resources-0")
        for done in range(0, operations, CHUNK):
            _emit_spans(tel, min(CHUNK, operations - done))
            await bus.flush()
    spent = time.process_time() - start
    assert sink.stats().exported == 3 * operations, sink.stats()
    return spent


def _sdk_to(endpoint: str, operations: int) -> float:
    exporter: SpanExporter = OTLPSpanExporter(endpoint=endpoint + "/v1/traces")
    provider = TracerProvider(resource=Resource(RESOURCE_ATTRIBUTES))
    provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=1 << 16))
    start = time.process_time()
    _direct_spans(provider.get_tracer("bench"), operations)
    provider.force_flush()
    provider.shutdown()
    return time.process_time() - start


async def _paced_to(endpoint: str, seconds: float, prompt: bool) -> tuple[float, int, int]:
    """(process CPU, spans exported, requests) for commits emitted every millisecond."""
    options: dict[str, Any] = {} if prompt else {"prompt_interval": None}
    sink = OtlpSpanSink(endpoint, resource_attributes=RESOURCE_ATTRIBUTES, max_queue=1 << 16, **options)
    start = time.process_time()
    async with Bus() as bus:
        bus.subscribe(sink, linger=None if prompt else 0.05)
        tel = Telemetry(bus, kind="resources", instance="resources-0")
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            _emit_spans(tel, 1)
            await anyio.sleep(0.001)
    spent = time.process_time() - start
    stats = sink.stats()
    assert stats.dropped == 0, stats
    return spent, stats.exported, stats.exports


def bench_paced(endpoint: str, seconds: float, rounds: int) -> dict[str, Any]:
    """CPU per span and requests of a paced stream, prompt export vs batch schedule, alternated."""
    best: dict[bool, tuple[float, int, int]] = {}
    for _ in range(rounds):
        for prompt in (True, False):
            cpu, spans, requests = anyio.run(_paced_to, endpoint, seconds, prompt)
            if prompt not in best or cpu / spans < best[prompt][0] / best[prompt][1]:
                best[prompt] = (cpu, spans, requests)
    per = {prompt: cpu / spans * 1e6 for prompt, (cpu, spans, _) in best.items()}
    return {
        "us_per_span_prompt": per[True],
        "us_per_span_batch": per[False],
        "requests_per_1000_spans_prompt": best[True][2] / best[True][1] * 1000,
        "requests_per_1000_spans_batch": best[False][2] / best[False][1] * 1000,
        "ratio": per[True] / per[False],
    }


def bench_to_collector(endpoint: str, operations: int, rounds: int) -> dict[str, Any]:
    """Process CPU per span, emit to accepted export, ours vs the SDK, rounds alternated."""
    ours = sdk = float("inf")
    for _ in range(rounds):
        ours = min(ours, anyio.run(_ours_to, endpoint, operations))
        sdk = min(sdk, _sdk_to(endpoint, operations))
    spans = 3 * operations
    return {
        "spans": spans,
        "us_per_span_ours": ours / spans * 1e6,
        "us_per_span_sdk": sdk / spans * 1e6,
        "ratio": ours / sdk,
    }


def run(quick: bool = False) -> dict[str, Any]:
    """Both benchmarks; the collector one is skipped (``None``) without rotel."""
    operations, rounds = (2_000, 3) if quick else (10_000, 5)
    encode = bench_encode(operations, rounds)
    with rotel.collector() as endpoint:
        wire = bench_to_collector(endpoint, operations, rounds) if endpoint else None
        paced = bench_paced(endpoint, 1.0 if quick else 2.0, rounds) if endpoint else None
    per = encode["us_per_span"]
    rows: list[tuple[str, Any, str, bool | None]] = [
        (
            "OTLP encode: ours (protobuf, from events) / SpanSink + OTel encoder",
            encode["ratio"],
            "< 1.0",
            encode["ratio"] < 1.0,
        ),
        ("OTLP encode: us per span, ours protobuf", per["ours_protobuf"], "", None),
        ("OTLP encode: us per span, ours JSON (msgspec)", per["ours_json"], "", None),
        (
            "OTLP encode: us per span, SpanSink + OTel encoder",
            per["span_sink_and_otel_encoder"],
            "peer",
            None,
        ),
        ("OTLP encode: us per span, OTel encoder alone", per["otel_encoder_only"], "peer", None),
    ]
    if wire is not None:
        rows += [
            (
                "spans to rotel: emit + OtlpSpanSink / SDK (batch + OTLP exporter), CPU",
                wire["ratio"],
                "<= 0.1",
                wire["ratio"] <= 0.1,
            ),
            ("spans to rotel: us per span, ours", wire["us_per_span_ours"], "", None),
            ("spans to rotel: us per span, SDK", wire["us_per_span_sdk"], "peer", None),
        ]
    else:
        why = rotel.why_missing()
        rows.append((f"spans to rotel: emit + OtlpSpanSink / SDK, CPU ({why})", None, "<= 0.1", None))
    if paced is None:
        why = rotel.why_missing()
        rows.append((f"paced commits to rotel: prompt / batch schedule ({why})", None, "<= 1.25", None))
    else:
        rows += [
            (
                "paced commits to rotel: CPU per span, prompt export / batch schedule alone",
                paced["ratio"],
                "<= 1.25",
                paced["ratio"] <= 1.25,
            ),
            ("paced commits: us per span, prompt export", paced["us_per_span_prompt"], "", None),
            ("paced commits: us per span, batch schedule", paced["us_per_span_batch"], "", None),
            (
                "paced commits: requests per 1000 spans, prompt",
                paced["requests_per_1000_spans_prompt"],
                "",
                None,
            ),
            (
                "paced commits: requests per 1000 spans, batch",
                paced["requests_per_1000_spans_batch"],
                "",
                None,
            ),
        ]
    return {"quick": quick, "encode": encode, "to_collector": wire, "paced": paced, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None, allow_abbrev=False
    )
    parser.add_argument("--quick", action="store_true", help="smaller runs")
    args = parser.parse_args(argv)
    with report.failure_in_one_line("otlp"):
        result = run(quick=args.quick)
        report.print_table("ckpt-events OTLP export (ratios measured side by side)", result["rows"])
        print(report.markdown_table(result["rows"]))
        return 0


if __name__ == "__main__":
    sys.exit(main())
