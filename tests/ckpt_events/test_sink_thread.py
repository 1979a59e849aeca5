"""A blocking sink's own thread (``ckpt_events._sink_thread``): off the loop, a daemon, in order."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from ckpt_events import Bus, Event
from ckpt_events._sink_thread import SinkThread
from tests.ckpt_events.test_bus import refused


async def test_blocking_sink_runs_in_a_worker_thread() -> None:
    """A sync sink marked blocking runs off the event loop thread."""
    loop_thread = threading.get_ident()
    seen: list[int] = []

    class Blocking:
        blocking = True

        def handle(self, batch: list[Event]) -> None:
            seen.append(threading.get_ident())

    async with Bus() as bus:
        bus.subscribe(Blocking())
        bus.emit(refused(1))
        await bus.flush(timeout=5)
    assert seen and seen[0] != loop_thread


async def test_one_daemon_thread_runs_the_batches_in_order() -> None:
    """Every batch runs on the same daemon thread, named after the sink, in the order given."""
    sink_thread = SinkThread("exporter", asyncio.get_running_loop().call_soon_threadsafe)
    handled: list[tuple[Any, threading.Thread]] = []

    def handle(batch: list[Any]) -> None:
        handled.append((batch, threading.current_thread()))

    for n in range(5):
        await sink_thread.run(handle, [n])
    sink_thread.stop()
    assert [batch for batch, _ in handled] == [[0], [1], [2], [3], [4]]
    threads = {thread for _, thread in handled}
    assert len(threads) == 1
    (thread,) = threads
    assert thread.daemon and thread.name == "ckpt_events sink exporter"
    assert thread is not threading.current_thread()
    thread.join(timeout=5)
    assert not thread.is_alive()  # stop() lets it end after its last job


async def test_a_handle_error_is_raised_in_the_caller_and_the_thread_goes_on() -> None:
    """handle()'s exception comes back to the awaiting task; the next batch still runs."""
    sink_thread = SinkThread("flaky", asyncio.get_running_loop().call_soon_threadsafe)
    handled: list[list[int]] = []

    def handle(batch: list[int]) -> None:
        if batch == [1]:
            raise OSError("disk full")
        handled.append(batch)

    with pytest.raises(OSError, match="disk full"):
        await sink_thread.run(handle, [1])
    await sink_thread.run(handle, [2])
    sink_thread.stop()
    assert handled == [[2]]
