"""The no-op twins (``ckpt_events._noop``): the live handles' surface, nothing emitted, names
still checked."""

from __future__ import annotations

import inspect

import pytest

from ckpt_events import (
    Bus,
    CoordinateFinished,
    InvalidValueError,
    OperationFinished,
    OperationStarted,
    Telemetry,
)
from ckpt_events._controller_spans import CollectionSpan, CoordinateSpan, StageSpan
from ckpt_events._noop import NOOP_COLLECTION, NOOP_COORDINATE, NOOP_OPERATION, NOOP_STAGE, NOOP_STEP
from ckpt_events._span_handles import OperationSpan, StepSpan
from ckpt_events.testing import MemorySink, capture_events
from ckpt_events.vocab import Operation

TWINS = [
    (StepSpan, NOOP_STEP),
    (OperationSpan, NOOP_OPERATION),
    (StageSpan, NOOP_STAGE),
    (CoordinateSpan, NOOP_COORDINATE),
    (CollectionSpan, NOOP_COLLECTION),
]


def _public_methods(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_") or name in ("__enter__", "__exit__")
    }


@pytest.mark.parametrize(("live", "twin"), TWINS, ids=[live.__name__ for live, _ in TWINS])
def test_every_live_method_has_a_twin_with_the_same_signature(live: type, twin: object) -> None:
    """Code written against a live handle runs unchanged when telemetry is off: a keyword added to a
    live ``set()`` and not to its twin would raise ``TypeError`` only in the disabled path."""
    assert isinstance(twin, live)
    live_methods = _public_methods(live)
    twin_methods = _public_methods(type(twin))
    twin_only = [k for k in type(twin).__mro__ if k not in live.__mro__]
    for name, signature in live_methods.items():
        owner = next(k for k in type(twin).__mro__ if name in k.__dict__)
        assert owner in twin_only, f"{type(twin).__name__} runs the live {name}() (from {owner.__name__})"
        assert twin_methods[name].parameters.keys() == signature.parameters.keys(), name


def test_no_op_handles_are_singletons_and_emit_nothing() -> None:
    telemetry = Telemetry(None, kind="environment", instance="environment-0")
    with telemetry.operation("commit", checkpoint_id="ckpt-1") as op:
        assert op is NOOP_OPERATION
        with op.step("write") as step:
            assert step is NOOP_STEP
            step.set(records=3, bytes=10)
        op.set(records=3, phase="paused")
        op.set_attribute("user.key", "v")
        assert op.traceparent() is None
        assert op.with_tracestate("k=v") is op


async def test_a_bus_without_sinks_hands_out_the_twins_and_nothing_reaches_a_later_sink() -> None:
    async with Bus() as bus:
        telemetry = Telemetry(bus, kind="rollout", instance="rollout-0")
        with telemetry.operation("commit", checkpoint_id="ckpt-1") as op:
            assert op is NOOP_OPERATION
        sink = MemorySink()
        bus.subscribe(sink)
        await bus.flush()
        assert sink.events == []


@pytest.mark.parametrize("bad", ["Write", "", "x" * 65, "a b"])
def test_step_and_stage_names_are_checked_with_telemetry_off(bad: str) -> None:
    with pytest.raises(InvalidValueError):
        NOOP_OPERATION.step(bad)
    with pytest.raises(InvalidValueError):
        NOOP_COORDINATE.stage(bad)


def test_open_names_are_accepted_with_telemetry_off() -> None:
    assert NOOP_OPERATION.step("tokenize") is NOOP_STEP
    assert NOOP_COORDINATE.stage("rollout-db") is NOOP_STAGE


@pytest.mark.parametrize(
    ("live", "noop"),
    [
        (OperationSpan, type(NOOP_OPERATION)),
        (StepSpan, type(NOOP_OPERATION.step("write"))),
        (CoordinateSpan, type(NOOP_COORDINATE)),
        (StageSpan, type(NOOP_COORDINATE.stage("agent"))),
        (CollectionSpan, type(NOOP_COLLECTION)),
    ],
)
def test_noop_handles_have_the_live_signatures(live: type, noop: type) -> None:
    """Each no-op twin's public methods take exactly the live handle's parameters."""
    live_methods, noop_methods = _public_methods(live), _public_methods(noop)
    for name, signature in live_methods.items():
        twin = noop_methods[name]
        assert list(twin.parameters.values()) == list(signature.parameters.values()), name


