"""Many stragglers of one kind are one flag (``trends.NAMED_STRAGGLERS``), on the run page and in
the terminal: a fleet whose first third was slower in every checkpoint named each of them, twice
on the page (the flags line and the trends table), so the page grew with the fleet (3
checkpoints of 5,000: 1,617 flags, 743,913 bytes; of 1,000: 34,202)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from ckpt_events import Telemetry
from ckpt_events.participants.cli.demo import checks
from ckpt_events.participants.cli.main import main
from ckpt_events.participants.cli.report.overview import overview
from ckpt_events.participants.cli.report.trends import NAMED_STRAGGLERS
from ckpt_events.participants.errors import DemoFailed
from ckpt_events.participants.faults import parse_fault
from ckpt_events.sinks import JsonLinesSink
from ckpt_events.testing import capture_events

_MS = 1_000_000
_BASE = 1_700_000_000_000_000_000


async def _checkpoints(n: int) -> list[Any]:
    """3 collection checkpoints whose prepare calls ``n`` environments at once, each a prepare
    with a write step, as the real telemetry emits them."""
    async with capture_events() as (bus, events):
        ctl = Telemetry(bus, kind="controller", instance="coordination")
        servers = [Telemetry(bus, kind="environment", instance=f"env-{i}") for i in range(n)]

        async def prepare(server: Telemetry, cid: str, traceparent: str) -> None:
            with server.operation("prepare", checkpoint_id=cid, traceparent=traceparent) as op:
                with op.step("write"):
                    await anyio.sleep(0)

        for k in range(3):
            with ctl.collection("checkpoint", checkpoint_id=f"c{k}") as collection:
                with ctl.coordinate("prepare", checkpoint_id=f"c{k}", parent=collection) as coordinate:
                    async with anyio.create_task_group() as tg:
                        for server in servers:
                            tg.start_soon(prepare, server, f"c{k}", coordinate.traceparent())
    return events


def _retimed(events: list[Any], slow: int) -> list[Any]:
    """``events`` on a fixed schedule: checkpoint k at k x 100 ms, ``env-0`` to ``env-{slow-1}``
    4 ms (and a microsecond per index) in each, the others 1 ms."""
    out = []
    for e in events:
        t = _BASE + int(e.checkpoint_id[1:]) * 100 * _MS
        if e.kind == "controller":
            collection = "Collection" in type(e).__name__
            lo, hi = (t, t + 10 * _MS) if collection else (t + _MS // 2, t + 9 * _MS)
        else:
            i = int(e.instance.split("-")[1])
            lo = t + _MS
            hi = lo + (4 * _MS + i * 1000 if i < slow else _MS)
            if "Step" in type(e).__name__:
                lo, hi = lo + _MS // 10, hi - _MS // 10
        changes: dict[str, int] = {"start_ns": lo}
        if getattr(e, "end_ns", None) is not None:
            changes["end_ns"] = hi
        if getattr(e, "monotonic_start_ns", None) is not None:
            changes["monotonic_start_ns"] = lo
        out.append(msgspec.structs.replace(e, **changes))
    return out


def _page(tmp_path: Path, n: int, slow: int) -> str:
    """The run page of ``_checkpoints(n)``, ``slow`` of them slower (``_retimed``)."""
    log, page = tmp_path / f"log-{n}.jsonl", tmp_path / f"report-{n}.html"
    sink = JsonLinesSink(log)
    sink.handle(_retimed(anyio.run(_checkpoints, n), slow))
    anyio.run(sink.aclose)
    assert main(["report", str(log), "--report", str(page)]) == 0
    return page.read_text()


def test_many_stragglers_of_a_kind_are_one_flag_and_the_page_does_not_grow_with_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A third of 30 and of 120 environments slower in each checkpoint: one flag saying how
    many of how many and naming the first in full, in the terminal and on the page, whose size
    is the same for both (before: 10 then 40 flags, each twice on the page)."""
    small, large = _page(tmp_path, 30, 10), _page(tmp_path, 120, 40)
    out = capsys.readouterr().out
    assert len(large.encode()) / len(small.encode()) < 1.05, (len(small.encode()), len(large.encode()))
    for n, page in ((30, small), (120, large)):
        said = (
            f"stragglers: {n // 3} of {n} environment participants were each among the slowest "
            "in most checkpoints"
        )
        assert page.count(said) == 2  # the flags line, the trends table
        assert out.count(said) == 1
        assert re.search(r"too many to name one by one; the first: environment/env-\d+ was ", page)
    assert "straggler: environment/" not in large


def test_a_few_stragglers_are_each_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Up to ``NAMED_STRAGGLERS`` of a kind, each its own flag, as before."""
    page = _page(tmp_path, 3 * NAMED_STRAGGLERS, NAMED_STRAGGLERS)
    capsys.readouterr()
    named = set(re.findall(r"straggler: environment/(env-\d+) was", page))
    assert named == {f"env-{i}" for i in range(NAMED_STRAGGLERS)}
    assert "stragglers: " not in page


def test_the_demo_s_slow_check_says_the_folded_flag_never_none() -> None:
    """The demo's ``slow`` check fails on a run whose stragglers were folded into one flag,
    saying that flag (it read only ``straggler: `` lines: "the stragglers flagged are: none")."""
    run = overview(_retimed(anyio.run(_checkpoints, 30), 10))
    with pytest.raises(DemoFailed) as info:
        checks._straggler_check(run, parse_fault("slow:env-1"))
    assert str(info.value).startswith(
        "env-1 writes 5x slower, but the stragglers flagged are: "
        "stragglers: 10 of 30 environment participants "
    )
