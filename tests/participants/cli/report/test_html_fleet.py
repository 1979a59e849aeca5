"""A wide fleet's breakdown on the page is the terminal's (``timeline.shown_rows``): past
``FLEET`` participants one row per kind, its longest instance, with the same figures, and a line
under the table saying how many participants each row folds."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anyio
import pytest

from ckpt_events import Telemetry
from ckpt_events.participants.cli.main import main
from ckpt_events.sinks import JsonLinesSink
from ckpt_events.testing import capture_events

#: The page's breakdown section (table and its note) of ``_fleet(150, 50)``: 21,633 bytes when it
#: had one row per participant, 710 now (30% room).
TABLE_BYTES = 930
#: The whole page: 47,543 bytes with a row per participant, 24,430 to 24,564 now (30% room).
PAGE_BYTES = 32_000
_SECTION = re.compile(r"<section><h2>time per participant.*?</section>", re.S)
_ROW = re.compile(r"<tr><td>(.*?)</td>(.*?)</tr>")
_CELL = re.compile(r"<td>(.*?)</td>")


async def _fleet(environments: int, models: int) -> list[Any]:
    """One collection checkpoint whose prepare calls ``environments`` and then ``models``
    servers in parallel, each a prepare with a write step (bytes) and a commit (records), the
    environment ``environment-7``'s prepare failing."""
    async with capture_events() as (bus, events):
        ctl = Telemetry(bus, kind="controller", instance="coordination")
        fleet = {
            "environment": [
                Telemetry(bus, kind="environment", instance=f"env-{i}") for i in range(environments)
            ],
            "model": [Telemetry(bus, kind="model", instance=f"model-{i}") for i in range(models)],
        }

        async def prepare(i: int, server: Telemetry, traceparent: str) -> None:
            try:
                with server.operation("prepare", checkpoint_id="c", traceparent=traceparent) as op:
                    with op.step("write") as write:
                        await anyio.sleep(0)
                        write.set(bytes=1000 + i)
                    if server.instance == "env-7":
                        raise RuntimeError("disk full")
            except RuntimeError:
                pass
            with server.operation("commit", checkpoint_id="c", traceparent=traceparent) as op:
                op.set(records=10 + i)

        with ctl.collection("checkpoint", checkpoint_id="c") as collection:
            with ctl.coordinate("prepare", checkpoint_id="c", parent=collection) as coordinate:
                for kind, servers in fleet.items():
                    with coordinate.stage(kind) as stage:
                        async with anyio.create_task_group() as tg:
                            for i, server in enumerate(servers):
                                tg.start_soon(prepare, i, server, stage.traceparent())
    return events


def _terminal_rows(out: str) -> dict[str, list[str]]:
    """The terminal's breakdown table: participant -> its cells, by its header's columns."""
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.strip().startswith("participant"))
    rows = {}
    for line in lines[head + 2 :]:
        if not line.strip():
            break
        who, *cells = re.split(r"\s{2,}", line.strip())
        rows[who] = cells
    return rows


def test_a_page_of_200_participants_shows_the_terminals_rows_per_kind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The page of 200 participants has one breakdown row per kind, the figures of the
    terminal's table of the same log cell for cell, a line naming how many participants each
    row folds, and stays under ``TABLE_BYTES`` and ``PAGE_BYTES``."""
    events = anyio.run(_fleet, 150, 50)
    log, page_path = tmp_path / "log.jsonl", tmp_path / "report.html"
    sink = JsonLinesSink(log)
    sink.handle(events)
    anyio.run(sink.aclose)
    monkeypatch.setenv("COLUMNS", "200")  # the wide table, not the pivoted one
    assert main(["report", str(log), "--checkpoint", "c", "--report", str(page_path)]) == 0
    terminal = _terminal_rows(capsys.readouterr().out)
    page = page_path.read_text()

    section = _SECTION.search(page)
    assert section is not None
    rows = {who.replace("<wbr>", ""): _CELL.findall(cells) for who, cells in _ROW.findall(section[0])}
    # The failed participant is listed under its kind's row, named with its error type.
    failed = "environment/env-7 (1 error: RuntimeError)"
    assert list(rows) == ["environment x150 (longest) (1 error)", failed, "model x50 (longest)"]
    assert rows == terminal
    assert rows.pop(failed)[3:] == ["17", "1,007"]
    # The longest write of each kind, records and bytes summed over every participant.
    header = re.findall(r"<th>(.*?)</th>", section[0])
    assert header == ["participant", "prepare", "commit", "write", "records committed", "bytes written"]
    env, model = rows.values()
    assert env[3:] == [f"{sum(10 + i for i in range(150)):,}", f"{sum(1000 + i for i in range(150)):,}"]
    assert model[3:] == [f"{sum(10 + i for i in range(50)):,}", f"{sum(1000 + i for i in range(50)):,}"]
    assert (
        '<p class="parts" id="folded">200 participants folded into one row per kind '
        "(environment: 150 participants; model: 50 participants)"
    ) in section[0]
    assert len(section[0].encode()) < TABLE_BYTES, len(section[0].encode())
    assert len(page.encode()) < PAGE_BYTES, len(page.encode())
