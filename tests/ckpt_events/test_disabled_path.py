"""The off path: with no sink listening, an instrumented site allocates nothing of its own.

Counted with an allocator hook (``PyMem_SetAllocator``; see ``benchmarks/allocount.py``),
since tracemalloc snapshots miss allocations freed within the call. The baseline is the
same site around a shared do-nothing context manager: on CPython 3.11 each ``with``
statement itself allocates two short-lived bound methods.
"""

from __future__ import annotations

import contextlib

import pytest

from ckpt_events import Bus, Telemetry
from ckpt_events.benchmarks.allocount import NOTHING, AllocCounterUnavailable, build, calls_per_run
from ckpt_events.testing import MemorySink


@pytest.fixture(scope="module", autouse=True)
def _hook() -> None:
    try:
        build()
    except AllocCounterUnavailable as exc:  # no C compiler on this machine
        pytest.skip(str(exc))


def _site(tel: Telemetry) -> None:
    with tel.operation("commit", checkpoint_id="c1") as op:
        with op.step("export"):
            pass
        with op.step("write"):
            pass
        op.set(records=12, bytes=4096)


def _baseline() -> None:
    with NOTHING:
        with NOTHING:
            pass
        with NOTHING:
            pass


def _points(tel: Telemetry) -> None:
    tel.refused("stale_attempt", checkpoint_id="c1")
    tel.lease_expired("prepared")
    tel.prepare_not_ready(3)
    tel.generation_cut("durable_prefix", 2)


def _coordinate(tel: Telemetry) -> None:
    with tel.coordinate("prepare", checkpoint_id="c1") as coord:
        with coord.stage("model") as stage:
            stage.set(participants=1)
        coord.set(participants=4, prepared=True)


def _two_withs() -> None:
    with NOTHING:
        with NOTHING:
            pass


def _empty() -> None:
    pass


def test_disabled_operation_site_allocates_nothing_of_its_own() -> None:
    """An operation with two steps and a set() makes no allocator call beyond the baseline."""
    tel = Telemetry(None, kind="resources", instance="r0")
    assert calls_per_run(lambda: _site(tel), _baseline) == 0


def test_disabled_coordinate_and_point_events_allocate_nothing() -> None:
    """Coordinate spans, stages and every counted event allocate nothing when off."""
    tel = Telemetry(None, kind="controller", instance="coordination")
    assert calls_per_run(lambda: _coordinate(tel), _two_withs) == 0
    assert calls_per_run(lambda: _points(tel), _empty) == 0


async def test_a_bus_with_sinks_for_other_types_keeps_the_site_free() -> None:
    """Subscribed sinks that do not want span events leave operation sites on the off path."""
    from ckpt_events import Refused

    async with Bus() as bus:
        bus.subscribe(MemorySink(interests=[Refused]))
        tel = Telemetry(bus, kind="resources", instance="r0")
        assert tel.enabled
        assert calls_per_run(lambda: _site(tel), _baseline) == 0


def test_enabled_guard_allocates_nothing() -> None:
    """``if tel.enabled:`` makes no allocator call."""
    tel = Telemetry(None, kind="resources", instance="r0")

    def guard() -> None:
        if tel.enabled:
            raise AssertionError

    assert calls_per_run(guard, _empty) == 0


def test_the_counter_sees_short_lived_allocations() -> None:
    """The hook is not blind: a nullcontext() site allocates more than the baseline."""

    def nullcontexts() -> None:
        with contextlib.nullcontext():
            with contextlib.nullcontext():
                pass
            with contextlib.nullcontext():
                pass

    assert calls_per_run(nullcontexts, _baseline) >= 3
    tel_on_site_allocs = calls_per_run(lambda: [0] * 3, _empty)
    assert tel_on_site_allocs >= 1


def test_emit_allocates_nothing_of_its_own() -> None:
    """bus.emit() to two sinks that keep up allocates nothing: no iterator, no wrapper.

    (A backlog over 256 events makes CPython allocate the buffer's length as an int, and a
    deque takes a new 64-slot block now and then; a sink that keeps up causes neither.)
    """
    from ckpt_events import Refused
    from ckpt_events.vocab import ErrorCode, Kind

    bus = Bus()
    first = bus.subscribe(MemorySink(interests=[Refused]))._buffer
    second = bus.subscribe(MemorySink(interests=[Refused]))._buffer
    event = Refused(Kind.MODEL, "m0", 1, ErrorCode.STALE_ATTEMPT)
    emit = bus.emit
    take_first, take_second = first.popleft, second.popleft

    def emit_and_deliver() -> None:
        emit(event)
        take_first()  # what the sinks' delivery tasks do
        take_second()

    def deliver_only() -> None:
        first.append(event)
        second.append(event)
        take_first()
        take_second()

    assert calls_per_run(emit_and_deliver, deliver_only) == 0
