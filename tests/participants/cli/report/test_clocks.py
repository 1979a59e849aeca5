"""Clocks and copies, from a real fleet's logs rewritten: one participant's clock 40 s behind or
60 s ahead is aligned by the controller's calls (the pause figures match the true run's, and a
line says so); a clock stepping back 5 s during a write gives no negative duration and says
what it cannot know; a log out of order and its copy count once."""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ckpt_events import CheckpointEvent, CoordinateFinished, OperationFinished, OperationStarted, StepFinished
from ckpt_events.participants.cli.main import main
from ckpt_events.participants.cli.report.clocks import ClockEvidence
from ckpt_events.participants.cli.report.events import duration_ns
from ckpt_events.participants.cli.report.logs import LogProblems, identity, merged_events
from ckpt_events.participants.cli.report.overview import overview
from ckpt_events.sinks import JsonLinesSink
from ckpt_events.vocab import Operation, Step
from tests.participants.controller.test_coordinator import coordinated

CHECKPOINTS = 4
SECOND = 1_000_000_000
#: One row of the overview table: number, what, id, start, ms, paused ms, outcome.
_ROW = re.compile(r"^\s*(\d+)\s+checkpoint\s+(\S+)\s+[\d:.]+\s+([\d.]+)\s+([\d.]+|unknown)\s+published")
_LOGS_TIME = re.compile(r"of the logs' ([\d.]+ m?s)")
_TOTAL = re.compile(r"paused the fleet .* ([\d.]+) ms in all, ([\d.]+)% of the logs'")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> list[Any]:
    """A real fleet's events: four participants over HTTP, ``CHECKPOINTS`` checkpoints."""
    import anyio

    root = tmp_path_factory.mktemp("run")

    async def checkpoints() -> list[Any]:
        async with coordinated() as (co, _, events):
            for n in range(CHECKPOINTS):
                await co.checkpoint(f"c{n}", str(root / f"ck{n}"), deadline_ts=time.time() + 10)
        return list(events)

    return anyio.run(checkpoints)


def _shift(e: Any, by: int) -> Any:
    changes = {
        name: value + by
        for name in ("start_ns", "end_ns", "received_ns", "time_ns")
        if (value := getattr(e, name, None)) is not None
    }
    return msgspec.structs.replace(e, **changes)


def _write(folder: Path, events: list[Any]) -> Path:
    """One JSON-lines file per process, as a fleet on several hosts writes them."""
    folder.mkdir()
    by_process: dict[str, list[Any]] = {}
    for e in events:
        by_process.setdefault(f"{e.kind}-{e.instance}", []).append(e)
    for name, mine in by_process.items():
        sink = JsonLinesSink(folder / f"{name}.jsonl")
        sink.handle(mine)
        sink.close()
    return folder


def _report(capsys: pytest.CaptureFixture[str], *args: Path | str) -> tuple[str, str]:
    assert main(["report", *map(str, args)]) == 0
    captured = capsys.readouterr()
    return captured.out, captured.err


def _pauses(out: str) -> tuple[dict[str, float], float, float]:
    """Each checkpoint's paused ms, the total and its share of the logs' wall time (%)."""
    rows = {m[2]: float(m[4]) for line in out.splitlines() if (m := _ROW.match(line))}
    total = _TOTAL.search(out.replace("\n", " "))
    assert total is not None, out
    return rows, float(total[1]), float(total[2])


def _same_pauses(true_out: str, out: str) -> float:
    """Assert ``out`` (a report of skewed logs) gives each checkpoint the pause ``true_out`` (the
    same logs on true clocks) gives, within 3 ms; returns ``out``'s share of wall time (%)."""
    expected, expected_total, _ = _pauses(true_out)
    got, total, share = _pauses(out)
    assert len(expected) == CHECKPOINTS and got.keys() == expected.keys()
    for checkpoint, ms in expected.items():
        assert got[checkpoint] == pytest.approx(ms, abs=3.0), (checkpoint, got, expected)
    assert total == pytest.approx(expected_total, abs=3.0 * CHECKPOINTS)
    return share


