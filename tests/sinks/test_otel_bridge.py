"""``sinks.otel_bridge``: the ``ckpt_events.context_bridges`` entry point's home resolves to the bridge."""

from __future__ import annotations

import sys
from importlib.metadata import entry_points

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from ckpt_events import Bus, InvalidValueError, Telemetry
from ckpt_events.sinks import otel_bridge
from ckpt_events.sinks.otel._context_bridge import OtelContextBridge as Implemented


def test_the_entry_point_loads_the_bridge_this_module_exports() -> None:
    """The installed ``opentelemetry`` bridge is ``otel_bridge.OtelContextBridge``, the same class
    its private home defines, and reads the real SDK's current span."""
    [point] = [p for p in entry_points(group="ckpt_events.context_bridges") if p.name == "opentelemetry"]
    assert point.value == "ckpt_events.sinks.otel_bridge:OtelContextBridge"
    assert point.load() is otel_bridge.OtelContextBridge is Implemented
    assert otel_bridge.__all__ == ["OtelContextBridge"]
    with TracerProvider().get_tracer("t").start_as_current_span("s") as span:
        context = span.get_span_context()
        assert otel_bridge.OtelContextBridge().current_parent() == (
            context.trace_id,
            context.span_id,
            True,
            False,  # a span of this process
            None,  # no tracestate
        )
    assert trace.get_current_span().get_span_context().is_valid is False


async def test_an_extracted_remote_parent_keeps_its_remote_flag_and_tracestate() -> None:
    """A server without auto-instrumentation makes the caller's span current with
    ``propagate.extract`` + ``context.attach``: the operation was an INTERNAL child with a local
    parent and no tracestate. It is the SERVER child of the remote parent, its tracestate kept,
    as with ``traceparent=`` and ``with_tracestate``."""
    from opentelemetry import context, propagate

    from ckpt_events import OperationFinished, Telemetry
    from ckpt_events.testing import capture_events
    from ckpt_events.vocab import SpanKind, span_kind_of

    headers = {
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "tracestate": "vendor=abc",
    }
    token = context.attach(propagate.extract(headers))
    try:
        async with capture_events() as (bus, events):
            tel = Telemetry(bus, kind="agent", instance="a0", otel_context=True)
            with tel.operation("commit", checkpoint_id="c1") as op:
                assert op.tracestate() == "vendor=abc"
                # What the app's own instrumented client sends from inside the operation carries
                # the caller's tracestate on (the current span had none: attach took none).
                sent: dict[str, str] = {}
                propagate.inject(sent)
                assert sent == {"traceparent": op.traceparent(), "tracestate": "vendor=abc"}
    finally:
        context.detach(token)
    (finished,) = [e for e in events if isinstance(e, OperationFinished)]
    assert finished.parent_remote is True and finished.parent_span_id == 0xB7AD6B7169203331
    assert finished.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert span_kind_of(finished) == SpanKind.SERVER


class _Bridge:
    """A user's bridge written to the protocol before ``tracestate``: three arguments."""

    def __init__(self) -> None:
        self.attached: list[tuple[object, ...]] = []

    def current_parent(self) -> None:
        return None

    def attach(self, trace_id: int, span_id: int, sampled: bool) -> object:
        self.attached.append((trace_id, span_id, sampled))
        return None

    def detach(self, token: object) -> None:
        pass


class _StateBridge(_Bridge):
    def attach(self, trace_id: int, span_id: int, sampled: bool, **options: object) -> object:
        self.attached.append((trace_id, span_id, sampled, options))
        return None


async def test_a_bridge_gets_the_tracestate_only_if_its_attach_takes_it() -> None:
    """A three-argument ``attach`` (the protocol as it was) is called as before, never with a
    keyword it would refuse; one taking ``tracestate`` (or ``**kwargs``) gets the operation's."""
    from ckpt_events import Telemetry
    from ckpt_events.testing import capture_events

    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    for bridge, extra in ((_Bridge(), ()), (_StateBridge(), ({"tracestate": "vendor=abc"},))):
        async with capture_events() as (bus, _):
            tel = Telemetry(bus, kind="agent", instance="a0", otel_context=bridge)
            with tel.operation("commit", traceparent=traceparent).with_tracestate("vendor=abc") as op:
                pass
        assert bridge.attached == [(op.trace_id, op.span_id, True, *extra)]


