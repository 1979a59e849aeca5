"""SpanSink: names, attributes, nesting, trace context, status, sampling and faults."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

import msgspec
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from ckpt_events import (
    Bus,
    InvalidArgumentError,
    OperationFinished,
    StepFinished,
    Telemetry,
    UnknownNameError,
    new_span_id,
    new_trace_id,
)
from ckpt_events.participants.kinds import PREPARE_ORDER
from ckpt_events.sinks.otel import AttributeLimits, SpanSink
from ckpt_events.testing import MemorySink
from ckpt_events.vocab import REDACTED
from tests.sinks.helpers import by_name

P = "nemo.gym.checkpoint."


def _identity(kind: str, instance: str, outcome: str = "ok", checkpoint_id: str = "c1") -> dict[str, object]:
    return {
        P + "id": checkpoint_id,
        P + "participant_kind": kind,
        P + "instance": instance,
        P + "outcome": outcome,
    }


async def _run_participant(tel: Telemetry) -> None:
    with tel.operation("prepare", checkpoint_id="c1") as op:
        with op.step("generation_cut") as cut:
            cut.set(calls=3, cut_durable_prefix=2, cut_durable_failure=1)
        with op.step("wait_ready"):
            pass
        op.set(phase="prepared", blockers=0)
    with tel.operation("commit", checkpoint_id="c1") as op:
        with op.step("export") as st:
            st.set(records=5)
        with op.step("write") as st:
            st.set(records=5, bytes=2048)
        op.set(records=5, bytes=2048)
    with tel.operation("restore", checkpoint_id="c1") as op:
        with op.step("read") as st:
            st.set(records=5, bytes=2048)
        with op.step("install") as st:
            st.set(records=5)
        op.set(records=5, bytes=2048)
    with tel.operation("resume", checkpoint_id="c1"):
        pass
    with tel.operation("retire", checkpoint_id="c1") as op:
        op.set(episodes=4)
    with tel.operation("forget", checkpoint_id="c1") as op:
        op.set(rollouts=2)
    with tel.operation("renew", checkpoint_id="c1"):
        pass


async def test_participant_spans_names_attributes_and_nesting(
    ckpt_span_exporter: InMemorySpanExporter, ckpt_span_sink: SpanSink
) -> None:
    """Every participant span has SPEC names and attributes, and steps nest under their operation."""
    async with Bus() as bus:
        bus.subscribe(ckpt_span_sink)
        await _run_participant(Telemetry(bus, kind="model", instance="model-0"))
        await bus.flush()
    spans = by_name(ckpt_span_exporter.get_finished_spans())
    assert sorted(spans) == sorted(
        "gym.checkpoint." + n
        for n in [
            "prepare",
            "generation_cut",
            "wait_ready",
            "commit",
            "export",
            "write",
            "restore",
            "read",
            "install",
            "resume",
            "retire",
            "forget",
        ]
    )
    assert all(len(v) == 1 for v in spans.values())
    one = {name: group[0] for name, group in spans.items()}
    ident = _identity("model", "model-0")
    prepare = dict(one["gym.checkpoint.prepare"].attributes)
    assert prepare == {**ident, P + "phase": "prepared", P + "blockers": 0}
    assert dict(one["gym.checkpoint.commit"].attributes) == {**ident, P + "records": 5}
    assert dict(one["gym.checkpoint.restore"].attributes) == {**ident, P + "records": 5}
    assert dict(one["gym.checkpoint.resume"].attributes) == ident
    assert dict(one["gym.checkpoint.retire"].attributes) == {**ident, P + "episodes": 4}
    assert dict(one["gym.checkpoint.forget"].attributes) == {**ident, P + "rollouts": 2}
    assert dict(one["gym.checkpoint.wait_ready"].attributes) == {}
    assert dict(one["gym.checkpoint.generation_cut"].attributes) == {
        P + "calls": 3,
        P + "cut_durable_prefix": 2,
        P + "cut_durable_failure": 1,
    }
    assert dict(one["gym.checkpoint.export"].attributes) == {P + "records": 5}
    assert dict(one["gym.checkpoint.write"].attributes) == {P + "records": 5, P + "bytes": 2048}
    assert dict(one["gym.checkpoint.read"].attributes) == {P + "records": 5, P + "bytes": 2048}
    assert dict(one["gym.checkpoint.install"].attributes) == {P + "records": 5}
    for child, parent in [
        ("generation_cut", "prepare"),
        ("wait_ready", "prepare"),
        ("export", "commit"),
        ("write", "commit"),
        ("read", "restore"),
        ("install", "restore"),
    ]:
        c, p = one["gym.checkpoint." + child], one["gym.checkpoint." + parent]
        assert c.parent is not None and c.parent.span_id == p.context.span_id
        assert not c.parent.is_remote
        assert c.context.trace_id == p.context.trace_id
        assert p.start_time <= c.start_time <= c.end_time <= p.end_time
    for op in ("prepare", "commit", "restore", "resume", "retire", "forget"):
        assert one["gym.checkpoint." + op].parent is None
    assert all(s.status.status_code is StatusCode.UNSET for s in one.values())
    assert ckpt_span_sink.stats().skipped == 1  # renew: counted, no span
    assert ckpt_span_sink.stats().exported == 12


async def test_coordinate_and_stage_spans_for_every_stage(
    ckpt_span_exporter: InMemorySpanExporter, ckpt_span_sink: SpanSink
) -> None:
    """coordinate.prepare has one child per stage in prepare order, an empty stage included."""
    async with Bus() as bus:
        bus.subscribe(ckpt_span_sink)
        ctl = Telemetry(bus, kind="controller", instance="coordination")
        with ctl.coordinate("prepare", checkpoint_id="c1") as co:
            for kind in PREPARE_ORDER:
                with co.stage(kind) as stage:
                    stage.set(participants=0 if kind == "resources" else 2)
            co.set(participants=6, prepared=True)
        with ctl.coordinate("prepare", checkpoint_id="c2") as co:
            co.set(participants=6, prepared=False, stopped_at="model")
        for op in ("commit", "restore", "retire"):
            with ctl.coordinate(op, checkpoint_id="c1") as co:
                co.set(participants=6, episodes=10)
        with ctl.coordinate("forget", checkpoint_id="c1") as co:
            co.set(participants=6, rollouts=3)
        with ctl.coordinate("resume", checkpoint_id="c1") as co:
            co.set(participants=6)
        await bus.flush()
    spans = by_name(ckpt_span_exporter.get_finished_spans())
    ident = _identity("controller", "coordination")
    first, stopped = spans["gym.checkpoint.coordinate.prepare"]
    assert dict(first.attributes) == {**ident, P + "participants": 6, P + "prepared": True}
    assert dict(stopped.attributes) == {
        **_identity("controller", "coordination", checkpoint_id="c2"),
        P + "participants": 6,
        P + "prepared": False,
        P + "stopped_at": "model",
    }
    stages = [spans[f"gym.checkpoint.coordinate.prepare.{k}"][0] for k in PREPARE_ORDER]
    assert [dict(s.attributes) for s in stages] == [{P + "participants": n} for n in (2, 2, 2, 0)]
    assert all(s.parent is not None and s.parent.span_id == first.context.span_id for s in stages)
    assert [s.start_time for s in stages] == sorted(s.start_time for s in stages)
    for op in ("commit", "restore", "retire"):
        (span,) = spans[f"gym.checkpoint.coordinate.{op}"]
        assert dict(span.attributes) == {**ident, P + "participants": 6, P + "episodes": 10}
    (forget,) = spans["gym.checkpoint.coordinate.forget"]
    assert dict(forget.attributes) == {**ident, P + "participants": 6, P + "rollouts": 3}
    (resume,) = spans["gym.checkpoint.coordinate.resume"]
    assert dict(resume.attributes) == {**ident, P + "participants": 6}


async def test_collection_spans(ckpt_span_exporter: InMemorySpanExporter, ckpt_span_sink: SpanSink) -> None:
    """collection.checkpoint and collection.restore carry id and their own attributes."""
    async with Bus() as bus:
        bus.subscribe(ckpt_span_sink)
        ctl = Telemetry(bus, kind="controller", instance="coordination")
        with ctl.collection("checkpoint", checkpoint_id="c1") as col:
            col.set(in_flight=7, stop=False, published=True)
        with ctl.collection("restore", checkpoint_id="c1") as col:
            col.set(rows=12, restarts=2)
        await bus.flush()
    spans = by_name(ckpt_span_exporter.get_finished_spans())
    (ckpt,) = spans["gym.checkpoint.collection.checkpoint"]
    assert dict(ckpt.attributes) == {
        P + "id": "c1",
        P + "in_flight": 7,
        P + "stop": False,
        P + "published": True,
    }
    (restore,) = spans["gym.checkpoint.collection.restore"]
    assert dict(restore.attributes) == {P + "id": "c1", P + "rows": 12, P + "restarts": 2}


async def test_one_trace_across_controller_and_two_participants(
    ckpt_span_exporter: InMemorySpanExporter, ckpt_span_sink: SpanSink
) -> None:
    """Participants continue the controller's trace; their spans have remote parents."""
    async with Bus() as bus:
        bus.subscribe(ckpt_span_sink)
        ctl = Telemetry(bus, kind="controller", instance="coordination")
        env = Telemetry(bus, kind="environment", instance="env-0")
        model = Telemetry(bus, kind="model", instance="model-0")
        with ctl.coordinate("prepare", checkpoint_id="c1") as co:
            for kind, tel in (("environment", env), ("model", model)):
                with co.stage(kind) as stage:
                    stage.set(participants=1)
                    header = stage.traceparent()
                    with tel.operation("prepare", checkpoint_id="c1", traceparent=header) as op:
                        with op.step("wait_ready"):
                            pass
        await bus.flush()
    spans = ckpt_span_exporter.get_finished_spans()
    assert len(spans) == 1 + 2 + 2 * 2
    assert len({s.context.trace_id for s in spans}) == 1
    named = by_name(spans)
    for kind in ("environment", "model"):
        (stage,) = named[f"gym.checkpoint.coordinate.prepare.{kind}"]
        (op,) = [s for s in named["gym.checkpoint.prepare"] if s.attributes[P + "participant_kind"] == kind]
        assert op.parent is not None and op.parent.is_remote
        assert op.parent.span_id == stage.context.span_id
    for wait in named["gym.checkpoint.wait_ready"]:
        assert wait.parent is not None and not wait.parent.is_remote