_INCOMING = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


async def test_with_telemetry_off_a_callers_trace_is_handed_on_and_nothing_is_recorded() -> None:
    """A server with no sink in the middle of a chain: its operation records nothing, but its
    ``traceparent()`` (and a step's) is the caller's, ``tracestate`` kept, so the participant it
    calls next joins the caller's trace as a child of the caller's span (was: ``None``, and a new
    trace for everything after this server). A malformed header is ignored, as with a sink on."""
    async with Bus() as off_bus, Bus() as on_bus:
        off = Telemetry(off_bus, kind="model", instance="m0")
        sink = MemorySink()
        on_bus.subscribe(sink)
        downstream = Telemetry(on_bus, kind="environment", instance="e0")
        with off.operation("prepare", traceparent=_INCOMING).with_tracestate("vendor=1") as op:
            assert op.traceparent() == _INCOMING
            assert op.tracestate() == "vendor=1"
            with op.step("export") as step:
                assert step.traceparent() == _INCOMING
                assert step.tracestate() == "vendor=1"
                step.set(records=1)
                with downstream.operation("prepare", traceparent=step.traceparent()):
                    pass
            op.set(records=1, phase="exporting")
            with pytest.raises(InvalidValueError):
                op.step("not a step name")
        assert off_bus.stats().sinks == ()
        await on_bus.flush()
        (finished,) = sink.of_type(OperationFinished)
        assert f"{finished.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
        assert f"{finished.parent_span_id:016x}" == "b7ad6b7169203331"
        assert off.operation("prepare", traceparent="garbage") is NOOP_OPERATION
        assert off.operation("prepare").traceparent() is None


_UNSAMPLED = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"


async def test_a_passed_on_handle_as_parent_continues_the_callers_trace() -> None:
    """A passed-on operation (or its step) of a Telemetry with no sink, given as ``parent=`` to
    another Telemetry's live span, continues the caller's trace: its trace id, the caller's span
    as a remote parent, its sampled flag and tracestate (was: a new, sampled root trace, so the
    trace was cut where telemetry was off). ``NOOP_OPERATION`` as parent still starts a root."""
    off = Telemetry(None, kind="model", instance="m0")
    async with capture_events() as (bus, events):
        on = Telemetry(bus, kind="environment", instance="e0")
        with off.operation("prepare", traceparent=_UNSAMPLED).with_tracestate("vendor=1") as op:
            with on.operation("commit", parent=op) as child:
                assert child.traceparent() == f"00-{_UNSAMPLED[3:35]}-{child.span_id:016x}-00"
                assert child.tracestate() == "vendor=1"
            with op.step("export") as step, on.operation("commit", parent=step) as child:
                assert child.tracestate() == "vendor=1"
            with on.coordinate("prepare", parent=op) as coordinate:
                assert coordinate.tracestate() == "vendor=1"
        with on.operation("commit", parent=NOOP_OPERATION) as root:
            assert root.tracestate() is None
    started = [e for e in events if isinstance(e, OperationStarted)]
    finished = [e for e in events if isinstance(e, OperationFinished | CoordinateFinished)]
    assert len(started) == 3 and len(finished) == 4
    *continued, new_root = finished
    for event in [*started[:2], *continued]:
        assert f"{event.trace_id:032x}" == _UNSAMPLED[3:35]
        assert event.parent_span_id == 0xB7AD6B7169203331
        assert event.parent_remote is True
        assert event.sampled is False
    assert f"{new_root.trace_id:032x}" != _UNSAMPLED[3:35]
    assert new_root.parent_span_id is None and new_root.parent_remote is False and new_root.sampled


