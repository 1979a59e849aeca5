"""Sink benchmarks: ratios against direct OpenTelemetry SDK use, measured side by side in one run.

* spans: emit + bus + ``SpanSink`` vs the OTel SDK tracer producing the same spans (same
  names, attributes, nesting) through a ``SimpleSpanProcessor``; both into an exporter that
  counts spans and keeps none (an ``InMemorySpanExporter`` keeps every span, and the garbage
  collector scanning them would dominate the SDK's figure); total CPU (``process_time``) and
  the emitting side's share, beside ``python_floor``: the least any pure-Python handle with
  this API does (its ids, clock reads, stores and one append, nothing else).
* metrics: ``MetricSink`` on a checkpoint event mix vs the direct instrument calls the
  original system makes for the same mix (same ``MeterProvider`` setup).
* JSON lines: events per second written to a file.

Targets (SPEC section 7): spans <= 0.2x, emit side <= 0.02x, metrics <= 0.25x, JSON lines
>= 1,000,000 events/s. ``run(quick)`` returns the figures and the table's rows;
``python -m ckpt_events.benchmarks.bench_sinks [--quick] [--json PATH]`` prints the table, writes JSON.
"""

from __future__ import annotations

import argparse
import functools
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)

from ckpt_events import (
    Bus,
    Event,
    GenerationCut,
    OperationFinished,
    Refused,
    StepFinished,
    Telemetry,
    new_span_id,
    new_trace_id,
)
from ckpt_events.sinks.jsonl import JsonLinesSink
from ckpt_events.sinks.otel import MetricSink, SpanSink
from ckpt_events.vocab import Disposition, ErrorCode, Kind, Operation, Step

from . import python_floor, report

#: SPEC section 7: the span path at most 0.1x the SDK in total, its emitting side at most 0.035x.
TARGETS = {"spans_total": 0.1, "spans_emit": 0.035, "metrics": 0.25, "jsonl_events_per_s": 1_000_000}
DEFAULT_JSON = Path(__file__).parent / "results" / "sinks.json"
P = "nemo.gym.checkpoint."
RESOURCE = Resource({"service.name": "bench"})
CHUNK = 1000  # operations emitted between flushes: well under the bus buffer (no drops)


class CountingExporter(SpanExporter):
    """An exporter that counts the spans handed to it and keeps none (the honest baseline)."""

    def __init__(self) -> None:
        self.count = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.count += len(spans)
        return SpanExportResult.SUCCESS


def _cpu(fn: Callable[[], None]) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


# -- spans -------------------------------------------------------------------------------------


def _direct_spans(tracer: Any, n: int) -> None:
    start = tracer.start_as_current_span
    for _ in range(n):
        with start(
            "gym.checkpoint.commit",
            attributes={P + "id": "c1", P + "participant_kind": "resources", P + "instance": "resources-0"},
        ) as op:
            with start("gym.checkpoint.export") as step:
                step.set_attribute(P + "records", 5)
            with start("gym.checkpoint.write") as step:
                step.set_attribute(P + "records", 5)
                step.set_attribute(P + "bytes", 2048)
            op.set_attribute(P + "records", 5)
            op.set_attribute(P + "outcome", "ok")


def _emit_spans(tel: Telemetry, n: int) -> None:
    for _ in range(n):
        with tel.operation("commit", checkpoint_id="c1") as op:
            with op.step("export") as step:
                step.set(records=5)
            with op.step("write") as step:
                step.set(records=5, bytes=2048)
            op.set(records=5, bytes=2048)


