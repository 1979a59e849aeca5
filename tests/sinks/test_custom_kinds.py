"""A user's own kind and step (``judge``, ``upload``) through every sink: spans, JSON lines and
replay, OpenTelemetry metrics, Prometheus and the OTLP encoder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ckpt_events import Bus, OperationFinished, StageFinished, StepFinished, Telemetry
from ckpt_events.sinks import JsonLinesSink, read_events
from ckpt_events.sinks._span_attrs import span_plan
from ckpt_events.sinks.otel import MetricSink, SpanSink
from ckpt_events.sinks.prometheus import PrometheusSink, TotalsCollector
from ckpt_events.sinks.replay import replay
from ckpt_events.testing import MemorySink
from ckpt_events.vocab import Attr
from tests.sinks.helpers import by_name, metric_points

KIND = Attr.PARTICIPANT_KIND


async def _judge(bus: Bus) -> None:
    """A controller stage for the judges, and a judge committing with an upload step."""
    ctl = Telemetry(bus, kind="controller", instance="coordination")
    judge = Telemetry(bus, kind="judge", instance="judge-0")
    with ctl.coordinate("prepare", checkpoint_id="c1") as co:
        with co.stage("judge") as stage:
            stage.set(participants=1)
    with judge.operation("commit", checkpoint_id="c1") as op:
        with op.step("upload") as upload:
            upload.set(records=3, bytes=4096, calls=1)  # calls belongs to generation_cut only
        op.set(records=3)


def _check_spans(spans: tuple[ReadableSpan, ...]) -> None:
    named = {name: found[0] for name, found in by_name(spans).items()}
    commit, upload = named["gym.checkpoint.commit"], named["gym.checkpoint.upload"]
    assert commit.attributes is not None and commit.attributes[KIND] == "judge"
    assert upload.parent is not None and upload.parent.span_id == commit.context.span_id
    assert dict(upload.attributes or {}) == {Attr.RECORDS: 3, Attr.BYTES: 4096}
    stage = named["gym.checkpoint.coordinate.prepare.judge"]
    assert stage.parent is not None
    assert stage.parent.span_id == named["gym.checkpoint.coordinate.prepare"].context.span_id


async def test_a_users_kind_and_step_are_spans() -> None:
    """``gym.checkpoint.commit`` of kind ``judge`` has the child ``gym.checkpoint.upload`` (with
    records and bytes), and the judges' stage is ``gym.checkpoint.coordinate.prepare.judge``."""
    exporter = InMemorySpanExporter()
    async with Bus() as bus:
        bus.subscribe(SpanSink(exporter, span_groups="default,checkpoint"))
        await _judge(bus)
    _check_spans(exporter.get_finished_spans())


async def test_a_users_kind_and_step_round_trip_through_json_lines_and_replay(tmp_path: Path) -> None:
    """The log holds ``judge`` and ``upload``; read back they are plain strings equal to the live
    events, and replayed they make the same spans."""
    path = tmp_path / "run.jsonl"
    live = MemorySink()
    async with Bus() as bus:
        bus.subscribe(JsonLinesSink(path))
        bus.subscribe(live)
        await _judge(bus)
    back = [event for _, event in read_events(path)]
    assert back == live.events
    step = next(e for e in back if isinstance(e, StepFinished))
    assert (type(step.kind), step.kind, type(step.step), step.step) == (str, "judge", str, "upload")
    stage = next(e for e in back if isinstance(e, StageFinished))
    assert stage.stage == "judge"
    exporter = InMemorySpanExporter()
    result = await replay(path, SpanSink(exporter, span_groups="default,checkpoint"))
    assert result.corrupt == () and result.events == len(back)
    _check_spans(exporter.get_finished_spans())


async def test_a_users_kind_is_a_metric_attribute() -> None:
    """The duration and records of the judge's commit are points of kind ``judge``."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    try:
        async with Bus() as bus:
            bus.subscribe(MetricSink(provider))
            await _judge(bus)
        points = metric_points(reader)
    finally:
        provider.shutdown()
    commit = frozenset({Attr.OPERATION: "commit", KIND: "judge"}.items())
    assert points["gym.checkpoint.records_total"][1] == {commit: 3}
    durations = points["gym.checkpoint.operation_duration_ms"][1]
    assert durations[frozenset({*commit, ("outcome", "ok")})] == 1


async def test_a_users_kind_is_a_prometheus_label() -> None:
    """The scrape shows the judge's commit under ``participant_kind="judge"``."""
    sink = PrometheusSink()
    async with Bus() as bus:
        bus.subscribe(sink)
        await _judge(bus)
    registry = CollectorRegistry()
    registry.register(TotalsCollector(sink))
    text = generate_latest(registry).decode()
    label = "nemo_gym_checkpoint_participant_kind"
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    records = [s for s in samples if s.name == "gym_checkpoint_records_total"]
    assert [(s.labels[label], s.value) for s in records] == [("judge", 3.0)]
    assert any(s.labels.get(label) == "judge" for s in samples if "duration" in s.name)


async def test_the_span_rule_names_a_users_step_and_stage() -> None:
    """``span_plan`` (shared by SpanSink and the OTLP encoder) answers for a user's step and
    stage, with the step's records and bytes, and the same plan on every call."""
    live = MemorySink()
    async with Bus() as bus:
        bus.subscribe(live)
        await _judge(bus)
    plans: dict[type, Any] = {type(e): span_plan(e) for e in live.events if span_plan(e) is not None}
    assert plans[StepFinished] == (
        "gym.checkpoint.upload",
        (("records", Attr.RECORDS), ("bytes", Attr.BYTES)),
    )
    assert plans[StageFinished][0] == "gym.checkpoint.coordinate.prepare.judge"
    assert plans[OperationFinished][0] == "gym.checkpoint.commit"
    step = next(e for e in live.events if isinstance(e, StepFinished))
    assert span_plan(step) is span_plan(step)
