"""StallWatch: one warning and one counted ``stalled`` per operation open past the threshold."""

from __future__ import annotations

import logging
import math
import time

import anyio
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from ckpt_events import Bus, ConfigurationError, InvalidArgumentError, OperationStarted, Stalled, Telemetry
from ckpt_events import _wallclock as wallclock
from ckpt_events.sinks import StallWatch, configure
from ckpt_events.sinks._open_work import MAX_OPEN
from ckpt_events.sinks.otel import MetricSink
from ckpt_events.testing import MemorySink
from ckpt_events.vocab import METRIC_EVENTS, METRIC_OLDEST_OPEN, Kind, Operation
from tests.sinks.helpers import metric_points

P = "nemo.gym.checkpoint."


async def test_one_warning_one_stalled_and_a_line_when_it_ends(caplog: pytest.LogCaptureFixture) -> None:
    """A prepare held past ``after`` is warned about once (timer wakes several times), counted once,
    the gauge sees its age grow, and its end is logged with how long it took."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    memory = MemorySink()
    caplog.set_level(logging.WARNING, logger="ckpt_events.sinks.stall")
    async with Bus() as bus:
        watch = StallWatch(after=0.3, bus=bus)
        bus.subscribe(watch)
        bus.subscribe(MetricSink(provider))
        bus.subscribe(memory)
        tel = Telemetry(bus, kind="environment", instance="environment-0", worker=2)
        with tel.operation("prepare", checkpoint_id="c-stuck"):
            await bus.flush()
            first = metric_points(reader)[METRIC_OLDEST_OPEN][1]
            await anyio.sleep(2.6)  # the timer wakes 2-3 times past the threshold
            await bus.flush()
            later = metric_points(reader)[METRIC_OLDEST_OPEN][1]
        await bus.flush()
    key = frozenset({(P + "operation", "prepare"), (P + "participant_kind", "environment")})
    assert 0 <= first[key] < 0.5 and later[key] > 2.0
    # On a loaded machine the watch may also say its loop answered late (a warning of its own,
    # about the loop, not this prepare: a full run beside another suite saw one).
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.name == "ckpt_events.sinks.stall"
        and not r.getMessage().startswith("stall watch: the event loop")
    ]
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith(
        "stalled: prepare of environment environment-0 (checkpoint c-stuck, phase preparing) open for "
    )
    assert warnings[1].startswith(
        "stall ended: prepare of environment environment-0 (checkpoint c-stuck) ended ok after 2."
    )
    (stalled,) = [e for e in memory.events if isinstance(e, Stalled)]
    assert (stalled.kind, stalled.instance, stalled.worker, stalled.checkpoint_id) == (
        "environment",
        "environment-0",
        2,
        "c-stuck",
    )
    assert 0.3 <= stalled.age_s < 1.5 and watch.stalls == 1
    events = metric_points(reader)[METRIC_EVENTS][1]
    stalled_key = frozenset(
        {(P + "event", "stalled"), (P + "participant_kind", "environment"), (P + "operation", "prepare")}
    )
    assert events == {stalled_key: 1}
    provider.shutdown()


async def test_a_stalled_prepare_that_ended_not_ready_is_not_said_to_have_ended_ok(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A participant's prepare that answered not ready and the controller's coordinate.prepare
    that stopped at its stage end as ``ok`` spans; their end lines say how they failed (``demo
    --fault stall --watch`` said "ended ok" of the prepare that aborted the checkpoint)."""
    caplog.set_level(logging.WARNING, logger="ckpt_events.sinks.stall")
    async with Bus() as bus:
        watch = StallWatch(after=0.3, bus=bus)
        bus.subscribe(watch)
        env = Telemetry(bus, kind="environment", instance="environment-0")
        ctl = Telemetry(bus, kind="controller", instance="coordination")
        with ctl.coordinate("prepare", checkpoint_id="c-held") as coordinate:
            with env.operation("prepare", checkpoint_id="c-held") as prepare:
                await bus.flush()
                assert watch.check(time.time_ns() + 10**9) == 2
                prepare.set(blockers=2)
            coordinate.set(prepared=False, stopped_at="environment")
        await bus.flush()
    ends = sorted(r.getMessage() for r in caplog.records if " ended: " in r.getMessage())
    assert len(ends) == 2, ends
    assert ends[0].startswith(
        "stall ended: prepare of environment environment-0 (checkpoint c-held) ended not ready "
        "(2 blocking) after "
    ), ends
    # The controller waited on environment-0 (``test_the_controller_waiting_is_never_said_stalled``).
    assert ends[1].startswith(
        "wait ended: prepare of controller coordination (checkpoint c-held) ended not prepared "
        "(stopped at stage environment) after "
    ), ends
    assert not any(" ended ok " in e for e in ends)


