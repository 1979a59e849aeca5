"""read_events (``ckpt_events.sinks.jsonl._reader``): corrupt lines reported with their numbers and
skipped, numbering across read blocks, and a line past ``max_line`` skipped as one corrupt line,
in linear time and bounded memory (issue 29: a 64 MB line took 24.5 s, quadratic in the line's
length)."""

from __future__ import annotations

import gzip
import io
import sys
import time
import tracemalloc
from pathlib import Path

import msgspec
import pytest

from ckpt_events import CheckpointEvent, InvalidArgumentError
from ckpt_events.sinks.jsonl import MAX_LINE, CorruptLine, read_events

GOOD = b'{"type":"refused","kind":"agent","instance":"a%d","time_ns":%d,"code":"unauthorized"}\n'


def _log(path: Path, long_line: int, *, good: int = 100) -> Path:
    """``good`` lines, one event's line of ``long_line`` bytes, then ``good`` lines again."""
    with open(path, "wb") as file:
        file.write(b"".join(GOOD % (n, n) for n in range(good)))
        prefix, suffix = (
            b'{"type":"refused","kind":"agent","instance":"',
            b'","time_ns":1,"code":"unauthorized"}',
        )
        file.write(prefix + b"x" * (long_line - len(prefix) - len(suffix)) + suffix + b"\n")
        file.write(b"".join(GOOD % (n, n) for n in range(good, 2 * good)))
    return path


def test_a_line_past_the_bound_is_one_corrupt_line_and_the_rest_reads(tmp_path: Path) -> None:
    """A 3 MiB line: its number, its length and the bound in the error, the first bytes as the
    excerpt; the lines around it decode with their own numbers."""
    path = _log(tmp_path / "e.jsonl", 3 << 20)
    results = list(read_events(path))
    assert [n for n, _ in results] == list(range(1, 202))
    corrupt = [item for _, item in results if isinstance(item, CorruptLine)]
    assert [c.line for c in corrupt] == [101]
    assert corrupt[0].error == f"line of {3 << 20:,} bytes, longer than the {MAX_LINE:,}-byte bound"
    assert corrupt[0].excerpt == ('{"type":"refused","kind":"agent","instance":"' + "x" * 120)[:120]
    assert results[-1][1].time_ns == 199  # type: ignore[union-attr]


@pytest.mark.parametrize("length", [MAX_LINE - 1, MAX_LINE, MAX_LINE + 1])
def test_the_bound_is_the_line_without_its_newline(tmp_path: Path, length: int) -> None:
    """A line of exactly ``max_line`` bytes decodes; one byte more is corrupt."""
    path = _log(tmp_path / "e.jsonl", length, good=1)
    kinds = [isinstance(item, CorruptLine) for _, item in read_events(path)]
    assert kinds == [False, length > MAX_LINE, False]


def test_max_line_raises_or_lowers_the_bound() -> None:
    """A caller may read longer lines, or refuse shorter ones, whatever the block size;
    a last line without its newline is judged the same way."""
    data = (
        GOOD % (0, 0)
        + b'{"type":"refused","kind":"agent","instance":"'
        + b"y" * 70_000
        + b'","time_ns":1,"code":"unauthorized"}'
    )
    assert not any(
        isinstance(item, CorruptLine) for _, item in read_events(io.BytesIO(data), max_line=80_000)
    )
    lowered = [item for _, item in read_events(io.BytesIO(data), max_line=50)]
    assert all(isinstance(item, CorruptLine) for item in lowered) and len(lowered) == 2


def test_bad_max_line_is_refused() -> None:
    """max_line is a positive int."""
    for bad in (0, -1, 1.5, True, "1"):
        with pytest.raises(InvalidArgumentError):
            list(read_events(io.BytesIO(b""), max_line=bad))  # type: ignore[arg-type]