def test_without_opentelemetry_otel_context_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """On an install without the otel extra, ``otel_context=True`` is one error naming the extra,
    not the entry point's ``ModuleNotFoundError`` traceback."""
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # as if not installed
    for module in ("ckpt_events.sinks.otel_bridge", "ckpt_events.sinks.otel._context_bridge"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(InvalidValueError, match=r"install ckpt-events\[otel\], or pass a ContextBridge"):
        Telemetry(Bus(), kind="agent", instance="a0", otel_context=True)


async def test_a_passed_on_parent_is_continued_by_a_bridged_operation() -> None:
    """``parent=`` a passed-on operation (a Telemetry with no sink, given the caller's header)
    makes a bridged operation the remote caller's child, over the current OpenTelemetry span,
    and that operation is the current span while open (was: a new root trace)."""
    from ckpt_events import OperationFinished
    from ckpt_events.testing import capture_events

    caller = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
    off = Telemetry(None, kind="model", instance="m0")
    with TracerProvider().get_tracer("t").start_as_current_span("app"):
        async with capture_events() as (bus, events):
            tel = Telemetry(bus, kind="agent", instance="a0", otel_context=True)
            with (
                off.operation("prepare", traceparent=caller).with_tracestate("vendor=1") as passed,
                tel.operation("commit", parent=passed) as op,
            ):
                current = trace.get_current_span().get_span_context()
                assert (current.trace_id, current.span_id) == (0x0AF7651916CD43DD8448EB211C80319C, op.span_id)
                assert op.tracestate() == "vendor=1"
    (finished,) = [e for e in events if isinstance(e, OperationFinished)]
    assert finished.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert (finished.parent_span_id, finished.parent_remote, finished.sampled) == (
        0xB7AD6B7169203331,
        True,
        False,
    )


#: File-system audit events: what reading the installed packages' metadata raises.
_FILE_EVENTS = ("open", "os.listdir", "os.scandir")
_audited: list[list[str]] = []


def _audit(event: str, args: tuple[object, ...]) -> None:
    if _audited and event in _FILE_EVENTS:
        _audited[-1].append(event)


def test_a_telemetry_made_per_request_reads_no_package_metadata() -> None:
    """A user who builds ``Telemetry(..., otel_context=True)`` in each request (rather than once)
    paid an entry-point lookup each time: the installed packages' metadata read again, 5.4 ms a
    Telemetry against 4 us without ``otel_context``. The lookup is made once; each Telemetry still
    gets a working bridge (the current span is its operation's parent)."""
    bus = Bus()
    Telemetry(bus, kind="agent", instance="a0", otel_context=True)  # the first one may look up
    sys.addaudithook(_audit)  # cannot be removed: inert while _audited is empty
    _audited.append([])
    try:
        for _ in range(5):
            Telemetry(bus, kind="agent", instance="a0", otel_context=True)
    finally:
        read = _audited.pop()
    assert read == []
    tel = Telemetry(bus, kind="agent", instance="a0", otel_context=True)
    assert tel._bridge is not None and tel._bridge_state
    with TracerProvider().get_tracer("t").start_as_current_span("request") as span:
        assert tel._bridge.current_parent()[:2] == (
            span.get_span_context().trace_id,
            span.get_span_context().span_id,
        )


async def test_concurrent_tasks_and_threads_each_nest_under_their_own_operation() -> None:
    """One Telemetry with ``otel_context=True`` shared by 8 anyio tasks (steps interleaved across
    ``await``s) and 4 threads: each inner operation, made without ``parent=``, is the child of
    its own task's or thread's operation, never another's, as each step is of its operation."""
    import threading

    import anyio

    from ckpt_events import OperationFinished, StepFinished
    from ckpt_events.testing import capture_events

    async with capture_events() as (bus, events):
        tel = Telemetry(bus, kind="agent", instance="a0", otel_context=True)

        async def task(n: int) -> None:
            with tel.operation("commit", checkpoint_id=f"task-{n}") as op:
                for turn in range(10):
                    with op.step("upload"):
                        await anyio.sleep(0.001 * ((n + turn) % 3))
                    with tel.operation("restore", checkpoint_id=f"task-{n}"):
                        await anyio.sleep(0)

        def thread(n: int) -> None:
            with tel.operation("commit", checkpoint_id=f"thread-{n}") as op:
                for _ in range(50):
                    with op.step("upload"):
                        pass
                    with tel.operation("restore", checkpoint_id=f"thread-{n}"):
                        pass

        threads = [threading.Thread(target=thread, args=(n,)) for n in range(4)]
        for started in threads:
            started.start()
        async with anyio.create_task_group() as group:
            for n in range(8):
                group.start_soon(task, n)
        for started in threads:
            started.join(timeout=30)
    finished = [e for e in events if isinstance(e, OperationFinished)]
    commits = {e.span_id: e.checkpoint_id for e in finished if e.operation == "commit"}
    inner = [e for e in finished if e.operation == "restore"]
    steps = [e for e in events if isinstance(e, StepFinished)]
    assert len(commits) == 12 and len(inner) == len(steps) == 8 * 10 + 4 * 50
    assert all(commits.get(e.parent_span_id) == e.checkpoint_id for e in inner)
    assert all(commits.get(e.parent_span_id) == e.checkpoint_id for e in steps)
