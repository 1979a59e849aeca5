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
from ckpt_events.participants.cli.report.html import waterfall_svg
from ckpt_events.participants.cli.report.model import checkpoint_and_restore, trace_spans
from ckpt_events.participants.cli.report.terminal import render, render_waterfall
from ckpt_events.participants.cli.report.timeline import breakdown, breakdown_columns
from ckpt_events.participants.cli.watch.view import FleetView
from ckpt_events.participants.kinds import prepare_order
from ckpt_events.participants.workloads.registry import KINDS, OTHER_COLOURS, other_colour
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


async def test_the_report_draws_a_users_kind_in_a_colour_of_its_own_and_names_it_in_the_legend() -> None:
    """The judge's bars were white and the legend listed the registry's kinds (environment,
    agent, resources: none in these logs) but not the judge. Now the legend names the kinds the
    logs hold, and the judge has a colour, the same in the terminal and the HTML page."""
    events = await _checkpoint_with_a_judge()
    console = Console(width=160, record=True, color_system="truecolor", file=io.StringIO())
    render(console, events)
    text = console.export_text(clear=False)
    legend = next(line for line in text.splitlines() if line.startswith("who: "))
    assert "judge" in legend and "model" in legend and "controller" in legend
    assert "environment" not in legend and "resources" not in legend
    colour = other_colour("judge")
    assert colour in OTHER_COLOURS and colour not in KINDS.palette().values()
    red, green, blue = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    assert f"38;2;{red};{green};{blue}m" in console.export_text(styles=True)  # its bars and legend
    spans = trace_spans(events, checkpoint_and_restore(events)[0])
    assert f'fill="{colour}"' in waterfall_svg(spans, title="checkpoint")


async def test_bytes_nobody_recorded_are_unknown_not_zero(tmp_path: Path) -> None:
    """A server that never sets ``bytes`` on a ``write`` step (the README's quickstart: an
    ``upload``) read "bytes written 0"; now ``-``. A recorded 0 stays 0."""
    async with Bus() as bus:
        sink = MemorySink()
        bus.subscribe(sink)
        tel = Telemetry(bus, kind="judge", instance="judge-0")
        with tel.operation("commit", checkpoint_id="c1") as op:
            with op.step("upload"):
                pass
            op.set(records=2)
        other = Telemetry(bus, kind="model", instance="model-0")
        with other.operation("commit", checkpoint_id="c1") as op, op.step("write") as write:
            write.set(bytes=0)
    rows = {r.kind: r for r in breakdown(sink.events)}
    assert (rows["judge"].records, rows["judge"].bytes) == (2, None)
    assert (rows["model"].records, rows["model"].bytes) == (None, 0)
    console = Console(width=160, record=True, color_system=None, file=io.StringIO())
    render(console, sink.events)
    table = console.export_text()
    judge = next(line for line in table.splitlines() if "judge/judge-0" in line)
    model = next(line for line in table.splitlines() if "model/model-0" in line)
    assert judge.split()[-2:] == ["2", "-"] and model.split()[-2:] == ["-", "0"]


async def test_the_waterfall_axis_of_a_trace_under_a_millisecond_is_not_all_zeros() -> None:
    """A 0.1 ms commit's axis read ``0``, ``0`` and ``0 ms``."""
    sink = MemorySink()
    async with Bus() as bus:
        bus.subscribe(sink)
        with Telemetry(bus, kind="judge", instance="judge-0").operation("commit", checkpoint_id="c1"):
            time.sleep(0.0003)
    spans = trace_spans(sink.events, checkpoint_and_restore(sink.events)[0])
    header = render_waterfall(spans, 120).columns[2].header
    assert isinstance(header, str)
    assert header.split()[-2] not in ("0", "0.0") and header.split()[-1] == "ms", header