@pytest.mark.slow
def test_a_64_mb_line_is_skipped_in_linear_time_and_bounded_memory(tmp_path: Path) -> None:
    """8 MB and 64 MB lines: the 64 MB one costs about 8x the 8 MB one (quadratic was 64x,
    24.5 s), and reading it holds about one bound of memory, not the line."""
    taken = {}
    for megabytes in (8, 64):
        path = _log(tmp_path / f"e{megabytes}.jsonl", megabytes << 20)
        best = float("inf")
        for _ in range(3):
            began = time.perf_counter()
            corrupt = sum(isinstance(item, CorruptLine) for _, item in read_events(path))
            best = min(best, time.perf_counter() - began)
        assert corrupt == 1
        taken[megabytes] = best
    print(f"8 MB line: {taken[8] * 1e3:.1f} ms, 64 MB line: {taken[64] * 1e3:.1f} ms")
    assert taken[64] < 2.0
    assert taken[64] < 24 * taken[8] + 0.1  # linear: 8x, with room for noise
    tracemalloc.start()
    try:
        for _ in read_events(path):
            pass
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * MAX_LINE


def test_corrupt_lines_are_reported_with_line_numbers_and_skipped(tmp_path: Path) -> None:
    """Garbage, a wrong type tag and a truncated last line are reported; good lines still decode."""
    good = msgspec.json.encode(
        msgspec.json.decode(
            b'{"type":"refused","kind":"agent","instance":"a0","time_ns":1,"code":"unauthorized"}',
            type=CheckpointEvent,
        )
    )
    path = tmp_path / "e.jsonl"
    path.write_bytes(b"\n".join([good, b"not json", b"", good, b'{"type":"nope","kind":"agent"}', good[:20]]))
    results = list(read_events(path))
    assert [n for n, _ in results] == [1, 2, 4, 5, 6]
    corrupt = [item for _, item in results if isinstance(item, CorruptLine)]
    assert [c.line for c in corrupt] == [2, 5, 6]
    assert all(c.error for c in corrupt)
    assert sum(1 for _, item in results if not isinstance(item, CorruptLine)) == 2
    assert len(list(read_events(io.BytesIO(path.read_bytes())))) == 5


def test_runs_past_a_megabyte_keep_line_numbers_and_find_the_corrupt_line(tmp_path: Path) -> None:
    """Lines spread over several read blocks (one longer than a block), with a blank and a
    corrupt line deep in the file: every line is numbered as in the file, the corrupt one named."""
    path = tmp_path / "e.jsonl"
    lines = [b'{"type":"refused","kind":"agent","instance":"a%d","time_ns":%d,"code":"unauthorized"}' % (n, n)
             for n in range(12_000)]  # fmt: skip
    lines[5_000] = b""
    lines[9_000] = b'{"type":"refused","kind":"agent"'
    lines[10_000] = b'{"type":"refused","kind":"agent","instance":"%s","time_ns":1,"code":"unauthorized"}' % (
        b"x" * 900_000)  # fmt: skip
    path.write_bytes(b"\n".join(lines) + b"\n")
    results = list(read_events(path))
    numbers = [n for n, _ in results]
    assert numbers == [n + 1 for n in range(12_000) if n != 5_000]
    corrupt = [item for _, item in results if isinstance(item, CorruptLine)]
    assert [c.line for c in corrupt] == [9_001]
    by_number = dict(results)
    assert by_number[10_001].instance == "x" * 900_000  # type: ignore[union-attr]
    assert by_number[12_000].time_ns == 11_999 and by_number[1].instance == "a0"  # type: ignore[union-attr]


SPAN = (
    b'{"type":"operation_finished","kind":"model","instance":"m0","trace_id":1,"span_id":%d,'
    b'"start_ns":%d,"end_ns":%d,"operation":"commit","received_ns":%s}\n'
)