async def _span_path(n: int, rounds: int) -> dict[str, Any]:
    exporter = CountingExporter()
    simple = TracerProvider(resource=RESOURCE)
    simple.add_span_processor(SimpleSpanProcessor(exporter))
    batch_exporter = CountingExporter()
    batched = TracerProvider(resource=RESOURCE)
    batched.add_span_processor(BatchSpanProcessor(batch_exporter, max_queue_size=1 << 16))
    sink = SpanSink(exporter, resource=RESOURCE, blocking=False)
    best: dict[str, float] = {}

    def keep(name: str, value: float) -> None:
        best[name] = min(best.get(name, float("inf")), value)

    async with Bus() as bus:
        bus.subscribe(sink)
        tel = Telemetry(bus, kind="resources", instance="resources-0")
        for _ in range(rounds):
            keep("direct_simple", _cpu(lambda: _direct_spans(simple.get_tracer("bench"), n)))
            exporter.count = 0

            def direct_batch() -> None:
                _direct_spans(batched.get_tracer("bench"), n)
                batched.force_flush()

            keep("direct_batch", _cpu(direct_batch))
            emit = 0.0
            start = time.process_time()
            for done in range(0, n, CHUNK):
                emit += _cpu(functools.partial(_emit_spans, tel, min(CHUNK, n - done)))
                await bus.flush()
            total = time.process_time() - start
            keep("ours_total", total)
            keep("ours_emit", emit)
            floor = python_floor.FloorTelemetry()
            floor_cpu = 0.0
            for done in range(0, n, CHUNK):
                floor_cpu += _cpu(functools.partial(python_floor.emit, floor, min(CHUNK, n - done)))
                floor.done.clear()
            keep("python_floor", floor_cpu)
            assert exporter.count == 3 * n, "sink lost spans"
    simple.shutdown()
    batched.shutdown()
    spans = 3 * n
    per = {k: v / spans * 1e6 for k, v in best.items()}
    return {
        "spans": spans,
        "us_per_span": per,
        "ratio_total_vs_simple": best["ours_total"] / best["direct_simple"],
        "ratio_emit_vs_simple": best["ours_emit"] / best["direct_simple"],
        "ratio_total_vs_batch": best["ours_total"] / best["direct_batch"],
        "ratio_emit_vs_batch": best["ours_emit"] / best["direct_batch"],
        "ratio_floor_vs_simple": best["python_floor"] / best["direct_simple"],
    }


# -- metrics -----------------------------------------------------------------------------------

# One model participant's share of a checkpoint cycle: prepare (with a cut round: two
# dispositions), two lease renewals, commit (with volume), resume, and the calls refused
# with admission_closed while admission was closed.
REFUSED_PER_CYCLE = 16


def _metric_mix(cycles: int) -> list[Event]:
    events: list[Event] = []
    t = 1_000_000_000
    for c in range(cycles):
        ident: dict[str, Any] = {"kind": Kind.MODEL, "instance": "model-0", "checkpoint_id": f"c{c}"}

        def op(operation: str, ident: dict[str, Any] = ident, c: int = c, **fields: Any) -> OperationFinished:
            return OperationFinished(
                **ident,
                trace_id=new_trace_id(),
                span_id=new_span_id(),
                start_ns=t,
                end_ns=t + 3_000_000 + c,
                operation=Operation(operation),
                **fields,
            )

        events.append(op("prepare"))
        events.append(GenerationCut(**ident, time_ns=t, disposition=Disposition.DURABLE_PREFIX, calls=12))
        events.append(GenerationCut(**ident, time_ns=t, disposition=Disposition.DURABLE_FAILURE, calls=1))
        events.extend(
            Refused(**ident, time_ns=t, code=ErrorCode.ADMISSION_CLOSED) for _ in range(REFUSED_PER_CYCLE)
        )
        events.append(op("renew"))
        events.append(op("renew"))
        events.append(op("commit", records=800, bytes=1_600_000))
        events.append(op("resume"))
    return events


