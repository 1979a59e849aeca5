"""``bench_core``'s memory row (SPEC 7, "Memory": events through the bus leave memory flat),
at a size a test affords."""

from __future__ import annotations

import time

import anyio
import pytest

from ckpt_events.benchmarks import bench_core


def test_events_through_the_bus_leave_resident_memory_flat() -> None:
    """400,000 events to a counting sink: what is resident after the first 100,000 does not grow
    by the end (past a page or an arena: ``FLAT_MIB``)."""
    marks = anyio.run(bench_core.rss_through_bus, 400_000, 100_000)
    if marks[0] is None:
        pytest.skip("no /proc/self/statm on this system")
    assert len(marks) == 5  # after each 100,000 and once all are delivered
    first, last = marks[0], marks[-1]
    assert first is not None and last is not None
    assert (last - first) / 2**20 <= bench_core.FLAT_MIB, marks


def test_the_off_path_pairs_are_timed_interleaved_in_cpu() -> None:
    """Timed apart in wall time (all of one's repeats, then the other's), a busy machine read the
    disabled site at 1.390x ``nullcontext()``: the repeats alternate, and a wait costs no CPU."""
    order: list[str] = []

    def first() -> None:
        order.append("first")
        time.sleep(0.002)  # a wait: wall time, no CPU

    def second() -> None:
        order.append("second")

    first_ns, _ = bench_core.pair_ns(first, second, number=3, repeat=4)
    blocks = [order[i] for i in range(0, len(order), 3)]
    assert blocks == ["first", "second", "second", "first", "first", "second", "second", "first"]
    assert first_ns < 1_000_000  # 2 ms of sleep per call in wall time
