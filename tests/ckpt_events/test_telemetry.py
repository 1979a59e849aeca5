"""Telemetry: spans as event pairs, errors, trace context, counted events, the off switch."""

from __future__ import annotations

import pytest

from ckpt_events import (
    Bus,
    CollectionFinished,
    CoordinateFinished,
    GenerationCut,
    InvalidArgumentError,
    InvalidTypeError,
    InvalidValueError,
    LeaseExpired,
    OperationFinished,
    OperationStarted,
    PrepareNotReady,
    Refused,
    StageFinished,
    StepFinished,
    StepStarted,
    Telemetry,
    UnknownNameError,
    format_traceparent,
)
from ckpt_events.testing import MemorySink, capture_events
from ckpt_events.vocab import Disposition, ErrorCode, Phase


async def test_remote_parent_from_traceparent_and_outgoing_header() -> None:
    """An incoming traceparent makes the span a child of the caller's; traceparent() names it."""
    async with capture_events() as (bus, events):
        controller = Telemetry(bus, kind="controller", instance="coordination")
        participant = Telemetry(bus, kind="agent", instance="a0")
        with controller.coordinate("commit", checkpoint_id="c1") as coord:
            header = coord.traceparent()
            assert header == format_traceparent(coord.trace_id, coord.span_id)
            with participant.operation("commit", checkpoint_id="c1", traceparent=header):
                pass
    op = next(e for e in events if isinstance(e, OperationFinished))
    co = next(e for e in events if isinstance(e, CoordinateFinished))
    assert op.trace_id == co.trace_id and op.parent_span_id == co.span_id and op.parent_remote


@pytest.mark.parametrize(
    "header",
    [
        "garbage",
        "",
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
        "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
        "00-0af7651916cd43dd8448eb211c80319-b7ad6b7169203331-01",
        "x" * 10_000,
    ],
)
async def test_malformed_traceparent_starts_a_new_trace(header: str) -> None:
    """A malformed traceparent is ignored: a root span in a new trace, never an exception."""
    async with capture_events() as (bus, events):
        tel = Telemetry(bus, kind="agent", instance="a0")
        with tel.operation("prepare", traceparent=header):
            pass
    finished = events[-1]
    assert isinstance(finished, OperationFinished)
    assert finished.parent_span_id is None and not finished.parent_remote and finished.trace_id


async def test_local_parent_nests_spans_in_one_process() -> None:
    """parent= nests a span under another span of this process."""
    async with capture_events() as (bus, events):
        tel = Telemetry(bus, kind="controller", instance="coordination")
        with tel.collection("checkpoint", checkpoint_id="c1") as coll:
            coll.set(in_flight=3, stop=False, published=True)
            with tel.coordinate("prepare", checkpoint_id="c1", parent=coll) as coord:
                for kind in ("environment", "model", "agent", "resources"):
                    with coord.stage(kind) as stage:
                        stage.set(participants=1 if kind != "resources" else 0)
                coord.set(participants=3, prepared=True)
    collection = next(e for e in events if isinstance(e, CollectionFinished))
    coordinate = next(e for e in events if isinstance(e, CoordinateFinished))
    stages = [e for e in events if isinstance(e, StageFinished)]
    assert coordinate.parent_span_id == collection.span_id and not coordinate.parent_remote
    assert [str(s.stage) for s in stages] == ["environment", "model", "agent", "resources"]
    assert all(s.parent_span_id == coordinate.span_id for s in stages)
    assert stages[-1].participants == 0
    assert collection.in_flight == 3 and collection.published is True and collection.stop is False


async def test_counted_events() -> None:
    """refused, lease_expired, prepare_not_ready and generation_cut emit typed point events."""
    async with capture_events() as (bus, events):
        tel = Telemetry(bus, kind="model", instance="m0")
        tel.refused("stale_attempt", checkpoint_id="c1")
        tel.lease_expired(Phase.PREPARED)
        tel.prepare_not_ready(7)
        tel.generation_cut("durable_prefix", 3)
    refused, lease, not_ready, cut = events
    assert isinstance(refused, Refused) and refused.code is ErrorCode.STALE_ATTEMPT
    assert refused.checkpoint_id == "c1"
    assert isinstance(lease, LeaseExpired) and lease.phase is Phase.PREPARED
    assert isinstance(not_ready, PrepareNotReady) and not_ready.blockers == 7
    assert isinstance(cut, GenerationCut) and cut.disposition is Disposition.DURABLE_PREFIX
    assert cut.calls == 3