@pytest.mark.parametrize(
    ("field", "value", "line"),
    [
        ("start_ns", 2**63, SPAN % (2, 2**63, 2**63 + 5, b"null")),
        ("start_ns", 2**64 + 7, SPAN % (2, 2**64 + 7, 2**64 + 9, b"null")),
        ("end_ns", 2**63 + 5, SPAN % (2, 1, 2**63 + 5, b"null")),
        ("received_ns", -1, SPAN % (2, 1, 5, b"-1")),
        ("time_ns", -3, GOOD % (0, -3)),
    ],
)
def test_a_time_outside_0_to_2_63_is_a_corrupt_line_naming_the_field(
    tmp_path: Path, field: str, value: int, line: bytes
) -> None:
    """A stamp no signed 64-bit int holds (``report`` crashed with OverflowError on 2**63, and
    showed a nonsense row for 2**64 + 7) is a ``CorruptLine`` naming its field and value, in a
    run of good lines and alone; the lines around it read."""
    path = tmp_path / "t.jsonl"
    path.write_bytes(SPAN % (1, 1, 2, b"3") + line + GOOD % (9, 2**63 - 1))
    results = list(read_events(path))
    assert [n for n, _ in results] == [1, 2, 3]
    bad = results[1][1]
    assert isinstance(bad, CorruptLine) and bad.line == 2
    assert bad.error == f"Expected `int` >= 0 and < 2**63 (Unix ns), got {value} - at `$.{field}`"
    assert not isinstance(results[0][1], CorruptLine) and not isinstance(results[2][1], CorruptLine)
    path.write_bytes(line)
    assert [type(item) for _, item in read_events(path)] == [CorruptLine]


def test_report_of_a_log_with_a_time_past_2_63_skips_that_line_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``report``: the line is named as corrupt, once, and the rest is reported (was a traceback)."""
    from ckpt_events.participants.cli.main import main

    path = tmp_path / "t.jsonl"
    path.write_bytes(SPAN % (1, 1_000_000, 2_000_000, b"null") + SPAN % (2, 2**63, 2**63 + 5, b"null"))
    assert main(["report", str(path)]) == 0
    err = capsys.readouterr().err
    assert err.startswith(f"{path}:2: corrupt line skipped: Expected `int` >= 0 and < 2**63"), err
    assert "Traceback" not in err


def test_a_gzipped_log_reads_as_the_log_and_damage_is_one_corrupt_line(tmp_path: Path) -> None:
    """A log compressed by logrotate's ``compress`` (``events.jsonl.1.gz``) reads as the log it
    holds: it was one corrupt line ("invalid character") and no event. Cut short, it gives every
    whole line before the cut and then one ``CorruptLine`` naming the damage."""
    plain = _log(tmp_path / "events.jsonl", 10, good=50)
    expected = list(read_events(plain))
    packed = tmp_path / "events.jsonl.1.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert list(read_events(packed)) == expected
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(packed.read_bytes()[: packed.stat().st_size // 2])
    read = list(read_events(cut))
    *lines, (number, damage) = read
    assert isinstance(damage, CorruptLine) and "gzip stream is cut short or damaged" in damage.error
    assert number == lines[-1][0] + 1
    whole = [item for item in lines if not isinstance(item[1], CorruptLine)]
    assert whole == [item for item in expected if not isinstance(item[1], CorruptLine)][: len(whole)]
    assert len(whole) > 10


def test_an_event_of_a_type_this_version_does_not_know_is_said_so() -> None:
    """A fleet's other version wrote a type this one lacks: its line is skipped as an unknown
    type, not as damage (msgspec's own message, "Invalid value 'heartbeat' - at `$.type`", read
    as a corrupt file); a damaged line and one missing its type keep msgspec's message."""
    lines = [
        b'{"type":"heartbeat","kind":"model","instance":"model-0"}',
        b'{"type":"operation_started","kind":',
        b'{"kind":"model"}',
        b'["heartbeat"]',
    ]
    found = [item for _, item in read_events(io.BytesIO(b"\n".join(lines) + b"\n"))]
    assert all(isinstance(item, CorruptLine) for item in found) and len(found) == 4
    errors = [item.error for item in found if isinstance(item, CorruptLine)]
    assert errors[0] == (
        "an event type this version of ckpt-events does not know: 'heartbeat' "
        "(written by another version of the library?)"
    )
    assert "does not know" not in " ".join(errors[1:])
    assert "missing required field `type`" in errors[2]