async def test_the_controller_waiting_is_never_said_stalled(caplog: pytest.LogCaptureFixture) -> None:
    """A controller's operation past ``after`` says whom it waits on: a participant's operation
    of its checkpoint open on this bus, else its open stage, else unknown; each is still counted
    ``stalled`` (open past the threshold). Was: "stalled: prepare of controller coordination"
    beside the stuck environment-0 (``demo --fault stall --watch``)."""
    caplog.set_level(logging.WARNING, logger="ckpt_events.sinks.stall")
    memory = MemorySink()
    async with Bus() as bus:
        watch = StallWatch(after=0.3, bus=bus)
        bus.subscribe(watch)
        bus.subscribe(memory)
        env = Telemetry(bus, kind="environment", instance="environment-0")
        ctl = Telemetry(bus, kind="controller", instance="coordination")
        with ctl.coordinate("prepare", checkpoint_id="c-env") as coordinate:
            with coordinate.stage("environment"), env.operation("prepare", checkpoint_id="c-env"):
                await bus.flush()
                assert watch.check(time.time_ns() + 10**9) == 2
        with ctl.coordinate("prepare", checkpoint_id="c-stage") as coordinate:
            with coordinate.stage("model"):  # its calls in other processes
                await bus.flush()
                assert watch.check(time.time_ns() + 10**9) == 1
        with ctl.coordinate("commit", checkpoint_id="c-none"):
            await bus.flush()
            assert watch.check(time.time_ns() + 10**9) == 1
        await bus.flush()
    said = [r.getMessage() for r in caplog.records if "controller coordination" in r.getMessage()]
    assert not [m for m in said if m.startswith(("stalled: ", "stall ended: "))], said
    assert len(said) == 6, said  # each warned once, and its end
    waiting = [m for m in said if m.startswith("waiting: ")]
    assert len(waiting) == 2, said
    assert waiting[0].startswith(
        "waiting: prepare of controller coordination (checkpoint c-env, phase preparing) waiting on "
        "environment/environment-0, open for "
    ), waiting
    assert "(checkpoint c-stage, phase preparing) waiting on its model stage (calls not seen" in waiting[1]
    unknown = [m for m in said if "c-none" in m]
    assert unknown[0].startswith(
        "stalled or waiting (unknown): commit of controller coordination (checkpoint c-none, phase -) "
    ), unknown
    assert unknown[1].startswith("stall or wait ended: commit of controller coordination (checkpoint c-none)")
    stalled = sorted((e.kind, e.checkpoint_id) for e in memory.events if isinstance(e, Stalled))
    assert stalled == [
        ("controller", "c-env"),
        ("controller", "c-none"),
        ("controller", "c-stage"),
        ("environment", "c-env"),
    ]


async def test_quick_operations_are_never_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    """Operations that end before ``after`` leave no warning and no open entry."""
    async with Bus() as bus:
        watch = StallWatch(after=0.5, bus=bus)
        bus.subscribe(watch)
        tel = Telemetry(bus, kind="model", instance="model-0")
        for _ in range(20):
            with tel.operation("commit", checkpoint_id="c1"):
                pass
        await bus.flush()
        assert watch.check(time.time_ns() + 10**9) == 0
    assert not [r for r in caplog.records if r.name == "ckpt_events.sinks.stall"]


@pytest.mark.parametrize("bad", [0, -1.0, True, "5", math.inf, math.nan])
def test_after_must_be_positive_seconds(bad: object) -> None:
    """A threshold that is not a finite positive number is refused when built."""
    with pytest.raises(InvalidArgumentError, match="after must be"):
        StallWatch(after=bad)  # type: ignore[arg-type]


async def test_a_huge_threshold_is_never_reached() -> None:
    """A finite threshold whose nanoseconds overflow an int reports nothing, and raises nothing."""
    async with Bus() as bus:
        watch = StallWatch(after=1e300, bus=bus)
        bus.subscribe(watch)
        tel = Telemetry(bus, kind="model", instance="model-0")
        with tel.operation("prepare", checkpoint_id="c1"):
            await bus.flush()
            assert watch.check(time.time_ns() + 10**18) == 0


