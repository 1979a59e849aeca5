"""``ckpt-events report`` (``participants.cli.report.command``): the breakdown from a log, a corrupt
line named by its number, the report file written; an ASCII stdout."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ckpt_events.participants.cli.main import main


def test_report_skips_a_corrupt_line_with_its_number(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """report prints the breakdown from a log and names a corrupt line by number."""
    log = tmp_path / "log.jsonl"
    good = (
        b'{"type":"operation_finished","kind":"model","instance":"m0","trace_id":1,"span_id":2,'
        b'"start_ns":1000000,"end_ns":5000000,"operation":"commit","records":3}\n'
    )
    log.write_bytes(good + b"{not json\n" + good)
    assert main(["report", str(log), "--report", str(tmp_path / "t.html")]) == 0
    captured = capsys.readouterr()
    assert f"{log}:2: corrupt line skipped" in captured.err
    assert "model/m0" in captured.out
    assert "<svg" in (tmp_path / "t.html").read_text()


def test_a_picture_of_logs_with_no_row_draws_the_last_trace_as_the_terminal_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Participants' logs only (their roots are in a controller log not given): ``--report x.svg``
    draws the last trace (the restore), as the terminal does. (That the events are no longer all
    read into a list for it is the memory bound of ``tests/attacks/test_report_floods.py``.)"""
    import anyio

    from ckpt_events.sinks import JsonLinesSink
    from tests.participants.cli.report_events import checkpoint_and_restore

    events = [e for e in anyio.run(checkpoint_and_restore) if e.kind != "controller"]
    log = tmp_path / "participants.jsonl"
    sink = JsonLinesSink(log)
    sink.handle(events)
    anyio.run(sink.aclose)
    traces = {getattr(e, "trace_id", None) for e in events} - {None}
    assert len(traces) == 2  # the checkpoint's and the restore's
    picture = tmp_path / "x.svg"
    assert main(["report", str(log), "--report", str(picture)]) == 0
    drawn = picture.read_text()
    # The restore's trace is drawn, nothing of the checkpoint's: no commit, no prepare.
    assert "restore" in drawn
    assert "commit" not in drawn and "prepare" not in drawn
    captured = capsys.readouterr()
    assert "report written to" in captured.out
    # What the page lacks is said: the checkpoints are named from the controller's log.
    assert "no controller's coordination in these logs" in captured.err
    assert "if a controller coordinated them, pass its log too" in captured.err


