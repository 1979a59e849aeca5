"""The participants' span handles (``ckpt_events._span_handles``): operations and steps as Started/Finished
pairs, their ``set()`` values and error fields, each in its own slot."""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from ckpt_events import (
    InvalidArgumentError,
    OperationFinished,
    OperationStarted,
    SpanNotStartedError,
    StepFinished,
    StepStarted,
    Telemetry,
    UnknownNameError,
    format_traceparent,
)
from ckpt_events.testing import capture_events
from ckpt_events.vocab import Kind, Operation, Outcome, Phase
from tests.ckpt_events.test_positional_fields import _fields, _only

TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
REMOTE_PARENT = 0xB7AD6B7169203331


async def test_operation_with_steps_emits_started_and_finished_pairs() -> None:
    """An operation and its steps emit Started/Finished events with nested ids and attributes."""
    async with capture_events() as (bus, events):
        tel = Telemetry(bus, kind="resources", instance="r0")
        with tel.operation("commit", checkpoint_id="c1") as op:
            with op.step("export") as export:
                export.set(records=2)
            with op.step("write") as write:
                write.set(records=2, bytes=4096)
            op.set(records=2)
    kinds = [type(e).__name__ for e in events]
    assert kinds == [
        "OperationStarted",
        "StepStarted",
        "StepFinished",
        "StepStarted",
        "StepFinished",
        "OperationFinished",
    ]
    started, finished = events[0], events[-1]
    assert isinstance(finished, OperationFinished)
    assert finished.operation is Operation.COMMIT and finished.kind == Kind.RESOURCES
    assert finished.checkpoint_id == "c1" and finished.records == 2
    assert finished.span_id == started.span_id and finished.parent_span_id is None
    assert finished.start_ns <= finished.end_ns
    steps = [e for e in events if isinstance(e, StepFinished)]
    assert [str(s.step) for s in steps] == ["export", "write"]
    assert all(s.parent_span_id == finished.span_id and s.trace_id == finished.trace_id for s in steps)
    assert steps[1].bytes == 4096 and steps[1].records == 2
    assert finished.start_ns <= steps[0].start_ns <= steps[1].end_ns <= finished.end_ns


async def test_an_exception_records_error_and_propagates() -> None:
    """An exception leaving an operation gives outcome error with its type, and re-raises."""
    async with capture_events() as (bus, events):
        tel = Telemetry(bus, kind="model", instance="m0")
        with pytest.raises(KeyError), tel.operation("restore") as op:
            with op.step("read"):
                raise KeyError("missing")
    step, operation = events[2], events[3]
    assert isinstance(step, StepFinished) and step.outcome is Outcome.ERROR
    assert isinstance(operation, OperationFinished)
    assert operation.outcome is Outcome.ERROR and operation.error_type == "KeyError"
    assert operation.error_message == "'missing'"


async def test_bad_attribute_values_raise() -> None:
    """set() rejects negative or non-int counts; set_attribute() non-scalar values."""
    async with capture_events() as (bus, _):
        tel = Telemetry(bus, kind="model", instance="m0")
        with tel.operation("commit") as op:
            with pytest.raises(InvalidArgumentError, match="records"):
                op.set(records=-1)
            with pytest.raises(InvalidArgumentError, match="bytes"):
                op.set(bytes="10")  # type: ignore[arg-type]
            with pytest.raises(UnknownNameError, match="phase"):
                op.set(phase="done")
            with pytest.raises(InvalidArgumentError, match="attribute"):
                op.set_attribute("x", [1])  # type: ignore[arg-type]