@pytest.mark.parametrize("skew_s", [-40, 60])
def test_a_participant_clock_off_by_tens_of_seconds_is_aligned_by_the_calls(
    run: list[Any],
    skew_s: int,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """agent-0's stamps moved by -40 s or +60 s: the pause per checkpoint and in all match the
    true run's within a few ms (they were 40,043-40,059 ms: 254.6% of the logs' wall time), and
    one line says how agent-0's clock was aligned."""
    monkeypatch.setenv("COLUMNS", "200")
    true_out, true_err = _report(capsys, _write(tmp_path / "true", run))
    assert "aligned" not in true_err
    skewed = [_shift(e, skew_s * SECOND) if e.instance == "agent-0" else e for e in run]
    out, err = _report(capsys, _write(tmp_path / "skewed", skewed))

    share = _same_pauses(true_out, out)
    assert share < 100
    aligned = [line for line in err.splitlines() if line.startswith("aligned agent/agent-0's clock by ")]
    assert len(aligned) == 1, err
    assert f"by {skew_s:+.1f} s " in aligned[0]
    assert "aligned" not in err.replace(aligned[0], "")


def _with_workers(run: list[Any], instance: str) -> list[Any]:
    """``run`` with two ``serve --workers`` workers under each of ``instance``'s prepares, as a
    real one logs them: each worker's prepare answers its main process's (a remote parent),
    inside it, and names no controller's call."""
    out = []
    for e in run:
        out.append(e)
        if (
            isinstance(e, OperationStarted | OperationFinished)
            and e.instance == instance
            and e.operation == Operation.PREPARE
        ):
            for w in (0, 1):
                out.append(
                    msgspec.structs.replace(
                        e, span_id=e.span_id ^ (0x7F00 + w), parent_span_id=e.span_id, worker=w
                    )
                )
    return out


@pytest.mark.parametrize("skew_s", [-40, 60])
def test_a_participant_s_workers_share_its_aligned_clock(
    run: list[Any],
    skew_s: int,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """agent-0 and its two workers (one host, one clock) 40 s behind or 60 s ahead: the workers
    are moved with their main process, so the pauses are the true run's (the workers' prepares,
    left 40 s early, made each pause 40,039 ms for a 48 ms one), and its line says so."""
    monkeypatch.setenv("COLUMNS", "200")
    fleet = _with_workers(run, "agent-0")
    true_out, _ = _report(capsys, _write(tmp_path / "true", fleet))
    skewed = [_shift(e, skew_s * SECOND) if e.instance == "agent-0" else e for e in fleet]
    out, err = _report(capsys, _write(tmp_path / "skewed", skewed))

    _same_pauses(true_out, out)
    aligned = [line for line in err.splitlines() if line.startswith("aligned agent/agent-0's clock")]
    assert len(aligned) == 1, err
    said = f"aligned agent/agent-0's clock (and its 2 workers') by {skew_s:+.1f} s "
    assert aligned[0].startswith(said), err


def test_a_clock_stepping_back_during_a_write_gives_no_negative_duration(
    run: list[Any], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """model-0's clock goes back 5 s during checkpoint c1's write: its write and commit have no
    known duration (never negative), the checkpoints whose pause crosses processes after the
    step say unknown, a line says the clock could not be aligned, and c0's pause is the true one."""
    monkeypatch.setenv("COLUMNS", "200")
    write = next(
        e
        for e in run
        if isinstance(e, StepFinished)
        and e.step == Step.WRITE
        and e.instance == "model-0"
        and e.checkpoint_id == "c1"
    )
    step_at = write.start_ns + (write.end_ns - write.start_ns) // 2

    def stepped(e: Any) -> Any:
        if e.instance != "model-0":
            return e
        # Every stamp read after the step is 5 s early; those read before it are right.
        changes = {
            name: value - 5 * SECOND
            for name in ("start_ns", "end_ns", "received_ns", "time_ns")
            if (value := getattr(e, name, None)) is not None and value > step_at
        }
        return msgspec.structs.replace(e, **changes)

    events = [stepped(e) for e in run]
    negative = [e for e in events if hasattr(e, "end_ns") and e.end_ns < e.start_ns]
    assert {type(e) for e in negative} == {StepFinished, OperationFinished}  # the write and its commit
    assert all(duration_ns(e) is None for e in negative)

    true_out, _ = _report(capsys, _write(tmp_path / "true", run))
    out, err = _report(capsys, _write(tmp_path / "stepped", events))
    expected, _, _ = _pauses(true_out)
    rows = {m[2]: m[4] for line in out.splitlines() if (m := _ROW.match(line))}
    assert float(rows["c0"]) == pytest.approx(expected["c0"], abs=0.05)
    assert rows["c1"] == rows["c2"] == rows["c3"] == "unknown"  # c1 resumed after the step
    assert "pause unknown for 3 checkpoints" in out
    # The logs' time is the controller's, not stretched 5 s by model-0's stamps.
    assert _LOGS_TIME.findall(out) == _LOGS_TIME.findall(true_out)
    assert any(line.startswith("could not align model/model-0's clock") for line in err.splitlines()), err
    assert not re.search(r"(?<![\w.:])-\d", out), [
        line for line in out.splitlines() if re.search(r"(?<![\w.:])-\d", line)
    ]

    detail, _ = _report(capsys, tmp_path / "stepped", "--checkpoint", "c1")
    assert not re.search(r"(?<![\w.:])-\d", detail)


def _out_of_order(run: list[Any]) -> list[Any]:
    """The run as one process wrote it, its clock stepping back 5 s after the second checkpoint:
    the log's stamps go back in the middle of the file."""
    cut = next(
        e.start_ns for e in run if getattr(e, "checkpoint_id", None) == "c2" and hasattr(e, "start_ns")
    )
    return [_shift(e, -5 * SECOND) if (getattr(e, "start_ns", None) or e.time_ns) >= cut else e for e in run]


def test_a_log_out_of_order_and_its_copy_count_once(
    run: list[Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The copy of a log whose clock stepped back (so identical events are far apart in the
    merge): every event of the copy is dropped, trends' p95 equals the single log's (it was
    about twice it), and one line counts the duplicates."""
    log = tmp_path / "fleet.jsonl"
    sink = JsonLinesSink(log)
    sink.handle(_out_of_order(run))
    sink.close()
    copy = tmp_path / "copy" / "fleet.jsonl"
    copy.parent.mkdir()
    shutil.copy(log, copy)

    alone, first, twice = LogProblems(), LogProblems(), LogProblems()
    single = overview(list(merged_events([log], alone)))
    list(merged_events([log, copy], first))
    assert first.disordered  # the log goes back in time: its copies need an exact read
    both = overview(list(merged_events([log, copy], twice, exact=True)))
    assert twice.duplicates == alone.events == len(run) and twice.unchecked == 0
    assert [(t.key, t.count, t.p50, t.p95, t.max) for t in both.trends.table()] == [
        (t.key, t.count, t.p50, t.p95, t.max) for t in single.trends.table()
    ]
    assert [(r.checkpoint_id, r.ms, r.paused_ms) for r in both.rows] == [
        (r.checkpoint_id, r.ms, r.paused_ms) for r in single.rows
    ]
    _, err = _report(capsys, log, copy)
    assert f"dropped {len(run):,} duplicate events: the same event in two files" in err


def test_a_copy_forgotten_before_it_came_is_counted_and_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With fewer identities kept than the copy lags behind, the events whose copy may have
    been forgotten are counted (never silently counted twice), and a line says so."""
    from ckpt_events.participants.cli.report import logs

    lines = _spans_lines(40)
    log, copy = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    log.write_bytes(b"".join(lines[20:] + lines[:20]))  # the clock stepped back after 20
    copy.write_bytes(log.read_bytes())
    problems = LogProblems()
    monkeypatch.setattr(logs, "DEDUP_EVENTS", 8)
    events = list(merged_events([log, copy], problems, exact=True))
    assert problems.unchecked > 0
    assert len(events) + problems.duplicates == 80 and len(events) <= 40 + problems.unchecked
    assert any("could not be checked for a copy" in line for line in problems.summary())


def _spans_lines(count: int) -> list[bytes]:
    return [
        b'{"type":"operation_finished","kind":"model","instance":"m0","trace_id":1,"span_id":%d,'
        b'"start_ns":%d,"end_ns":%d,"operation":"commit"}\n'
        % (n + 2, 1_000_000 * (n + 1), 1_000_000 * (n + 1) + 5)
        for n in range(count)
    ]


def test_identity_tells_apart_every_event_of_a_run(run: list[Any]) -> None:
    """No two events of a real run share an identity: dropping by it never merges two events."""
    assert len({identity(e) for e in run}) == len(run)


def test_an_event_repeated_within_one_file_is_kept(tmp_path: Path) -> None:
    """Only another file's copy is a duplicate: a counted event written twice by one process
    (two identical refusals in the same nanosecond, on a coarse clock) is kept twice."""
    line = b'{"type":"refused","kind":"model","instance":"m0","time_ns":5,"code":"invalid_phase"}\n'
    log = tmp_path / "a.jsonl"
    log.write_bytes(line * 2)
    other = tmp_path / "b.jsonl"
    other.write_bytes(line)
    problems = LogProblems()
    assert len(list(merged_events([log, other], problems))) == 2 and problems.duplicates == 1


def test_calls_bound_a_clock_and_a_stepped_one_is_not_aligned(run: list[Any]) -> None:
    """The evidence: agreeing clocks need no shift; a constant skew is found within the calls'
    slack; a clock that moves during the run fits no one shift and is left alone."""
    clocks = ClockEvidence()
    for e in run:
        clocks.add(e)
    assert clocks.offsets() == {} and clocks.outside == set()
    assert {p[1] for p in clocks.ranges} == {"environment-0", "model-0", "agent-0", "resources-0"}

    skewed = ClockEvidence()
    for e in run:
        skewed.add(_shift(e, -40 * SECOND) if e.instance == "agent-0" else e)
    (process, by), *others = skewed.offsets().items()
    assert not others and process[1] == "agent-0" and abs(by - 40 * SECOND) < 5_000_000

    first_commit = next(
        e for e in run if isinstance(e, OperationFinished) and e.operation is Operation.COMMIT
    )
    moving = ClockEvidence()
    for e in run:
        late = e.instance == "agent-0" and getattr(e, "start_ns", 0) > first_commit.end_ns
        moving.add(_shift(e, 5 * SECOND) if late else e)
    assert moving.offsets() == {}
    assert any(line.startswith("could not align agent/agent-0's clock") for line in moving.lines({}))
    assert moving.outside


def test_a_span_whose_clock_went_back_has_no_duration_anywhere() -> None:
    """end before start (the clock went back 5 s during it): left out of durations, a blank in
    the breakdown, an instant in the waterfall that says why; never a negative number."""
    from ckpt_events.participants.cli.report.durations import durations
    from ckpt_events.participants.cli.report.model import trace_spans
    from ckpt_events.participants.cli.report.timeline import breakdown

    back = OperationFinished("model", "m0", 1, 2, 10 * SECOND, 5 * SECOND + 3_000_000, Operation.COMMIT)
    fine = OperationFinished("model", "m1", 1, 3, 10 * SECOND, 10 * SECOND + 4_000_000, Operation.COMMIT)
    assert duration_ns(back) is None and duration_ns(fine) == 4_000_000
    assert durations([back, fine]).ok == {("model", "commit", ""): [4.0]}
    assert durations([back, fine]).failed == {}
    rows = {r.instance: r for r in breakdown([back, fine])}
    assert rows["m0"].ms == {} and rows["m0"].unknown == {"commit"} and rows["m1"].ms == {"commit": 4.0}
    spans = {s.who: s for s in trace_spans([back, fine], 1)}
    assert spans["model/m0"].ms == 0 and not spans["model/m0"].known
    assert spans["model/m0"].details["duration_ms"] == "unknown: the clock went back 4,997.0 ms during it"


def test_a_call_the_controller_gave_up_on_bounds_no_answers_end() -> None:
    """The controller's own deadline cancels a prepare stage at 200 while environment-0 answers
    at 240 (it was told to resume): the call bounds the answer's start only. environment-0's
    clock agrees with its other call, so nothing is shifted, no trace is outside, and no line
    says it "could not align" a clock that never moved (it did, and the pause was unknown)."""
    from ckpt_events import StageFinished
    from ckpt_events.vocab import Outcome

    def call(span: int, start: int, end: int, **fields: Any) -> StageFinished:
        return StageFinished(
            kind="controller", instance="coordination", trace_id=span, span_id=span, start_ns=start,
            end_ns=end, stage="environment", checkpoint_id=f"c{span}", **fields,
        )  # fmt: skip

    def answer(span: int, start: int, end: int) -> OperationFinished:
        return OperationFinished(
            kind="environment", instance="environment-0", trace_id=span, span_id=span + 100, start_ns=start,
            end_ns=end, operation=Operation.PREPARE, checkpoint_id=f"c{span}", parent_span_id=span,
            parent_remote=True, outcome=Outcome.ERROR,
        )  # fmt: skip

    clocks = ClockEvidence()
    for e in (
        call(1, 100, 200, outcome=Outcome.ERROR, error_type="CancelledError"),
        answer(1, 110, 240),
        answer(2, 310, 350),
        call(2, 300, 400),
    ):
        clocks.add(e)
    assert clocks.unaligned() == [] and clocks.outside == set() and clocks.offsets() == {}
    assert clocks.lines({}) == []
    behind = ClockEvidence()  # stamped 50 before its call: bounded below only, shifted by the least
    for e in (call(1, 100, 200, outcome=Outcome.ERROR), answer(1, 50, 240)):
        behind.add(e)
    assert behind.offsets() == {("environment", "environment-0", None): 50}


def test_a_shift_of_microseconds_is_said_in_microseconds() -> None:
    """A clock aligned by 0.9 us read "aligned ... by +0.0 ms" (by nothing, it seemed)."""
    from ckpt_events.participants.cli.report.clocks import _seconds

    assert _seconds(-900) == "-0.9 us"
    assert _seconds(120_000) == "+0.1 ms"
    assert _seconds(2_000_000_000) == "+2.0 s"


HOUR = 3600 * SECOND


def _stepped_back_in_c2(run: list[Any], *, during_call: bool, by: int = -HOUR) -> list[Any]:
    """The fleet's events as one process whose clock stepped back an hour (NTP) after c2's
    coordinate.prepare ended: everything begun after it stamped an hour back (``by``: forward
    too). ``during_call``: it stepped during resources-0's prepare call instead, so that prepare
    (and its step), stamped after the step, sits an hour before the call it answered, stamped
    before it. The monotonic clock does not step: the roots' ``monotonic_start_ns`` stay."""
    prepare = next(
        e
        for e in run
        if type(e).__name__ == "CoordinateFinished" and e.checkpoint_id == "c2" and e.operation == "prepare"
    )
    answer = next(
        e
        for e in run
        if isinstance(e, OperationFinished)
        and e.instance == "resources-0"
        and e.checkpoint_id == "c2"
        and e.operation == Operation.PREPARE
    )
    out = []
    for e in run:
        start = getattr(e, "start_ns", None)
        if start is None:
            start = e.time_ns
        stepped = start > prepare.end_ns
        if during_call and e.trace_id == answer.trace_id and answer.start_ns <= start <= answer.end_ns:
            stepped = e.instance == "resources-0"
        out.append(_shift(e, by) if stepped else e)
    return out


def _old_log(events: list[Any]) -> list[Any]:
    """``events`` as a log written before the roots carried their monotonic start."""
    return [
        msgspec.structs.replace(e, monotonic_start_ns=None) if isinstance(e, CoordinateFinished) else e
        for e in events
    ]


@pytest.mark.parametrize("during_call", [False, True])
def test_a_clock_stepped_back_an_hour_mid_checkpoint_leaves_its_duration_unknown(
    run: list[Any], tmp_path: Path, capsys: pytest.CaptureFixture[str], during_call: bool
) -> None:
    """A bare coordinator's checkpoint spans three root spans (prepare, commit, resume), each
    stamped when it began: a clock stepped back an hour after c2's prepare made c2 "3600000.0 ms",
    the slowest checkpoint (flagged, and the one detailed), and the run "0.0% of the logs' 3600.0
    s". In a log written before the roots carried their monotonic start, its duration and the
    run's share are unknown, each with why; the others keep theirs."""
    logs = _write(tmp_path / "logs", _old_log(_stepped_back_in_c2(run, during_call=during_call)))
    out, _ = _report(capsys, logs)
    flat = " ".join(out.split())
    rows = {
        m[1]: m[2] for m in re.finditer(r"checkpoint (c\d) [\d:.]+ (\S+) (?:[\d.]+|unknown) published", flat)
    }
    assert rows.keys() == {"c0", "c1", "c2", "c3"} and rows["c2"] == "unknown", (rows, out)
    assert all(float(rows[c]) < 10_000 for c in ("c0", "c1", "c3")), rows
    why = (
        "its coordinate operations' stamps are out of the order they ran in "
        "(its resume stamped before its prepare): the controller's clock stepped during it?"
    )
    assert re.search(rf"duration unknown for 1 row \(#\d checkpoint c2: {re.escape(why)}", flat), out
    assert "its share of the logs' time unknown (a clock stepped during the run" in flat, out
    assert "% of the logs'" not in flat and "3600000.0" not in flat and "took 3600000" not in flat, out
    assert "checkpoint c2 (" not in flat, out  # the slowest detailed: c2 is not known slowest


@pytest.mark.parametrize(("by", "during_call"), [(HOUR, False), (HOUR, True), (-HOUR, False)])
def test_a_wall_clock_step_between_a_checkpoint_s_roots_is_left_out_of_its_duration(
    run: list[Any], tmp_path: Path, capsys: pytest.CaptureFixture[str], by: int, during_call: bool
) -> None:
    """A clock stepped forward an hour during c2 (after its prepare, or inside its prepare's call:
    every root in order, every answer inside its call) made c2 "3600047.8 ms", the slowest
    checkpoint; back an hour, "unknown". Each root now carries the monotonic clock read at its
    start: c2 takes its true duration (as on the unstepped clocks, within 3 ms), a line says the
    controller's wall clock stepped and by how much, and its pause is unknown, with why."""
    pattern = r"checkpoint (c\d) [\d:.]+ (\S+) (?:[\d.]+|unknown) published"
    true_out, _ = _report(capsys, _write(tmp_path / "true", list(run)))
    expected = {m[1]: float(m[2]) for m in re.finditer(pattern, " ".join(true_out.split()))}
    logs = _write(tmp_path / "logs", _stepped_back_in_c2(run, during_call=during_call, by=by))
    out, _ = _report(capsys, logs)
    flat = " ".join(out.split())
    rows = {m[1]: m[2] for m in re.finditer(pattern, flat)}
    assert rows.keys() == expected.keys() == {"c0", "c1", "c2", "c3"}, (rows, out)
    assert float(rows["c2"]) == pytest.approx(expected["c2"], abs=3.0), (rows, expected, out)
    assert re.search(
        rf"the controller's wall clock stepped during 1 row, their durations read on its monotonic "
        rf"clock, the step left out \(#\d checkpoint c2: {re.escape(f'{by / SECOND:+,.1f}')} s\)",
        flat,
    ), out
    # Its pause spans the participants' stamps across the step (one answered outside its call:
    # that is said instead).
    pause_why = "with a participant that answered outside" if during_call else "during which the controller's"
    assert f"pause unknown for 1 checkpoint: 1 checkpoint {pause_why}" in flat, out
    assert "3600000" not in flat and "3,600,0" not in flat and "% of the logs'" not in flat, out


def _prepare_stepped_back_an_hour() -> list[CheckpointEvent]:
    """A rollout collection's checkpoint and restore whose resources-0 stamped its prepare (and
    what it began during it) an hour back: a clock stepped during the call."""
    import anyio

    from tests.participants.cli.report_events import checkpoint_and_restore

    events = anyio.run(checkpoint_and_restore)
    answer = next(
        e
        for e in events
        if isinstance(e, OperationFinished)
        and e.instance == "resources-0"
        and e.operation == Operation.PREPARE
    )
    return [
        _shift(e, -HOUR)
        if e.instance == "resources-0" and answer.start_ns <= getattr(e, "start_ns", -1) <= answer.end_ns
        else e
        for e in events
    ]


def test_where_a_checkpoint_s_time_went_is_unknown_when_an_answer_sits_outside_its_call(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rollout collection's checkpoint (one root): resources-0's prepare stamped an hour back, a
    clock stepped during its call. The checkpoint's duration is its root's own (66 ms, right), but
    where the time went was "transit: replies and waiting (coordinate.prepare.resources)" for the
    call its handler filled: unknown, and why; the critical path unknown as before."""
    stepped = _prepare_stepped_back_an_hour()
    out, _ = _report(capsys, _write(tmp_path / "logs", stepped))
    flat = " ".join(out.split())
    said = re.search(r"checkpoint c1 \(collection\.checkpoint\): ([\d.]+) ms total; where it went unknown: "
                     r"resources/resources-0's prepare sits 3,599,9\d\d\.\d ms outside the controller's "
                     r"coordinate\.prepare\.resources it answered", flat)  # fmt: skip
    assert said is not None and float(said[1]) < 1000, out
    assert "replies and waiting (coordinate.prepare.resources)" not in flat, out
    assert "#1 checkpoint, critical path: unknown" in flat, out


def test_a_waterfall_is_drawn_to_its_checkpoint_s_time_not_to_a_stepped_clock_s(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """resources-0's prepare stamped an hour back: the waterfalls (terminal and HTML) were scaled
    to 3,600,043.4 ms, every bar a sliver at the right edge; now to the checkpoint's own 55.4 ms,
    the two spans outside it named and not drawn."""
    stepped = _prepare_stepped_back_an_hour()
    page = tmp_path / "run.html"
    out, _ = _report(capsys, _write(tmp_path / "logs", stepped), "--report", page)
    flat = " ".join(out.split())
    scale = re.search(
        r"checkpoint c1: waterfall \(([\d.,]+) ms; 2 spans outside it not drawn: a clock that stepped\?\)",
        flat,
    )
    assert scale is not None and float(scale[1].replace(",", "")) < 1000, out
    assert flat.count("outside the checkpoint's time: not drawn") == 2, out
    html = page.read_text()
    title = re.search(r"checkpoint c1 \(([\d.,]+) ms; 2 spans outside it not drawn", html)
    assert title is not None and float(title[1].replace(",", "")) < 1000
    assert html.count('class="outside"') == 2


def test_a_checkpoint_whose_commit_is_stamped_an_hour_early_starts_at_its_prepare(
    run: list[Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A clock stepped back an hour after c2's prepare: c2's row took its commit's stamp, an hour
    before its prepare's ("20:49:35.554" for a prepare at 21:49:35.548), and sorted first of the
    checkpoints it followed. Its start is its prepare's (it ran first), and it sorts after c1."""
    from datetime import UTC, datetime

    logs = _write(tmp_path / "logs", _stepped_back_in_c2(run, during_call=False))
    out, _ = _report(capsys, logs)
    starts = {
        m[2]: m[3]
        for line in out.splitlines()
        if (m := re.match(r"^\s*(\d+)\s+checkpoint\s+(c\d)\s+([\d:.]+)", line))
    }
    order = [m[1] for line in out.splitlines() if (m := re.match(r"^\s*\d+\s+checkpoint\s+(c\d)\s", line))]
    prepare = next(
        e
        for e in run
        if type(e).__name__ == "CoordinateStarted" and e.checkpoint_id == "c2" and e.operation == "prepare"
    )
    assert starts["c2"] == datetime.fromtimestamp(prepare.start_ns / 1e9, UTC).strftime("%H:%M:%S.%f")[:-3], (
        out
    )
    # c3 ran wholly after the step: its own stamps, an hour back, put it first; c2 follows c1.
    assert order.index("c2") == order.index("c1") + 1, order


def test_a_published_checkpoint_s_spans_that_never_finished_are_counted_and_named(
    run: list[Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """model-0's commit in c2 entered and never exited (its OperationFinished, and its steps',
    not in the logs): c2 published, and the report said nothing of it anywhere. Its note under
    the table counts and names them; the other checkpoints have no such line, in the terminal
    or the run page. Its critical path and slowest operation are unknown, and why (they named
    the next slowest participant)."""
    commit = next(
        e
        for e in run
        if isinstance(e, OperationFinished)
        and e.checkpoint_id == "c2"
        and e.operation == Operation.COMMIT
        and e.instance == "model-0"
    )
    gone = [
        e
        for e in run
        if e is not commit and not (type(e).__name__ == "StepFinished" and e.parent_span_id == commit.span_id)
    ]
    assert len(run) - len(gone) == 3  # the commit and its export and write
    logs = _write(tmp_path / "logs", gone)
    out, _ = _report(capsys, logs)
    flat = " ".join(out.split())
    said = (
        "checkpoint published: 3 spans never finished (the log ends / the process died?): commit on "
        "model/model-0, export on model/model-0, write on model/model-0"
    )
    number = next(
        m[1] for line in out.splitlines() if (m := re.match(r"^\s*(\d+)\s+checkpoint\s+c2\s", line))
    )
    assert f"#{number} {said}" in flat, out
    # Its critical path named the next slowest participant: the commit's length is not known.
    # A row's critical path is its longest root's: the commit's, whose trace holds the unfinished
    # span, unless the prepare or resume ran longer (a loaded machine) and its path is said.
    path = (
        f"#{number} checkpoint, critical path: unknown (commit on model/model-0 never finished: how long "
        "it took is not known); slowest operation: unknown too"
    )
    roots = [e for e in run if isinstance(e, CoordinateFinished) and e.checkpoint_id == "c2"]
    longest = max(roots, key=lambda e: e.end_ns - e.start_ns)
    if longest.operation == Operation.COMMIT:
        assert path in flat, out
        assert flat.count("never finished") == 2, out
    else:
        assert f"#{number} checkpoint, critical path: unknown" not in flat, out
        assert flat.count("never finished") == 1, out
    page = tmp_path / "run.html"
    assert main(["report", str(logs), "--report", str(page)]) == 0
    capsys.readouterr()
    assert page.read_text().count("3 spans never finished (the log ends / the process died?)") == 1


@pytest.mark.parametrize("skew_ms", [-50, 50])
def test_a_request_s_arrival_is_aligned_inside_its_call(
    skew_ms: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A restore call of 45 ms whose request waited 30 ms in model-0 (arrived at 1, ran 31-41),
    model-0's clock 50 ms behind or ahead: its operation alone was put inside the call, its
    arrival 12.5 ms before the call began, so the line read '17.5 ms transit/queue, 17.5 ms
    unattributed (38.9%)' (on one clock: 31.0 and 4.0). The arrival bounds the clock too."""
    ms = 1_000_000
    at = 1_796_482_555_000_000_000
    skew = skew_ms * ms
    call = CoordinateFinished(
        "controller", "coordination", 7, 100, at, at + 45 * ms, Operation.RESTORE, checkpoint_id="c1"
    )
    answer = OperationFinished(
        "model", "model-0", 7, 200, at + 31 * ms + skew, at + 41 * ms + skew, Operation.RESTORE, "c1", 100,
        parent_remote=True, received_ns=at + ms + skew,
    )  # fmt: skip
    log = tmp_path / "events.jsonl"
    log.write_bytes(b"".join(msgspec.json.encode(e) + b"\n" for e in (answer, call)))
    page = tmp_path / "x.html"
    assert main(["report", str(log), "--report", str(page)]) == 0
    out = capsys.readouterr().err
    shift = 51.5 if skew_ms < 0 else -48.5  # the arrival at 1 ms and the end at 42.5 ms, of 45
    assert f"aligned model/model-0's clock by {-shift:+.1f} ms (shifted its stamps {shift:+.1f} ms" in out
    (line,) = re.findall(r'<p class="line"[^>]*>([^<]*)</p>', page.read_text())
    assert line.startswith("45.0 ms total, 10.0 ms in participants&#x27; handlers, 32.5 ms transit/queue, ")
    assert line.endswith(", 2.5 ms unattributed (5.6%)")