async def test_failure_sets_error_status_and_records_exception(
    ckpt_span_exporter: InMemorySpanExporter, ckpt_span_sink: SpanSink
) -> None:
    """A failed operation ends with status ERROR, an exception event, and outcome error."""
    async with Bus() as bus:
        bus.subscribe(ckpt_span_sink)
        tel = Telemetry(bus, kind="resources", instance="r0")
        with pytest.raises(OSError):
            with tel.operation("commit", checkpoint_id="c1") as op:
                with op.step("write"):
                    raise OSError("disk full")
        await bus.flush()
    named = {s.name: s for s in ckpt_span_exporter.get_finished_spans()}
    for name in ("gym.checkpoint.commit", "gym.checkpoint.write"):
        span = named[name]
        assert span.status.status_code is StatusCode.ERROR
        (event,) = span.events
        assert event.name == "exception"
        assert event.attributes == {"exception.type": "OSError", "exception.message": "disk full"}
    assert named["gym.checkpoint.commit"].attributes[P + "outcome"] == "error"


async def test_a_failed_span_carries_error_type_as_the_sdk_records_its_exception() -> None:
    """``error.type`` on every failed span (semantic conventions, "recording errors"): the
    exception's type, the one OpenTelemetry's own ``start_as_current_span`` names in its
    exception event; kept first under the attribute count limit; ``_OTHER`` when unknown; the
    user's own kept."""
    exporter = InMemorySpanExporter()
    sink = SpanSink(exporter, attribute_limits=AttributeLimits(count=5), blocking=False, linger=0)
    kept = MemorySink()
    async with Bus() as bus:
        bus.subscribe(sink)
        bus.subscribe(kept)
        tel = Telemetry(bus, kind="resources", instance="r0")
        with pytest.raises(OSError):
            with tel.operation("commit", checkpoint_id="c1") as op:
                op.set_attribute("user.a", 1)
                raise OSError("disk full")
        with tel.operation("commit", checkpoint_id="c2") as op:
            op.set_attribute("error.type", "mine")  # a user's own, on a span that did not fail
        with pytest.raises(TimeoutError):
            with tel.operation("commit", checkpoint_id="c3") as op:
                op.set_attribute("error.type", "upstream_timeout")  # a code of the user's domain
                raise TimeoutError
        await bus.flush()
    failed, ok, coded = exporter.get_finished_spans()
    assert coded.attributes["error.type"] == "upstream_timeout"
    assert coded.events[0].attributes["exception.type"] == "TimeoutError"
    assert failed.attributes["error.type"] == failed.events[0].attributes["exception.type"] == "OSError"
    assert "user.a" not in failed.attributes and failed.dropped_attributes == 1
    assert ok.attributes["error.type"] == "mine" and ok.status.status_code is StatusCode.UNSET
    sdk_exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(sdk_exporter))
    with pytest.raises(OSError), provider.get_tracer("t").start_as_current_span("theirs"):
        raise OSError("disk full")
    [theirs] = sdk_exporter.get_finished_spans()
    assert theirs.events[0].attributes["exception.type"] == failed.attributes["error.type"]
    assert theirs.status.status_code is failed.status.status_code is StatusCode.ERROR
    first = kept.of_type(OperationFinished)[0]
    unknown = InMemorySpanExporter()  # the bus shut the first sink down as it closed
    SpanSink(unknown, blocking=False).handle([msgspec.structs.replace(first, error_type=None)])
    assert unknown.get_finished_spans()[0].attributes["error.type"] == "_OTHER"