async def test_operation_and_step_fields_land_in_their_own_slots() -> None:
    """Operation and step: each of their settable fields is given a distinct value and read back,
    the caller's tracestate last on all four events (the step inherits it)."""
    header = format_traceparent(TRACE_ID, REMOTE_PARENT)
    async with capture_events() as (bus, events):
        tel = Telemetry(bus, kind="model", instance="model-7")
        span = tel.operation("prepare", checkpoint_id="ck-1", traceparent=header)
        with span.with_tracestate("dd=s:1,ot=th:8") as op:
            with op.step("generation_cut") as step:
                step.set(records=11, bytes=12, calls=13, cut_durable_prefix=14, cut_durable_failure=15)
                step.set_attribute("user.step", "s")
            op.set(records=21, bytes=22, phase="preparing", blockers=23, episodes=24, rollouts=25)
            op.set(received_ns=27, loop_lag_ms=28.5)
            op.set_attribute("user.op", 26)
    started, finished = _only(events, OperationStarted), _only(events, OperationFinished)
    step_started, step_finished = _only(events, StepStarted), _only(events, StepFinished)

    assert _fields(finished) == {
        "kind": Kind.MODEL,
        "instance": "model-7",
        "trace_id": TRACE_ID,
        "span_id": started.span_id,
        "start_ns": started.start_ns,
        "end_ns": finished.end_ns,
        "operation": "prepare",
        "checkpoint_id": "ck-1",
        "parent_span_id": REMOTE_PARENT,
        "parent_remote": True,
        "sampled": True,
        "outcome": Outcome.OK,
        "error_type": None,
        "error_message": None,
        "attributes": {"user.op": 26},
        "phase": Phase.PREPARING,
        "blockers": 23,
        "records": 21,
        "bytes": 22,
        "episodes": 24,
        "rollouts": 25,
        "received_ns": 27,
        "loop_lag_ms": 28.5,
        "worker": None,
        "tracestate": "dd=s:1,ot=th:8",
    }
    assert _fields(step_finished) == {
        "kind": Kind.MODEL,
        "instance": "model-7",
        "trace_id": TRACE_ID,
        "span_id": step_started.span_id,
        "start_ns": step_started.start_ns,
        "end_ns": step_finished.end_ns,
        "step": "generation_cut",
        "checkpoint_id": "ck-1",
        "parent_span_id": started.span_id,
        "parent_remote": False,
        "sampled": True,
        "outcome": Outcome.OK,
        "error_type": None,
        "error_message": None,
        "attributes": {"user.step": "s"},
        "records": 11,
        "bytes": 12,
        "calls": 13,
        "cut_durable_prefix": 14,
        "cut_durable_failure": 15,
        "worker": None,
        "tracestate": "dd=s:1,ot=th:8",
    }
    for event in (started, step_started):
        assert event.__struct_fields__[-2:] == ("worker", "tracestate")
        assert event.tracestate == "dd=s:1,ot=th:8"
    assert started.start_ns <= step_started.start_ns <= step_finished.end_ns <= finished.end_ns
    assert len({started.span_id, step_started.span_id, REMOTE_PARENT}) == 3


async def test_failed_operation_fills_the_error_fields() -> None:
    """An exception fills outcome, error_type and error_message, each in its own field."""
    async with capture_events() as (bus, events):
        tel = Telemetry(bus, kind="agent", instance="agent-3")
        with pytest.raises(KeyError), tel.operation("commit", checkpoint_id="ck-2") as op:
            with op.step("write"):
                raise KeyError("disk")
    for cls in (OperationFinished, StepFinished):
        event = _only(events, cls)
        assert (event.outcome, event.error_type, event.error_message) == (
            Outcome.ERROR,
            "KeyError",
            "'disk'",
        )
        assert event.parent_remote is False


async def test_a_cancelled_operation_names_its_cancel_without_addresses_or_paths() -> None:
    """An operation ended by anyio's cancellation (a client that went away, a timeout) carried
    "Cancelled via cancel scope 7f41... by <Task pending name=... running at /.../_tasks.py:327>"
    as its error message: 300 characters of addresses and the host's paths in every exported span.
    The message is anyio's first words; a cancellation's own message (``task.cancel("why")``) stays."""
    import asyncio

    import anyio

    async with capture_events() as (bus, events):
        tel = Telemetry(bus, kind="agent", instance="agent-3")

        async def request(checkpoint_id: str) -> None:
            with tel.operation("commit", checkpoint_id=checkpoint_id):
                await anyio.sleep(5)

        async with anyio.create_task_group() as tg:
            tg.start_soon(request, "scope")
            await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
        task = asyncio.ensure_future(request("own"))
        await asyncio.sleep(0.01)
        task.cancel("the client went away")
        with pytest.raises(asyncio.CancelledError):
            await task
    finished = {e.checkpoint_id: e for e in events if isinstance(e, OperationFinished)}
    assert finished["scope"].error_type == "asyncio.exceptions.CancelledError"
    assert finished["scope"].error_message == "Cancelled via cancel scope"
    assert finished["own"].error_message == "the client went away"