def test_a_known_event_with_a_value_this_version_does_not_know_is_said_so(tmp_path: Path) -> None:
    """A newer version added a value to a closed vocabulary (an ``operation``, a ``code``, an
    ``outcome``): its line is skipped as such, ``unknown_value`` naming the field and the value
    (was: msgspec's "Invalid enum value 'snapshot' - at `$.operation`", read as damage). With a
    second fault besides (an id of the wrong length, a time out of range) it is damage still."""
    finished = (
        b'{"type":"operation_finished","kind":"model","instance":"m","trace_id":"%s",'
        b'"span_id":"00000000000000aa","start_ns":1,"end_ns":%d,"operation":"%s","outcome":"%s"}'
    )
    lines = [
        b'{"type":"refused","kind":"agent","instance":"a","time_ns":1,"code":"over_quota"}',
        finished % (b"1" * 32, 2, b"snapshot", b"ok"),
        finished % (b"1" * 32, 2, b"commit", b"partial"),
        finished % (b"1" * 32, 2, b"snapshot", b"partial"),  # the first in field order is named
        finished % (b"1" * 31, 2, b"snapshot", b"ok"),  # a trace id one digit short
        finished % (b"1" * 32, 2**63, b"snapshot", b"ok"),  # a time past int64
        b'{"type":"refused","kind":"agent","instance":"a","time_ns":1,"code":7}',  # not a str
        finished % (b"1" * 32, 2, b"commit", b"ok"),
    ]
    log = tmp_path / "newer.jsonl"
    log.write_bytes(b"\n".join(lines) + b"\n")
    found = [item for _, item in read_events(log)]
    assert isinstance(found[-1], CheckpointEvent) and len(found) == len(lines)
    corrupt = [item for item in found[:-1] if isinstance(item, CorruptLine)]
    assert len(corrupt) == len(lines) - 1
    assert [item.unknown_value for item in corrupt] == [
        ("code", "over_quota"),
        ("operation", "snapshot"),
        ("outcome", "partial"),
        ("operation", "snapshot"),
        None,
        None,
        None,
    ]
    assert all(item.unknown_type is None for item in corrupt)
    assert corrupt[1].error == (
        "a value this version of ckpt-events does not know: 'snapshot' at `$.operation` of a "
        "'operation_finished' event (written by another version of the library?)"
    )
    assert "does not know" not in " ".join(item.error for item in corrupt[4:])
    assert "hex digits" in corrupt[4].error and "2**63" in corrupt[5].error


@pytest.mark.parametrize("end", [b"\n", b"\r\n"])
def test_a_utf8_byte_order_mark_is_skipped_and_the_first_event_reads(tmp_path: Path, end: bytes) -> None:
    """A log saved with a UTF-8 BOM (a Windows editor) reads whole, CRLF or not (was: its first
    event a corrupt line, "invalid character")."""
    log = tmp_path / "events.jsonl"
    log.write_bytes(b"\xef\xbb\xbf" + b"".join((GOOD % (n, n)).replace(b"\n", end) for n in range(3)))
    items = [item for _, item in read_events(log)]
    assert not any(isinstance(item, CorruptLine) for item in items), items
    assert [item.instance for item in items] == ["a0", "a1", "a2"]  # type: ignore[union-attr]
    stream = [item for _, item in read_events(io.BytesIO(log.read_bytes()))]
    assert stream == items


