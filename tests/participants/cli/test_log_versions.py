"""Logs kept across an upgrade, and one log shared by a fleet running two versions at once.

``demo-0.2.0-fed5445.jsonl.gz`` (tests/sinks/jsonl/data) was written by commit fed5445 (version
0.2.0, before kinds and steps became the user's names): ``ckpt-events demo --rollouts 12
--concurrency 4 --steps 1 --jsonl ...`` run from that checkout, then gzipped. 130 lines: one
published checkpoint and its restore, 4 refusals.
"""

from __future__ import annotations

import gc
import gzip
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import get_args

import anyio
import pytest

from ckpt_events import CheckpointEvent, PrepareNotReady
from ckpt_events.participants.cli.main import main
from ckpt_events.participants.cli.report.events import UnreadEnd
from ckpt_events.participants.cli.report.fold import ENDED_WAITING, fold_events
from ckpt_events.participants.cli.report.logs import ENDED_KEPT, SHOWN, LogProblems, merged_events
from ckpt_events.participants.cli.watch.follow import ENDED_KEPT as WATCH_ENDED_KEPT
from ckpt_events.participants.cli.watch.follow import LogFollower
from ckpt_events.sinks.replay import replay
from tests.participants.cli.otlp_receiver import otlp_receiver

_FIXTURE = Path(__file__).parents[2] / "sinks" / "jsonl" / "data" / "demo-0.2.0-fed5445.jsonl.gz"
_LINES = 130


def _old_lines() -> list[bytes]:
    lines = gzip.decompress(_FIXTURE.read_bytes()).splitlines(keepends=True)
    assert len(lines) == _LINES
    return lines


def _newer(line: bytes, kind: str) -> bytes:
    """``line`` as an event of a type this version does not know (a newer version's), its
    fields otherwise a well-formed event's."""
    event = json.loads(line)
    event["type"] = kind
    return json.dumps(event).encode() + b"\n"


class _Collect:
    interests = get_args(CheckpointEvent)

    def __init__(self) -> None:
        self.events: list[CheckpointEvent] = []

    def handle(self, batch: list[CheckpointEvent]) -> None:
        self.events.extend(batch)


def test_a_0_2_0_log_reads_in_report_diff_watch_and_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A guard: the old version's log, read by every reader of this one, without a word of
    damage, every line an event."""
    log = tmp_path / "old.jsonl"
    log.write_bytes(b"".join(_old_lines()))
    assert main(["report", str(log)]) == 0
    out, err = capsys.readouterr()
    assert "corrupt" not in err and "not a ckpt-events" not in err, err
    assert "1 checkpoint and restore" not in out and "published" in out and "restored" in out
    assert main(["diff", str(log), str(log)]) == 0
    assert "corrupt" not in capsys.readouterr().err
    assert main(["watch", "--once", "--follow", str(log)]) == 0
    out, err = capsys.readouterr()
    assert "skipped" not in out + err
    assert all(f"{kind}-0" in out for kind in ("environment", "model", "agent", "resources"))
    sink = _Collect()
    result = anyio.run(replay, log, sink)
    assert (result.events, result.corrupt_lines, len(sink.events)) == (_LINES, 0, _LINES)


def test_a_log_opening_with_a_newer_versions_events_is_read_not_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: 16 events of a type this version does not know at a log's head (a newer server
    writing first into the fleet's shared log) made report and diff refuse the whole file as
    "not a ckpt-events JSON-lines log (an event type this version ... does not know ...)", and
    none of its 130 events of known types was read; watch read them."""
    lines = _old_lines()
    log = tmp_path / "upgraded.jsonl"
    log.write_bytes(b"".join([_newer(lines[0], "heartbeat")] * 20 + lines))
    assert main(["report", str(log)]) == 0
    out, err = capsys.readouterr()
    assert "published" in out and "not a ckpt-events" not in err, err
    assert [line for line in err.splitlines() if str(log) in line] == [
        f"{log}: 20 events of a type this version does not know skipped ('heartbeat' 20; "
        "written by another version of ckpt-events?)"
    ]
    assert main(["diff", str(log), str(log)]) == 0
    assert "not a ckpt-events" not in capsys.readouterr().err