def test_the_html_page_of_a_log_of_refusals_alone_shows_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A log holding only refusals: the terminal listed "refused stale_attempt 8", the HTML page
    an empty participant table and nothing of them. The page has the counted events too."""
    refusal = b'{"type":"refused","kind":"agent","instance":"agent-0","time_ns":%d,"code":"stale_attempt"}\n'
    log = tmp_path / "refusals.jsonl"
    log.write_bytes(b"".join(refusal % (1_000_000 * (n + 1)) for n in range(8)))
    page = tmp_path / "page.html"
    assert main(["report", str(log), "--report", str(page)]) == 0
    out = capsys.readouterr().out
    assert "stale_attempt" in out
    html = page.read_text()
    assert "<h2>counted events</h2>" in html
    assert "<tr><td>refused</td><td>stale_attempt</td><td>8</td></tr>" in html


def test_an_ascii_stdout_shows_what_it_cannot_encode_as_escapes(tmp_path: Path) -> None:
    """Under ``PYTHONIOENCODING=ascii`` a checkpoint id with an ``é`` (and the waterfall's bars)
    was a UnicodeEncodeError traceback half way through the report: shown escaped, as stderr does."""
    log = tmp_path / "log.jsonl"
    log.write_bytes(
        b'{"type":"operation_finished","kind":"model","instance":"m0","trace_id":1,"span_id":2,'
        b'"start_ns":1000000,"end_ns":5000000,"operation":"commit","checkpoint_id":"c\\u00e9"}\n'
    )
    root = Path(__file__).resolve().parents[4]
    done = subprocess.run(
        [sys.executable, "-m", "ckpt_events.participants.cli", "report", str(log)],
        check=False,
        capture_output=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(root), "PYTHONIOENCODING": "ascii"},
    )
    assert done.returncode == 0 and b"Traceback" not in done.stderr, done.stderr.decode()
    assert b"checkpoint c\\xe9 (commit)" in done.stdout


def _edited_log(tmp_path: Path, edit: Callable[[list[dict[str, Any]]], None]) -> Path:
    """The real emitter's checkpoint and restore written by the jsonl sink, its records passed
    through ``edit`` (a hostile or broken writer's log)."""
    import anyio
    import msgspec

    from ckpt_events.sinks import JsonLinesSink
    from tests.participants.cli.report_events import checkpoint_and_restore

    written = tmp_path / "written.jsonl"
    sink = JsonLinesSink(written)
    sink.handle(anyio.run(checkpoint_and_restore))
    anyio.run(sink.aclose)
    records = [msgspec.json.decode(line) for line in written.read_bytes().splitlines()]
    edit(records)
    log = tmp_path / "edited.jsonl"
    log.write_bytes(b"".join(msgspec.json.encode(r) + b"\n" for r in records))
    return log


def _roots(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The collections' records that have no parent: the checkpoint's and the restore's."""
    return [r for r in records if r["type"].startswith("collection_") and r["parent_span_id"] is None]


def test_a_root_whose_parent_is_its_own_child_is_drawn_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A collection whose parent id names its own first child (a loop: no span of the trace
    without a parent): the waterfall had no row and the report ended in "max() arg is an empty
    sequence"; every span of the loop is drawn, on the terminal and in the picture."""

    def loop(records: list[dict[str, Any]]) -> None:
        first_child = {}
        for r in records:
            if r["type"] == "coordinate_started":
                first_child.setdefault(r["trace_id"], r["span_id"])
        for r in _roots(records):
            r["parent_span_id"] = first_child[r["trace_id"]]

    log = _edited_log(tmp_path, loop)
    picture = tmp_path / "loop.svg"
    assert main(["report", str(log), "--report", str(picture)]) == 0
    out = capsys.readouterr().out
    assert "collection.checkpoint" in out and "coordinate.prepare" in out and "write" in out
    # No span to walk the critical path from: unknown, never left out or guessed.
    assert "#1 checkpoint, critical path: unknown (the trace's parent ids loop" in out
    assert "collection.checkpoint" in picture.read_text()


def test_a_root_that_names_itself_its_parent_is_still_a_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A collection whose parent id is its own span id: the overview dropped it (its parent was
    "seen"), found no row and said "no controller's coordination in these logs", beside the
    controller's very spans. A nested one (the publish) ended the trace's spans as a root's:
    the checkpoint's critical path was walked over the resume alone. Both as the log unedited."""

    def own_parent(records: list[dict[str, Any]]) -> None:
        for r in records:
            if r["type"].startswith("collection_"):
                r["parent_span_id"] = r["span_id"]

    log = _edited_log(tmp_path, own_parent)
    assert main(["report", str(tmp_path / "written.jsonl")]) == 0
    unedited = capsys.readouterr().out
    assert main(["report", str(log)]) == 0
    captured = capsys.readouterr()
    assert "no controller's coordination" not in captured.err
    assert "run overview (1 log file): 2 checkpoints and restores" in captured.out
    assert "collection.checkpoint" in captured.out

    def paths(out: str) -> list[str]:
        return [line for line in out.splitlines() if ", critical path: " in line]

    assert len(paths(unedited)) == 2 and paths(captured.out) == paths(unedited)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (a disk that is full)")
@pytest.mark.parametrize("name", ["page.html", "one.svg", "run.perfetto.json"])
def test_a_report_that_cannot_be_written_to_the_end_is_one_line(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A disk that fills while the report is written (a link to ``/dev/full``): the probe up front
    passes, the write raised ``OSError: [Errno 28] No space left on device``, a traceback; it is one
    line naming the file and why, exit 2."""
    log = _edited_log(tmp_path, lambda records: None)
    (full := tmp_path / name).symlink_to("/dev/full")
    argv = ["report", str(log), "--report", str(full)]
    if name == "one.svg":
        argv += ["--checkpoint", "c1"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("ckpt-events report: error: cannot write ") and str(full) in err[-1]
    assert "No space left on device" in err[-1]


def test_a_checkpoint_whose_clock_went_back_is_of_unknown_duration_not_0_ms(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The controller's clock went back during the checkpoint (its collection ends before it
    starts): the overview said it took 0.0 ms, on the terminal and the page, where its critical
    path was rightly unknown; its duration is unknown (``?``), as a span's is."""

    def back(records: list[dict[str, Any]]) -> None:
        for r in _roots(records):
            if r["type"] == "collection_finished" and r["action"] == "checkpoint":
                r["end_ns"] = r["start_ns"] - 1_000

    log = _edited_log(tmp_path, back)
    page = tmp_path / "page.html"
    assert main(["report", str(log), "--report", str(page)]) == 0
    out = capsys.readouterr().out
    (row,) = [line.split() for line in out.splitlines() if line.strip().startswith("1   checkpoint")]
    assert row[4] == "?" and "0.0" not in row
    html = page.read_text()
    assert "#1 checkpoint c1: published, duration unknown" in html
    assert "<td>0.0</td>" not in html.split('<table id="overview">')[1].split("</table>")[0]


def test_checkpoints_that_share_one_trace_have_an_unknown_pause_said_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every collection given one traceparent (a job traced as one span): the checkpoint's pause
    ran from its first prepare to the restore's last resume (the trace's), and the restore had
    a pause of its own; the rows sharing a trace have an unknown pause, and the line says why."""
    trace = "ab" * 16

    def one_trace(records: list[dict[str, Any]]) -> None:
        for r in _roots(records):
            r["parent_span_id"] = "1" * 16  # the job's span, in a log not given
            r["parent_remote"] = True
        for r in records:
            if "trace_id" in r:
                r["trace_id"] = trace

    log = _edited_log(tmp_path, one_trace)
    assert main(["report", str(tmp_path / "written.jsonl")]) == 0
    apart = capsys.readouterr().out
    assert "checkpointing paused the fleet (admission closed, first prepare to last resume) " in apart
    assert main(["report", str(log)]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [row[1] for row in rows[:2]] == ["checkpoint", "restore"]
    assert rows[0][5] == "unknown" and rows[1][5] == "restored"  # the restore's pause: blank
    assert (
        "checkpointing paused the fleet (admission closed, first prepare to last resume) for an "
        "unknown time (pause unknown for 1 checkpoint: 1 checkpoint sharing its trace with another "
        "checkpoint or restore (one traceparent given to several collections))"
    ) in " ".join(out.split())  # the terminal's lines wrapped


def _one_trace(records: list[dict[str, Any]]) -> None:
    """Every collection given one traceparent: the job's span, in a log not given."""
    for r in _roots(records):
        r["parent_span_id"] = "1" * 16
        r["parent_remote"] = True
    for r in records:
        if "trace_id" in r:
            r["trace_id"] = "ab" * 16


def test_the_detail_of_a_row_sharing_its_trace_shows_its_own_spans_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A checkpoint and a restore under one traceparent: each one's detail drew the whole trace,
    both collections (the checkpoint's breakdown counted the restore's reads, its waterfall ran
    on into the restore, and an attribution "restore c1 (collection.checkpoint)" followed). Each
    shows the spans under its own root, and a line says the trace is shared, with which row."""
    log = _edited_log(tmp_path, _one_trace)
    page = tmp_path / "run.html"
    assert main(["report", str(log), "--checkpoint", "c1"]) == 0
    out = capsys.readouterr().out
    _, checkpoint, restore = out.split(" time per participant (ms), records and bytes")
    assert "collection.checkpoint" in checkpoint and "commit environment-0" in checkpoint
    assert "collection.restore" not in checkpoint and "install" not in checkpoint, checkpoint
    assert "collection.restore" in restore and "install" in restore
    assert "collection.checkpoint" not in restore and "commit environment-0" not in restore, restore
    said = " ".join(out.split())
    shared = "its trace is shared with #{} ({} c1): shown are the spans under its own root"
    assert shared.format(2, "restore") in said and shared.format(1, "checkpoint") in said, said
    assert main(["report", str(log), "--report", str(page)]) == 0
    html = page.read_text()
    first, second = html.split('<section id="detail-1">')[1].split('<section id="detail-2">')
    assert "collection.restore" not in first and "collection.checkpoint" not in second
    assert shared.format(2, "restore") in first and shared.format(1, "checkpoint") in second


def test_a_pause_unknown_for_a_resume_whose_clock_went_back_is_said_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A participant's clock went back during its resume (its end unknown): the pause is unknown,
    rightly, but the line blamed "a participant that answered outside the controller's call (a
    clock no one shift aligns)", which no clock line backed; it names the resume."""

    def back(records: list[dict[str, Any]]) -> None:
        for r in records:
            if r["type"] == "operation_finished" and r["operation"] == "resume" and r["kind"] == "agent":
                r["end_ns"] = r["start_ns"] - 1_000
                return

    log = _edited_log(tmp_path, back)
    assert main(["report", str(log)]) == 0
    captured = capsys.readouterr()
    said = " ".join(captured.out.split())  # the terminal's lines wrapped
    assert "could not align" not in captured.err and "outside the controller's call" not in said
    assert (
        "for an unknown time (pause unknown for 1 checkpoint: 1 checkpoint with a resume during "
        "which its participant's clock went back (its end unknown))"
    ) in said


def test_the_checkpoints_detailed_by_default_are_bounded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every checkpoint that did not publish was detailed: 2,100 open checkpoints (a controller's
    log without its ends) printed 26 MB and a 98 MB page in 53 s and 597 MB. The first
    ``DETAILED_UNPUBLISHED`` are, the rest are counted in one line naming ``--checkpoint``; the
    page, which draws every row of a run of at most ``ALL_WATERFALLS``, draws those."""
    from ckpt_events.participants.cli.report.overview_terminal import DETAILED_UNPUBLISHED
    from ckpt_events.participants.cli.report.run_page import ALL_WATERFALLS

    started = (
        '{"type":"collection_started","kind":"controller","instance":"c","trace_id":%d,"span_id":1,'
        '"start_ns":%d,"action":"checkpoint","checkpoint_id":"c%d"}\n'
    )
    count = ALL_WATERFALLS + 7
    log = tmp_path / "open.jsonl"
    log.write_text("".join(started % (n, (n + 1) * 1_000_000_000, n) for n in range(1, count + 1)))
    page = tmp_path / "page.html"
    assert main(["report", str(log), "--report", str(page)]) == 0
    captured = capsys.readouterr()
    heading = "(open at end of log): time per participant"
    detailed = [line for line in captured.out.splitlines() if heading in line]
    assert len(detailed) == DETAILED_UNPUBLISHED
    assert "checkpoint c1 (open at end of log)" in detailed[0]
    said = " ".join(captured.err.split())
    left = count - DETAILED_UNPUBLISHED
    assert f"{left} more checkpoints and restores that did not publish are not detailed" in said
    assert "--checkpoint ID" in said
    assert page.read_text().count('<section id="detail-') == DETAILED_UNPUBLISHED


def test_a_long_or_empty_checkpoint_id_is_shown_cut_or_quoted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A user's ids as given to ``checkpoint_id=``: a 10 KB one filled 61 lines of the overview
    (and again each line naming it), an empty one read as no id (``#4 checkpoint , start``).
    Each is shown cut to its start and end with its length, or as ``''``; a non-ASCII one whole,
    and ``--checkpoint ''`` still finds its row."""
    import anyio

    from ckpt_events import Bus, Telemetry
    from ckpt_events.sinks import JsonLinesSink

    log = tmp_path / "run.jsonl"
    ids = ["c1", "x" * 10_240, "検査点-ü", ""]

    async def run() -> None:
        async with Bus() as bus:
            bus.subscribe(JsonLinesSink(log))
            controller = Telemetry(bus, kind="controller", instance="coordination")
            judge = Telemetry(bus, kind="judge", instance="judge-0")
            for checkpoint_id in ids:
                with controller.coordinate("commit", checkpoint_id=checkpoint_id) as coordinate:
                    with judge.operation(
                        "commit", checkpoint_id=checkpoint_id, traceparent=coordinate.traceparent()
                    ):
                        pass

    anyio.run(run)
    assert main(["report", str(log)]) == 0
    out = capsys.readouterr().out
    assert "x" * 100 not in out
    assert f"{'x' * 48}...{'x' * 16} (10,240 characters)" in out
    assert "検査点-ü" in out
    assert "''" in out and "checkpoint , " not in out
    assert len(out) < 8_000
    assert main(["report", str(log), "--checkpoint", ""]) == 0
    assert "checkpoint '' (published)" in capsys.readouterr().out


def test_a_checkpoint_id_two_runs_used_is_detailed_by_row_and_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two fleets' logs that both checkpointed (and restored) ``c1``: ``--checkpoint c1`` showed
    two sections headed alike, "checkpoint c1 (published)", and drew the first to ``--report``,
    without a word; now each is headed by its row, one line names the rows and how to pick one,
    and ``--checkpoint c1#N`` details row N alone."""
    import anyio

    from ckpt_events.sinks import JsonLinesSink
    from tests.participants.cli.report_events import checkpoint_and_restore

    for fleet in ("a", "b"):
        sink = JsonLinesSink(tmp_path / f"{fleet}.jsonl")
        sink.handle(anyio.run(checkpoint_and_restore))
        sink.close()
    assert main(["report", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]) == 0
    overview = capsys.readouterr().out
    numbers = [line.split()[0] for line in overview.splitlines() if " checkpoint   c1 " in line]
    assert len(numbers) == 2, overview
    first, second = numbers
    assert main(["report", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"), "--checkpoint", "c1"]) == 0
    out, err = capsys.readouterr()
    assert (
        f"checkpoint id c1 was used by 2 checkpoints (rows #{first} and #{second}): each is detailed under "
        f"its row number, and --report draws #{first}; pick one with --checkpoint c1#{second}"
    ) in " ".join(err.split())
    assert f"#{first} checkpoint c1 (published)" in out and f"#{second} checkpoint c1 (published)" in out
    assert (
        main(["report", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"), "--checkpoint", f"c1#{second}"])
        == 0
    )
    out, err = capsys.readouterr()
    assert out.count("checkpoint c1 (published)") == 1 and "was used by" not in err, out