def test_a_passed_on_operations_steps_share_one_handle() -> None:
    """With no sink, every step of a passed-on operation is one handle made at its first step
    (was: one per ``step()`` call, ~170 ns each), handing on the caller's trace; a tracestate
    kept after a step was made reaches the steps made after it, not the one before."""
    off = Telemetry(None, kind="model", instance="m0")
    op = off.operation("prepare", traceparent=_INCOMING)
    first = op.step("wait_ready")
    assert op.step("export") is first and op.step("upload") is first
    assert first.traceparent() == _INCOMING and first.tracestate() is None
    assert op.with_tracestate("vendor=1") is op
    later = op.step("export")
    assert later.traceparent() == _INCOMING and later.tracestate() == "vendor=1"
    assert first.tracestate() is None
    with pytest.raises(InvalidValueError):
        op.step("not a step name")
    other = off.operation("prepare", traceparent=_UNSAMPLED).step("export")
    assert other is not later and other.traceparent() == _UNSAMPLED


async def test_with_telemetry_off_a_child_of_a_span_carrying_a_trace_hands_it_on() -> None:
    """With no sink, an operation whose ``parent=`` is a passed-on operation or step (or a live
    span of another Telemetry) hands on that parent's trace and tracestate, as a live child would
    continue it (was: ``NOOP_OPERATION``, and the trace cut at the nested operation). A child of
    ``NOOP_OPERATION`` is ``NOOP_OPERATION``; a tracestate given to a child is ignored."""
    off = Telemetry(None, kind="model", instance="m0")
    with off.operation("prepare", traceparent=_UNSAMPLED).with_tracestate("vendor=1") as op:
        for parent in (op, op.step("export")):
            with off.operation("commit", parent=parent).with_tracestate("other=2") as child:
                assert child.traceparent() == _UNSAMPLED and child.tracestate() == "vendor=1"
                with child.step("write") as step:
                    assert step.traceparent() == _UNSAMPLED and step.tracestate() == "vendor=1"
    assert off.operation("commit", parent=NOOP_OPERATION) is NOOP_OPERATION
    assert off.operation("commit", parent=NOOP_OPERATION, traceparent=_INCOMING).traceparent() == _INCOMING
    async with capture_events() as (bus, _):
        on = Telemetry(bus, kind="environment", instance="e0")
        with on.operation("commit", traceparent=_INCOMING) as live:
            assert off.operation("commit", parent=live).traceparent() == live.traceparent()


@pytest.mark.parametrize("on", [True, False], ids=["on", "off"])
async def test_a_stage_of_a_coordinate_other_than_prepare_is_refused_on_and_off(on: bool) -> None:
    """SPEC's stages are ``coordinate.prepare.<kind>``, children of coordinate.prepare only: a
    stage of a commit was accepted and written (with no operation of its own, so the report
    named it ``coordinate.prepare.judge``). Refused, precisely, with a sink or without; nothing
    is written for it, and a prepare's stage and a commit span alone still are."""
    sink = MemorySink()
    async with Bus() as bus:
        if on:
            bus.subscribe(sink)
        ctl = Telemetry(bus, kind="controller", instance="coordination")
        refused = r"stage\(\) nests under coordinate\.prepare only .* not coordinate\.commit"
        with (
            ctl.coordinate("commit", checkpoint_id="c1") as commit,
            pytest.raises(InvalidValueError, match=refused),
        ):
            commit.stage("judge")
        with ctl.coordinate(Operation.RESUME, checkpoint_id="c1") as resume, pytest.raises(InvalidValueError):
            resume.stage("agent")
        with ctl.coordinate("prepare", checkpoint_id="c1") as prepare, prepare.stage("judge"):
            pass
        await bus.flush()
    names = [
        (type(e).__name__, getattr(e, "operation", None))
        for e in sink.events
        if type(e).__name__.endswith("Finished")
    ]
    assert names == (
        [
            ("CoordinateFinished", "commit"),
            ("CoordinateFinished", "resume"),
            ("StageFinished", None),
            ("CoordinateFinished", "prepare"),
        ]
        if on
        else []
    )