def test_a_rolling_upgrades_events_are_one_counted_line_not_corrupt_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: each event of a type this version does not know was said as a "corrupt line
    skipped", the first five by number and the rest counted among real damage. Now damage is
    still named line by line, and a newer version's events are one line per file, counted by
    type; every event of a known type is read."""
    mixed = []
    for n, line in enumerate(_old_lines()):
        mixed += [line, _newer(line, "heartbeat")]
        if n % 3 == 0:
            mixed.append(_newer(line, "resource_sample"))
    mixed.insert(5, b'{"type":"operation_finished","kind":\n')  # damage, said as it was
    log = tmp_path / "mixed.jsonl"
    log.write_bytes(b"".join(mixed))
    assert main(["report", str(log)]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if str(log) in line]
    assert len(err) == 2, err
    assert err[0].startswith(f"{log}:6: corrupt line skipped: ")
    assert err[1] == (
        f"{log}: {_LINES + 44} events of a type this version does not know skipped ('heartbeat' "
        f"{_LINES}, 'resource_sample' 44; written by another version of ckpt-events?)"
    )


def test_many_files_and_types_unknown_are_bounded_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Forty types in each of eight files: the most frequent types named, the others counted,
    and the first SHOWN files said, the others counted in one line."""
    lines = _old_lines()
    for f in range(8):
        newer = [_newer(lines[n % _LINES], f"type{n:02}") for n in range(40)]
        (tmp_path / f"p{f}.jsonl").write_bytes(b"".join(lines[:20] + newer))
    assert main(["report", str(tmp_path)]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if "does not know" in line]
    assert len(err) == SHOWN + 1, err
    assert err[0].endswith(
        "'type00' 1, 'type01' 1, 'type02' 1 and 37 more types; written by another version of ckpt-events?)"
    )
    assert err[-1] == f"... and {8 - SHOWN} more files with events of a type this version does not know"
    # A new type each line (damage, or a hostile file): 64 types kept, the rest counted together.
    hostile = tmp_path / "hostile" / "p.jsonl"
    hostile.parent.mkdir()
    hostile.write_bytes(b"".join(lines[:20] + [_newer(lines[0], f"t{n:03}") for n in range(100)]))
    assert main(["report", str(hostile)]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if "does not know" in line]
    assert err == [
        f"{hostile}: 100 events of a type this version does not know skipped ('t000' 1, 't001' 1, "
        "'t002' 1 and more types; written by another version of ckpt-events?)"
    ]


def _valued(line: bytes, name: str, value: str) -> bytes:
    """``line`` (an event of a known type) with ``name`` set to ``value``, a value of a closed
    vocabulary this version does not know (a newer version's), its fields otherwise well-formed."""
    event = json.loads(line)
    event[name] = value
    return json.dumps(event).encode() + b"\n"


def _with_newer_values(lines: list[bytes]) -> tuple[list[bytes], dict[tuple[str, str], int]]:
    """``lines`` with, after each event of a kind below, its copy holding a newer version's value."""
    newer = {b'"operation_finished"': ("operation", "snapshot"), b'"refused"': ("code", "over_quota")}
    newer[b'"step_finished"'] = ("outcome", "partial")
    out: list[bytes] = []
    counts: dict[tuple[str, str], int] = {}
    for line in lines:
        out.append(line)
        for tag, (name, value) in newer.items():
            if tag in line:
                out.append(_valued(line, name, value))
                counts[name, value] = counts.get((name, value), 0) + 1
    return out, counts