def _direct_metrics(meter: Any, events: list[Event]) -> None:
    """What the original system does: one SDK call per measurement, as it happens."""
    duration = meter.create_histogram("gym.checkpoint.operation_duration_ms", unit="ms")
    records = meter.create_counter("gym.checkpoint.records_total", unit="1")
    size = meter.create_counter("gym.checkpoint.bytes_total", unit="By")
    counted = meter.create_counter("gym.checkpoint.events_total", unit="1")
    for e in events:
        if isinstance(e, OperationFinished):
            duration.record(
                (e.end_ns - e.start_ns) / 1e6,
                {P + "operation": e.operation.value, P + "participant_kind": str(e.kind), "outcome": "ok"},
            )
            if e.records is not None:
                attrs = {P + "operation": e.operation.value, P + "participant_kind": str(e.kind)}
                records.add(e.records, attrs)
                size.add(e.bytes or 0, attrs)
        elif isinstance(e, Refused):
            counted.add(1, {P + "event": "refused", P + "code": e.code.value})
        elif isinstance(e, GenerationCut):
            counted.add(e.calls, {P + "event": "generation_cut", P + "disposition": e.disposition.value})


def _metric_round(events: list[Event], batch: int) -> tuple[float, float]:
    reader_a, reader_b = InMemoryMetricReader(), InMemoryMetricReader()
    direct_provider = MeterProvider(metric_readers=[reader_a], resource=RESOURCE)
    sink_provider = MeterProvider(metric_readers=[reader_b], resource=RESOURCE)
    meter = direct_provider.get_meter("bench")
    direct = _cpu(lambda: _direct_metrics(meter, events))
    sink = MetricSink(sink_provider)
    chunks = [events[i : i + batch] for i in range(0, len(events), batch)]

    def feed() -> None:
        for chunk in chunks:
            sink.handle(chunk)

    ours = _cpu(feed)
    direct_provider.shutdown()
    sink_provider.shutdown()
    return direct, ours


def _metric_path(cycles: int, rounds: int) -> dict[str, Any]:
    events = _metric_mix(cycles)
    ops_only: list[Event] = [e for e in events if isinstance(e, OperationFinished)]
    best: dict[str, float] = {}
    for _ in range(rounds):
        for name, evs in (("mix", events), ("ops_only", ops_only)):
            direct, ours = _metric_round(evs, 4096)
            best[f"{name}_direct"] = min(best.get(f"{name}_direct", float("inf")), direct)
            best[f"{name}_ours"] = min(best.get(f"{name}_ours", float("inf")), ours)
    return {
        "events": len(events),
        "mix": f"per cycle: 5 operations (prepare, 2 renew, commit, resume), 2 generation_cut, "
        f"{REFUSED_PER_CYCLE} refused",
        "us_per_event_direct": best["mix_direct"] / len(events) * 1e6,
        "us_per_event_ours": best["mix_ours"] / len(events) * 1e6,
        "ratio_mix": best["mix_ours"] / best["mix_direct"],
        "ratio_operations_only": best["ops_only_ours"] / best["ops_only_direct"],
    }


# -- JSON lines --------------------------------------------------------------------------------


def _jsonl_events(n: int) -> list[Event]:
    trace, op_id = new_trace_id(), new_span_id()
    ident: dict[str, Any] = {
        "kind": Kind.RESOURCES,
        "instance": "resources-0",
        "checkpoint_id": "c1",
        "trace_id": trace,
    }
    pool: list[Event] = [
        OperationFinished(
            **ident, span_id=op_id, start_ns=1, end_ns=2, operation=Operation.COMMIT, records=5, bytes=9
        ),
        StepFinished(
            **ident, span_id=new_span_id(), parent_span_id=op_id, start_ns=1, end_ns=2, step=Step.WRITE
        ),
        Refused(kind=Kind.AGENT, instance="agent-0", time_ns=3, code=ErrorCode.ADMISSION_CLOSED),
    ]
    return [pool[i % len(pool)] for i in range(n)]


