"""The default clocks (``_wallclock``): every stamp of a process is one monotonic read on one
offset to the wall clock, so a process's stamps keep the order of what they stamp."""

from __future__ import annotations

import time

import pytest

from ckpt_events import Bus, Telemetry
from ckpt_events import _wallclock as wallclock
from ckpt_events._events import SpanEvent
from ckpt_events.testing import EventCapture


def _stamp(event: SpanEvent) -> int:
    end = getattr(event, "end_ns", None)
    return end if end is not None else event.start_ns


def test_stamps_of_one_process_never_go_back() -> None:
    """Spans ending back to back, in two Telemetries of one process: each line's stamp is at
    or after the one above it. Each span read the wall clock and the monotonic clock a moment
    apart, its end its wall start plus its monotonic duration: 28 of 36,000 events of such a log
    went back ~1 us, and the report said a clock had stepped back."""
    with EventCapture() as capture:
        # The default clocks (EventCapture.telemetry's are deterministic: no jitter to find).
        judge = Telemetry(capture.bus, kind="judge", instance="judge-0")
        ctl = Telemetry(capture.bus, kind="controller", instance="coordination")
        for i in range(2_500):
            with ctl.collection("checkpoint", checkpoint_id=f"c{i}") as collection:
                with ctl.coordinate("prepare", parent=collection) as coordinate, coordinate.stage("judge"):
                    with judge.operation("commit", checkpoint_id=f"c{i}", parent=coordinate) as op:
                        with op.step("export"), op.step("write"):
                            pass
        events = [e for e in capture.events if isinstance(e, SpanEvent)]
    assert len(events) == 2_500 * 12
    back = [(a, b) for a, b in zip(events, events[1:], strict=False) if _stamp(b) < _stamp(a)]
    assert back == []


def test_the_default_clock_is_the_wall_clock() -> None:
    """A default Telemetry stamps with ``wall_ns``, within a millisecond of ``time.time_ns``."""
    tel = Telemetry(Bus(), kind="judge", instance="judge-0")
    assert tel.clock is wallclock.wall_ns
    before = time.time_ns()
    stamp = tel.clock()
    after = time.time_ns()
    assert before - 1_000_000 <= stamp <= after + 1_000_000


def test_a_stepped_wall_clock_is_followed_at_the_next_calibration(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wall clock stepped 5 s ahead (NTP, a VM resumed) is the stamps' clock once the offset
    is read again (within ``RECALIBRATE_NS``); the reads' own jitter is not followed."""
    calibration = wallclock.CALIBRATION
    # Put back after the test: the process's stamps stayed 5 s ahead until the next calibration,
    # then stepped back, and the next test's log read "out of time order".
    monkeypatch.setattr(calibration, "offset", calibration.offset)
    monkeypatch.setattr(calibration, "due", -1)
    first = wallclock.wall_ns()
    offset = calibration.offset
    monkeypatch.setattr(wallclock, "time_ns", lambda: time.time_ns() + 5_000)  # jitter: 5 us
    monkeypatch.setattr(calibration, "due", 0)
    wallclock.wall_ns()
    assert calibration.offset == offset
    monkeypatch.setattr(wallclock, "time_ns", lambda: time.time_ns() + 5_000_000_000)
    assert wallclock.wall_ns() - first < 1_000_000_000  # not read again before it is due
    monkeypatch.setattr(calibration, "due", 0)
    assert wallclock.wall_ns() - first >= 5_000_000_000
    assert calibration.due > time.monotonic_ns()


def test_clocks_the_caller_gives_are_read_as_given() -> None:
    """``clock=`` and ``monotonic=`` keep their meaning: the start from the one, the duration
    from the other (no offset of ours between them)."""
    readings = iter(range(1_000, 100_000, 1_000))
    monos = iter(range(5, 500, 5))
    with EventCapture() as capture:
        clocks = {"clock": lambda: next(readings), "monotonic": lambda: next(monos)}
        tel = Telemetry(capture.bus, kind="judge", instance="judge-0", **clocks)
        with tel.operation("commit"):
            pass
        start, finish = capture.events
    assert start.start_ns == 1_000
    assert finish.start_ns == 1_000 and finish.end_ns == 1_005


@pytest.mark.parametrize("step_s", [-3600, 3600])
def test_a_span_begun_after_a_step_is_stamped_inside_its_local_parent(
    step_s: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wall clock steps an hour (NTP, a VM resumed) while a collection, a coordinate, a stage,
    an operation and its first step run, and the offset follows it: the spans begun after it
    (the second step, a stage, an operation under it) are stamped on their local parent's
    offset, inside it, with their true durations; a new root takes the new offset. Was: the
    write step stamped 3,600 s before (or after) its own commit."""
    calibration = wallclock.CALIBRATION
    monkeypatch.setattr(calibration, "offset", calibration.offset)  # put back after the test
    monkeypatch.setattr(calibration, "due", -1)
    wall = time.time_ns
    with EventCapture() as capture:
        judge = Telemetry(capture.bus, kind="judge", instance="judge-0")
        ctl = Telemetry(capture.bus, kind="controller", instance="coordination")
        with ctl.collection("checkpoint", checkpoint_id="c1") as collection:
            with ctl.coordinate("prepare", parent=collection) as coordinate:
                with judge.operation("commit", checkpoint_id="c1", parent=coordinate) as op:
                    with op.step("export"):
                        time.sleep(0.002)
                    # The OS clock steps, and the offset is read again (due within a second).
                    monkeypatch.setattr(wallclock, "time_ns", lambda: wall() + step_s * 10**9)
                    monkeypatch.setattr(calibration, "due", 0)
                    with op.step("write"):
                        time.sleep(0.002)
                with coordinate.stage("judge"), judge.operation("commit", parent=coordinate):
                    time.sleep(0.002)
        with judge.operation("commit", checkpoint_id="c2"):
            pass
        spans = [e for e in capture.events if isinstance(e, SpanEvent) and hasattr(e, "end_ns")]
    by_id = {e.span_id: e for e in spans}
    children = [e for e in spans if e.parent_span_id in by_id]
    assert len(children) == 6
    outside = [
        (type(e).__name__, (e.start_ns - by_id[e.parent_span_id].start_ns) / 1e9)
        for e in children
        if not by_id[e.parent_span_id].start_ns <= e.start_ns <= e.end_ns <= by_id[e.parent_span_id].end_ns
    ]
    assert outside == []
    assert all(e.end_ns - e.start_ns < 1_000_000_000 for e in spans)
    root = spans[-1]  # c2: a new root, on the offset that followed the step
    assert abs(root.start_ns - (wall() + step_s * 10**9)) < 1_000_000_000
