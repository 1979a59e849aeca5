"""``LogFollower`` follows logs as ``tail -F`` does: across the sink's own rotation and a
copy-truncate rotation nothing is lost or read twice, and the first read folds the whole log."""

from __future__ import annotations

import gzip
import io
import re
import shutil
import time
from pathlib import Path

import pytest
from rich.console import Console

from ckpt_events import Event, OperationFinished, OperationStarted, Stalled
from ckpt_events.participants.cli.main import main
from ckpt_events.participants.cli.watch.backlog import MAX_FINISHED, Backlog
from ckpt_events.participants.cli.watch.follow import MAX_READ, LogFollower
from ckpt_events.participants.cli.watch.view import FleetView
from ckpt_events.sinks.jsonl import JsonLinesSink, oldest_first

NS = 1_000_000_000
#: A minute before each test (``_a_minute_ago``): an operation open since then is stalled (past
#: the view's 30 s), and shown in seconds (past two minutes the view says minutes, so a time taken
#: once at import would change the text in a long run).
T0 = time.time_ns() - 60 * NS


@pytest.fixture(autouse=True)
def _a_minute_ago(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(globals(), "T0", time.time_ns() - 60 * NS)


def _started(
    span: int, op: str, cid: str, at: int | None = None, instance: str = "environment-0"
) -> OperationStarted:
    at = T0 if at is None else at
    return OperationStarted(
        kind="environment",
        instance=instance,
        trace_id=7,
        span_id=span,
        start_ns=at,
        operation=op,
        checkpoint_id=cid,
    )


def _finished(
    span: int, op: str, cid: str, at: int | None = None, instance: str = "environment-0"
) -> OperationFinished:
    at = T0 if at is None else at
    return OperationFinished(
        kind="environment",
        instance=instance,
        trace_id=7,
        span_id=span,
        start_ns=at,
        end_ns=at + NS // 100,
        operation=op,
        checkpoint_id=cid,
        outcome="ok",
    )


def _line_size(event: Event) -> int:
    out = io.BytesIO()
    JsonLinesSink(out).handle([event])
    return len(out.getvalue())


def _shown(view: FleetView, events: list[Event]) -> str:
    view.add_events(events)
    out = Console(width=160, record=True, color_system=None, file=io.StringIO())
    out.print(view.render())
    return out.export_text()


@pytest.mark.parametrize("spec", ["file", "folder"])
@pytest.mark.parametrize("lands", ["old file", "new file"])
def test_a_commit_across_the_sinks_own_rotation_is_seen_to_finish(
    tmp_path: Path, spec: str, lands: str, request: pytest.FixtureRequest
) -> None:
    """A real ``JsonLinesSink(max_bytes=...)``: the commit's ``OperationFinished`` is written after
    the follower's last read, just before the rotation (in the old file) or as the line that rotates
    it (first in the new file); a renew straddles the rotation. Followed by the file or by its
    folder, the commit and the renew finish and nothing is read twice."""
    log = tmp_path / "env.jsonl"
    follower = LogFollower([str(log) if spec == "file" else str(tmp_path)])
    view = FleetView([], stall_after=30.0)
    commit_end = _finished(1, "commit", "c1")
    max_bytes = 2000
    sink = JsonLinesSink(log, max_bytes=max_bytes, backups=3)
    # Closed even when an assertion fails: an open file found by the garbage collector later is
    # reported against whichever test runs then.
    request.addfinalizer(sink.close)
    request.addfinalizer(follower.close)
    sink.handle([_started(1, "commit", "c1"), _started(2, "renew", "c1")])
    # Stamped a minute ago and read just now, by a participant known from its log alone: a clock
    # a minute behind ours would stamp it so too, so its age is at least what its log says, 0 s.
    text = _shown(view, follower.read())
    assert re.search(r"open commit c1 >=\d+\.\d s", text) and "STALLED" not in text, text
    # Fillers: ends of renews never started (ignored by the view), a byte shorter than the commit's.
    filler, spans = _finished(10, "renew", "c0"), iter(range(10, 10_000))
    assert _line_size(filler) < _line_size(commit_end)

    def free() -> int:
        return max_bytes - log.stat().st_size

    # old file: the commit's end still fits after the fillers; new file: it no longer does.
    room = 2 * _line_size(commit_end) if lands == "old file" else _line_size(commit_end)
    while free() >= room:  # bounded: each filler takes a line of the 2000 bytes, none rotates
        sink.handle([_finished(next(spans), "renew", "c0")])
    sink.handle([commit_end])
    assert sink.stats().rotations == (lands == "new file")
    sink.handle([_finished(2, "renew", "c1")])
    while sink.stats().rotations < 1:
        sink.handle([_finished(next(spans), "renew", "c0")])
    sink.close()
    assert (tmp_path / "env.jsonl.1").exists()
    events = follower.read()
    text = _shown(view, events)
    assert "open" not in text and "STALLED" not in text, text
    assert events.count(commit_end) == 1 and events.count(_finished(2, "renew", "c1")) == 1
    assert follower.read() == []
    notes = " ".join(follower.notes.values())
    assert notes == "" or "rotated" in notes
    follower.close()


@pytest.mark.parametrize("spec", ["file", "folder"])
@pytest.mark.parametrize("refill", ["shorter", "longer"])
def test_a_copy_truncate_rotation_continues_in_the_copy(tmp_path: Path, spec: str, refill: str) -> None:
    """logrotate's ``copytruncate``: the copy (``env.jsonl.1``, a new inode) is recognised by its
    first line and read from where the original was; the original, refilled (shorter or longer
    than what had been read), is read from its start. Every commit is seen to finish, once."""
    log = tmp_path / "env.jsonl"
    follower = LogFollower([str(log) if spec == "file" else str(tmp_path)])
    view = FleetView([], stall_after=30.0)
    sink = JsonLinesSink(log)
    sink.handle([_started(1, "commit", "c1")])
    sink.flush()
    assert "open commit c1" in _shown(view, follower.read())
    sink.handle([_finished(1, "commit", "c1"), _started(2, "commit", "c2")])
    sink.close()
    shutil.copyfile(log, tmp_path / "env.jsonl.1")
    with open(log, "r+b") as file:
        file.truncate(0)
    after = JsonLinesSink(log)
    after.handle([_finished(2, "commit", "c2")])
    if refill == "longer":
        after.handle(
            [x for n in range(10, 20) for x in (_started(n, "prepare", "c3"), _finished(n, "prepare", "c3"))]
        )
    after.close()
    events = follower.read()
    text = _shown(view, events)
    assert "open" not in text and "STALLED" not in text, text
    ends = [e.checkpoint_id for e in events if isinstance(e, OperationFinished) and e.operation == "commit"]
    assert ends == ["c1", "c2"]
    assert any("copy-truncate" in note for note in follower.notes.values()), follower.notes
    follower.close()


def _big_log(path: Path, checkpoints: int) -> int:
    """A log of ``checkpoints`` commits, every one finished, 15 s apart, after a prepare of
    environment-9 that never finished (a true stall, at the very start); its size."""
    sink = JsonLinesSink(path)
    start = T0 - checkpoints * 15 * NS
    sink.handle([_started(1, "prepare", "ckpt-stuck", start, instance="environment-9")])
    batch: list[Event] = []
    for n in range(checkpoints):
        at = start + n * 15 * NS
        cid = f"ckpt-{n:08d}"
        batch += [_started(100 + n, "commit", cid, at), _finished(100 + n, "commit", cid, at)]
        if len(batch) >= 10_000:
            sink.handle(batch)
            batch = []
    sink.handle(batch)
    sink.close()
    return path.stat().st_size


def test_once_on_a_log_over_8_mib_shows_its_true_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``watch --once --follow`` on a 20 MiB log: the last checkpoint is the log's last, no
    finished commit is shown open, and the prepare left open at the log's start is (not stalled:
    environment-9 wrote nothing after it, so its age against our clock is not known)."""
    monkeypatch.setenv("COLUMNS", "160")
    log = tmp_path / "env.jsonl"
    checkpoints = 40_000
    assert _big_log(log, checkpoints) > 2 * MAX_READ
    assert main(["watch", "--once", "--follow", str(log)]) == 0
    out = capsys.readouterr().out
    last = f"ckpt-{checkpoints - 1:08d} commit ok"
    assert last in out, out
    assert "open commit" not in out, out
    assert "environment environment-9" in out and "open prepare ckpt-stuck >=0." in out, out
    assert "STALLED" not in out, out


def test_a_backlog_is_read_over_several_reads_and_handed_on_whole(tmp_path: Path) -> None:
    """Live, a read takes at most ``budget`` bytes of a file: until the backlog is read to its end
    nothing is handed on (a note says how far it is), then the fold of the whole log."""
    log = tmp_path / "env.jsonl"
    size = _big_log(log, 8_000)
    follower = LogFollower([str(log)], budget=size // 3 + 1)
    assert follower.read() == [] and follower.read() == []
    assert "reading the logs' backlog" in follower.notes["(backlog)"]
    events = follower.read()
    assert follower.notes == {}
    view = FleetView([], stall_after=30.0)
    text = _shown(view, events)
    assert "ckpt-00007999 commit ok" in text and "open commit" not in text
    assert "open prepare ckpt-stuck" in text
    assert len(events) < 20  # the fold: the last finished per participant, and what is open
    follower.close()


def test_a_deleted_file_is_read_to_its_end_then_waited_for(tmp_path: Path) -> None:
    """A followed file deleted after being read: what it gained before is read from the open
    file, then its name is one note until it is back, and a new file there is read from 0."""
    log = tmp_path / "env.jsonl"
    sink = JsonLinesSink(log)
    sink.handle([_started(1, "commit", "c1")])
    sink.flush()
    follower = LogFollower([str(log)])
    assert [e.checkpoint_id for e in follower.read()] == ["c1"]
    sink.handle([_finished(1, "commit", "c1")])
    sink.close()
    log.unlink()
    assert [type(e).__name__ for e in follower.read()] == ["OperationFinished"]
    assert follower.notes[str(log)].startswith(f"{log}: cannot read (No such file or directory)")
    sink = JsonLinesSink(log)
    sink.handle([_started(2, "commit", "c2")])
    sink.close()
    assert [e.checkpoint_id for e in follower.read()] == ["c2"]
    follower.close()


@pytest.mark.parametrize("layout", ["a log and its first half, in one folder", "one log, reversed"])
def test_a_span_seen_finished_is_never_opened_again_by_its_started_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], layout: str
) -> None:
    """``watch --once``: a ``*Started`` event read after its span's ``*Finished`` (a copy of the
    log's start in the same folder, a file out of time order) opens nothing (was: every such span
    shown open and STALLED); the prepare still open is shown (with the copy: stalled, open 2 s by
    the stamps of the same participant's later commits), and the last commit is the log's."""
    monkeypatch.setenv("COLUMNS", "160")
    events: list[Event] = [_started(1, "prepare", "stuck", at=T0)]
    for n in range(3):
        events += [
            _started(n + 2, "commit", f"c{n}", at=T0 + n * NS),
            _finished(n + 2, "commit", f"c{n}", at=T0 + n * NS),
        ]
    folder = tmp_path / "logs"
    folder.mkdir()
    full = folder / "a.jsonl"
    sink = JsonLinesSink(full)
    sink.handle(events)
    sink.close()
    lines = full.read_bytes().splitlines(keepends=True)
    if layout.startswith("one log"):
        full.write_bytes(b"".join(reversed(lines)))
        spec = str(full)
    else:
        (folder / "b.jsonl").write_bytes(b"".join(lines[:4]))  # the prepare and c0 started, c1 ended
        spec = str(folder)
    assert main(["watch", "--once", "--follow", spec, "--stall-after", "1"]) == 0
    out = capsys.readouterr().out
    assert "open commit" not in out, out
    if layout.startswith("one log"):
        # Stamps that run backwards in one file are what a clock stepped back writes: the commits'
        # stamps, read before the prepare's, say nothing of its age (watch.view.STEP_BACK_S).
        assert "open prepare stuck >=0.0 s" in out and "STALLED" not in out, out
    else:
        assert out.count("STALLED") == 1 and "open prepare stuck" in out, out
    assert "last: c0 commit ok 10 ms | c1 commit ok 10 ms | c2 commit ok 10 ms" in out, out


@pytest.mark.parametrize("spec", ["file", "folder"])
@pytest.mark.parametrize("mode", ["create", "copytruncate"])
def test_a_dateext_rotation_loses_nothing_and_reads_nothing_twice(
    tmp_path: Path, spec: str, mode: str
) -> None:
    """logrotate's ``dateext`` (``env.jsonl-20261203``), by renaming (``create``) or by copying then
    truncating: a commit's end and the next commit's start written after the last read are read
    once, in the order written, and the next commit's end in the new file after them. Was: by the
    file, the copy went unseen and those two events were lost (c1 shown open for ever); by the
    folder, the new file was read before the renamed one's end, so c2's end came before its start
    and c2 was shown open for ever."""
    log = tmp_path / "env.jsonl"
    follower = LogFollower([str(log) if spec == "file" else str(tmp_path)])
    sink = JsonLinesSink(log)
    sink.handle([_started(1, "commit", "c1")])
    sink.close()
    view = FleetView([], stall_after=30.0)
    assert "open commit c1" in _shown(view, follower.read())
    sink = JsonLinesSink(log)
    sink.handle([_finished(1, "commit", "c1"), _started(2, "commit", "c2")])
    sink.close()
    rotated = tmp_path / "env.jsonl-20261203"
    if mode == "create":
        log.rename(rotated)
    else:
        shutil.copyfile(log, rotated)
        with open(log, "r+b") as file:
            file.truncate(0)
    sink = JsonLinesSink(log)
    sink.handle([_finished(2, "commit", "c2")])
    sink.close()
    events = follower.read()
    assert [(type(e).__name__, e.checkpoint_id) for e in events] == [
        ("OperationFinished", "c1"),
        ("OperationStarted", "c2"),
        ("OperationFinished", "c2"),
    ]
    text = _shown(view, events)
    assert "open" not in text and "STALLED" not in text, text
    assert follower.read() == []
    follower.close()


def test_gzipped_rotations_are_folded_once_and_never_read_as_corrupt(tmp_path: Path) -> None:
    """``compress`` with ``delaycompress``: the first read folds a gzipped rotation whole (a commit
    started there ends in the log); later, the rotation read so far turns into a ``.gz`` copy of
    itself, which is left alone (was: read as raw bytes, "corrupt line(s) skipped")."""
    import gzip

    older = tmp_path / "env.jsonl-20261202.gz"
    plain = io.BytesIO()
    JsonLinesSink(plain).handle([_started(1, "commit", "c1")])
    older.write_bytes(gzip.compress(plain.getvalue()))
    newest = tmp_path / "env.jsonl-20261203"
    sink = JsonLinesSink(newest)
    sink.handle([_finished(1, "commit", "c1"), _started(2, "commit", "c2")])
    sink.close()
    log = tmp_path / "env.jsonl"
    sink = JsonLinesSink(log)
    sink.handle([_finished(2, "commit", "c2")])
    sink.close()
    for spec in (str(log), str(tmp_path)):
        follower = LogFollower([spec])
        view = FleetView([], stall_after=30.0)
        text = _shown(view, follower.read())
        assert "open" not in text and "c1 commit ok" in text and "c2 commit ok" in text, (spec, text)
        newest.with_name(newest.name + ".gz").write_bytes(gzip.compress(newest.read_bytes()))
        newest.rename(tmp_path / "moved-away")  # the name gone, as delaycompress deletes it
        assert follower.read() == []
        assert not any("corrupt" in note for note in follower.notes.values()), follower.notes
        (tmp_path / "moved-away").rename(newest)
        newest.with_name(newest.name + ".gz").unlink()
        follower.close()


def test_a_name_that_only_ends_like_a_date_is_not_a_rotation_of_the_followed_log(tmp_path: Path) -> None:
    """Following ``env.jsonl``: ``env.jsonl-2026-notes``, ``env.jsonl-20261399`` and
    ``other.jsonl-20261203`` are not its rotations, so their open commits are not shown;
    ``env.jsonl.20261203`` (a ``.%Y%m%d`` dateformat) is, and its open commit is."""
    log = tmp_path / "env.jsonl"
    JsonLinesSink(log).close()
    for n, name in enumerate(["env.jsonl-2026-notes", "env.jsonl-20261399", "other.jsonl-20261203"]):
        sink = JsonLinesSink(tmp_path / name)
        sink.handle([_started(10 + n, "commit", f"not-{n}")])
        sink.close()
    sink = JsonLinesSink(tmp_path / "env.jsonl.20261203")
    sink.handle([_started(1, "commit", "c1")])
    sink.close()
    follower = LogFollower([str(log)])
    text = _shown(FleetView([], stall_after=30.0), follower.read())
    assert "open commit c1" in text and "not-" not in text, text
    follower.close()


def test_what_the_backlog_left_out_is_said_for_as_long_as_it_is_watched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spans the backlog could not keep (past ``MAX_OPEN``) were said in a note on the first
    frame only, a second later gone: the view's '+N' open counted them out without a word."""
    from ckpt_events.participants.cli.watch import backlog

    # The backlog keeps at most its MAX_OPEN, and its note names the same figure.
    monkeypatch.setattr(backlog, "MAX_OPEN", 10)
    log = tmp_path / "env.jsonl"
    sink = JsonLinesSink(log)
    sink.handle([_started(span, "commit", f"c{span}") for span in range(15)])
    sink.close()
    with LogFollower([str(log)]) as follower:
        assert len(follower.read()) == 10
        first = dict(follower.notes)
        assert first == {"(backlog)": "backlog: 5 open span(s) past 10 not shown"}
        sink = JsonLinesSink(log)
        sink.handle([_finished(0, "commit", "c0")])
        sink.close()
        assert len(follower.read()) == 1
        assert follower.notes == first
        assert follower.read() == [] and follower.notes == first


def test_corrupt_lines_are_counted_over_every_chunk_of_a_read(tmp_path: Path) -> None:
    """A read of a log past ``MAX_READ`` decodes it chunk by chunk: its note counts the corrupt
    lines of every chunk (was: the last chunk's own count, "1 corrupt line(s)" for 4)."""
    one = tmp_path / "one.jsonl"
    sink = JsonLinesSink(one)
    sink.handle([_finished(1, "commit", "c1")])
    sink.close()
    line = one.read_bytes().splitlines(keepends=True)[-1]
    log = tmp_path / "env.jsonl"
    with open(log, "wb") as file:
        file.write(b"torn\ngarbage\n\x00\x01\n")
        file.write(line * (MAX_READ // len(line) + 1))
        file.write(b"garbage\n")
    with LogFollower([str(log)], budget=None) as follower:
        follower.read()
        assert follower.notes == {str(log): f"{log}: 4 corrupt line(s) skipped"}


def test_once_reads_a_last_line_with_no_newline_or_counts_it_corrupt(tmp_path: Path) -> None:
    """``--once`` (``budget=None``) reads no further, so a last line with no newline is read as a
    line, as ``report`` reads it (was: held unread, and its commit shown as open work), and a torn
    one is counted corrupt (was: unsaid)."""
    log = tmp_path / "env.jsonl"
    sink = JsonLinesSink(log)
    sink.handle([_started(1, "commit", "c1"), _finished(1, "commit", "c1")])
    sink.close()
    log.write_bytes(log.read_bytes().removesuffix(b"\n"))
    with LogFollower([str(log)], budget=None) as follower:
        events = follower.read()
        assert follower.notes == {}
    view = FleetView([], stall_after=30.0)
    text = _shown(view, events)
    assert "c1 commit ok" in text and "open commit" not in text, text
    torn = tmp_path / "torn.jsonl"
    torn.write_bytes(log.read_bytes()[:-20])
    with LogFollower([str(torn)], budget=None) as follower:
        follower.read()
        assert follower.notes == {str(torn): f"{torn}: 1 corrupt line(s) skipped"}


def test_an_event_of_a_type_this_version_does_not_know_is_not_called_corrupt(tmp_path: Path) -> None:
    """A fleet being upgraded: a newer server writes an event type this version does not know.
    ``watch`` skips it as ``report`` does, saying so (was: "corrupt line(s)", as if the log were
    damaged), and counts real damage apart, in a plain read and in a gzipped log's."""
    log = tmp_path / "env.jsonl"
    sink = JsonLinesSink(log)
    sink.handle([_finished(1, "commit", "c1")])
    sink.close()
    newer = b'{"type":"quota_exceeded","kind":"environment","instance":"env-0","time_ns":1}\n'
    log.write_bytes(log.read_bytes() + newer + b"garbage\n" + newer)
    said = "1 corrupt line(s) skipped; 2 event(s) of a type this version does not know skipped"
    with LogFollower([str(log)], budget=None) as follower:
        events = follower.read()
        assert len(events) == 1
        assert follower.notes[str(log)].startswith(f"{log}: {said}")
    zipped = tmp_path / "old.jsonl.gz"
    zipped.write_bytes(gzip.compress(log.read_bytes()))
    with LogFollower([str(zipped)], budget=None) as follower:
        assert len(follower.read()) == 1
        assert follower.notes[str(zipped)].startswith(f"{zipped}: {said}")


def test_an_event_holding_a_value_this_version_does_not_know_is_not_called_corrupt(tmp_path: Path) -> None:
    """A newer server writes a known event type with a value this version lacks ("operation":
    "snapshot"): ``watch`` skips it as ``report`` does, counted by field and value (was: "corrupt
    line(s)", as if the log were damaged), real damage counted apart, in a plain read and in a
    gzipped log's whole read."""
    log = tmp_path / "env.jsonl"
    sink = JsonLinesSink(log)
    sink.handle([_finished(1, "commit", "c1"), _finished(2, "commit", "c1")])
    sink.close()
    good, second = log.read_bytes().splitlines(keepends=True)
    newer = second.replace(b'"operation":"commit"', b'"operation":"snapshot"')
    coded = second.replace(b'"outcome":"ok"', b'"outcome":"partial"')
    log.write_bytes(good + newer + b"garbage\n" + newer + coded)
    said = (
        "1 corrupt line(s) skipped; 3 event(s) with a value this version does not know skipped "
        "('operation' 'snapshot' 2, 'outcome' 'partial' 1; written by another version of ckpt-events?)"
    )
    with LogFollower([str(log)], budget=None) as follower:
        assert len(follower.read()) == 1
        assert follower.notes[str(log)] == f"{log}: {said}"
    zipped = tmp_path / "old.jsonl.gz"
    zipped.write_bytes(gzip.compress(log.read_bytes()))
    with LogFollower([str(zipped)], budget=None) as follower:
        assert len(follower.read()) == 1
        assert follower.notes[str(zipped)] == f"{zipped}: {said}"


def test_a_backlog_past_max_finished_folds_in_linear_time() -> None:
    """Past ``MAX_FINISHED`` finished spans, each one more (forgetting the oldest) costs about
    what the first ones did: forgetting walked past every span forgotten before it (8.5 s for
    the second 200,000 here, against 0.3 s for the first; 169 s for a 794 MB log)."""
    spans = [_finished(n, "commit", f"c{n}", at=T0 + n) for n in range(1, 2 * MAX_FINISHED + 1)]
    backlog = Backlog()
    started = time.monotonic()
    backlog.add_all(spans[:MAX_FINISHED])
    first = time.monotonic() - started
    started = time.monotonic()
    backlog.add_all(spans[MAX_FINISHED:])
    second = time.monotonic() - started
    assert second < 4 * first + 0.5, (first, second)
    # The forgotten half is forgotten: a start older than the last forgotten end is unknown.
    backlog.add_all([_started(2 * MAX_FINISHED + 1, "commit", "late", at=T0 + MAX_FINISHED // 2)])
    assert backlog.unknown == 1


def test_a_file_per_worker_read_one_after_the_other_is_no_clock_step(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Two workers of environment-0, a log each (``jsonl_path=f"events.{os.getpid()}.jsonl"``),
    followed by their folder with ``--interval 3``: each read took the first file's 3 s of lines,
    then the second's, 3 s back, which ran on a second without coming back: a clock stepped back,
    so worker A's commit, hung a minute, was of unknown age for ever. Merged by stamp, it is
    STALLED."""
    first, second = (JsonLinesSink(tmp_path / f"events.{pid}.jsonl") for pid in (101, 102))
    request.addfinalizer(first.close)
    request.addfinalizer(second.close)
    follower = LogFollower([str(tmp_path)])
    request.addfinalizer(follower.close)
    view = FleetView([], stall_after=30.0)
    first.handle([_started(1, "commit", "hung")])
    view.add_events(follower.read(), (T0 + NS) / NS)  # the backlog
    spans = iter(range(100, 1000))
    # 3 s of both workers' work, every 0.1 s, between two reads.
    for at in range(T0 + 57 * NS, T0 + 60 * NS, NS // 10):
        first.handle([_finished(next(spans), "renew", "c1", at)])
        second.handle([_finished(next(spans), "renew", "c2", at + NS // 20)])
    text = _shown(view, follower.read())
    assert re.search(r"open commit hung >=\d+\.\d s STALLED", text), text


def test_a_backlog_of_a_file_per_worker_is_no_clock_step(tmp_path: Path) -> None:
    """The same two workers' logs folded whole (``--once``): worker B's commit, hung a minute, is
    read after worker A's later work (its file comes second), which went back a minute: it was
    ">=0.0 s" and A's own hung commit "age unknown (clock stepped back?)". Each is STALLED."""
    newer, older = (JsonLinesSink(tmp_path / f"events.{pid}.jsonl") for pid in (101, 102))
    older.handle([_started(1, "commit", "hung-b")])
    newer.handle([_started(2, "commit", "hung-a", T0 + 20 * NS)])
    newer.handle([_finished(span, "renew", "c1", T0 + span * NS) for span in range(50, 60)])
    newer.close()
    older.close()
    view = FleetView([], stall_after=30.0)
    with LogFollower([str(tmp_path)], budget=None) as follower:
        text = _shown(view, follower.read())
    assert re.search(r"open commit hung-b >=59\.\d s STALLED", text), text
    assert re.search(r"open commit hung-a >=39\.\d s STALLED", text), text


def _write(path: Path, *events: Event) -> None:
    """``events`` as a sink writes them, gzipped when ``path`` ends in ``.gz`` (logrotate's
    ``compress``)."""
    out = io.BytesIO()
    JsonLinesSink(out).handle(list(events))
    path.write_bytes(gzip.compress(out.getvalue()) if path.suffix == ".gz" else out.getvalue())


async def _snapshot_a_minute_on(specs: list[str], *, once: bool) -> tuple[str, dict[str, str]]:
    """What ``watch`` (``--once``, or live) shows of ``specs`` a minute after it read them: the
    view, and the follower's notes."""
    from ckpt_events.participants.cli.watch.command import snapshot

    view = FleetView([], stall_after=30.0)
    with LogFollower(specs, budget=None if once else MAX_READ) as follower:
        await snapshot(view, None, follower, 1.0)
        await snapshot(view, None, follower, 1.0)  # a live watch's next round reads nothing new
        notes = dict(follower.notes)
    out = Console(width=300, record=True, color_system=None, file=io.StringIO())
    out.print(view.render(time.time() + 60))
    return out.export_text(), notes


@pytest.mark.parametrize("once", [True, False])
@pytest.mark.parametrize(
    "given",
    [
        ["env.jsonl.1"],
        ["env.jsonl.3", "env.jsonl.1"],
        ["env.jsonl.1", "env.jsonl.3"],
        ["env.jsonl.*"],
        ["env.jsonl.1.gz"],
    ],
)
async def test_work_open_at_the_end_of_a_rotated_file_given_alone_is_of_unknown_age(
    tmp_path: Path, given: list[str], once: bool
) -> None:
    """A rotated file (or several) given without the log it rotated from: the commit open at its
    end finished in that log, not given. Was: shown open, aged from when the backlog was read, and
    STALLED 30 s on, or at once with a stall report there. Its age is unknown, never stalled, and
    one note names the file to add."""
    newest = sorted(given, key=oldest_first)[-1]  # the file the commit started in
    _write(tmp_path / "env.jsonl.3", _started(3, "prepare", "c0"), _finished(3, "prepare", "c0"))
    # StallWatch's report, in the same file: as stale as the age (the commit ended after it).
    stall = Stalled(kind="environment", instance="environment-0", time_ns=T0 + 40 * NS, operation="commit",
                    age_s=40.0, checkpoint_id="c1")  # fmt: skip
    _write(tmp_path / newest.replace("*", "1"), _started(1, "commit", "c1"), stall)
    _write(tmp_path / "env.jsonl", _finished(1, "commit", "c1"))
    text, notes = await _snapshot_a_minute_on([str(tmp_path / name) for name in given], once=once)
    assert "STALLED" not in text, text
    backup = str(tmp_path / newest.replace("*", "1"))
    assert f"open commit c1 age unknown (read from {backup}, a rotated file" in text, text
    log = tmp_path / "env.jsonl"
    assert notes == {
        backup: f"{backup}: the newest file given of {log}, and a rotated one: work open at its end may have "
        f"finished in a newer file, so its age is unknown (add {log} to --follow)"
    }
    log.unlink()  # the log it rotated from is not here: the note says so, not to add it
    text, notes = await _snapshot_a_minute_on([str(tmp_path / name) for name in given], once=once)
    assert "STALLED" not in text and "age unknown" in text, text
    assert notes[backup].endswith(f"({log}, which it rotated from, is not here)"), notes


@pytest.mark.parametrize("once", [True, False])
async def test_a_rotated_file_given_with_its_log_ages_its_open_work_as_before(
    tmp_path: Path, once: bool
) -> None:
    """The normal case is unchanged: with the log given too (by name or folder), a commit that ended
    there is finished, and one still open is aged and STALLED past ``stall_after``, with no note."""
    _write(tmp_path / "env.jsonl.2.gz", _started(3, "prepare", "c0"))
    _write(tmp_path / "env.jsonl.1", _finished(3, "prepare", "c0"), _started(1, "commit", "c1"))
    _write(tmp_path / "env.jsonl", _finished(1, "commit", "c1"), _started(2, "commit", "c2"))
    for given in (["env.jsonl"], ["env.jsonl.1", "env.jsonl"], ["."]):
        text, notes = await _snapshot_a_minute_on([str(tmp_path / name) for name in given], once=once)
        assert notes == {} and "open commit c1" not in text, (given, text)
        assert re.search(r"open commit c2 >=6\d\.\d s STALLED", text), (given, text)
