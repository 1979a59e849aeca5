"""A wide fleet's waterfall is bounded by what can be seen (``html._critical_marks``): a prepare
calling 2,000 participants in turn draws at most one critical-path mark per pixel column of a
row, over exactly the columns its stretches cover, each stretch counted."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anyio
import msgspec

from ckpt_events import Telemetry
from ckpt_events.participants.cli.main import main
from ckpt_events.participants.cli.report.model import checkpoint_and_restore, drawn_extent, trace_spans
from ckpt_events.participants.cli.report.paths import critical_path
from ckpt_events.sinks import JsonLinesSink
from ckpt_events.testing import capture_events

#: The run page of a prepare calling 2,000 participants in turn (``_retimed``): 168,824 bytes when
#: each of the controller's 2,001 stretches between calls was its own mark (2,009 in all), 25,156
#: now (71 marks; 30% room).
PAGE_BYTES = 32_700
_MARK = re.compile(
    r'<rect class="critical"(?: data-count="(\d+)")? x="([\d.]+)" y="(\d+)" width="([\d.]+)" '
    r'height="2" fill="#111"(?:/>|><title>critical path: ([\d,]+) stretches merged, '
    r"the longest ([\d.]+) ms</title></rect>)"
)
_BAR = re.compile(r'<rect class="span" data-span-id="([0-9a-f]+)"[^>]*? y="(\d+)"')
_AXIS = re.compile(r'<line x1="([\d.]+)" y1="\d+" x2="([\d.]+)" y2="\d+" stroke="#888"/>')


async def _prepare_in_turn(n: int) -> list[Any]:
    """One collection checkpoint whose prepare calls ``n`` environment servers one after another,
    each with a write step, as a real controller's and participants' telemetry emit it."""
    async with capture_events() as (bus, events):
        ctl = Telemetry(bus, kind="controller", instance="coordination")
        servers = [Telemetry(bus, kind="environment", instance=f"environment-{i}") for i in range(n)]
        with ctl.collection("checkpoint", checkpoint_id="c") as collection:
            with ctl.coordinate("prepare", checkpoint_id="c", parent=collection) as coordinate:
                for server in servers:
                    with server.operation(
                        "prepare", checkpoint_id="c", traceparent=coordinate.traceparent()
                    ) as op:
                        with op.step("write"):
                            pass
    return events


_CLOCKS = ("start_ns", "end_ns", "received_ns", "time_ns")


def _retimed(events: list[Any]) -> list[Any]:
    """``events`` with their times in the same order but on a fixed schedule, so the page is
    the same on a loaded machine (its gaps made 13 to 109 marks, 15 to 31 kB): 1 us between
    two instants, 50 to 400 us every 97th (runs of empty columns in the controller's row, one
    column wide among them, and wide stretches)."""
    instants = sorted({t for e in events for name in _CLOCKS if (t := getattr(e, name, None)) is not None})
    at, now = {}, 1_700_000_000_000_000_000
    for k, t in enumerate(instants):
        now += 50_000 * (1 + k // 97 % 8) if k % 97 == 0 else 1_000
        at[t] = now
    retimed = []
    for e in events:
        changes = {name: at[t] for name in _CLOCKS if (t := getattr(e, name, None)) is not None}
        if getattr(e, "monotonic_start_ns", None) is not None:
            changes["monotonic_start_ns"] = changes["start_ns"]  # one clock, never stepped
        retimed.append(msgspec.structs.replace(e, **changes))
    return retimed


def _columns(marks: list[tuple[int, int]]) -> set[int]:
    """The pixel columns that marks (left, right in tenths of a pixel) reach."""
    return {c for left, right in marks for c in range(left // 10, (right - 1) // 10 + 1)}


def test_a_prepare_calling_2000_participants_in_turn_draws_one_mark_per_pixel_column(tmp_path: Path) -> None:
    """Per row, no more critical marks than pixel columns they reach, the same columns as the
    stretches of the spans would reach one mark each, each mark from a stretch's start to a
    stretch's end, its title counting the stretches in it and their longest; the page under
    ``PAGE_BYTES``."""
    events = _retimed(anyio.run(_prepare_in_turn, 2000))
    log, page_path = tmp_path / "log.jsonl", tmp_path / "report.html"
    sink = JsonLinesSink(log)
    sink.handle(events)
    anyio.run(sink.aclose)
    assert main(["report", str(log), "--report", str(page_path)]) == 0
    page = page_path.read_text()
    assert len(page.encode()) < PAGE_BYTES, len(page.encode())

    trace, _ = checkpoint_and_restore(events)
    assert trace is not None
    spans = trace_spans(events, trace)
    t0, t1 = drawn_extent(spans)
    axis = _AXIS.search(page)
    assert axis is not None
    bars_from, bars_to = float(axis[1]), float(axis[2])
    row_of = {int(span_id, 16): int(y) - 3 for span_id, y in _BAR.findall(page)}

    def tenths(t: int) -> float:
        return (bars_from + (t - t0) / (t1 - t0) * (bars_to - bars_from)) * 10

    # Each stretch as a mark of its own (at least 0.5 px wide), in tenths of a pixel as drawn.
    stretches: dict[int, list[tuple[int, int, int]]] = {}
    for section in critical_path(spans):
        row = row_of.get(section.span.span_id)
        if row is not None and section.end_ns > section.start_ns:
            left = round(tenths(section.start_ns))
            width = max(5, round(tenths(section.end_ns) - tenths(section.start_ns)))
            stretches.setdefault(row, []).append((left, left + width, section.end_ns - section.start_ns))
    drawn: dict[int, list[tuple[int, int, int, str]]] = {}
    for count, x, y, width, said_count, longest in _MARK.findall(page):
        left = round(float(x) * 10)
        assert said_count.replace(",", "") == (count if count != "1" else "")
        drawn.setdefault(int(y) - 9, []).append(
            (left, left + round(float(width) * 10), int(count or 1), longest)
        )
    assert sum(map(len, drawn.values())) == page.count('class="critical"')

    assert sum(map(len, stretches.values())) > 2000  # the controller's stretches between calls
    assert drawn.keys() == stretches.keys()
    assert sum(map(len, drawn.values())) <= len(row_of) * (bars_to - bars_from)
    for row, marks in drawn.items():
        reached = _columns([(left, right) for left, right, _, _ in marks])
        assert reached == _columns([(left, right) for left, right, _ in stretches[row]]), row
        lefts, rights = {s[0] for s in stretches[row]}, {s[1] for s in stretches[row]}
        assert all(left in lefts and right in rights for left, right, _, _ in marks), row
        for left, right, count, longest in marks:
            within = [ns for a, _, ns in stretches[row] if left <= a < right]
            assert count == len(within), (row, left)
            assert longest == ("" if count == 1 else f"{max(within) / 1e6:.2f}"), (row, left)
        assert len(marks) <= len(reached), (row, len(marks), len(reached))