async def test_interest_decides_what_is_built() -> None:
    """Only wanted types are built: a finished-only sink gets no Started events."""
    async with capture_events(interests=[OperationFinished]) as (bus, events):
        tel = Telemetry(bus, kind="environment", instance="e0")
        assert tel.enabled
        with tel.operation("prepare") as op, op.step("wait_ready"):
            pass
        tel.refused("admission_closed")
    assert [type(e) for e in events] == [OperationFinished]


async def test_steps_are_built_when_only_steps_are_wanted() -> None:
    """A sink wanting only steps still gets them: the operation runs live to parent them."""
    async with capture_events(interests=[StepStarted]) as (bus, events):
        tel = Telemetry(bus, kind="environment", instance="e0")
        with tel.operation("prepare") as op, op.step("wait_ready"):
            pass
    assert [type(e) for e in events] == [StepStarted]


async def test_enabled_follows_subscribe_and_unsubscribe() -> None:
    """tel.enabled turns on at subscribe and off at unsubscribe, without any emit."""
    async with capture_events(interests=[Refused]) as (bus, _):
        tel = Telemetry(bus, kind="agent", instance="a0")
        assert tel.enabled
        sub = bus.subscribe(MemorySink(interests=[LeaseExpired]))
        sub.close()
        assert tel.enabled
        next(iter(bus._history)).close()  # the capture's own subscription
        assert not tel.enabled
        assert tel.operation("commit").traceparent() is None


def test_without_a_bus_everything_is_a_no_op() -> None:
    """Telemetry(None) is always off, and its handles accept every call."""
    tel = Telemetry(None, kind="agent", instance="a0")
    assert not tel.enabled
    with tel.operation("commit", checkpoint_id="c") as op:
        with op.step("write") as step:
            step.set(records=1, bytes=2)
            step.set_attribute("x", 1)
        op.set(records=1, phase="committed")
    with tel.coordinate("prepare") as coord, coord.stage("model") as stage:
        stage.set(participants=1)
    with tel.collection("restore") as coll:
        coll.set(rows=1, restarts=0)
    tel.refused("unauthorized")
    tel.lease_expired("preparing")
    tel.generation_cut("durable_failure", 2)
    tel.prepare_not_ready(1)
    assert op.traceparent() is None and coord.traceparent() is None


@pytest.mark.parametrize("enabled", [False, True], ids=["off", "on"])
async def test_unknown_names_raise_on_both_paths(enabled: bool) -> None:
    """A typo in a closed name fails whether or not telemetry is on, naming the valid values;
    a step or a stage (a kind) is open, so only a name of the wrong shape fails, naming the rule."""
    async with capture_events(interests=None if enabled else [CollectionFinished]) as (bus, _):
        tel = Telemetry(bus, kind="model", instance="m0")
        with pytest.raises(UnknownNameError, match="commit"):
            tel.operation("comit")
        with pytest.raises(UnknownNameError, match="operation"):
            tel.operation(["commit"])  # type: ignore[arg-type]
        with pytest.raises(InvalidValueError, match="invalid step 'Wait!': a step is 1-64 characters"):
            with tel.operation("prepare") as op:
                op.step("Wait!")
        with pytest.raises(UnknownNameError, match="stale_attempt"):
            tel.refused("stale")
        with pytest.raises(UnknownNameError, match="durable_prefix"):
            tel.generation_cut("partial", 1)
        with pytest.raises(UnknownNameError, match="idle"):
            tel.lease_expired("asleep")
        with pytest.raises(InvalidValueError, match="invalid participant kind 'Judge'"):
            tel.coordinate("prepare").stage("Judge")
        with pytest.raises(InvalidTypeError, match="a step must be a str"):
            with tel.operation("prepare") as op:
                op.step(3)  # type: ignore[arg-type]
        with pytest.raises(UnknownNameError, match="collection action"):
            tel.collection("upload")


