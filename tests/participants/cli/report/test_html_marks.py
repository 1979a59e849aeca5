"""A wide fleet's waterfall is bounded by what can be seen (``html._critical_marks``): a prepare
calling participants in turn folds the critical path as it folds the calls (the folded calls'
stretches one mark on their row, the controller's between them one), at most one mark per pixel
column of a row, each stretch counted."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from ckpt_events import Telemetry
from ckpt_events.participants.cli.main import main
from ckpt_events.sinks import JsonLinesSink
from ckpt_events.testing import capture_events

#: The run page of a prepare calling 2,000 participants in turn (``_retimed``): 168,824 bytes when
#: each of the controller's 2,001 stretches between calls was its own mark, 25,156 with a mark per
#: pixel column, 14,665 now (the folded calls' stretches one mark; 30% room).
PAGE_BYTES = 19_000
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


def _page(tmp_path: Path, n: int) -> tuple[list[Any], str]:
    """The run page of one checkpoint whose prepare calls ``n`` environments in turn (retimed)."""
    events = _retimed(anyio.run(_prepare_in_turn, n))
    log, page_path = tmp_path / f"log-{n}.jsonl", tmp_path / f"report-{n}.html"
    sink = JsonLinesSink(log)
    sink.handle(events)
    anyio.run(sink.aclose)
    assert main(["report", str(log), "--report", str(page_path)]) == 0
    return events, page_path.read_text()


def _marks(page: str) -> dict[int, list[tuple[int, int, int]]]:
    """Each row's critical marks: (left, right in tenths of a pixel, how many stretches)."""
    drawn: dict[int, list[tuple[int, int, int]]] = {}
    for count, x, y, width, said_count, _ in _MARK.findall(page):
        assert said_count.replace(",", "") == (count if count != "1" else "")
        left = round(float(x) * 10)
        drawn.setdefault(int(y) - 9, []).append((left, left + round(float(width) * 10), int(count or 1)))
    assert sum(map(len, drawn.values())) == page.count('class="critical"')
    return drawn


def test_a_prepare_calling_participants_in_turn_folds_its_critical_path_like_its_calls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The calls folded into ``+N more`` hold the critical path on that row, one mark counting
    their stretches; the controller's stretches between folded calls are one mark. The page
    is as large at 400 calls as at 100 (it grew with the calls, a mark per pixel column:
    37,129 / 58,211 / 132,382 bytes for 3 checkpoints of 10 / 100 / 1,000 calls), every
    stretch is counted once, and the calls kept (the slowest, the last on the path) keep
    their own marks."""
    (_, small), (_, large) = _page(tmp_path, 100), _page(tmp_path, 400)
    capsys.readouterr()
    assert len(large.encode()) / len(small.encode()) < 1.05, (len(small.encode()), len(large.encode()))
    assert sum(map(len, _marks(small).values())) < 16
    assert sum(map(len, _marks(large).values())) < 16

    for n, page in ((100, small), (400, large)):
        folded = re.search(r'<rect class="folded" data-count="(\d+)" x="[\d.]+" y="(\d+)"', page)
        assert folded is not None and int(folded[1]) == n - 2
        drawn = _marks(page)
        # The folded calls' stretches (each prepare's around its write, the write's) on their row.
        assert len(drawn[int(folded[2]) - 5]) == 1
        assert sum(c for _, _, c in drawn[int(folded[2]) - 5]) == 3 * (n - 2)
        # The controller's stretches between them counted too.
        assert sum(c for marks in drawn.values() for _, _, c in marks) > 4 * (n - 2)
        # The calls kept are drawn with their own marks.
        bars = {int(y) - 3 for _, y in _BAR.findall(page)}
        assert bars <= drawn.keys() | {min(bars)}


def test_a_prepare_calling_2000_participants_in_turn_draws_one_mark_per_pixel_column(tmp_path: Path) -> None:
    """Per row, no more critical marks than pixel columns they reach, each mark from a
    stretch's start to a stretch's end; the page under ``PAGE_BYTES``."""
    _, page = _page(tmp_path, 2000)
    assert len(page.encode()) < PAGE_BYTES, len(page.encode())
    axis = _AXIS.search(page)
    assert axis is not None
    bars_from, bars_to = float(axis[1]), float(axis[2])
    drawn = _marks(page)
    for row, marks in drawn.items():
        assert len(marks) <= len(_columns([(left, right) for left, right, _ in marks])), row
        assert all(bars_from * 10 <= left < right <= bars_to * 10 + 5 for left, right, _ in marks), row
    assert sum(c for marks in drawn.values() for _, _, c in marks) > 4 * 1998