def test_a_newer_versions_values_in_known_events_are_one_counted_line_not_damage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: each event of a known type holding a value a newer version added ("operation":
    "snapshot", a new outcome or code) was a "corrupt line skipped: Invalid enum value 'snapshot'
    - at `$.operation`", counted with real damage, in report, diff and replay, and watch called
    them corrupt lines. Now damage is named line by line as before, and the newer values are
    one line per file counted by field and value; every other event is read."""
    mixed, counts = _with_newer_values(_old_lines())
    assert counts == {("operation", "snapshot"): 28, ("code", "over_quota"): 4, ("outcome", "partial"): 21}
    mixed.insert(5, b'{"type":"operation_finished","kind":\n')  # damage, said as it was
    log = tmp_path / "mixed.jsonl"
    log.write_bytes(b"".join(mixed))
    said = (
        f"{log}: 53 events with a value this version does not know skipped ('operation' 'snapshot' "
        "28, 'outcome' 'partial' 21, 'code' 'over_quota' 4; written by another version of ckpt-events?)"
    )
    for command in (["report", str(log)], ["diff", str(log), str(log)]):
        assert main(command) == 0
        err = [line for line in capsys.readouterr().err.splitlines() if str(log) in line]
        assert err[0].startswith(f"{log}:6: corrupt line skipped: ") and err[1] == said, err
        assert len(err) == 2 * len(command[1:]), err
    assert main(["watch", "--once", "--follow", str(log)]) == 0
    out = capsys.readouterr().out
    flat = " ".join(out.split())  # the terminal's width may wrap the note
    said = f"{log}: 1 corrupt line(s) skipped; 53 event(s) with a value this version does not know"
    assert said in flat, out
    sink = _Collect()
    result = anyio.run(replay, log, sink)
    assert (result.events, len(sink.events), result.corrupt_lines) == (_LINES, _LINES, 54)
    values = [item.unknown_value for item in result.corrupt if item.unknown_value is not None]
    assert len(values) == 53 and {v: values.count(v) for v in values} == counts
    assert [item.line for item in result.corrupt if item.unknown_value is None] == [6]


def test_a_log_opening_with_a_newer_versions_values_is_read_not_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: 16 events holding a newer version's value at a log's head made report, diff and
    replay refuse the whole file as "not a ckpt-events JSON-lines log (Invalid enum value
    'snapshot' - at `$.operation`)", and none of its 130 other events was read."""
    lines = _old_lines()
    first = next(line for line in lines if b'"operation_finished"' in line)
    log = tmp_path / "upgraded.jsonl"
    log.write_bytes(b"".join([_valued(first, "operation", "snapshot")] * 20 + lines))
    for command in (["report", str(log)], ["diff", str(log), str(log)]):
        assert main(command) == 0
        out, err = capsys.readouterr()
        assert "not a ckpt-events" not in err and "corrupt" not in err, err
        assert (
            f"{log}: 20 events with a value this version does not know skipped ('operation' 'snapshot' 20;"
            in err
        )
    with otlp_receiver() as received:
        assert main(["replay", str(log), "--otlp-endpoint", received.url]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"replayed {_LINES} events: ") and "/v1/traces" in received.paths, out
    assert "not a ckpt-events" not in err and "corrupt" not in err, err
    assert f"{log}: 20 events with a value this version does not know skipped" in err


