"""tracestate on span handles: kept with a valid traceparent, inherited by children, else None."""

from __future__ import annotations

from ckpt_events import Telemetry
from ckpt_events.testing import capture_events

_PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


async def test_operation_keeps_the_incoming_tracestate_and_steps_inherit_it() -> None:
    """op.tracestate() is the validated header; its steps pass on the same one."""
    async with capture_events() as (bus, _):
        tel = Telemetry(bus, kind="agent", instance="a0")
        with tel.operation("prepare", traceparent=_PARENT).with_tracestate("rojo=1 , congo=2") as op:
            assert op.tracestate() == "rojo=1,congo=2"
            with op.step("wait_ready") as step:
                assert step.tracestate() == "rojo=1,congo=2"
            with tel.operation("commit", parent=op) as child:
                assert child.tracestate() == "rojo=1,congo=2"


async def test_tracestate_is_dropped_without_a_valid_traceparent_or_when_invalid() -> None:
    """No traceparent, a malformed one, or a malformed tracestate: tracestate() is None."""
    async with capture_events() as (bus, _):
        tel = Telemetry(bus, kind="agent", instance="a0")
        for traceparent, tracestate in ((None, "rojo=1"), ("00-bad", "rojo=1"), (_PARENT, "Rojo=1")):
            with tel.operation("prepare", traceparent=traceparent).with_tracestate(tracestate) as op:
                assert op.tracestate() is None


async def test_controller_spans_carry_it_from_their_root() -> None:
    """A collection continued from a caller's headers hands tracestate to its coordinate and stages."""
    async with capture_events() as (bus, _):
        tel = Telemetry(bus, kind="controller", instance="c0")
        with tel.collection("checkpoint", traceparent=_PARENT).with_tracestate("rojo=1") as collection:
            assert collection.tracestate() == "rojo=1"
            with tel.coordinate("prepare", parent=collection) as coordinate:
                with coordinate.stage("agent") as stage:
                    assert stage.tracestate() == "rojo=1"


def test_the_disabled_path_hands_the_callers_on() -> None:
    """With nobody listening an operation records nothing but hands on the caller's
    ``traceparent`` and the ``tracestate`` kept with it; without a caller's, it has none."""
    tel = Telemetry(None, kind="agent", instance="a0")
    with tel.operation("prepare", traceparent=_PARENT).with_tracestate("rojo=1") as op:
        assert op.tracestate() == "rojo=1" and op.traceparent() == _PARENT
    with tel.operation("prepare").with_tracestate("rojo=1") as op:
        assert op.tracestate() is None and op.traceparent() is None


async def test_a_root_span_ignores_tracestate() -> None:
    """A span that starts its own trace drops a tracestate handed to it (W3C: it goes with its parent)."""
    async with capture_events() as (bus, _):
        tel = Telemetry(bus, kind="agent", instance="a0")
        with tel.operation("prepare").with_tracestate("rojo=1") as op:
            assert op.tracestate() is None