async def test_an_exception_group_names_what_it_holds() -> None:
    """An error raised in an anyio task group leaves as an ``ExceptionGroup`` whose message was
    only "unhandled errors in a TaskGroup (1 sub-exception)": the ``OSError: disk full`` that
    failed the commit was in no event or span (OpenTelemetry's SDK keeps it in its stacktrace).
    The message names each member, nested groups' too, at most ``_MOST_MEMBERS`` of them."""
    import anyio

    async def disk_full() -> None:
        raise OSError("disk full")

    async with capture_events() as (bus, events):
        tel = Telemetry(bus, kind="agent", instance="agent-3")
        with pytest.raises(ExceptionGroup), tel.operation("commit", checkpoint_id="tg"):
            async with anyio.create_task_group() as tg:
                tg.start_soon(disk_full)
        nested = ExceptionGroup("outer", [KeyError("k"), ExceptionGroup("inner", [ValueError("v")])])
        with pytest.raises(ExceptionGroup), tel.operation("commit", checkpoint_id="nested"):
            raise nested
        many = ExceptionGroup("many", [ValueError(str(i)) for i in range(20)])
        with pytest.raises(ExceptionGroup), tel.operation("commit", checkpoint_id="many"):
            raise many
    finished = {e.checkpoint_id: e for e in events if isinstance(e, OperationFinished)}
    assert finished["tg"].error_type == "ExceptionGroup"
    tg_said = "unhandled errors in a TaskGroup (1 sub-exception): OSError: disk full"
    assert finished["tg"].error_message == tg_said
    assert finished["nested"].error_message == "outer (2 sub-exceptions): KeyError: 'k'; ValueError: v"
    shown = "; ".join(f"ValueError: {i}" for i in range(8))
    assert finished["many"].error_message == f"many (20 sub-exceptions): {shown}; and 12 more"


async def test_set_keeps_what_it_is_not_given_and_refuses_bad_counts() -> None:
    """A later set() leaves earlier values alone; a negative, bool or float count is refused."""
    async with capture_events() as (bus, events):
        tel = Telemetry(bus, kind="model", instance="m0")
        with tel.operation("commit") as op:
            with op.step("write") as step:
                step.set(records=3)
                step.set(bytes=4)
                for bad in ({"calls": -1}, {"records": True}, {"cut_durable_prefix": 1.0}):
                    with pytest.raises(InvalidArgumentError):
                        step.set(**bad)  # type: ignore[arg-type]
            op.set(records=5, phase="preparing")
            op.set(blockers=2)
            with pytest.raises(InvalidArgumentError, match="received_ns"):
                op.set(received_ns=-1)
    step_event, op_event = _only(events, StepFinished), _only(events, OperationFinished)
    assert (step_event.records, step_event.bytes, step_event.calls) == (3, 4, None)
    assert (op_event.records, op_event.phase, op_event.blockers) == (5, Phase.PREPARING, 2)


async def test_a_step_named_by_the_user_is_kept_as_given() -> None:
    """A step that is not in the vocabulary but has the rule's shape is its own name."""
    async with capture_events() as (bus, events):
        tel = Telemetry(bus, kind="model", instance="m0")
        with tel.operation("commit") as op, op.step("tokenize"):
            pass
    assert _only(events, StepStarted).step == "tokenize" == _only(events, StepFinished).step


async def test_an_exception_whose_str_raises_leaves_the_block_as_it_was() -> None:
    """With a sink on, ``str(exc)`` raising inside ``__exit__`` replaced the app's exception with
    the one from ``__str__`` and lost the span; the app's exception now passes through."""

    class AppError(Exception):
        def __str__(self) -> str:
            raise RuntimeError("__str__ is broken")

    async with capture_events() as (bus, events):
        tel = Telemetry(bus, kind="agent", instance="a0")
        with pytest.raises(AppError), tel.operation("commit", checkpoint_id="c1") as op, op.step("write"):
            raise AppError
    finished = [event for event in events if isinstance(event, StepFinished | OperationFinished)]
    assert [event.error_message for event in finished] == [
        f"<{__name__}.{AppError.__qualname__}: str() of it raised>"
    ] * 2


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"records": 2**63}, r"records must be an int in \[0, 2\*\*63\), not 9223372036854775808"),
        ({"bytes": -1}, r"bytes must be an int in \[0, 2\*\*63\)"),
        ({"loop_lag_ms": math.inf}, "loop_lag_ms must be a finite number >= 0, not inf"),
        ({"loop_lag_ms": math.nan}, "loop_lag_ms must be a finite number >= 0, not nan"),
    ],
)
async def test_set_refuses_what_no_sink_can_carry(values: dict[str, Any], message: str) -> None:
    """Counts past int64 (OTLP's and Prometheus's integers) and an infinite loop lag (written as
    JSON ``null``, read back as unknown) are refused where they are set."""
    async with capture_events() as (bus, _):
        with Telemetry(bus, kind="agent", instance="a0").operation("commit") as op:
            with pytest.raises(InvalidArgumentError, match=message):
                op.set(**values)