@pytest.mark.parametrize("spec", ["default", "", "all,-", None])
async def test_no_checkpoint_group_means_no_spans_and_no_interest(spec: str | None) -> None:
    """Without the checkpoint group the sink wants nothing, so emit sites stay off."""
    if spec == "all,-":
        with pytest.raises(UnknownNameError):
            SpanSink(InMemorySpanExporter(), span_groups=spec)
        return
    exporter = InMemorySpanExporter()
    sink = SpanSink(exporter, span_groups=spec)
    assert not sink.enabled and tuple(sink.interests) == ()
    async with Bus() as bus:
        bus.subscribe(sink)
        tel = Telemetry(bus, kind="resources", instance="r0")
        assert not tel.enabled
        with tel.operation("commit", checkpoint_id="c1"):
            pass
        await bus.flush()
    assert exporter.get_finished_spans() == ()


async def test_span_groups_are_case_and_space_insensitive() -> None:
    """The spec is trimmed and case-insensitive; a list of names works too."""
    assert SpanSink(InMemorySpanExporter(), span_groups=" Checkpoint ").enabled
    assert SpanSink(InMemorySpanExporter(), span_groups=["all"]).enabled


async def test_sampled_out_trace_costs_no_spans(
    ckpt_span_exporter: InMemorySpanExporter, ckpt_span_sink: SpanSink
) -> None:
    """The root's decision holds downstream: unsampled events are skipped and counted."""
    async with Bus() as bus:
        bus.subscribe(ckpt_span_sink)
        ctl = Telemetry(bus, kind="controller", instance="coordination", sample_ratio=0.0)
        part = Telemetry(bus, kind="agent", instance="agent-0")
        with ctl.coordinate("commit", checkpoint_id="c1") as co:
            with part.operation("commit", checkpoint_id="c1", traceparent=co.traceparent()) as op:
                with op.step("write"):
                    pass
        await bus.flush()
    assert ckpt_span_exporter.get_finished_spans() == ()
    assert ckpt_span_sink.stats().unsampled == 3


