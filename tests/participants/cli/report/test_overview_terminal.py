"""The run overview in a terminal at 80 and 160 columns: a checkpoint id and its start time
each stay on one line (at 80 columns the id wrapped over 3 lines and the time was split)."""

from __future__ import annotations

import io
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from ckpt_events import CollectionFinished
from ckpt_events.participants.cli.report.overview import overview
from ckpt_events.participants.cli.report.overview_terminal import render_overview
from ckpt_events.vocab import CollectionAction, Kind, Outcome

MS = 1_000_000
#: 2026-12-02 10:22:41 UTC, as the demo's ids say.
T0 = 1_796_206_961_990 * MS
IDS = ("ckpt-20261202T102241-6cb441a9", "ckpt-20261202T102246-978655d9", "ckpt-20261202T102248-69572869")


def _run() -> list[Any]:
    """Three checkpoints (the first failed, 2060.6 ms, the longest a row holds; the others
    published) and a restore."""
    events: list[Any] = []
    for n, checkpoint in enumerate(IDS):
        start = T0 + n * 4_500 * MS
        ms = 2060.6 if n == 0 else 196.0
        outcome = Outcome.ERROR if n == 0 else Outcome.OK
        events.append(
            CollectionFinished(
                Kind.CONTROLLER,
                "c",
                n + 1,
                1,
                start,
                start + int(ms * MS),
                CollectionAction.CHECKPOINT,
                checkpoint,
                outcome=outcome,
                published=n > 0,  # as the controller says it: unsaid, its outcome is unknown
            )
        )
    start = T0 + 9_000 * MS
    events.append(
        CollectionFinished(
            Kind.CONTROLLER,
            "c",
            9,
            1,
            start,
            start + 28 * MS,
            CollectionAction.RESTORE,
            IDS[-1],
            rows=2,  # as the controller says it: unsaid, with nothing restored in the logs, unknown
            restarts=0,
        )
    )
    return events


def test_overview_keeps_ids_and_start_times_whole_at_80_and_160_columns() -> None:
    """Every id and every start time is on one line, no line is wider than the console, nothing
    is cut with an ellipsis."""
    run = overview(_run())
    starts = [datetime.fromtimestamp(r.start_ns / 1e9, UTC).strftime("%H:%M:%S.%f")[:-3] for r in run.rows]
    assert len(run.rows) == 4
    for width in (80, 160):
        console = Console(file=io.StringIO(), width=width, record=True)
        render_overview(console, run, title="1 log file")
        text = console.export_text()
        lines = text.splitlines()
        assert max(len(line) for line in lines) <= width and "…" not in text
        for number, (row, start) in enumerate(zip(run.rows, starts, strict=True), 1):
            (line,) = [line for line in lines if line.lstrip().startswith(f"{number} ")]
            assert row.checkpoint_id in line and start in line, (width, line)


def test_a_console_too_narrow_for_the_table_loses_no_column_and_cuts_no_id() -> None:
    """Narrower than the table (a split pane, ``COLUMNS=40``), each row is one labelled line
    wrapped between words: at 50 columns rich dropped the ms and outcome columns, at 40 it cut
    every id to 25 characters (three rows' ids read alike) and at 60 split ``2060.6``."""
    run = overview(_run())
    for width in (40, 50, 60, 76):
        console = Console(file=io.StringIO(), width=width, record=True)
        render_overview(console, run, title="1 log file")
        text = console.export_text()
        assert max(len(line) for line in text.splitlines()) <= width and "…" not in text
        words = text.split()
        for number, row in enumerate(run.rows, 1):
            start = datetime.fromtimestamp(row.start_ns / 1e9, UTC).strftime("%H:%M:%S.%f")[:-3]
            at = words.index(f"#{number}")
            said = " ".join(words[at : at + 11])
            head = f"#{number} {row.what} {row.checkpoint_id}, start {start} UTC, {row.ms_text} ms"
            assert head in said, said
            assert said.split(", ")[-1].startswith(row.outcome), said
            if row.what == "checkpoint":
                assert re.search(r", paused (\d+\.\d ms|unknown), ", said), said


def test_a_checkpoint_cut_before_its_resume_makes_the_pause_unknown_not_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``report`` of a log cut inside a checkpoint (its last line torn): the pause is unknown, in
    its cell and in the total (was "paused the fleet ... 0.0 ms in all")."""
    import anyio

    from ckpt_events.participants.cli.main import main
    from ckpt_events.sinks import JsonLinesSink
    from tests.participants.cli.report_events import checkpoint_and_restore

    events = anyio.run(checkpoint_and_restore)
    whole = tmp_path / "whole.jsonl"
    sink = JsonLinesSink(whole)
    sink.handle(events)
    sink.close()
    data = whole.read_bytes()
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(data[: len(data) // 4])
    assert main(["report", str(cut)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "0.0 ms in all" not in out, out
    assert "paused the fleet (admission closed, first prepare to last resume) for an unknown time" in out
    assert "pause unknown for 1 checkpoint: 1 checkpoint without both a prepare and a resume" in out
    assert re.search(r"checkpoint c1 [\d:.]+ unknown open at end of log", out), out
