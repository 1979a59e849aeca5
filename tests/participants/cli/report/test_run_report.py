"""A whole run from real participants: several logs merged, every checkpoint named with its outcome
and cause, each detail scoped to its own checkpoint."""

from __future__ import annotations

import io
import shutil
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from rich.console import Console

from ckpt_events.participants.cli.main import main
from ckpt_events.participants.cli.report.log_files import expand_logs
from ckpt_events.participants.cli.report.logs import LogProblems, merged_events
from ckpt_events.participants.cli.report.overview import overview
from ckpt_events.participants.cli.report.overview_terminal import render_overview
from ckpt_events.participants.controller.coordinator import CheckpointNotPrepared
from ckpt_events.sinks import JsonLinesSink
from ckpt_events.vocab import Kind
from tests.participants.controller.test_coordinator import AUTH, coordinated, start_work


async def _run(tmp_path: Path) -> list[Any]:
    """Two checkpoints, one blocked past its prepare deadline, one whose lease runs out, one more."""
    slow = {"environment-0": {"step_seconds": 1.0}, "model-0": {"lease_grace_seconds": 0.1}}
    async with coordinated(options=slow) as (co, http, events):
        for n in (1, 2):
            await co.checkpoint(f"c{n}", str(tmp_path / f"ck{n}"), deadline_ts=time.time() + 10)
        await start_work(http, co, "r1")
        env = co.of_kind("environment")[0]
        async with httpx.AsyncClient(headers=AUTH) as other, anyio.create_task_group() as tg:
            running = anyio.Event()

            async def run_step() -> None:
                running.set()
                await other.post(
                    env.url + "/work/advance", json={"rollout_id": "r1", "attempt": 0}, timeout=10
                )

            tg.start_soon(run_step)
            await running.wait()
            await anyio.sleep(0.2)
            with pytest.raises(CheckpointNotPrepared):
                await co.checkpoint("c-blocked", str(tmp_path / "ck-blocked"), deadline_ts=time.time() + 0.3)
        await co.prepare("c-lease", deadline_ts=time.time() + 3)
        await anyio.sleep(3.5)  # the model's lease (deadline + 0.1 s) runs out; nobody commits
        await co.resume("c-lease", deadline_ts=time.time() + 5)
    return events


def _write(path: Path, events: list[Any]) -> None:
    sink = JsonLinesSink(path)
    sink.handle(events)
    sink.close()


async def test_run_overview_names_each_checkpoint_and_its_cause(
    tmp_path: Path, aborted_run: list[Any]
) -> None:
    """Controller and participants in separate files (one given twice): each checkpoint once, causes named."""
    events = aborted_run
    logs = tmp_path / "logs"
    logs.mkdir()
    _write(logs / "controller.jsonl", [e for e in events if e.kind == Kind.CONTROLLER])
    _write(logs / "participants.jsonl", [e for e in events if e.kind != Kind.CONTROLLER])
    shutil.copy(logs / "participants.jsonl", tmp_path / "again.jsonl")
    paths, missing = expand_logs([str(logs), str(tmp_path / "again.*")])
    assert missing == [] and len(paths) == 3
    problems = LogProblems()
    run = overview(merged_events(paths, problems))
    if problems.disordered:
        # As the command does: a log out of time order (a span's end stamped by the monotonic
        # clock a few us from a wall-clock stamp, seen under load) is read again, sorted, its
        # copies looked for in any order; the single pass found 138 of 140 then.
        sort = frozenset(problems.out_of_order)
        problems = LogProblems()
        run = overview(merged_events(paths, problems, exact=True, sort=sort))
    assert problems.duplicates == len([e for e in events if e.kind != Kind.CONTROLLER])
    assert problems.events == len(events)
    by_id = {r.checkpoint_id: r for r in run.rows}
    assert [r.checkpoint_id for r in run.rows] == ["c1", "c2", "c-blocked", "c-lease"]
    assert by_id["c1"].outcome == by_id["c2"].outcome == "published"
    assert by_id["c1"].critical_path.startswith("critical path: ") and "slowest" in by_id["c1"].critical_path
    blocked = by_id["c-blocked"]
    assert blocked.outcome == "aborted"
    assert any(
        c.startswith("not ready at its deadline: environment/environment-0 blocked by 1")
        for c in blocked.causes
    )
    lease = by_id["c-lease"]
    assert lease.outcome == "aborted"
    assert any(c.startswith("lease expired on model/model-0 in phase prepared, 3.") for c in lease.causes), (
        lease.causes
    )
    # Paused: first prepare to last resume; the lease row holds the 3.5 s nobody committed.
    assert 0 < by_id["c1"].paused_ms <= by_id["c1"].ms  # type: ignore[operator]
    assert by_id["c-lease"].paused_ms >= 3000  # type: ignore[operator]
    out = Console(file=io.StringIO(), width=100)
    render_overview(out, run, title="t")
    text = out.file.getvalue()  # type: ignore[attr-defined]
    assert "lease expired on model/model-0" in text and text.count("published") == 2
    assert "checkpointing paused the fleet" in text