def test_bad_constructor_arguments() -> None:
    """Kind, instance, bus and sample_ratio are validated."""
    with pytest.raises(InvalidValueError, match="participant kind"):
        Telemetry(None, kind="Judge", instance="j0")
    with pytest.raises(InvalidArgumentError, match="instance"):
        Telemetry(None, kind="model", instance="../etc")
    with pytest.raises(InvalidArgumentError, match="bus"):
        Telemetry(object(), kind="model", instance="m0")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="sample_ratio"):
        Telemetry(None, kind="model", instance="m0", sample_ratio=2)


async def test_sampling_at_the_root_is_inherited_downstream() -> None:
    """sample_ratio=0 marks root spans unsampled; a child via traceparent keeps the decision."""
    async with capture_events() as (bus, events):
        root = Telemetry(bus, kind="controller", instance="coordination", sample_ratio=0.0)
        participant = Telemetry(bus, kind="model", instance="m0")
        with root.coordinate("prepare") as coord:
            assert coord.traceparent().endswith("-00")  # type: ignore[union-attr]
            with participant.operation("prepare", traceparent=coord.traceparent()):
                pass
    assert all(not e.sampled for e in events)


async def test_started_event_precedes_work_for_live_views() -> None:
    """OperationStarted is emitted on entry, before the block's own events."""
    async with capture_events() as (bus, events):
        tel = Telemetry(bus, kind="model", instance="m0")
        with tel.operation("prepare"):
            tel.refused("admission_closed")
    assert [type(e) for e in events] == [OperationStarted, Refused, OperationFinished]


async def test_operations_without_step_interest_build_no_step_handles() -> None:
    """A sink wanting only finished operations (metrics) gets them; steps are no live handles
    (they record and queue nothing), but hand the operation's trace on: the shared no-op step
    they were had no ``traceparent()``, so a call made inside a step started a new trace."""
    async with Bus() as bus:
        sink = MemorySink(interests=[OperationFinished])
        bus.subscribe(sink)
        tel = Telemetry(bus, kind="resources", instance="r0")
        with tel.operation("commit", checkpoint_id="c1") as op:
            step = op.step("write")
            with step:
                step.set(records=1)
                assert step.traceparent() == op.traceparent() is not None
            with pytest.raises(InvalidValueError):
                op.step("No such step")
            upload = op.step("upload")  # a user's step: the same
            assert upload.traceparent() == op.traceparent()
        assert type(step).__name__ == type(upload).__name__ == "_PassedStep"
        bus.subscribe(MemorySink(interests=[StepFinished]))
        with tel.operation("commit", checkpoint_id="c1") as op:
            assert type(op.step("write")).__name__ == "StepSpan"
        await bus.flush()
    assert [type(e) for e in sink.events] == [OperationFinished, OperationFinished]


@pytest.mark.parametrize("listening", [False, True])
@pytest.mark.parametrize("bad", [5, 1.5, ("a", "b"), b"c1"])
async def test_a_checkpoint_id_that_is_not_a_str_is_refused_on_and_off(listening: bool, bad: object) -> None:
    """An int checkpoint id was accepted and written, and every line holding it then failed to
    read back; it is refused where it is given, with telemetry on or off alike."""
    async with Bus() as bus:
        if listening:
            bus.subscribe(MemorySink())
        tel = Telemetry(bus, kind="agent", instance="a0")
        calls = [
            lambda: tel.operation("commit", checkpoint_id=bad),
            lambda: tel.coordinate("commit", checkpoint_id=bad),
            lambda: tel.collection("checkpoint", checkpoint_id=bad),
            lambda: tel.refused("stale_attempt", checkpoint_id=bad),
            lambda: tel.lease_expired("preparing", checkpoint_id=bad),
            lambda: tel.prepare_not_ready(1, checkpoint_id=bad),
            lambda: tel.generation_cut("durable_prefix", 1, checkpoint_id=bad),
        ]
        for call in calls:
            with pytest.raises(InvalidTypeError, match=r"checkpoint_id must be a str or None, not "):
                call()
        if listening:
            with (
                tel.collection("checkpoint") as collection,
                pytest.raises(InvalidTypeError, match="checkpoint_id"),
            ):
                collection.set(checkpoint_id=bad)  # type: ignore[arg-type]