async def test_out_of_order_events_still_give_the_right_tree(
    ckpt_span_exporter: InMemorySpanExporter, ckpt_span_sink: SpanSink
) -> None:
    """A step finishing after its operation (another thread) still nests under it."""
    trace, op_id, step_id = new_trace_id(), new_span_id(), new_span_id()
    common = {"kind": "resources", "instance": "r0", "checkpoint_id": "c1", "trace_id": trace}
    op = OperationFinished(**common, span_id=op_id, start_ns=100, end_ns=200, operation="commit", records=1)
    step = StepFinished(
        **common, span_id=step_id, parent_span_id=op_id, start_ns=150, end_ns=250, step="write"
    )
    ckpt_span_sink.handle([op])
    ckpt_span_sink.handle([step])
    named = {s.name: s for s in ckpt_span_exporter.get_finished_spans()}
    write = named["gym.checkpoint.write"]
    assert write.parent is not None and write.parent.span_id == named["gym.checkpoint.commit"].context.span_id
    assert write.context.trace_id == trace
    assert (write.start_time, write.end_time) == (150, 250)


async def test_user_attributes_are_redacted_and_ours_are_not(
    ckpt_span_exporter: InMemorySpanExporter, ckpt_span_sink: SpanSink
) -> None:
    """User attributes matching the redact rule become [REDACTED]; our names never do."""
    async with Bus() as bus:
        bus.subscribe(ckpt_span_sink)
        tel = Telemetry(bus, kind="agent", instance="a0")
        with tel.operation("commit", checkpoint_id="c1") as op:
            op.set_attribute("user.prompt", "tell me a secret")
            op.set_attribute("user.api_token_count", 3)
            op.set_attribute("user.token", "abc")
            op.set_attribute("team", "rl")
            op.set_attribute(P + "instance", "spoofed")
            op.set(records=1)
        await bus.flush()
    (span,) = ckpt_span_exporter.get_finished_spans()
    attributes = dict(span.attributes)
    assert attributes["user.prompt"] == REDACTED
    assert attributes["user.token"] == REDACTED
    assert attributes["user.api_token_count"] == 3
    assert attributes["team"] == "rl"
    assert attributes[P + "instance"] == "a0"
    assert REDACTED not in [v for k, v in attributes.items() if k.startswith(P)]


