"""ckpt_events.testing: deterministic ids and clock for Telemetry, and EventCapture from sync code."""

from __future__ import annotations

from typing import Any

import pytest

from ckpt_events import InvalidArgumentError, InvalidTypeError, OperationFinished, Refused, Telemetry
from ckpt_events.testing import CLOCK_START_NS, EventCapture, SequentialIds, TickingClock


def _run() -> list[object]:
    with EventCapture() as capture:
        tel = capture.telemetry("resources", "r0")
        with tel.operation("commit", checkpoint_id="c1") as op:
            with op.step("write") as write:
                write.set(records=1)
        tel.refused("unauthorized")
        return list(capture.events)


def test_two_runs_give_equal_events() -> None:
    """With SequentialIds and a TickingClock the same code emits equal events, run after run."""
    first, second = _run(), _run()
    assert first == second
    finished = [e for e in first if isinstance(e, OperationFinished)]
    assert [(e.trace_id, e.span_id, e.start_ns) for e in finished] == [(1, 1, CLOCK_START_NS)]
    (refused,) = [e for e in first if isinstance(e, Refused)]
    assert refused.time_ns == CLOCK_START_NS + 4 * 1_000_000


def test_sequential_ids_and_ticking_clock() -> None:
    """Trace and span ids count separately; the clock steps by step_ns per reading."""
    ids = SequentialIds(first_trace=10)
    assert [ids(128), ids(64), ids(128), ids(64)] == [10, 1, 11, 2]
    clock = TickingClock(start_ns=5, step_ns=2)
    assert [clock(), clock(), clock()] == [5, 7, 9]


def test_ids_and_clock_must_be_callable() -> None:
    """A non-callable ids or clock is refused."""
    with pytest.raises(InvalidArgumentError):
        Telemetry(None, kind="agent", instance="a0", ids=3)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        Telemetry(None, kind="agent", instance="a0", clock="now")  # type: ignore[arg-type]


def test_capture_outside_its_block_says_so() -> None:
    """Reading events of a capture that is not running raises a clear error."""
    capture = EventCapture()
    with pytest.raises(RuntimeError, match="not running"):
        capture.flush_sync()


def test_a_capture_s_events_are_read_after_its_block() -> None:
    """After the ``with`` block the bus has drained into the capture: ``events``, ``of_type``
    and ``clear`` read it (they raised 'not running: use it as `with EventCapture() as
    capture:`', of a capture used just so); emitting through it afterwards still fails."""
    with EventCapture() as capture:
        tel = capture.telemetry("resources", "r0")
        with tel.operation("commit", checkpoint_id="c1"):
            pass
    (finished,) = capture.of_type(OperationFinished)
    assert finished.span_id == 1 and [type(e) for e in capture.events][-1] is OperationFinished
    capture.clear()
    assert capture.events == []
    with pytest.raises(RuntimeError, match=r"has ended: its events are read as they were"):
        capture.subscribe(EventCapture().sink)


@pytest.mark.parametrize("cls", ["OperationFinished", None, 3])
def test_of_type_refuses_what_is_not_an_event_class(cls: Any) -> None:
    """``of_type("Refused")`` (a name, not the class) found nothing when nothing was captured,
    so ``assert not capture.of_type("Refused")`` passed whatever was emitted; it is refused."""
    with EventCapture() as capture:
        for where in (capture, capture.sink):
            with pytest.raises(InvalidTypeError, match=r"of_type takes an event class \(or a tuple"):
                where.of_type(cls)


def test_entering_a_capture_twice_leaves_no_thread_running() -> None:
    """The second ``with`` is refused (a bus is entered once); its portal's event-loop thread
    stayed running and kept the interpreter from exiting."""
    import threading

    from ckpt_events import InvalidValueError

    before = set(threading.enumerate())
    capture = EventCapture()
    with capture:
        pass
    with pytest.raises(InvalidValueError, match="entered once"), capture:
        pass
    time_left = 5.0
    while set(threading.enumerate()) - before and time_left > 0:
        threading.Event().wait(0.05)
        time_left -= 0.05
    assert not set(threading.enumerate()) - before


def test_entering_a_running_capture_again_leaves_it_running() -> None:
    """A second ``with`` inside the first (a test's ``with ckpt_capture:``) is refused and the
    capture goes on capturing; it closed the running bus, and every later read said "not running"."""
    from ckpt_events import InvalidValueError, OperationFinished

    with EventCapture() as capture:
        with pytest.raises(InvalidValueError, match="entered once"), capture:
            pass
        with capture.telemetry("model", "model-0").operation("commit", checkpoint_id="c1"):
            pass
        assert len(capture.of_type(OperationFinished)) == 1


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: SequentialIds(first_trace=0), r"first_trace must be an int in \[1, 2\*\*128\), not 0"),
        (lambda: SequentialIds(first_span=-1), r"first_span must be an int in \[1, 2\*\*64\), not -1"),
        (lambda: SequentialIds(first_trace=2**128), "ids must fit their bits"),
        (lambda: TickingClock(step_ns=-1000), "step_ns must be an int >= 0, not -1000"),
        (lambda: TickingClock(start_ns="now"), "start_ns must be an int >= 0"),  # type: ignore[arg-type]
    ],
)
def test_deterministic_ids_and_clock_refuse_what_makes_invalid_events(make: Any, message: str) -> None:
    """``first_trace=2**128`` made a 33-digit traceparent and failed a JSON-lines batch; 0 drew a
    random trace id (the run no longer deterministic); a negative step ended spans before they
    started."""
    with pytest.raises(InvalidArgumentError, match=message):
        make()


def test_sequential_ids_say_when_they_run_out() -> None:
    ids = SequentialIds(first_span=2**64 - 1)
    assert ids(64) == 2**64 - 1
    with pytest.raises(InvalidArgumentError, match="ran out of 64-bit ids"):
        ids(64)


def test_a_sink_stuck_in_handle_fails_the_read_instead_of_hanging_the_test() -> None:
    """A sink of the test's that never returns from ``handle`` hung ``capture.events`` for
    ever; the flush waits ``timeout`` seconds and names the sink."""
    import threading

    release = threading.Event()

    class Stuck:
        interests = None

        def handle(self, batch: list[Any]) -> None:
            release.wait(10)

    with EventCapture(close_timeout=1) as capture:
        capture.subscribe(Stuck(), name="stuck")
        capture.telemetry("agent", "a0").refused("unauthorized")
        with pytest.raises(
            TimeoutError, match=r"within 0\.2 s \(a sink stuck in handle\? subscribed: capture, stuck\)"
        ):
            capture.flush_sync(timeout=0.2)
        release.set()
        assert [type(e) for e in capture.events] == [Refused]


@pytest.mark.parametrize("timeout", ["30", -1, float("nan")])
def test_flush_refuses_a_timeout_that_is_not_seconds(timeout: Any) -> None:
    """A flush timeout that is not a number of seconds >= 0 is refused in one line, and the
    capture goes on. Was: a TypeError from inside ``threading``, or for -1 a ``TimeoutError``
    blaming a stuck sink ("not handled within -1 s")."""
    with EventCapture() as capture:
        capture.telemetry("agent", "a0").refused("unauthorized")
        with pytest.raises(InvalidArgumentError, match=r"^flush timeout must be a number of seconds >= 0"):
            capture.flush_sync(timeout=timeout)
        assert [type(e) for e in capture.events] == [Refused]