def test_a_skipped_end_of_a_span_still_names_the_span_it_ended() -> None:
    """A ``*_finished`` line of another version (a value, or a type, this one does not know)
    is skipped, but ``ended`` names the span it ended (trace id, span id, end): the readers
    close that span instead of showing it open. Not for a started event, nor for ids that do
    not read as ours."""
    span = (
        b'{"type":"%s","kind":"model","instance":"m","trace_id":"%s","span_id":"00000000000000aa",'
        b'"start_ns":1,"end_ns":7,"operation":"commit","outcome":"%s"}'
    )
    lines = [
        span % (b"operation_finished", b"1" * 32, b"cancelled"),  # a newer outcome
        span % (b"snapshot_finished", b"1" * 32, b"ok"),  # a newer *_finished type
        span % (b"snapshot_started", b"1" * 32, b"ok"),  # a newer type, not an end
        span % (b"snapshot_finished", b"1" * 31, b"ok"),  # its trace id not ours
        (span % (b"operation_started", b"1" * 32, b"ok")).replace(b"commit", b"snapshot"),  # no end
    ]
    found = [item for _, item in read_events(io.BytesIO(b"\n".join(lines) + b"\n"))]
    assert all(isinstance(item, CorruptLine) for item in found) and len(found) == len(lines)
    trace = int("1" * 32, 16)
    assert [item.ended for item in found if isinstance(item, CorruptLine)] == [
        (trace, 0xAA, 7),
        (trace, 0xAA, 7),
        None,
        None,
        None,
    ]


_FINISHED_LINE = (
    b'{"type":"operation_finished","kind":"model","instance":"m0","trace_id":"'
    + b"1" * 32
    + b'","span_id":"'
    + b"2" * 16
    + b'","start_ns":1,"end_ns":%d,"operation":"commit"%s}'
)


@pytest.mark.parametrize("blank", [False, True], ids=["whole-runs", "line-by-line"])
def test_fields_a_newer_version_added_are_told_and_the_event_read(blank: bool) -> None:
    """Fields an event's class does not have were dropped without a word; given
    ``on_unknown_fields``, each such line is told (number, type, fields in order) and its
    event still read; a line also damaged otherwise stays a corrupt line, not told."""
    lines = [
        _FINISHED_LINE % (5, b""),
        _FINISHED_LINE % (5, b',"gpu_ms":3,"zone":"a"'),
        _FINISHED_LINE % (2**63, b',"gpu_ms":3'),  # a time out of range besides
        _FINISHED_LINE % (5, b',"gpu_ms":4'),
    ]
    if blank:  # a blank line makes the reader go line by line
        lines.insert(1, b"")
    data = b"\n".join(lines) + b"\n"
    told: list[tuple[int, str, tuple[str, ...]]] = []
    items = list(read_events(io.BytesIO(data), on_unknown_fields=lambda *a: told.append(a)))
    shift = int(blank)
    assert told == [
        (2 + shift, "operation_finished", ("gpu_ms", "zone")),
        (4 + shift, "operation_finished", ("gpu_ms",)),
    ]
    assert [type(item).__name__ for _, item in items] == [
        "OperationFinished",
        "OperationFinished",
        "CorruptLine",
        "OperationFinished",
    ]
    assert [n for n, _ in items] == [1, 2 + shift, 3 + shift, 4 + shift]
    assert items[0][1] == items[1][1] == items[3][1]
    assert list(read_events(io.BytesIO(data))) == items  # without it: the same items, nothing told
    with pytest.raises(InvalidArgumentError, match="on_unknown_fields must be callable"):
        list(read_events(io.BytesIO(data), on_unknown_fields=1))  # type: ignore[arg-type]


def _id_as_before(given: object, digits: int) -> int | None:
    """The id check as it was (a generator over the characters): the reference the fast one
    must agree with, decision for decision."""
    if type(given) is int:
        return given if 0 < given < 1 << (4 * digits) else None
    if isinstance(given, str) and len(given) == digits and all(c in "0123456789abcdef" for c in given):
        return int(given, 16) or None
    return None


