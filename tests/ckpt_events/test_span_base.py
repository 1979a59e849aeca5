"""What every span handle answers (``ckpt_events._span_base``): extra attributes travel on the
finished event, a ``set_attribute`` after the block is ignored, a handle ends once, and an
error's type and message are recorded. A finished span's attributes: ``test_frozen_attrs.py``."""

from __future__ import annotations

from typing import Any

import pytest

from ckpt_events import (
    Bus,
    CoordinateFinished,
    InvalidTypeError,
    OperationFinished,
    OperationStarted,
    Redactor,
    StageFinished,
    StepFinished,
    Telemetry,
)
from ckpt_events.testing import capture_events
from ckpt_events.vocab import Outcome


class _Keep:
    def __init__(self) -> None:
        self.events: list[Any] = []

    def handle(self, batch: list[Any]) -> None:
        self.events.extend(batch)


async def test_set_attribute_after_the_block_does_not_rewrite_a_delivered_event() -> None:
    """After delivery, ``set_attribute`` on the ended handle is ignored (it rewrote the event)."""
    keep = _Keep()
    async with Bus() as bus:
        bus.subscribe(keep)
        tel = Telemetry(bus, kind="agent", instance="agent-0")
        with tel.operation("commit", checkpoint_id="c1") as op:
            op.set_attribute("user.a", 1)
        with tel.operation("commit", checkpoint_id="c1") as bare:
            pass
        with tel.coordinate("commit", checkpoint_id="c1") as co:
            co.set_attribute("user.a", 1)
        await bus.flush()
        op.set_attribute("user.a", 2)
        op.set_attribute("user.new", 3)
        bare.set_attribute("user.new", 3)
        co.set_attribute("user.a", 2)
        await bus.flush()
    ops = [e for e in keep.events if isinstance(e, OperationFinished)]
    [coordinate] = [e for e in keep.events if isinstance(e, CoordinateFinished)]
    assert [e.attributes for e in ops] == [{"user.a": 1}, None]
    assert coordinate.attributes == {"user.a": 1}


async def test_re_entering_a_finished_handle_emits_nothing_more() -> None:
    """A second ``with`` on an ended handle gives no second event with the same span id."""
    keep = _Keep()
    async with Bus() as bus:
        bus.subscribe(keep)
        tel = Telemetry(bus, kind="agent", instance="agent-0")
        ctl = Telemetry(bus, kind="controller", instance="coordination")
        op = tel.operation("commit", checkpoint_id="c1")
        co = ctl.coordinate("commit", checkpoint_id="c1")
        for _ in range(2):
            with op, co:
                pass
        await bus.flush()
    finished = [e for e in keep.events if isinstance(e, OperationFinished | CoordinateFinished)]
    started = [e for e in keep.events if isinstance(e, OperationStarted)]
    assert sorted(e.span_id for e in finished) == sorted([op.span_id, co.span_id])
    assert [e.span_id for e in started] == [op.span_id]


async def test_extra_attributes_travel_on_the_finished_event() -> None:
    """set_attribute() values arrive on the Finished event for sinks to redact and export."""
    async with capture_events() as (bus, events):
        tel = Telemetry(bus, kind="model", instance="m0")
        with tel.operation("commit") as op:
            op.set_attribute("user.api_key", "hunter2")
            op.set_attribute("batch", 3)
    assert events[-1].attributes == {"user.api_key": "hunter2", "batch": 3}


class _DiskGone(Exception):
    """An exception defined outside builtins: its type is recorded with its module."""


async def test_an_error_records_its_qualified_type_and_a_bounded_message() -> None:
    """A builtin keeps its bare name, any other class its module path; the message is cut at 1,024."""
    async with capture_events() as (bus, events):
        ctl = Telemetry(bus, kind="controller", instance="coordination")
        with pytest.raises(_DiskGone), ctl.coordinate("prepare") as co:
            with pytest.raises(ValueError), co.stage("agent"):
                raise ValueError("short")
            raise _DiskGone("x" * 5000)
    [stage] = [e for e in events if isinstance(e, StageFinished)]
    [coordinate] = [e for e in events if isinstance(e, CoordinateFinished)]
    assert (stage.outcome, stage.error_type, stage.error_message) == (Outcome.ERROR, "ValueError", "short")
    assert coordinate.error_type == f"{__name__}._DiskGone"
    assert coordinate.error_message == "x" * 1024