_HEADER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.parametrize("listening", [False, True])
@pytest.mark.parametrize("bridged", [False, True])
async def test_a_trace_context_of_the_wrong_type_is_refused_on_and_off(
    listening: bool, bridged: bool
) -> None:
    """A raw ASGI header (``bytes``) as ``traceparent`` or ``tracestate``, or a header passed as
    ``parent=``, was taken as no parent and the trace cut without a word; each is refused where
    it is given, with telemetry on or off alike. A malformed ``str`` is still ignored."""
    async with Bus() as bus:
        if listening:
            bus.subscribe(MemorySink())

        class Current:  # a current span: the bridged path never reads traceparent
            def current_parent(self) -> tuple[int, int, bool]:
                return 1, 2, True

            def attach(self, trace_id: int, span_id: int, sampled: bool) -> object:
                return None

            def detach(self, token: object) -> None:
                return None

        tel = Telemetry(bus, kind="agent", instance="a0", otel_context=Current() if bridged else False)
        raw = _HEADER.encode()
        for make in (tel.operation, tel.coordinate):
            with pytest.raises(
                InvalidTypeError, match=r"traceparent must be a str or None, not b'00-.*decode"
            ):
                make("prepare", traceparent=raw)  # type: ignore[arg-type]
            with pytest.raises(
                InvalidTypeError, match=r"parent must be a span handle .* not '00-.*traceparent="
            ):
                make("prepare", parent=_HEADER)  # type: ignore[arg-type]
        with pytest.raises(InvalidTypeError, match="traceparent must be a str or None"):
            tel.collection("checkpoint", traceparent=raw)  # type: ignore[arg-type]
        with pytest.raises(InvalidTypeError, match="parent must be a span handle"):
            tel.collection("checkpoint", parent=_HEADER)  # type: ignore[arg-type]
        for traceparent in (_HEADER, None):
            with pytest.raises(InvalidTypeError, match=r"tracestate must be a str or None, not b'rojo=1'"):
                tel.operation("prepare", traceparent=traceparent).with_tracestate(b"rojo=1")  # type: ignore[arg-type]
        assert tel.operation("prepare", traceparent="00-not-a-header").traceparent() != "00-not-a-header"


async def test_a_str_subclass_is_a_checkpoint_id() -> None:
    class Id(str):
        pass

    async with capture_events() as (bus, events):
        with Telemetry(bus, kind="agent", instance="a0").operation("commit", checkpoint_id=Id("c1")):
            pass
    assert [e.checkpoint_id for e in events if isinstance(e, OperationFinished)] == ["c1"]


@pytest.mark.parametrize("listening", [False, True])
async def test_counted_events_check_their_counts_on_and_off(listening: bool) -> None:
    """``prepare_not_ready(-1)`` and ``generation_cut(..., calls="3")`` passed with no sink
    and raised with one."""
    async with Bus() as bus:
        if listening:
            bus.subscribe(MemorySink())
        tel = Telemetry(bus, kind="agent", instance="a0")
        with pytest.raises(InvalidArgumentError, match="blockers must be an int >= 0, not -1"):
            tel.prepare_not_ready(-1)
        with pytest.raises(InvalidArgumentError, match="calls must be an int >= 0, not '3'"):
            tel.generation_cut("durable_prefix", "3")  # type: ignore[arg-type]


def test_a_telemetry_made_per_request_is_freed_and_still_emits() -> None:
    """The pattern is one Telemetry per participant, but one made per request must not leak: the
    bus tells its Telemetry of new subscriptions through weak references, so each is freed once
    its spans are delivered (a million made: memory flat), and each one's events arrive."""
    import gc
    import weakref

    from ckpt_events import OperationFinished, StepFinished
    from ckpt_events.testing import EventCapture

    with EventCapture() as capture:
        made: list[weakref.ref[Telemetry]] = []
        for n in range(200):
            tel = Telemetry(capture.bus, kind="judge", instance="judge-0")
            with tel.operation("commit", checkpoint_id=f"r{n}") as op, op.step("write"):
                pass
            made.append(weakref.ref(tel))
            del tel, op
        assert len(capture.of_type(OperationFinished)) == len(capture.of_type(StepFinished)) == 200
        gc.collect()
        assert [ref for ref in made if ref() is not None] == []
