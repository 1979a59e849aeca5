"""BusThread: a bus on a thread of its own, driven from synchronous code (a WSGI app, a thread
pool, a training script), with real sinks: every event once, bounded close, nothing left running."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anyio
import pytest

from ckpt_events import BusThread, Event, InvalidValueError, OperationFinished, Subscription, Telemetry
from ckpt_events.sinks import JsonLinesSink, read_events
from ckpt_events.testing import MemorySink
from tests.processes import forked_exit

THREADS = 8
PER_THREAD = 250
DEADLINE = 0.5
SLACK = 2.0


def _bus_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name == "ckpt-events-bus"]


def _work(tel: Telemetry, worker: int) -> None:
    for n in range(PER_THREAD):
        with tel.operation("commit", checkpoint_id=f"c{worker}-{n}") as op:
            with op.step("write"):
                pass
            op.set(records=n)


class Raises:
    """A sink that fails on every batch."""

    def handle(self, batch: list[Event]) -> None:
        raise RuntimeError("broken sink")


class SleepsForever:
    """An async sink whose handle never returns: the close deadline gives up on it."""

    def __init__(self) -> None:
        self.entered = threading.Event()

    async def handle(self, batch: list[Event]) -> None:
        self.entered.set()
        await anyio.sleep_forever()


def test_threads_emit_to_a_json_lines_file_and_every_event_lands_once(tmp_path: Path) -> None:
    """Eight threads emit through a BusThread's bus into a real JsonLinesSink: each event is in
    the file exactly once, the bus's thread is gone after the block."""
    path = tmp_path / "events.jsonl"
    with BusThread() as bus:
        bus.subscribe(JsonLinesSink(path), name="jsonl")  # from this (sync) thread
        tel = Telemetry(bus, kind="judge", instance="judge-0")
        with ThreadPoolExecutor(THREADS) as pool:
            list(pool.map(lambda w: _work(tel, w), range(THREADS)))
    assert _bus_threads() == []
    finished = [e.checkpoint_id for _, e in read_events(path) if isinstance(e, OperationFinished)]
    assert len(finished) == len(set(finished)) == THREADS * PER_THREAD
    stats = bus.stats().sink("jsonl")
    assert stats.emitted == stats.delivered == 4 * THREADS * PER_THREAD
    assert (stats.dropped, stats.failed, stats.pending, stats.abandoned) == (0, 0, 0, 0)


def test_a_block_that_raises_still_delivers_and_ends_the_thread() -> None:
    """The exception propagates; what was emitted before it reached the sink; no thread is left."""
    sink = MemorySink()
    with pytest.raises(ZeroDivisionError), BusThread() as bus:
        bus.subscribe(sink)
        tel = Telemetry(bus, kind="judge", instance="judge-0")
        with tel.operation("commit", checkpoint_id="c1"):
            pass
        1 / 0  # noqa: B018 (the user's failure)
    assert [type(e).__name__ for e in sink.events] == ["OperationStarted", "OperationFinished"]
    assert sink.closed
    assert _bus_threads() == []