@pytest.mark.parametrize(
    ("code", "said"),
    [
        (0, "a clean exit (status 0) ended it before it finished"),
        (None, "a clean exit (status 0) ended it before it finished"),
        (False, "a clean exit (status 0) ended it before it finished"),
        (3, "an exit with status 3 ended it before it finished"),
        ("usage: tool FILE", "usage: tool FILE"),
    ],
)
async def test_a_system_exit_says_it_was_an_exit_not_a_bare_code(code: Any, said: str) -> None:
    """A ``SystemExit`` ending an operation and its step is still outcome ``error`` (the work did
    not finish), but says it was an exit. Was: ``SystemExit: 0`` (``SystemExit(None)``: an empty
    message), which a report shows as a failure's cause."""
    async with capture_events() as (bus, events):
        tel = Telemetry(bus, kind="resources", instance="resources-0")
        with pytest.raises(SystemExit), tel.operation("commit", checkpoint_id="c1") as op:
            with op.step("write"):
                raise SystemExit(code)
    ended = [e for e in events if isinstance(e, (OperationFinished, StepFinished))]
    assert [(e.outcome, e.error_type, e.error_message) for e in ended] == [
        (Outcome.ERROR, "SystemExit", said)
    ] * 2


async def test_a_cut_message_does_not_keep_half_a_urls_password() -> None:
    """The cut at 1,024 may fall between a URL's password and its ``@``, the mark by which the
    redaction rule knows a password: the cut-off authority is left out, so no sink shows it."""
    async with capture_events() as (bus, events):
        tel = Telemetry(bus, kind="model", instance="m0")
        with pytest.raises(RuntimeError), tel.operation("commit"):
            raise RuntimeError("x" * 1000 + " https://svc:hunter2hunter2@db.internal/x")
    [finished] = [e for e in events if isinstance(e, OperationFinished)]
    assert finished.error_message == "x" * 1000 + " https://"
    assert "hunter" not in Redactor().redact_message(finished.error_message)


@pytest.mark.parametrize(("name", "value"), [("user.a", [1]), ("user.a", None), (3, "v")])
async def test_set_attribute_takes_a_str_name_and_a_scalar_value(name: Any, value: Any) -> None:
    """A non-str name or a value that is not str, bool, int or float is an InvalidTypeError."""
    async with capture_events() as (bus, _):
        tel = Telemetry(bus, kind="model", instance="m0")
        with tel.operation("commit") as op:
            with pytest.raises(InvalidTypeError, match="attribute"):
                op.set_attribute(name, value)


async def test_traceparent_names_the_span_and_carries_the_sampling_flag() -> None:
    """traceparent() is the W3C header of this span: its trace id, its span id, its sampled flag."""
    async with capture_events() as (bus, _):
        tel = Telemetry(bus, kind="model", instance="m0")
        with tel.operation("commit") as op:
            header = op.traceparent()
    assert header == f"00-{op.trace_id:032x}-{op.span_id:016x}-01"


@pytest.mark.parametrize("listening", [False, True], ids=["off", "on"])
async def test_async_with_on_a_handle_says_to_use_with(listening: bool) -> None:
    """``async with`` on any handle, telemetry on or off, is one ``InvalidTypeError`` naming the
    call and ``with`` (it was Python's "'_NoopOperation' object does not support the asynchronous
    context manager protocol", naming an internal class), and it starts nothing."""
    async with capture_events() as (bus, events):
        tel = Telemetry(bus if listening else Bus(), kind="controller", instance="c0")
        with tel.operation("commit", checkpoint_id="c1") as op, tel.coordinate("prepare") as co:
            makes = {
                "tel.operation(...)": lambda: tel.operation("commit", checkpoint_id="c1"),
                "op.step(...)": lambda: op.step("write"),
                "tel.coordinate(...)": lambda: tel.coordinate("commit"),
                "coordinate.stage(...)": lambda: co.stage("resources"),
                "tel.collection(...)": lambda: tel.collection("checkpoint"),
            }
            for call, make in makes.items():
                with pytest.raises(InvalidTypeError) as refused:
                    async with make():
                        pass
                assert str(refused.value).startswith(f"{call} ")
                assert "is entered with `with`, not `async with`" in str(refused.value)
                assert "Noop" not in str(refused.value)
    assert sorted({type(event).__name__ for event in events}) == (
        ["CoordinateFinished", "CoordinateStarted", "OperationFinished", "OperationStarted"]
        if listening
        else []
    )
    assert len(events) == (4 if listening else 0)  # the two entered with `with`, nothing else