class _Bridge:
    """A ``ContextBridge`` with no current span that counts what it attaches and detaches."""

    def __init__(self) -> None:
        self.attached = self.detached = 0

    def current_parent(self) -> None:
        return None

    def attach(self, trace_id: int, span_id: int, sampled: bool) -> object:
        self.attached += 1
        return trace_id

    def detach(self, token: object) -> None:
        self.detached += 1


#: Every live handle kind, built and not entered (its parent, where it has one, entered).
_HANDLES: dict[str, Callable[[Telemetry], Any]] = {
    "operation": lambda tel: tel.operation("commit", checkpoint_id="c1"),
    "bridged operation": lambda tel: Telemetry(
        tel.bus, kind="judge", instance="judge-0", otel_context=_Bridge()
    ).operation("commit", checkpoint_id="c1"),
    "step": lambda tel: tel.operation("commit", checkpoint_id="c1").__enter__().step("write"),
    "coordinate": lambda tel: tel.coordinate("commit", checkpoint_id="c1"),
    "stage": lambda tel: tel.coordinate("prepare", checkpoint_id="c1").__enter__().stage("model"),
    "collection": lambda tel: tel.collection("checkpoint", checkpoint_id="c1"),
}


@pytest.mark.parametrize("kind", list(_HANDLES))
async def test_leaving_a_handle_never_entered_raises_and_emits_nothing(kind: str) -> None:
    """``__exit__`` without ``__enter__`` raises ``SpanNotStartedError`` (a span from 1970 was
    emitted, or an ``AttributeError`` ended the handle); the handle still works as a ``with``."""
    async with capture_events() as (bus, events):
        tel = Telemetry(bus, kind="resources", instance="r0")
        handle = _HANDLES[kind](tel)
        with pytest.raises(SpanNotStartedError, match="without being entered") as raised:
            handle.__exit__(None, None, None)
        assert isinstance(raised.value, RuntimeError) and raised.value.handle == type(handle).__name__
        await bus.flush()
        assert not [e for e in events if getattr(e, "span_id", None) == handle.span_id]
        with handle:
            pass
    mine = [e for e in events if getattr(e, "span_id", None) == handle.span_id]
    assert [type(e).__name__.endswith("Started") for e in mine] == [True, False]
    assert 0 < mine[0].start_ns == mine[1].start_ns <= mine[1].end_ns


# In a fresh interpreter: the warning is said once a process, and other tests may say it.
_FORGOT_WITH = """
import logging, sys
from ckpt_events import OperationFinished, StepFinished
from ckpt_events.testing import EventCapture

logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(levelname)s %(message)s")
with EventCapture() as capture:
    tel = capture.telemetry("judge", "judge-0")
    with tel.operation("commit", checkpoint_id="right") as op:  # as documented: nothing said
        with op.step("upload"):
            pass
    print("said nothing yet", flush=True)
    for n in range(3):
        op = tel.operation("commit", checkpoint_id=f"forgot-{n}")  # `with` forgotten
        with op.step("upload"):
            pass
        op.set(records=3)
    ops = capture.of_type(OperationFinished)
    print("operations", [e.checkpoint_id for e in ops], "steps", len(capture.of_type(StepFinished)))
"""


def test_a_step_of_an_operation_never_entered_is_said_once() -> None:
    """``op = tel.operation(...)`` without ``with``, then ``op.step(...)`` and ``op.set(...)``:
    the steps were recorded as children of a span never recorded, the operation and its
    ``set()`` lost, without a word. One warning says so and names the fix; the operation
    used as documented says nothing; what is recorded is unchanged."""
    result = subprocess.run(
        [sys.executable, "-c", _FORGOT_WITH], capture_output=True, text=True, timeout=60, check=True
    )
    lines = result.stdout.splitlines()
    assert lines[0] == "said nothing yet", result.stdout
    warnings = [line for line in lines if line.startswith("WARNING")]
    assert len(warnings) == 1, result.stdout
    assert "step 'upload' made of a commit operation not entered" in warnings[0]
    assert "`with tel.operation(...) as op:`" in warnings[0]
    assert lines[-1] == "operations ['right'] steps 4"