def _jsonl_path(n: int, rounds: int) -> dict[str, Any]:
    events = _jsonl_events(n)
    batches = [events[i : i + 4096] for i in range(0, n, 4096)]
    best = float("inf")
    size = 0
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            path = Path(tmp) / f"bench-{r}.jsonl"
            sink = JsonLinesSink(path)
            start = time.perf_counter()
            for batch in batches:
                sink.handle(batch)
            sink.close()
            best = min(best, time.perf_counter() - start)
            size = path.stat().st_size
            path.unlink()
    return {"events": n, "bytes_per_event": size / n, "events_per_s": n / best}


# -- run ---------------------------------------------------------------------------------------


def run(quick: bool = False) -> dict[str, Any]:
    """Run every sink benchmark; ``quick`` keeps it under ~20 s. Returns a JSON-able dict."""
    ops, rounds = (2_000, 3) if quick else (10_000, 5)
    spans = anyio.run(_span_path, ops, rounds)
    metrics = _metric_path(cycles=400 if quick else 2_000, rounds=rounds)
    jsonl = _jsonl_path(200_000 if quick else 1_000_000, rounds)
    per = spans["us_per_span"]
    checks = {
        "spans_total": spans["ratio_total_vs_simple"] <= TARGETS["spans_total"],
        "spans_emit": spans["ratio_emit_vs_simple"] <= TARGETS["spans_emit"],
        "metrics": metrics["ratio_mix"] <= TARGETS["metrics"],
        "jsonl_events_per_s": jsonl["events_per_s"] >= TARGETS["jsonl_events_per_s"],
    }
    rows = [
        (
            "spans: emit + SpanSink / SDK (simple processor, non-retaining exporter), CPU",
            spans["ratio_total_vs_simple"],
            f"<= {TARGETS['spans_total']}",
            checks["spans_total"],
        ),
        (
            "spans: emitting side / SDK (simple processor, non-retaining exporter), CPU",
            spans["ratio_emit_vs_simple"],
            f"<= {TARGETS['spans_emit']}",
            checks["spans_emit"],
        ),
        (
            "spans: emit + SpanSink / SDK (batch processor, non-retaining exporter), CPU",
            spans["ratio_total_vs_batch"],
            "",
            None,
        ),
        ("spans: us per span, ours (emit + sink)", spans["us_per_span"]["ours_total"], "", None),
        ("spans: us per span, ours (emitting side)", spans["us_per_span"]["ours_emit"], "", None),
        ("spans: this API's pure-Python floor / SDK (simple), CPU", spans["ratio_floor_vs_simple"], "", None),
        ("spans: us per span, that floor (ids, clocks, stores, an append)", per["python_floor"], "", None),
        (
            "spans: us per span, SDK (simple processor, non-retaining exporter)",
            spans["us_per_span"]["direct_simple"],
            "peer",
            None,
        ),
        (
            "metrics: MetricSink / direct calls, checkpoint mix",
            metrics["ratio_mix"],
            "<= 0.25",
            checks["metrics"],
        ),
        ("metrics: MetricSink / direct calls, operations only", metrics["ratio_operations_only"], "", None),
        (
            "JSON lines: M events/s to a file",
            jsonl["events_per_s"] / 1e6,
            ">= 1.0",
            checks["jsonl_events_per_s"],
        ),
    ]
    return {
        "quick": quick,
        "machine": platform.machine(),
        "targets": TARGETS,
        "spans": spans,
        "metrics": metrics,
        "jsonl": jsonl,
        "meets_targets": checks,
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--quick", action="store_true", help="smaller runs (< 20 s)")
    parser.add_argument(
        "--json", type=report.output_path, default=DEFAULT_JSON, help="where to write the results"
    )
    args = parser.parse_args(argv)
    with report.failure_in_one_line("sinks"):
        result = run(quick=args.quick)
        rows = result.pop("rows")
        title = "ckpt-events sinks: spans, metrics, JSON lines (ratios measured side by side)"
        report.publish(title, rows, args.json, result)
        return 0


if __name__ == "__main__":
    sys.exit(main())