def test_a_sink_that_raises_is_counted_and_said_the_others_get_everything(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A failing sink's events are counted failed and said in one warning at close; the healthy
    sink gets every event."""
    healthy = MemorySink()
    with caplog.at_level(logging.WARNING, "ckpt_events"), BusThread() as bus:
        bus.subscribe(Raises(), name="broken")
        bus.subscribe(healthy, name="healthy")
        tel = Telemetry(bus, kind="judge", instance="judge-0")
        for n in range(10):
            with tel.operation("commit", checkpoint_id=f"c{n}"):
                pass
    assert len(healthy.events) == 20
    assert bus.stats().sink("broken").failed == 20
    [said] = [r.getMessage() for r in caplog.records if "BusThread closed" in r.getMessage()]
    assert "0 events dropped" in said and "20 failed in a sink" in said and "0 abandoned" in said


def test_close_gives_up_on_a_stuck_sink_at_the_bus_deadline(caplog: pytest.LogCaptureFixture) -> None:
    """A sink stuck in handle is abandoned at close_timeout: close returns in time, the events
    it held are counted and said, and the thread ends."""
    stuck = SleepsForever()
    with caplog.at_level(logging.WARNING, "ckpt_events"), BusThread(close_timeout=DEADLINE) as bus:
        bus.subscribe(stuck, name="stuck")
        tel = Telemetry(bus, kind="judge", instance="judge-0")
        tel.refused("unauthorized")
        assert stuck.entered.wait(5)
        for _ in range(3):
            tel.refused("unauthorized")
        began = time.monotonic()
    assert time.monotonic() - began < DEADLINE + SLACK
    assert bus.stats().sink("stuck").abandoned == 4
    [said] = [r.getMessage() for r in caplog.records if "BusThread closed" in r.getMessage()]
    assert "4 abandoned at the 0.5 s close deadline" in said
    assert _bus_threads() == []


def test_started_once_and_refused_after_close_with_a_precise_error() -> None:
    """A second start, a start after close, and call/subscribe after close each say what to do."""
    runner = BusThread()
    with runner as bus:
        with pytest.raises(InvalidValueError, match="started already"):
            runner.start()
        assert runner.call(bus.flush, 1.0) is True
    runner.close()  # idempotent
    with pytest.raises(InvalidValueError, match="started already"):
        runner.start()
    with pytest.raises(InvalidValueError, match="BusThread is closed"):
        runner.call(bus.flush, 1.0)
    with pytest.raises(InvalidValueError, match="bus is closed"):
        bus.subscribe(MemorySink())
    with pytest.raises(InvalidValueError, match="BusThread is not started"):
        BusThread().call(print)


def test_a_bus_not_run_by_a_bus_thread_still_refuses_subscribe_from_another_thread() -> None:
    """The hop to the loop is the BusThread's: a bus the caller runs itself still refuses a
    subscribe from another thread (its task group is that loop's)."""
    from anyio.from_thread import start_blocking_portal

    from ckpt_events import Bus

    with start_blocking_portal() as portal, portal.wrap_async_context_manager(Bus()) as bus:
        with pytest.raises(InvalidValueError, match="event loop's thread"):
            bus.subscribe(MemorySink())


def test_a_child_forked_while_it_runs_counts_its_events_dropped_and_closes_at_once() -> None:
    """In a child forked while the BusThread runs (gunicorn --preload), its events are counted
    dropped as any bus's are, and leaving the block returns at once (the thread is the
    parent's); the parent's bus goes on."""
    if not hasattr(os, "fork"):
        pytest.skip("needs os.fork")
    sink = MemorySink()
    with BusThread() as bus:
        bus.subscribe(sink)
        tel = Telemetry(bus, kind="judge", instance="judge-0")
        runner_in_child = BusThread()
        runner_in_child.start()
        read, write = os.pipe()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork of a threaded process
            pid = os.fork()
        if pid == 0:  # pragma: no cover - the child, reported through the pipe
            try:
                os.close(read)
                began = time.monotonic()
                with tel.operation("commit", checkpoint_id="child"):
                    pass
                runner_in_child.close()
                seen = {"dropped": bus.stats().dropped_after_close, "took": time.monotonic() - began}
                os.write(write, json.dumps(seen).encode())
            finally:
                os._exit(0)
        os.close(write)
        assert forked_exit(pid, 20) == 0
        with os.fdopen(read, "rb") as reply:
            child = json.loads(reply.read())
        runner_in_child.close()
        with tel.operation("commit", checkpoint_id="parent"):
            pass
    assert child["dropped"] == 2 and child["took"] < 2.0
    assert [e.checkpoint_id for e in sink.events if isinstance(e, OperationFinished)] == ["parent"]
    assert _bus_threads() == []


NEVER_CLOSED = """
import sys
from ckpt_events import BusThread, Telemetry
from ckpt_events.sinks import JsonLinesSink
bus = BusThread().start()  # a WSGI module's global: never closed
bus.subscribe(JsonLinesSink(sys.argv[1]))
tel = Telemetry(bus, kind="judge", instance="judge-0")
for n in range(100):
    with tel.operation("commit", checkpoint_id=f"c{n}"):
        tel.refused("unauthorized")
"""


def test_one_never_closed_is_closed_at_exit_and_delivers_everything(tmp_path: Path) -> None:
    """A BusThread started and never closed (a module's global) neither hangs the interpreter's
    exit nor loses what was emitted: it is closed as the interpreter exits."""
    path = tmp_path / "events.jsonl"
    result = subprocess.run(
        [sys.executable, "-c", NEVER_CLOSED, str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )
    assert result.returncode == 0, result.stderr
    assert len(list(read_events(path))) == 300


RUNS = 15
SUBSCRIBERS = 300


def test_subscriptions_closed_on_a_thread_as_the_bus_closes_leave_it_closed() -> None:
    """Subscriptions closed on a thread of their own while the BusThread closes its bus: the
    close is made on the bus's loop, so the closed bus's routes stay closed and an event emitted
    afterwards is counted dropped. From the thread, a route table rebuilt as the bus closed
    replaced the closed one: the event went to a finished sink's buffer, counted nowhere (36 of
    60 runs)."""
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads take turns often, as on a loaded server: the race shows
    try:
        _close_as_the_bus_closes(RUNS)
    finally:
        sys.setswitchinterval(switch)


def _close_as_the_bus_closes(runs: int) -> None:
    uncounted = 0
    for _ in range(runs):
        runner = BusThread(close_timeout=DEADLINE)
        bus = runner.start()
        subs = [bus.subscribe(MemorySink()) for _ in range(SUBSCRIBERS)]
        ready = threading.Barrier(2, timeout=SLACK)

        def close_them(subs: list[Subscription] = subs, ready: threading.Barrier = ready) -> None:
            ready.wait()
            for sub in subs:
                sub.close()

        closer = threading.Thread(target=close_them)
        closer.start()
        ready.wait()
        runner.close()
        closer.join(SLACK)
        assert not closer.is_alive()
        Telemetry(bus, kind="judge", instance="judge-0").refused("unauthorized")
        stats = bus.stats()
        assert sum(s.pending for s in stats.sinks) == 0
        uncounted += 1 - stats.dropped_after_close
    assert uncounted == 0


class Slow:
    """A blocking sink taking 0.1 s a batch."""

    blocking = True

    def handle(self, batch: list[Event]) -> None:
        time.sleep(0.1)


def test_flush_from_sync_code_waits_for_the_sinks_and_says_a_timeout() -> None:
    """runner.flush() is bus.flush() for a synchronous caller: it waits for the sinks (called as
    bus.flush(5.0) from sync code, a coroutine came back at once, true, 5 events still pending).
    A timeout returns False and the events stay pending, then delivered."""
    runner = BusThread()
    with runner as bus:
        sub = bus.subscribe(Slow())
        tel = Telemetry(bus, kind="judge", instance="judge-0")
        for _ in range(5):
            tel.refused("unauthorized")
        assert runner.flush(0.0) is False
        assert sub.stats().pending > 0
        assert runner.flush(5.0) is True
        assert sub.stats().pending == 0
        assert sub.stats().delivered == 5
    with pytest.raises(InvalidValueError, match="closed"):
        runner.flush()