async def test_report_scopes_each_checkpoint_and_names_a_cut_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], aborted_run: list[Any]
) -> None:
    """A log cut mid-commit is open at the end, with who never answered; details are per checkpoint."""
    events = aborted_run
    full = tmp_path / "run.jsonl"
    _write(full, events)
    lines = full.read_bytes().splitlines(keepends=True)
    cut_at = next(i for i, line in enumerate(lines) if b'"operation_started"' in line and b'"commit"' in line
                  and b'"c2"' in line)  # fmt: skip
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(b"".join(lines[: cut_at + 1]) + lines[cut_at + 1][:20])
    assert main(["report", str(cut)]) == 0
    captured = capsys.readouterr()
    assert f"{cut}:{cut_at + 2}: corrupt line skipped" in captured.err
    assert "open at end of log" in captured.out and "still open" in captured.out
    assert "never answered:" in captured.out
    assert main(["report", str(full), "--checkpoint", "c1"]) == 0
    scoped = capsys.readouterr().out
    assert "run overview" not in scoped
    # The per-participant table holds c1's commit only: one checkpoint's records, not the run's;
    # the attribution line names the checkpoint it is about.
    assert scoped.count("checkpoint c1 (published): time per participant") == 1
    assert scoped.count("checkpoint c1 (coordinate.commit): ") == 1
    assert "checkpoint c2" not in scoped


async def test_a_rotated_file_given_without_its_newer_file_names_no_one_who_never_answered(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], aborted_run: list[Any]
) -> None:
    """The same run rotated mid-commit: ``run.jsonl.1`` given alone ends with the commit open, but
    its participants answered in ``run.jsonl``. Was: "never answered: ...", a wrong diagnosis;
    now none of them has an answer in the logs given, and one line names the file to add."""
    full = tmp_path / "full.jsonl"
    _write(full, aborted_run)
    lines = full.read_bytes().splitlines(keepends=True)
    cut_at = next(i for i, line in enumerate(lines) if b'"operation_started"' in line and b'"commit"' in line
                  and b'"c2"' in line)  # fmt: skip
    backup, log = tmp_path / "run.jsonl.1", tmp_path / "run.jsonl"
    backup.write_bytes(b"".join(lines[: cut_at + 1]))
    log.write_bytes(b"".join(lines[cut_at + 1 :]))
    assert main(["report", str(backup)]) == 0
    captured = capsys.readouterr()
    assert "open at end of log" in captured.out and "never answered" not in captured.out, captured.out
    assert "no answer in the logs given (a log ends in a rotated file): " in " ".join(captured.out.split())
    assert f"{backup}: the newest file given of {log}, and a rotated one" in captured.err
    assert captured.err.rstrip().endswith(f"(add {log})"), captured.err
    assert main(["report", str(backup), str(log)]) == 0
    together = capsys.readouterr()
    assert main(["report", str(full)]) == 0
    assert "rotated" not in together.out + together.err, together
    whole = capsys.readouterr().out
    assert together.out.split("\n", 1)[1] == whole.split("\n", 1)[1]  # but "2 log files"


def test_not_a_log_is_refused_naming_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file that is not a log: one line naming it and its line, non-zero exit, no traceback."""
    bogus = tmp_path / "notes.txt"
    bogus.write_text("hello\n")
    assert main(["report", str(bogus)]) != 0
    err = capsys.readouterr().err
    assert f"{bogus}:1: not a ckpt-events JSON-lines log" in err and "Traceback" not in err
    assert main(["report", str(tmp_path / "nothing-*.jsonl")]) != 0
    assert "no such file, directory or matching glob" in capsys.readouterr().err


async def test_one_of_a_kind_is_said_in_the_singular(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A log of one checkpoint: "1 log file: 1 checkpoint or restore" (it printed "1 log file(s)":
    "1 checkpoints and restores")."""
    async with coordinated() as (co, _, events):
        await co.checkpoint("c1", str(tmp_path / "ck1"), deadline_ts=time.time() + 10)
    log = tmp_path / "one.jsonl"
    _write(log, list(events))
    assert await anyio.to_thread.run_sync(main, ["report", str(log)]) == 0
    out = capsys.readouterr().out
    assert "run overview (1 log file): 1 checkpoint or restore" in out
    assert "1 checkpoints" not in out and "file(s)" not in out