@pytest.mark.parametrize("step_s", [-3600, 3600])
async def test_a_wall_clock_step_neither_hides_nor_makes_a_stall(
    step_s: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ages run on the monotonic clock: an operation open 0.4 s past a wall clock stepped back an
    hour is reported at its true age, and one stepped forward an hour is not reported an hour old."""
    memory = MemorySink([Stalled])
    async with Bus() as bus:
        watch = StallWatch(after=0.3, bus=bus)
        bus.subscribe(watch)
        bus.subscribe(memory)
        tel = Telemetry(bus, kind="model", instance="model-0")
        with tel.operation("prepare", checkpoint_id="c1"):
            await bus.flush()  # the watch has seen it start
            wall = time.time_ns
            monkeypatch.setattr(time, "time_ns", lambda: wall() + step_s * 10**9)
            await anyio.sleep(0.4)
            watch.check(time.time_ns())
        await bus.flush()
    (stalled,) = memory.events
    assert 0.3 <= stalled.age_s < 1.5 and watch.stalls == 1


@pytest.mark.parametrize("followed", [False, True])
async def test_a_start_stamped_as_the_clock_steps_forward_is_not_an_hour_old(
    followed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The OS clock steps an hour ahead and the stamps' offset follows it up to a second later
    (``_wallclock``): a commit begun in that second, open 0.1 s, is no stall, whether the watch
    reads the clock before the offset follows or its own read makes it follow. Was: its start
    read against ``time.time_ns``, "stalled: ... open for 3600.0 s (threshold 30 s)"."""
    calibration = wallclock.CALIBRATION
    monkeypatch.setattr(calibration, "offset", calibration.offset)  # put back after the test
    memory = MemorySink([Stalled])
    async with Bus() as bus:
        watch = StallWatch(after=30, bus=bus)
        bus.subscribe(watch)
        bus.subscribe(memory)
        tel = Telemetry(bus, kind="judge", instance="judge-0")
        with tel.operation("commit", checkpoint_id="c0"):
            pass
        await bus.flush()  # the watch has read the offset
        monkeypatch.setattr(calibration, "due", time.monotonic_ns() + 10**9)  # read again in 1 s
        wall = time.time_ns

        def stepped() -> int:
            return wall() + 3600 * 10**9

        monkeypatch.setattr(time, "time_ns", stepped)  # the OS clock, as read at the boundary
        monkeypatch.setattr(wallclock, "time_ns", stepped)
        with tel.operation("commit", checkpoint_id="c1"):  # stamped on the offset before the step
            if followed:
                monkeypatch.setattr(calibration, "due", 0)  # the watch's read follows the step
            await bus.flush()
            await anyio.sleep(0.1)
            watch.check()
        await bus.flush()
    assert (memory.events, watch.stalls) == ([], 0)
    if followed:  # the stamps' clock did follow the step
        assert wallclock.wall_ns() - wall() > 3599 * 10**9


async def test_the_watch_is_bounded(caplog: pytest.LogCaptureFixture) -> None:
    """Past MAX_OPEN open operations (their ends lost to a full buffer), more are counted as
    untracked and warned about once, not kept."""
    caplog.set_level(logging.WARNING, logger="ckpt_events.sinks.stall")
    watch = StallWatch(after=3600)
    now = time.time_ns()
    started = [
        OperationStarted(Kind.MODEL, "m", 1, span_id, now, Operation.COMMIT)
        for span_id in range(MAX_OPEN + 6)
    ]
    watch.handle(started[: MAX_OPEN + 3])
    watch.handle(started[MAX_OPEN + 3 :])  # a later batch: counted, not warned about again
    await watch.aclose()
    assert watch.untracked == 6
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "ckpt_events.sinks.stall"]
    assert warning.startswith(f"stall watch: {MAX_OPEN} operations open, the most it tracks;")


async def test_subscribed_again_it_watches_afresh() -> None:
    """A watch subscribed to a second bus (an app started twice in one process) warns about a stall
    there, and not about an operation left open when the first bus closed."""
    watch = StallWatch(after=0.2)
    memory = MemorySink([Stalled])
    async with Bus() as bus:
        bus.subscribe(watch)
        left_open = Telemetry(bus, kind="model", instance="model-0").operation("prepare", checkpoint_id="c1")
        left_open.__enter__()
        await bus.flush()
    async with Bus() as bus:
        watch.bus = bus
        bus.subscribe(watch)
        bus.subscribe(memory)
        with Telemetry(bus, kind="model", instance="model-0").operation("prepare", checkpoint_id="c2"):
            await bus.flush()
            await anyio.sleep(1.3)  # the timer looks when the operation starts and a second later
        await bus.flush()
    left_open.__exit__(None, None, None)
    assert [e.checkpoint_id for e in memory.events] == ["c2"]


