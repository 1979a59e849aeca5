"""A user's kind and step in the harness's views: ``ckpt-events report`` on a log, the breakdown,
``watch``'s view and trends show a ``judge`` with its ``upload`` step."""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from ckpt_events import Bus, StageFinished, StepFinished, Telemetry
from ckpt_events.participants.cli.main import main
from ckpt_events.participants.cli.report.timeline import breakdown, breakdown_columns
from ckpt_events.participants.cli.watch.view import FleetView
from ckpt_events.participants.kinds import prepare_order
from ckpt_events.sinks import JsonLinesSink, read_events
from ckpt_events.sinks.otlp import read_otlp
from ckpt_events.testing import MemorySink
from tests.participants.cli.report.test_otlp_input import _export_as_collector_file


async def _checkpoint_with_a_judge(log: Path | None = None) -> list[Any]:
    """One collection checkpoint of a model and a judge, the judge's commit with an ``upload``
    step; prepare stages in the harness's order (the judge's last)."""
    sink = MemorySink()
    async with Bus() as bus:
        bus.subscribe(sink)
        if log is not None:
            bus.subscribe(JsonLinesSink(log))
        ctl = Telemetry(bus, kind="controller", instance="coordination")
        who = {kind: Telemetry(bus, kind=kind, instance=f"{kind}-0") for kind in ("model", "judge")}
        with ctl.collection("checkpoint", checkpoint_id="c1") as coll:
            with ctl.coordinate("prepare", checkpoint_id="c1", parent=coll) as coord:
                for kind in prepare_order(who):
                    with coord.stage(kind) as stage:
                        if kind in who:
                            with who[kind].operation("prepare", checkpoint_id="c1", parent=stage):
                                time.sleep(0.001)
            with ctl.coordinate("commit", checkpoint_id="c1", parent=coll) as coord:
                for kind, tel in who.items():
                    with tel.operation("commit", checkpoint_id="c1", parent=coord) as op:
                        with op.step("upload" if kind == "judge" else "write") as step:
                            time.sleep(0.002)
                            step.set(records=4, bytes=2048)
                        op.set(records=4)
            with ctl.collection("publish", checkpoint_id="c1", parent=coll):
                time.sleep(0.001)
    return sink.events


async def test_the_report_of_a_log_shows_the_judge_and_its_upload(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ckpt-events report LOG`` names ``judge/judge-0`` and its ``upload`` time, as the model's write."""
    log = tmp_path / "run.jsonl"
    await _checkpoint_with_a_judge(log)
    assert {e.kind for _, e in read_events(log)} == {"controller", "model", "judge"}
    capsys.readouterr()
    assert main(["report", str(log)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "judge/judge-0" in out and "model/model-0" in out
    assert "upload" in out and "write" in out
    assert "prepare.judge" in out  # the judges' prepare stage in the waterfall


async def test_the_breakdown_has_a_column_for_a_users_step() -> None:
    """The judge's row has its upload time; the columns are the known ones, then ``upload``;
    rows are in prepare order (the judge after the kinds the harness names)."""
    rows = breakdown(await _checkpoint_with_a_judge())
    assert [(r.kind, r.instance) for r in rows] == [("model", "model-0"), ("judge", "judge-0")]
    judge = rows[1]
    assert judge.ms["upload"] > 0 and judge.records == 4 and "write" not in judge.ms
    assert breakdown_columns(rows) == ["prepare", "commit", "write", "upload"]


async def test_watch_shows_a_judge_from_the_logs() -> None:
    """``watch``'s view folds in the judge's operations and renders its block."""
    events = await _checkpoint_with_a_judge()
    view = FleetView([], stall_after=60.0)
    view.add_events(events)
    console = Console(width=120, record=True, color_system=None, file=io.StringIO())
    console.print(view.render(time.time()))
    text = console.export_text()
    assert "judge" in text and "judge-0" in text


async def test_a_collectors_otlp_file_gives_back_the_judge_and_its_upload(tmp_path: Path) -> None:
    """Spans exported over OTLP and read back from the collector's file: the upload step (of the
    judge, its operation's kind) and the judges' prepare stage come back as their events."""
    events = await _checkpoint_with_a_judge()
    otlp = tmp_path / "collector.json"
    assert _export_as_collector_file(events, otlp) >= 1
    skipped: list[str] = []
    back = [event for _, event in read_otlp(otlp, skipped.append)]
    assert skipped == []
    (upload,) = [e for e in back if isinstance(e, StepFinished) and e.step == "upload"]
    assert (upload.kind, upload.instance, upload.records, upload.bytes) == ("judge", "judge-0", 4, 2048)
    assert any(isinstance(e, StageFinished) and e.stage == "judge" for e in back)