_TRICKY_IDS: list[object] = [
    "",
    "0",
    "a",
    "ab" * 8,  # a span id's length
    "ab" * 16,  # a trace id's length
    "ab" * 17,  # too long
    "ab" * 16 + "\n",  # a trailing newline: what ``re.match`` with ``$`` lets through
    "\n" + "ab" * 16,
    "AB" * 16,  # upper case
    "ab" * 15 + "aG",  # not hex
    "0x" + "ab" * 15,  # a prefix int() takes
    "+" + "1" * 31,
    "-" + "1" * 31,
    "1_" * 16,  # underscores int() takes
    " " * 32,
    " " + "1" * 31,
    "1" * 31 + "\t",
    "\u0661" * 32,  # ARABIC-INDIC DIGIT ONE: a digit to str.isdigit and int()
    "\uff11" * 32,  # FULLWIDTH DIGIT ONE
    "\u00e9" * 16,
    "0" * 32,  # the invalid all-zero id
    "0" * 16,
    "f" * 32,
    "f" * 16,
    "0" * 31 + "1",
    0,
    1,
    -1,
    (1 << 64) - 1,
    1 << 64,
    (1 << 128) - 1,
    1 << 128,
    True,
    1.0,
    None,
    ["ab" * 16],
    {"id": 1},
]


@pytest.mark.parametrize("digits", [32, 16], ids=["trace-id", "span-id"])
def test_a_skipped_ends_ids_are_accepted_and_refused_as_before(digits: int) -> None:
    """The fast id check (a compiled regex, was a generator over each character) decides as the
    old one did on every tricky id: empty, too long, not hex, upper case, unicode digits,
    whitespace, a trailing newline, ints out of range, other JSON types."""
    good = {32: "1" * 32, 16: "2" * 16}
    field = "trace_id" if digits == 32 else "span_id"
    lines = []
    expected = []
    for given in _TRICKY_IDS:
        ids = {"trace_id": good[32], "span_id": good[16], field: given}
        lines.append(msgspec.json.encode({"type": "snapshot_finished", **ids, "start_ns": 1, "end_ns": 7}))
        old = _id_as_before(given, digits)
        others = {32: int(good[32], 16), 16: int(good[16], 16), digits: old}
        expected.append(None if old is None else (others[32], others[16], 7))
    found = [item for _, item in read_events(io.BytesIO(b"\n".join(lines) + b"\n"))]
    assert all(isinstance(item, CorruptLine) for item in found) and len(found) == len(lines)
    ended = [item.ended for item in found if isinstance(item, CorruptLine)]
    assert ended == expected
    assert sum(e is not None for e in expected) >= 4  # the accepted ones are tested too


def test_lines_of_a_type_this_version_does_not_know_cost_few_python_calls() -> None:
    """Was: 62 Python calls a line of a newer version's ``*_finished`` type (a generator step per
    character of each id, ``shown``/``reprlib`` for the same reason each line): a log of 98% such
    lines read at 55,000 lines/s; now 8, without repr on the way (115,000 lines/s, same machine
    and load). Python calls counted, not time: the same on any machine."""
    count = 2000
    data = b"".join(
        b'{"type":"snapshot_finished","kind":"model","instance":"m0","trace_id":"%032x",'
        b'"span_id":"%016x","start_ns":%d,"end_ns":%d}\n' % (i, i, i, i + 1)
        for i in range(1, count + 1)
    )
    list(read_events(io.BytesIO(data)))  # the first read builds what is built once
    calls = 0

    def profile(frame: object, event: str, arg: object) -> None:
        nonlocal calls
        calls += event == "call"

    sys.setprofile(profile)
    try:
        items = [item for _, item in read_events(io.BytesIO(data))]
    finally:
        sys.setprofile(None)
    assert [item.ended for item in items if isinstance(item, CorruptLine)] == [
        (i, i, i + 1) for i in range(1, count + 1)
    ]
    assert calls / count < 16, calls / count