async def test_configure_subscribes_it_from_the_environment() -> None:
    """CKPT_EVENTS_STALL_AFTER subscribes a StallWatch; a bad value names the variable."""
    async with Bus() as bus:
        async with configure(bus, environ={"CKPT_EVENTS_STALL_AFTER": "12.5"}) as configured:
            assert [s.name for s in configured.subscriptions] == ["stall-watch"]
        with pytest.raises(ConfigurationError, match="CKPT_EVENTS_STALL_AFTER must be"):
            configure(bus, environ={"CKPT_EVENTS_STALL_AFTER": "soon"})


async def test_an_end_held_up_by_a_blocked_loop_is_not_a_stall(caplog: pytest.LogCaptureFixture) -> None:
    """An operation that ended at once, its end still undelivered while the event loop is blocked
    past ``after``, is not reported stalled; the watch says the loop was blocked instead."""
    caplog.set_level(logging.WARNING, logger="ckpt_events.sinks.stall")
    memory = MemorySink([Stalled])
    async with Bus() as bus:
        watch = StallWatch(after=0.2, bus=bus)
        bus.subscribe(watch)
        bus.subscribe(memory)
        with Telemetry(bus, kind="model", instance="model-0").operation("prepare", checkpoint_id="c1"):
            await bus.flush()  # the watch has seen it start
        time.sleep(1.6)  # the loop blocked: the end is emitted, not delivered, when the timer looks
        await bus.flush()
    assert memory.events == [] and watch.stalls == 0
    warnings = [r.getMessage() for r in caplog.records if r.name == "ckpt_events.sinks.stall"]
    assert len(warnings) == 1 and warnings[0].startswith("stall watch: the event loop answered "), warnings


async def test_on_two_buses_at_once_closing_one_keeps_watching_the_other() -> None:
    """A watch subscribed to two running buses: the second closing forgets what it opened only, so
    an operation stalled on the first is still reported."""
    watch = StallWatch(after=0.3)
    async with Bus() as first:
        first.subscribe(watch)
        with Telemetry(first, kind="model", instance="model-0").operation("prepare", checkpoint_id="c1"):
            await first.flush()
            async with Bus() as second:
                second.subscribe(watch)
                left = Telemetry(second, kind="model", instance="model-1").operation("prepare")
                left.__enter__()
                await second.flush()
            await anyio.sleep(1.3)  # the timer looks a second after the first start
        left.__exit__(None, None, None)
    assert watch.stalls == 1


async def test_an_operation_ending_between_two_seconds_is_still_reported() -> None:
    """An operation open 0.7 s with ``after`` 0.3 is reported while it is open: the timer looks
    when it comes due, not only once a second (then at 0 s and 1 s, when it had ended already).
    Its age is checked against how long the operation was open, read here: a late look on a
    busy host may read past 0.7 s, and is still a look while it was open."""
    memory = MemorySink([Stalled])
    async with Bus() as bus:
        watch = StallWatch(after=0.3, bus=bus)
        bus.subscribe(watch)
        bus.subscribe(memory)
        opened = time.monotonic()
        with Telemetry(bus, kind="model", instance="model-0").operation("prepare", checkpoint_id="c1"):
            await bus.flush()
            await anyio.sleep(0.7)
        open_for = time.monotonic() - opened
        await bus.flush()
    (stalled,) = memory.events
    assert 0.3 <= stalled.age_s < open_for and watch.stalls == 1, (stalled.age_s, open_for)


@pytest.mark.parametrize("raw", ["inf", "1e400", "nan", "0", "-1"])
async def test_a_threshold_out_of_range_in_the_environment_says_finite(raw: str) -> None:
    """``inf`` is a number of seconds > 0: the message says the threshold must also be finite."""
    async with Bus() as bus:
        with pytest.raises(ConfigurationError, match=r"must be a finite number of seconds > 0, not '"):
            configure(bus, environ={"CKPT_EVENTS_STALL_AFTER": raw})
