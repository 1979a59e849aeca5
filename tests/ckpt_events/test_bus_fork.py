"""A process forked while a bus runs (gunicorn ``--preload``, a ``fork`` multiprocessing pool).

The bus's loop and delivery tasks stay in the parent; the child's copy of the bus must count
what it is given as dropped and say so once, never keep it pending for ever (silent loss) or
hang a ``flush``.
"""

from __future__ import annotations

import json
import logging
import os
import warnings

import anyio
import pytest
from anyio.from_thread import start_blocking_portal

from ckpt_events import Bus, Telemetry
from ckpt_events.testing import MemorySink
from tests.processes import forked_exit

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def _in_child(bus: Bus, tel: Telemetry) -> dict[str, object]:
    """What the forked child sees: its drops, its warnings, and a flush that returns."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logging.getLogger("ckpt_events").addHandler(Keep())
    for n in range(3):
        with tel.operation("commit", checkpoint_id=f"child-{n}"):
            pass
    flushed = anyio.run(bus.flush, 2.0)
    return {
        "dropped": bus.stats().dropped_after_close,
        "warnings": lines,
        "flushed": flushed,
        "pid": os.getpid(),
    }


def test_a_child_forked_while_the_bus_runs_counts_its_events_dropped_and_says_so() -> None:
    """Events emitted in the child are counted dropped, with one warning; the parent is unaffected."""
    sink = MemorySink()
    with start_blocking_portal() as portal, portal.wrap_async_context_manager(Bus()) as bus:
        portal.call(bus.subscribe, sink)
        tel = Telemetry(bus, kind="judge", instance="judge-0")
        with tel.operation("commit", checkpoint_id="parent"):
            pass
        read, write = os.pipe()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork of a threaded process
            pid = os.fork()
        if pid == 0:  # pragma: no cover - the child, reported through the pipe
            try:
                os.close(read)
                try:
                    seen = _in_child(bus, tel)
                except BaseException as exc:  # said to the parent, which fails on it
                    seen = {"error": repr(exc)}
                os.write(write, json.dumps(seen).encode())
            finally:
                os._exit(0)
        os.close(write)
        assert forked_exit(pid, 20) == 0
        with os.fdopen(read, "rb") as reply:
            child = json.loads(reply.read())
        assert "error" not in child, child["error"]
        with tel.operation("commit", checkpoint_id="parent-after"):
            pass
        assert portal.call(bus.flush, 5.0)
    assert child["flushed"] is True
    assert child["dropped"] == 6  # three operations, a start and a finish each
    [warning] = child["warnings"]
    assert f"(pid {child['pid']}) was forked from pid {os.getpid()}" in warning
    assert "dropped_after_close" in warning
    assert "after the fork" in warning
    # The parent's bus goes on: its events before and after the fork, none of the child's.
    seen = [event.checkpoint_id for event in sink.events if type(event).__name__ == "OperationFinished"]
    assert seen == ["parent", "parent-after"]
