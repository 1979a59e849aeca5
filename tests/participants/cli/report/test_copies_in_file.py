"""A log repeated in one file: each span event counts once, and the copies are said per file."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_events.participants.cli.main import main

DEMO_STALL = Path(__file__).parent / "data" / "demo-fault-stall-checkpoint.jsonl"
#: The demo's counted events (no id): a copy of one in its own file is kept, and said.
_COUNTED = (b'"type":"stalled"', b'"type":"prepare_not_ready"')


def _spans_only() -> list[bytes]:
    """The demo's log without its counted events: span events alone, each with an identity."""
    lines = DEMO_STALL.read_bytes().splitlines(keepends=True)
    return [line for line in lines if not any(tag in line for tag in _COUNTED)]


def _report(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, list[str]]:
    """The report of ``path``, and its problem lines."""
    assert main(["report", str(path)]) == 0
    out, err = capsys.readouterr()
    return out, err.splitlines()


def _copies_line(path: Path, copies: int) -> str:
    return (
        f"{path}: dropped {copies:,} copies of span events read earlier in the same file (same type, "
        "trace, span and process: the log joined to itself, or written twice?): each counts once"
    )


def test_adjacent_copies_count_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each line written twice (in time order): the single log's report, and one line for the copies."""
    lines = _spans_only()
    single, doubled = tmp_path / "single.jsonl", tmp_path / "doubled.jsonl"
    single.write_bytes(b"".join(lines))
    doubled.write_bytes(b"".join(line + line for line in lines))
    alone = _report(single, capsys)
    twice = _report(doubled, capsys)
    # Before: prepare read 3,778.2 ms (two copies summed), each span drawn twice, no line said.
    assert twice == (alone[0], [*alone[1], _copies_line(doubled, len(lines))])


def test_file_appended_to_itself_counts_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The whole log appended to itself twice (back in time): the single log's report, the
    file said out of order and sorted, and one line for the copies."""
    log = b"".join(_spans_only())
    single, thrice = tmp_path / "single.jsonl", tmp_path / "thrice.jsonl"
    single.write_bytes(log)
    thrice.write_bytes(log * 3)
    alone, said = _report(single, capsys)
    out, problems = _report(thrice, capsys)
    assert out == alone and said == []
    assert len(problems) == 2, problems
    assert problems[0].startswith(f"{thrice}: out of time order (")
    assert problems[0].endswith("its events were sorted by time")
    assert problems[1] == _copies_line(thrice, 2 * len(_spans_only()))


def test_counted_copies_are_kept_and_said(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A counted event has no id: its copy in its own file is kept (a repeat looks the same), and said."""
    doubled = tmp_path / "doubled.jsonl"
    doubled.write_bytes(b"".join(line + line for line in DEMO_STALL.read_bytes().splitlines(keepends=True)))
    _, problems = _report(doubled, capsys)
    assert problems == [
        _copies_line(doubled, len(_spans_only()))
        + (
            "; 3 counted events equal in every field to one before it kept (with no id, a copy "
            "cannot be told from a repeat: their counts may be too high)"
        )
    ]


def test_copies_in_file_and_across_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The log three times in one file beside it once in another (the ``exact`` read): each
    span event once, the copies in the file and across files each said."""
    log = b"".join(_spans_only())
    single, thrice = tmp_path / "single.jsonl", tmp_path / "thrice.jsonl"
    (tmp_path / "again").mkdir()
    other = tmp_path / "again" / "single.jsonl"
    single.write_bytes(log)
    other.write_bytes(log)
    thrice.write_bytes(log * 3)
    alone, _ = _report(single, capsys)
    assert main(["report", str(thrice), str(other)]) == 0
    out, err = capsys.readouterr()
    assert out == alone.replace("(1 log file)", "(2 log files)", 1)
    spans = len(_spans_only())
    assert f"dropped {spans} duplicate events: the same event in two files" in err
    assert _copies_line(thrice, 2 * spans) in err.splitlines()
