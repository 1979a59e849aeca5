"""A restore in the overview, from a real demo run: linked to the checkpoint it restored, what
dominated it (read or install, which participant, records, MB/s) named in words, and how many
episodes continued from their boundary against restarted from scratch."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console

from ckpt_events.participants.cli.demo.runner import DemoOptions, run_demo
from ckpt_events.participants.cli.main import main
from ckpt_events.participants.cli.report.log_files import expand_logs
from ckpt_events.participants.cli.report.logs import LogProblems, merged_events
from ckpt_events.participants.cli.report.overview import overview


async def test_restore_row_names_its_source_and_what_dominated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "demo.jsonl"
    options = DemoOptions(rollouts=8, steps=2, concurrency=4, jsonl=log, workdir=tmp_path)
    printed = io.StringIO()
    await run_demo(options, Console(file=printed, width=170))
    paths, _ = expand_logs([str(log)])
    run = overview(merged_events(paths, LogProblems()))
    restores = [r for r in run.rows if r.what == "restore"]
    assert restores and all(r.outcome == "restored" for r in restores)
    restore = restores[-1]
    assert restore.source_row is not None
    source = run.rows[restore.source_row - 1]
    assert source.what == "checkpoint" and source.checkpoint_id == restore.checkpoint_id
    # "dominated" only for half of the restore or more; else the longest, with its share.
    match = re.fullmatch(
        r"(?:(read|install) on (\w+)/[\w-]+ [\d.]+ ms dominated|longest (read|install): on (\w+)/[\w-]+ "
        r"[\d.]+ ms, \d+% of the restore), ([\d,]+) records"
        r"(, [\d.,]+ (?:bytes|MB) at [\d.]+ (?:B|kB|MB|GB)/s)?",
        restore.dominated,
    )
    assert match is not None, restore.dominated
    assert int(match.group(5).replace(",", "")) > 0
    # The read step's bytes are the checkpoint file's size: the rate is bytes over the read's time.
    assert "install" in (match.group(1), match.group(3)) or match.group(6) is not None
    assert main(["report", str(log)]) == 0
    out = capsys.readouterr().out
    # The demo says what its checkpoint held: in flight (continued after the restore) and to restart.
    *_, held = re.finditer(r"\((\d+) done, (\d+) in flight, (\d+) to restart", printed.getvalue())
    assert (restore.continued, restore.restarted) == (int(held.group(2)), int(held.group(3)))
    assert restore.continued is not None and restore.continued > 0
    said = f"restore from #{restore.source_row} checkpoint {restore.checkpoint_id}; {restore.dominated}"
    words = " ".join(out.split())  # the terminal wraps long lines
    assert f"{said}; {restore.episodes_text}" in words
    assert f"after 1 restore: {restore.episodes_text}" in words


async def test_a_restore_row_s_detail_says_where_its_time_went_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``report --checkpoint c1#2`` (the restore row): its trace alone was drawn as both the
    checkpoint and the restore, its "where the time went" line and waterfall printed twice
    ("checkpoint c1 (collection.restore): 28.0 ms total, ..." then "restore c1 ..."). Once now,
    as the restore; the checkpoint row's detail is unchanged (once, as the checkpoint)."""
    from ckpt_events.sinks import JsonLinesSink
    from tests.participants.cli.report_events import checkpoint_and_restore

    log = tmp_path / "run.jsonl"
    sink = JsonLinesSink(log)
    sink.handle(await checkpoint_and_restore())
    sink.close()
    for row, label, trace in (
        ("c1#2", "restore", "collection.restore"),
        ("c1#1", "checkpoint", "collection.checkpoint"),
    ):
        assert main(["report", str(log), "--checkpoint", row]) == 0
        words = " ".join(capsys.readouterr().out.split())
        assert words.count(" ms total, ") == 1 and words.count(": waterfall (") == 1, words
        assert f"{label} c1 ({trace}): " in words and f"{label} c1: waterfall (" in words, words