def test_values_unknown_in_a_hostile_file_are_a_bounded_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A new value each line (damage, or a hostile file), and values too long to be a word: the
    first values kept are named, the rest counted together, memory bounded per file."""
    lines = _old_lines()
    first = next(line for line in lines if b'"operation_finished"' in line)
    newer = [_valued(first, "operation", f"v{n:03}") for n in range(100)]
    newer += [_valued(first, "outcome", "x" * 100_000)] * 3
    log = tmp_path / "p.jsonl"
    log.write_bytes(b"".join(lines[:20] + newer))
    assert main(["report", str(log)]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if "does not know" in line]
    assert err == [
        f"{log}: 103 events with a value this version does not know skipped ('operation' 'v000' 1, "
        "'operation' 'v001' 1, 'operation' 'v002' 1 and more values; written by another version of "
        "ckpt-events?)"
    ]


def test_a_log_of_a_newer_versions_events_only_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: a log whose 130 events are all of types a newer version added (an older
    ckpt-events reading a newer fleet's log) ended "holds no checkpoint events (1 file read)",
    as if it were empty. Now the one line says what was skipped and what to do."""
    log = tmp_path / "newer.jsonl"
    log.write_bytes(b"".join(_newer(line, f"x_{json.loads(line)['type']}") for line in _old_lines()))
    assert main(["report", str(log)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == (
        f"ckpt-events report: error: {log} holds no checkpoint events this version of ckpt-events "
        f"reads: {_LINES} events of types or values it does not know skipped (1 file read); read it "
        "with the version that wrote it, or a later one"
    )


def _ends_cancelled(lines: list[bytes], every: int = 5, count: int = 11) -> list[bytes]:
    """``lines`` with ``count`` of its ``*_finished`` events (every ``every``-th) ending with
    the outcome ``cancelled``, a value a newer version could write and this one does not know."""
    out = list(lines)
    finished = [n for n, line in enumerate(lines) if b'_finished"' in line and b'"outcome":"ok"' in line]
    for n in finished[::every][:count]:
        out[n] = lines[n].replace(b'"outcome":"ok"', b'"outcome":"cancelled"')
    assert sum(b"cancelled" in line for line in out) == count
    return out


def test_spans_ended_with_a_newer_outcome_are_ended_not_open_in_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: 11 finished events with an outcome this version does not know ("cancelled") were
    skipped with the spans they ended, so the report said "8 spans never finished (the log ends
    / the process died?)", the critical paths "never finished", and "install ... had not
    finished when the restore ended". Now those spans ended, with an outcome unknown, and why."""
    log = tmp_path / "newer.jsonl"
    log.write_bytes(b"".join(_ends_cancelled(_old_lines())))
    assert main(["report", str(log)]) == 0
    out, err = capsys.readouterr()
    text = " ".join(out.split())
    for false in ("never finished", "open at end of log", "had not finished", "died", "killed"):
        assert false not in text, (false, out)
    assert "published" in out and "restored" in out
    why = (
        "it ended with 'cancelled' at `outcome`, a value this version does not know (written by "
        "a newer version of ckpt-events?)"
    )
    assert f"#1 checkpoint, critical path: unknown (prepare on model/model-0: {why} (and 7 more spans" in text
    assert f"longest read or install unknown: install on resources/resources-0: {why}" in text
    assert f"{log}: 11 events with a value this version does not know skipped" in err


@pytest.mark.parametrize(
    ("old", "new", "why"),
    [
        (
            b'"outcome":"ok"',
            b'"outcome":"cancelled"',
            "it ended with 'cancelled' at `outcome`, a value this version does not know",
        ),
        (
            b'"type":"collection_finished"',
            b'"type":"collection_v2_finished"',
            "it ended with a 'collection_v2_finished' event, a type this version does not know",
        ),
    ],
)
def test_a_checkpoint_whose_end_another_version_wrote_has_an_unknown_outcome_not_open(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], old: bytes, new: bytes, why: str
) -> None:
    """Was: a checkpoint whose root span ended with an event this version cannot read (a newer
    outcome, a newer ``*_finished`` type) was "open at end of log: checkpoint on controller still
    open, 2146.0 ms", and "open" on the run page. Now its outcome is unknown, the row says why,
    and it took 346.0 ms, as its end says (that of a log of this version's)."""
    lines = [
        line.replace(old, new) if b'"collection_finished"' in line and b'"checkpoint"' in line else line
        for line in _old_lines()
    ]
    log = tmp_path / "newer.jsonl"
    log.write_bytes(b"".join(lines))
    page = tmp_path / "run.html"
    assert main(["report", str(log), "--report", str(page)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "open at end of log" not in text and "still open" not in text, text
    assert "1 checkpoint ckpt-20261204T182448-a3f41ae3 18:24:48.498 346.0 304.1 outcome unknown" in text
    html = page.read_text()
    assert "outcome unknown, 346.0 ms" in html and "open at end of log (0)" in html
    assert (
        f"#1 checkpoint outcome unknown: its end was skipped: {why} (written by a newer version of "
        "ckpt-events?)"
    ) in text
    assert "restored" in text


def test_spans_ended_with_a_newer_outcome_are_not_open_in_watch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: watch showed the 4 operations whose end had an outcome this version does not know
    as "open ... age unknown (later work finished since: restarted?)": from its backlog, and
    from lines appended while it follows. Now they ended; the skip note counts them."""
    from ckpt_events.participants.cli.watch.follow import LogFollower
    from ckpt_events.participants.cli.watch.view import FleetView

    lines = _ends_cancelled(_old_lines())
    log = tmp_path / "newer.jsonl"
    log.write_bytes(b"".join(lines))
    assert main(["watch", "--once", "--follow", str(log)]) == 0
    out = capsys.readouterr().out
    assert " open " not in out and "restarted?" not in out, out
    # Flattened: the terminal's width wraps the note where a longer tmp path pushes it.
    assert (
        f"{log}: 11 event(s) with a value this version does not know skipped ('outcome' 'cancelled' 11;"
        in " ".join(out.split())
    ), out
    # Following: each line appended after the first read (the backlog), read live.
    followed = tmp_path / "followed.jsonl"
    followed.write_bytes(b"")
    view = FleetView([])
    with LogFollower([str(followed)], budget=None) as follower:
        view.add_events(follower.read(), ended=follower.ended)
        for line in lines:
            with followed.open("ab") as file:
                file.write(line)
            view.add_events(follower.read(), ended=follower.ended)
    assert all(not seen.open for seen in view.seen.values()), {k: s.open for k, s in view.seen.items()}
    assert len(view.seen) == 5


def test_watch_names_the_types_it_skipped_with_their_counts_as_report_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: watch's note said "174 event(s) of a type this version does not know skipped", no
    type named, where report names the most frequent types with their counts. Now it names
    them too, the others counted together, in a plain read and a gzipped log's."""
    mixed = []
    for n, line in enumerate(_old_lines()):
        mixed += [line, _newer(line, "heartbeat")]
        if n % 3 == 0:
            mixed.append(_newer(line, "resource_sample"))
    mixed += [_newer(mixed[0], f"t{n}") for n in range(3)]
    log = tmp_path / "mixed.jsonl"
    log.write_bytes(b"".join(mixed))
    zipped = tmp_path / "old.jsonl.gz"
    zipped.write_bytes(gzip.compress(log.read_bytes()))
    for path in (log, zipped):
        assert main(["watch", "--once", "--follow", str(path)]) == 0
        out = " ".join(capsys.readouterr().out.split())
        assert (
            f"{path}: {_LINES + 44 + 3} event(s) of a type this version does not know skipped ('heartbeat' "
            f"{_LINES}, 'resource_sample' 44, 't0' 1 and more; written by another version of ckpt-events?)"
        ) in out, out


def test_a_skipped_end_read_before_its_start_in_another_file_still_ends_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The spans' starts in one file, the rest of the log (their ends, some of them skipped as
    another version's) in another: a skipped end may be read before its start is folded (the
    merge reads each file one event ahead), and still ends it when the start comes."""
    lines = _ends_cancelled(_old_lines())
    starts = [line for line in lines if b'_started"' in line]
    (tmp_path / "a.jsonl").write_bytes(b"".join(line for line in lines if line not in starts))
    (tmp_path / "b.jsonl").write_bytes(b"".join(starts))
    assert main(["report", str(tmp_path)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for false in ("never finished", "open at end of log", "had not finished"):
        assert false not in text, (false, text)
    assert (
        "#1 checkpoint, critical path: unknown (prepare on model/model-0: it ended with 'cancelled'" in text
    )


def test_spans_ended_with_a_newer_outcome_are_not_closed_as_truncated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: the 11 spans whose end holds an outcome this version does not know were taken as
    left open by a crash: ``replay`` exported them as truncated spans with status ERROR ("11
    spans left open by a stopped process"), and a process started again on the log
    (``truncated_spans``, as ``serve`` calls it) wrote 11 ``Truncated`` errors its predecessor
    never had. Now they ended: none is closed."""
    from ckpt_events.sinks.jsonl import truncated_spans

    log = tmp_path / "newer.jsonl"
    log.write_bytes(b"".join(_ends_cancelled(_old_lines())))
    assert truncated_spans(log) == []
    sink = _Collect()
    result = anyio.run(replay, log, sink)
    assert (result.truncated, result.events, len(sink.events)) == (0, _LINES - 11, _LINES - 11)
    with otlp_receiver() as received:
        assert main(["replay", str(log), "--otlp-endpoint", received.url]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"replayed {_LINES - 11} events: ") and "/v1/traces" in received.paths, out
    assert "left open" not in out + err and "truncated" not in out + err, out + err


def _with_fields(line: bytes, **fields: object) -> bytes:
    """``line`` with ``fields`` added (a newer version's event of a known type)."""
    return json.dumps({**json.loads(line), **fields}).encode() + b"\n"


def test_a_newer_versions_fields_in_known_events_are_said_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: fields a newer version added to known events ("gpu_ms", "zone") were dropped without
    a word by report, diff, replay and watch; now the events are still read, and one line says
    how many carried which fields, once for all files, bounded when each line names a new one."""
    lines = _old_lines()
    mixed = [_with_fields(line, gpu_ms=n, **({"zone": "a"} if n % 2 else {})) for n, line in enumerate(lines)]
    mixed[3] = _with_fields(lines[3], **{f"f{n:03}": n for n in range(100)})  # a hostile line
    newer, older = tmp_path / "newer.jsonl", tmp_path / "older.jsonl"
    newer.write_bytes(b"".join(mixed))
    older.write_bytes(b"".join(lines))
    said = (
        f"{_LINES} events carried fields this version does not know ('gpu_ms' {_LINES - 1}, 'zone' 64, "
        "'f000' 1 and more fields): read without them (written by a newer version of ckpt-events? "
        "upgrade to read them)"
    )
    for command in (["report", str(newer), str(older)], ["diff", str(older), str(newer)]):
        assert main(command) == 0
        out, err = capsys.readouterr()
        assert "published" in out or command[0] == "diff"
        assert err.splitlines().count(said) == 1, err
        assert "corrupt" not in err, err
    with otlp_receiver() as received:
        assert main(["replay", str(newer), "--otlp-endpoint", received.url]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"replayed {_LINES} events: "), out
    assert said in err.splitlines(), err
    assert main(["watch", "--once", "--follow", str(newer)]) == 0
    flat = " ".join(capsys.readouterr().out.split())  # the terminal's width may wrap the note
    assert all(f"{kind}-0" in flat for kind in ("environment", "model", "agent", "resources")), flat
    assert (
        f"{_LINES} event(s) carried fields this version does not know ('gpu_ms' {_LINES - 1}, 'zone' 64, "
        "'f000' 1 and more): read without them (written by a newer version of ckpt-events? upgrade to "
        "read them)"
    ) in flat, flat


def test_the_librarys_replay_counts_a_newer_versions_fields_in_known_events(tmp_path: Path) -> None:
    """Was: ``sinks.replay`` replayed events holding fields a newer version added without them
    and its result said nothing (``ReplayResult`` had no count; the ``replay`` command says
    them); now ``ReplayResult.unknown_fields`` counts those events, each replayed."""
    lines = _old_lines()
    newer = tmp_path / "newer.jsonl"
    mixed = [_with_fields(line, gpu_ms=n) if n % 3 else line for n, line in enumerate(lines)]
    newer.write_bytes(b"".join(mixed))
    sink = _Collect()
    result = anyio.run(replay, newer, sink)
    carried = sum(1 for n in range(_LINES) if n % 3)
    assert (result.events, result.unknown_fields, result.corrupt_lines) == (_LINES, carried, 0)
    assert len(sink.events) == _LINES
    older = tmp_path / "older.jsonl"
    older.write_bytes(b"".join(lines))
    assert anyio.run(replay, older, _Collect()).unknown_fields == 0


def _newer_end(i: int) -> bytes:
    """The line of a newer version's finished event this version cannot read, ending span ``i``."""
    return (
        b'{"type":"snapshot_finished","kind":"model","instance":"m0","trace_id":"%032x",'
        b'"span_id":"%016x","start_ns":%d,"end_ns":%d}\n' % (i, i, i, i + 1)
    )


def test_spans_ended_by_a_newer_versions_events_are_held_bounded_and_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: every span ended by a line this version cannot read was held until the next event
    it reads (diff and replay: to the end), 1,000,000 such lines 482 MB; now ``ENDED_KEPT`` are
    held, the rest counted exactly, and the report says such a span shown open may have ended."""
    more = 10
    log = tmp_path / "newer.jsonl"
    with log.open("wb") as file:
        for i in range(1, ENDED_KEPT + more + 1):
            file.write(_newer_end(i))
    problems = LogProblems()
    assert list(merged_events([log], problems)) == []
    assert (len(problems.ended), problems.ended_dropped) == (ENDED_KEPT, more)
    assert main(["report", str(log)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert (
        f"{more} more spans than the {ENDED_KEPT:,} held at once ended in lines this version cannot "
        "read, with no event it reads between them: such a span shown open may have ended (read the "
        "logs with the version of ckpt-events that wrote them)"
    ) in err, err


def _ends_feed(ended: dict[tuple[int, int], UnreadEnd], count: int, every: int) -> Iterator[CheckpointEvent]:
    for i in range(1, count + 1):
        ended[(i, i)] = UnreadEnd(i, "it ended with 'cancelled'")
        if i % every == 0:
            yield PrepareNotReady(kind="model", instance="model-0", time_ns=i, blockers=0)


def _fold_ends(count: int, every: int = 1000) -> tuple[float, int]:
    """The fold's CPU time (this thread's: a loaded machine's other processes do not count, as
    wall time did, 0.13 s against 3.5 s in one run) and how many ends it let go. The collector
    is off: a collection landing in one reading would time the heap, not the fold."""
    ended: dict[tuple[int, int], UnreadEnd] = {}
    feed = _ends_feed(ended, count, every)
    gc.disable()
    try:
        began = time.thread_time()
        fold = fold_events(feed, ended)
        took = time.thread_time() - began
    finally:
        gc.enable()
    return took, fold.ended_let_go


def test_ends_waiting_for_their_start_are_let_go_in_constant_time_and_counted() -> None:
    """Was: past ``ENDED_WAITING`` waiting, the oldest was let go with ``del d[next(iter(d))]``,
    which walks past every entry deleted before it: 1,000,000 skipped ends folded in 41 s (a
    1,000,000-line log's report 116 s), now 2.3 s; and the ones let go were not counted.
    Measured: the fold's thread CPU for ``ENDED_WAITING`` ends (none let go) and for four times
    as many, taken in turn three times, the least of each (a busy host only adds time, and a
    stretch of it cannot land on all three of one size, as it did on both back-to-back readings
    of one size in CI: 1.05 s against a bound of 0.97)."""
    small: list[float] = []
    large: list[float] = []
    for _ in range(3):
        took, none = _fold_ends(ENDED_WAITING)
        small.append(took)
        took, let_go = _fold_ends(4 * ENDED_WAITING)
        large.append(took)
        assert (none, let_go) == (0, 3 * ENDED_WAITING)
    first, second = min(small), min(large)
    print(f"fold of {ENDED_WAITING:,} ends: {first:.2f} s, of {4 * ENDED_WAITING:,}: {second:.2f} s")
    assert second < 8 * first + 0.5, (small, large)


def test_spans_ended_before_their_start_let_go_are_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: a skipped end read before its start, let go past ``ENDED_WAITING`` waiting for it,
    was silent, its span shown open if the start came; now counted and said in one line."""
    more = 10
    log = tmp_path / "newer.jsonl"
    with log.open("wb") as file:
        for i in range(1, ENDED_WAITING + more + 1):
            file.write(_newer_end(i))
            if i % 1000 == 0:  # an event this version reads: the fold drains the ends read
                file.write(
                    b'{"type":"prepare_not_ready","kind":"model","instance":"m0","time_ns":%d,"blockers":0}\n'
                    % (i + 1)
                )
    assert main(["report", str(log)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert (
        f"{more} more spans than the {ENDED_WAITING:,} kept waiting ended in lines this version cannot "
        "read before their start was read: such a span shown open may have ended (read the logs with "
        "the version of ckpt-events that wrote them)"
    ) in err, err


def test_spans_ended_by_a_newer_versions_events_are_handed_on_bounded_in_watch(tmp_path: Path) -> None:
    """Was: every span ended by a line this version cannot read, in one read of a followed log,
    was handed on (``LogFollower.ended``: no bound); now ``WATCH_ENDED_KEPT`` a read, the rest counted
    exactly over the watch and said in a lasting note."""
    more = 10
    log = tmp_path / "newer.jsonl"
    log.write_bytes(b"")
    with LogFollower([str(log)], budget=None) as follower:
        assert follower.read() == []  # the backlog: an empty log
        with log.open("ab") as file:
            for i in range(1, WATCH_ENDED_KEPT + more + 1):
                file.write(_newer_end(i))
        assert follower.read() == []
        assert (len(follower.ended), follower.ended_dropped) == (WATCH_ENDED_KEPT, more)
        note = (
            f"{more} more span(s) than the {WATCH_ENDED_KEPT:,} handed on per read ended in lines this "
            "version cannot read: such a span shown open may have ended (read the logs with the version of "
            "ckpt-events that wrote them)"
        )
        assert note in follower.notes.values(), follower.notes
        assert follower.read() == []
        assert (follower.ended, follower.ended_dropped) == ({}, more)
        assert note in follower.notes.values(), follower.notes  # its spans may still show open


def test_a_newer_versions_ends_cost_the_report_few_python_calls_a_line(tmp_path: Path) -> None:
    """Was: 72 Python calls a line of a newer version's ``*_finished`` type read by the report's
    merge (``shown``/``reprlib`` twice a line, in the reader and for the span's reason, and a
    generator step per character of each id; 18 with the reader's fixed): now 14, every span's
    reason still said. Calls counted, not time: the same on any machine."""
    count = 2000
    log = tmp_path / "newer.jsonl"
    log.write_bytes(
        b"".join(
            b'{"type":"snapshot_finished","kind":"model","instance":"m0","trace_id":"%032x",'
            b'"span_id":"%016x","start_ns":%d,"end_ns":%d}\n' % (i, i, i, i + 1)
            for i in range(1, count + 1)
        )
    )
    assert list(merged_events([log], LogProblems())) == []  # the first read builds what is built once
    calls = 0

    def profile(frame: object, event: str, arg: object) -> None:
        nonlocal calls
        calls += event == "call"

    problems = LogProblems()
    sys.setprofile(profile)
    try:
        list(merged_events([log], problems))
    finally:
        sys.setprofile(None)
    assert len(problems.ended) == count
    assert {end.why for end in problems.ended.values()} == {
        "it ended with a 'snapshot_finished' event, a type this version does not know (written by a "
        "newer version of ckpt-events?)"
    }
    assert calls / count < 16, calls / count