class _RaisingExporter(SpanExporter):
    def __init__(self) -> None:
        self.calls = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.calls += 1
        raise ConnectionError("collector down")


class _FailingExporter(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.FAILURE


async def test_raising_exporter_is_isolated_counted_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    """An exporter that raises never reaches the bus or the other sinks."""
    raising = _RaisingExporter()
    sink = SpanSink(raising)
    other = MemorySink()
    caplog.set_level(logging.WARNING, logger="ckpt_events.sinks.otel")
    async with Bus(batch_size=2) as bus:
        sub = bus.subscribe(sink, name="spans")
        bus.subscribe(other, name="other")
        tel = Telemetry(bus, kind="resources", instance="r0")
        for _ in range(5):
            with tel.operation("commit", checkpoint_id="c1"):
                pass
            await bus.flush()
        assert sub.stats().failed == 0
    assert raising.calls == 5
    stats = sink.stats()
    assert (stats.exported, stats.dropped, stats.export_failures) == (0, 5, 5)
    assert len(other.of_type(OperationFinished)) == 5
    assert len([r for r in caplog.records if r.name == "ckpt_events.sinks.otel"]) == 1


async def test_failing_exporter_result_counts_drops() -> None:
    """An exporter reporting FAILURE (a collector down, retries spent) shows in stats."""
    sink = SpanSink(_FailingExporter())
    async with Bus() as bus:
        bus.subscribe(sink)
        tel = Telemetry(bus, kind="resources", instance="r0")
        with tel.operation("commit", checkpoint_id="c1") as op:
            with op.step("write"):
                pass
        await bus.flush()
    assert sink.stats().dropped == 2 and sink.stats().export_failures == 1


async def test_export_batches_are_bounded_and_shutdown_drops(
    ckpt_span_exporter: InMemorySpanExporter,
) -> None:
    """Exports are at most max_export_batch spans; after shutdown spans are dropped, counted."""
    sizes: list[int] = []

    class Recording(InMemorySpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            sizes.append(len(spans))
            return super().export(spans)

    rec = Recording()
    sink = SpanSink(rec, max_export_batch=3, blocking=False)
    async with Bus() as bus:
        bus.subscribe(sink)
        tel = Telemetry(bus, kind="resources", instance="r0")
        for _ in range(7):
            with tel.operation("resume", checkpoint_id="c1"):
                pass
        await bus.flush()
        assert sink.force_flush()
        assert sum(sizes) == 7 and max(sizes) <= 3
        sink.shutdown()
        sink.shutdown()
        with tel.operation("resume", checkpoint_id="c1"):
            pass
        await bus.flush()
    assert sink.stats().dropped == 1
    assert len(rec.get_finished_spans()) == 7


def test_bad_arguments_are_rejected() -> None:
    """A non-exporter or a bad batch size raises InvalidArgumentError."""
    with pytest.raises(InvalidArgumentError):
        SpanSink(object())  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        SpanSink(InMemorySpanExporter(), max_export_batch=0)


async def test_collector_down_drops_are_counted_not_raised() -> None:
    """OTLP to a closed port fails within the exporter's timeout; the loss shows in stats."""
    import socket

    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    sink = SpanSink(OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces", timeout=1))
    async with Bus() as bus:
        bus.subscribe(sink)
        with Telemetry(bus, kind="resources", instance="r0").operation("resume", checkpoint_id="c1"):
            pass
        await bus.flush()
        stats = sink.stats()
    assert (stats.exported, stats.dropped, stats.export_failures) == (0, 1, 1)


def test_shutdown_shuts_the_exporter_down_when_its_flush_raises(caplog: pytest.LogCaptureFixture) -> None:
    """An exporter whose ``force_flush`` raises is still shut down (its threads and connections
    end), and the failure is logged once."""
    shut: list[bool] = []

    class FlushRaises(InMemorySpanExporter):
        def force_flush(self, timeout_millis: int = 30000) -> bool:
            raise ConnectionError("collector gone")

        def shutdown(self) -> None:
            shut.append(True)
            super().shutdown()

    sink = SpanSink(FlushRaises())
    caplog.set_level(logging.WARNING, logger="ckpt_events.sinks.otel")
    sink.shutdown()
    sink.shutdown()
    assert shut == [True]
    assert len([r for r in caplog.records if r.name == "ckpt_events.sinks.otel"]) == 1


async def test_the_bus_close_deadline_is_kept_with_an_exporter_whose_flush_hangs() -> None:
    """An exporter whose ``force_flush`` blocks (a hung collector): ``Bus(close_timeout=0.3)``
    returns by its deadline, not when the flush ends (it took the whole flush before)."""
    release = threading.Event()

    class FlushHangs(InMemorySpanExporter):
        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return release.wait(5)

    sink = SpanSink(FlushHangs())
    started = time.monotonic()
    try:
        async with Bus(close_timeout=0.3) as bus:
            bus.subscribe(sink)
            with Telemetry(bus, kind="resources", instance="r0").operation("commit", checkpoint_id="c1"):
                pass
        took = time.monotonic() - started
    finally:
        release.set()  # the flush's thread ends now
    assert took < 1.5, took