def test_each_unknown_type_is_named_in_its_own_line_however_many_there_are() -> None:
    """The reason for an unknown type is kept per type (short types, a bounded number): every
    line still names its own type, past the bound and for a type too long to keep."""
    kinds = [f"newer_{n}" for n in range(300)] + ["x" * 5000, "newer_0", "x" * 5000]
    data = b"".join(msgspec.json.encode({"type": kind, "kind": "model"}) + b"\n" for kind in kinds)
    found = [item for _, item in read_events(io.BytesIO(data))]
    assert [item.unknown_type for item in found if isinstance(item, CorruptLine)] == kinds
    errors = [item.error for item in found if isinstance(item, CorruptLine)]
    assert errors[299] == (
        "an event type this version of ckpt-events does not know: 'newer_299' "
        "(written by another version of the library?)"
    )
    assert errors[300] == errors[302] and "'xxxx" in errors[300] and "(5,000 characters)" in errors[300]


def test_a_newer_versions_log_is_counted_exactly_across_many_runs() -> None:
    """A newer version's log of many 64 KiB runs, most lines with fields this version lacks
    (learned once, then read in one pass), some with others, a few of an unknown type, one run
    damaged: every such line is told once with exactly its fields, every event read."""
    lines: list[bytes] = []
    expected: list[tuple[int, str, tuple[str, ...]]] = []
    unknown_types: list[int] = []
    for i in range(3000):
        number = i + 1
        if i % 700 == 7:  # a few: a run holding one goes line by line
            lines.append(b'{"type":"operation_paused","kind":"model","zone":"a"}')
            unknown_types.append(number)
        elif i % 3 == 0:
            lines.append(_FINISHED_LINE % (5, b',"gpu_ms":%d,"zone":"b"' % i))
            expected.append((number, "operation_finished", ("gpu_ms", "zone")))
        elif i % 7 == 0:
            lines.append(_FINISHED_LINE % (5, b',"node":1'))  # a field met late, on its own
            expected.append((number, "operation_finished", ("node",)))
        elif i == 2000:
            lines.append(_FINISHED_LINE % (5, b',"gpu_ms":1,"gpu_ms":2'))  # twice: told once
            expected.append((number, "operation_finished", ("gpu_ms",)))
        elif i % 5 == 0:
            lines.append(_FINISHED_LINE % (5, b""))  # none
        else:
            lines.append(_FINISHED_LINE % (5, b',"gpu_ms":%d' % i))
            expected.append((number, "operation_finished", ("gpu_ms",)))
    lines[2501] = b"{damaged"  # that run goes line by line
    expected = [t for t in expected if t[0] != 2502]
    data = b"\n".join(lines) + b"\n"
    assert len(data) > 6 * 65536
    told: list[tuple[int, str, tuple[str, ...]]] = []
    items = list(read_events(io.BytesIO(data), on_unknown_fields=lambda *a: told.append(a)))
    assert told == expected
    assert [n for n, _ in items] == list(range(1, 3001))
    corrupt = [item for _, item in items if isinstance(item, CorruptLine)]
    assert [c.line for c in corrupt if c.unknown_type == "operation_paused"] == unknown_types
    assert [c.line for c in corrupt if c.unknown_type is None] == [2502]
    assert sum(not isinstance(item, CorruptLine) for _, item in items) == 3000 - len(unknown_types) - 1
    assert list(read_events(io.BytesIO(data))) == items  # without it: the same items, nothing told


def test_a_line_with_a_newer_field_after_a_blank_line_is_told_once_with_its_number() -> None:
    """A run holding a blank line and a line with a field its class lacks: that line was told
    twice, once under the number it would have without the blank line (2, then 3)."""
    data = _FINISHED_LINE % (5, b"") + b"\n\n" + _FINISHED_LINE % (5, b',"gpu_ms":3') + b"\n"
    told: list[tuple[int, str, tuple[str, ...]]] = []
    items = list(read_events(io.BytesIO(data), on_unknown_fields=lambda *a: told.append(a)))
    assert told == [(3, "operation_finished", ("gpu_ms",))]
    assert [n for n, _ in items] == [1, 3]
