"""Every process's logs in: files, globs and directories merged into one time-ordered stream.

A file is a JSON-lines log of the jsonl sink, or a collector's OTLP JSON file (``sinks.otlp.read_otlp``),
told apart by its first line. A JSON-lines file is judged by its first line that decodes
(within ``PROBE_LINES``), so a torn first line (a cut copy, a crash) costs that line, not the file.

Each file is read lazily and the files are merged by event time (``heapq.merge`` of one
iterator per file), so memory holds one pending event per file, never a whole log; past the
files the process may open at once (its limit raised toward the hard one first), the rest are
each read whole before the merge. Each
process's stamps can be moved by an offset first (``clocks``: its clock proven off its
caller's), so the merge is in the callers' time.

An event read from two files (the same file named twice, a copy in two directories) is kept
once, whatever the order of either file. Its identity (``identity``): for a span event, its
type, trace id, span id and process (kind, instance, worker): a span id is 64 random bits
drawn once per span, and a span writes one ``*Started`` and one ``*Finished`` event (a handle
ends once), so two distinct events never share it: a span event's second copy in the same file
(a log joined to itself, a collector's file written twice) is dropped too, and counted per file
(``LogProblems.copies``). A counted event has no id: only one equal in every field (same
process, same nanosecond, same values) is the same, and within one file such an event is kept
(a coarse clock gives two refusals one stamp): counted only where the file also held span
copies (``LogProblems.equal_kept``), and said there. While every file is in time order, an
event's copy has its stamp, so only events whose stamps collide are compared (nothing kept,
nothing per event). A file that goes
back in time (a clock that stepped back, or a file joined or copied out of order) sets
``LogProblems.disordered`` and is named in ``LogProblems.out_of_order``: read again with
``sort`` naming it, its events are sorted by time (in a window as long as the file went back
at most, ``LogProblems.back_ns``: a clock a little behind another holds a few events; a file
whose processes' clocks are moved, whole) and merged as if each in-order run of it were a file
of its own; read again ``exact``,
the identities of the last ``DEDUP_EVENTS`` events are kept, whatever the order; an event
whose copy could have been forgotten is counted, and said.
"""

from __future__ import annotations

import functools
import heapq
from collections import deque
from collections.abc import Callable, Collection, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, TypeVar

import msgspec

from ckpt_events import CheckpointEvent, SpanEvent
from ckpt_events.checks import shown
from ckpt_events.participants.cli.report.clocks import ClockEvidence, Offsets, process_of, shifted
from ckpt_events.participants.cli.report.events import UnreadEnd, event_time
from ckpt_events.participants.cli.report.log_files import open_files_budget
from ckpt_events.participants.cli.report.runs import RunLinks
from ckpt_events.participants.cli.report.ties import in_tie_order, tie_ordered
from ckpt_events.participants.cli.words import counted
from ckpt_events.sinks.jsonl import CorruptLine
from ckpt_events.sinks.otlp import looks_like_otlp, read_otlp

__all__ = [
    "ENDED_KEPT",
    "LogProblems",
    "event_time",
    "identity",
    "merged_events",
    "nothing_read",
    "read_logs",
]

#: How many problem lines are shown; the rest are counted.
SHOWN = 5
#: A file is a log if an event decodes within its first this many non-blank lines; the corrupt
#: lines before it are skipped and counted. A crash tears one line (a crash loop a few), and
#: prose or binary data is refused after this many lines instead of being read to its end.
PROBE_LINES = 16
#: The spans whose end was a line this version could not read held at once, between two events
#: read (``LogProblems.ended``): ~26 MB at most; the fold drains them at each event.
ENDED_KEPT: Final = 65_536
#: The types of events this version does not know kept apart per file (their names are the
#: file's: a damaged or hostile file could hold a new one each line), and named in its line.
_UNKNOWN_TYPES_KEPT: Final = 64
_UNKNOWN_TYPES_SHOWN: Final = 3
#: A value longer than this is no vocabulary's (a value of ours is a word or two): counted with
#: the values past ``_UNKNOWN_TYPES_KEPT``, not kept.
_UNKNOWN_VALUE_CHARS: Final = 64
#: Identities kept to find an event's copy in another file when a file is out of time order:
#: the last this many events (~20 MB; a clock that stepped back by this many events' time).
DEDUP_EVENTS: Final = 65_536
#: A file whose events go back at most this far (ns) is sorted without a word: clocks of the
#: processes writing it that far apart (each process's own wall-clock offset), not a clock
#: stepped back. Several processes' batches to one file go back further, and are said.
SILENT_BACK_NS: Final = 1_000_000
#: Runs of forgotten stamps told apart; past it, one run holds them all.
_FORGOTTEN_RUNS: Final = 64
#: How a gzip file begins (``read_events`` reads one through, by these bytes, not its name).
_GZIP_MAGIC: Final = b"\x1f\x8b"
#: A merged log's entries: (time, file, line, event); plain tuples merge without a key function.
_Entry = tuple[int, int, int, CheckpointEvent]
T = TypeVar("T")


@dataclass
class LogProblems:
    """What was not a log: files refused whole and lines skipped, each counted with the first
    few kept (a folder of 10,000 non-logs, or 5 MB of noise after one good line, is a few lines)."""

    refused: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    refused_files: int = 0
    #: Of them, the files that could not be read at all (permissions, I/O): not read.
    unreadable: int = 0
    skipped: int = 0
    duplicates: int = 0
    #: Per file, the span events dropped as a second copy of one read earlier in that file.
    copies: dict[str, int] = field(default_factory=dict)
    #: Per file, the counted events (no id) kept though equal in every field to one read earlier
    #: in that file at that stamp: a repeat or a copy, nothing tells; said where ``copies`` is.
    equal_kept: dict[str, int] = field(default_factory=dict)
    #: A file went back in time (a clock that stepped back): its copies need an ``exact`` read.
    disordered: bool = False
    #: The files that went back in time, by their index among the paths read: (name, how many
    #: events were stamped before the one above them).
    out_of_order: dict[int, tuple[str, int]] = field(default_factory=dict)
    #: The same files: how far back in time each went at most (nanoseconds before the latest
    #: event above it). Passed as ``merged_events(sort=...)``, each is sorted in a window that
    #: long, not read whole.
    back_ns: dict[int, int] = field(default_factory=dict)
    #: The same files: how many events went back more than ``SILENT_BACK_NS`` (the ones said).
    far_back: dict[int, int] = field(default_factory=dict)
    #: The files this read sorted by time (``merged_events(sort=...)``).
    sorted_files: frozenset[int] = frozenset()
    #: Events too far out of time order to be checked against the other files.
    unchecked: int = 0
    events: int = 0
    #: The calls and answers seen, and the offsets applied to this read (``merged_events``).
    #: Set one to gather it (the report does; reading for durations alone needs none).
    clocks: ClockEvidence | None = None
    offsets: Offsets = field(default_factory=dict)
    #: Which files hold one run (traces in common) and their times: set one to gather it.
    runs: RunLinks | None = None
    #: Per file, the events of a type this version does not know, by type (the first
    #: ``_UNKNOWN_TYPES_KEPT`` types; the others under ``None``): another version's, not damage.
    unknown: dict[str, dict[str | None, int]] = field(default_factory=dict)
    #: Per file, the events of a type this version knows holding a value of a closed vocabulary
    #: it does not (a newer version's ``operation``, ``outcome``...), by (field, value), bounded
    #: as ``unknown`` is (the others under ``None``): another version's, not damage.
    unknown_values: dict[str, dict[tuple[str, str] | None, int]] = field(default_factory=dict)
    #: The spans whose end was such a skipped event, by (trace id, span id), each with why its
    #: outcome is unknown: filled as the files are read, drained by the fold
    #: (``fold_events(ended=...)``), which then says them ended, never open.
    ended: dict[tuple[int, int], UnreadEnd] = field(default_factory=dict)
    #: Such spans not kept, past ``ENDED_KEPT`` held at once: a span of them whose start is
    #: read may be shown open.
    ended_dropped: int = 0
    #: Events read whole but for fields this version does not know (a newer version's), and
    #: those fields, each with the events that held it (the first ``_UNKNOWN_TYPES_KEPT``
    #: names; the others under ``None``): read, but what those fields said is lost.
    unknown_field_events: int = 0
    unknown_fields: dict[str | None, int] = field(default_factory=dict)

    def refuse(self, line: str) -> None:
        self.refused_files += 1
        if len(self.refused) < SHOWN:
            self.refused.append(line)

    def read_again(self, first: int, index: int, path: str, event: CheckpointEvent) -> bool:
        """Count ``event``, whose identity was read before, first from the file at ``first``,
        now from the one at ``index`` (``path``): whether to drop it. A copy from another file
        is dropped (``duplicates``), and a span event's copy from its own file (``copies``); a
        counted event from its own file is kept (no id tells a copy from a repeat)."""
        if first != index:
            self.duplicates += 1
            return True
        if isinstance(event, SpanEvent):
            self.copies[path] = self.copies.get(path, 0) + 1
            return True
        self.equal_kept[path] = self.equal_kept.get(path, 0) + 1
        return False

    def skip(self, line: str) -> None:
        self.skipped += 1
        if len(self.lines) < SHOWN:
            self.lines.append(line)

    def unknown_type(self, path: Path, kind: str) -> None:
        """Count an event of a type this version does not know, read in ``path``."""
        # A newer version's log has such a line in every few: no dict built per call.
        name = str(path)
        types = self.unknown.get(name)
        if types is None:
            types = self.unknown[name] = {}
        if kind in types:
            types[kind] += 1
            return
        key = kind if len(types) < _UNKNOWN_TYPES_KEPT else None
        types[key] = types.get(key, 0) + 1

    def unknown_value(self, path: Path, name: str, value: str) -> None:
        """Count an event of a known type whose ``name`` holds ``value``, a value this version
        does not know, read in ``path``."""
        values = self.unknown_values.setdefault(str(path), {})
        key: tuple[str, str] | None = (name, value)
        if key not in values and (len(values) >= _UNKNOWN_TYPES_KEPT or len(value) > _UNKNOWN_VALUE_CHARS):
            key = None
        values[key] = values.get(key, 0) + 1

    def end(self, key: tuple[int, int], end: UnreadEnd) -> None:
        """Keep that the span ``key`` ended in a line this version could not read (drained by
        the fold), at most ``ENDED_KEPT`` of them: a file of a million such lines held them all
        until the next event read (482 MB; diff and replay never drain them)."""
        # The newest let go, not the oldest: a dict's first entry deleted again and again is
        # found past the holes left before it (a million such lines took 124 s, not 27).
        if len(self.ended) >= ENDED_KEPT and key not in self.ended:
            self.ended_dropped += 1
            return
        self.ended[key] = end

    def unknown_fields_in(self, number: int, kind: str, names: tuple[str, ...]) -> None:
        """Count an event (of type ``kind``, at line ``number``) read without ``names``, fields
        this version does not know (``read_events(on_unknown_fields=...)``)."""
        self.unknown_field_events += 1
        fields = self.unknown_fields
        for name in names:
            key = (
                name
                if name in fields or (len(fields) < _UNKNOWN_TYPES_KEPT and len(name) <= _UNKNOWN_VALUE_CHARS)
                else None
            )
            fields[key] = fields.get(key, 0) + 1

    def summary(self) -> list[str]:
        """One line per problem shown, and one counting the rest of each kind."""
        out = list(self.refused)
        if self.refused_files > len(self.refused):
            out.append(f"... and {counted(self.refused_files - len(self.refused), 'more file')} refused")
        out += self.lines
        if self.skipped > len(self.lines):
            out.append(f"... and {counted(self.skipped - len(self.lines), 'more line')} skipped")
        # A newer server's events in a fleet being upgraded: one line a file, not a line per
        # event said as damage ("corrupt line skipped"), which also hid the real damage's count.
        out += _per_file(self.unknown, _unknown_line, "with events of a type this version does not know")
        out += _per_file(
            self.unknown_values,
            _unknown_values_line,
            "with events holding a value this version does not know",
        )
        if self.unknown_field_events:
            out.append(_unknown_fields_line(self.unknown_field_events, self.unknown_fields))
        # A file back by a millisecond at most is sorted without a word: processes' clocks that
        # far apart, or a log of ours from before each span's end and start shared one offset
        # to the wall clock, is no clock stepped back and no file joined out of order.
        said = [(index, name) for index, (name, _) in self.out_of_order.items() if index in self.far_back]
        for index, name in said[:SHOWN]:
            how = (
                "its events were sorted by time"
                if index in self.sorted_files
                else "read as written: spans may be paired wrongly"
            )
            out.append(
                f"{name}: out of time order ({counted(self.far_back[index], 'event')} stamped over "
                f"{SILENT_BACK_NS // 1_000_000} ms before a line above it: several processes writing "
                f"one file, a clock that stepped back, or files joined out of order); {how}"
            )
        if len(said) > SHOWN:
            out.append(f"... and {counted(len(said) - SHOWN, 'more file')} out of time order")
        if self.duplicates:
            out.append(
                f"dropped {counted(self.duplicates, 'duplicate event')}: the same event in two "
                "files (same type, trace, span and process) counts once"
            )
        copied = {name: (n, self.equal_kept.get(name, 0)) for name, n in self.copies.items()}
        out += _per_file(copied, _copies_line, "with copies of its own events")
        if self.unchecked:
            out.append(
                f"{counted(self.unchecked, 'event')} out of time order by more than "
                f"{DEDUP_EVENTS:,} events (a clock that stepped back) could not be checked for "
                "a copy in another file: a copy would count twice"
            )
        return out + (self.clocks.lines(self.offsets) if self.clocks is not None else [])


def _per_file(per_file: Mapping[str, T], line: Callable[[str, T], str], what: str) -> list[str]:
    """One ``line`` for each of the first ``SHOWN`` files of ``per_file``, and one counting the rest."""
    out = [line(name, counts) for name, counts in list(per_file.items())[:SHOWN]]
    if len(per_file) > SHOWN:
        out.append(f"... and {counted(len(per_file) - SHOWN, 'more file')} {what}")
    return out


def _copies_line(path: str, counts: tuple[int, int]) -> str:
    """One file's copies of its own events: the span events dropped, the counted events kept."""
    copies, equal = counts
    line = (
        f"{path}: dropped {counted(copies, 'copy', 'copies')} of span events read earlier in the same file "
        "(same type, trace, span and process: the log joined to itself, or written twice?): each counts once"
    )
    if equal:
        line += (
            f"; {counted(equal, 'counted event')} equal in every field to one before it kept (with no id, "
            "a copy cannot be told from a repeat: their counts may be too high)"
        )
    return line


def _unknown_line(path: str, types: dict[str | None, int]) -> str:
    """One file's events of types this version does not know: how many, the most frequent
    types named with their counts, the others counted."""
    named = sorted(((n, kind) for kind, n in types.items() if kind is not None), key=lambda t: (-t[0], t[1]))
    shown_types = ", ".join(f"{shown(kind)} {n:,}" for n, kind in named[:_UNKNOWN_TYPES_SHOWN])
    if None in types:  # the types past _UNKNOWN_TYPES_KEPT, counted together: how many is unknown
        shown_types += " and more types"
    elif len(named) > _UNKNOWN_TYPES_SHOWN:
        shown_types += f" and {counted(len(named) - _UNKNOWN_TYPES_SHOWN, 'more type')}"
    return (
        f"{path}: {counted(sum(types.values()), 'event')} of a type this version does not know "
        f"skipped ({shown_types}; written by another version of ckpt-events?)"
    )


def _unknown_fields_line(events: int, fields: dict[str | None, int]) -> str:
    """Once for all files: how many events held fields this version does not know, the most
    frequent named with their counts, the others counted."""
    named = sorted(((n, name) for name, n in fields.items() if name is not None), key=lambda t: (-t[0], t[1]))
    said = ", ".join(f"{shown(name)} {n:,}" for n, name in named[:_UNKNOWN_TYPES_SHOWN])
    if None in fields:  # past _UNKNOWN_TYPES_KEPT, or too long to be a field's name
        said += (" and " if named else "") + "more fields"
    elif len(named) > _UNKNOWN_TYPES_SHOWN:
        said += f" and {counted(len(named) - _UNKNOWN_TYPES_SHOWN, 'more field')}"
    return (
        f"{counted(events, 'event')} carried fields this version does not know ({said}): read "
        "without them (written by a newer version of ckpt-events? upgrade to read them)"
    )


def _unknown_values_line(path: str, values: dict[tuple[str, str] | None, int]) -> str:
    """One file's events of known types holding values this version does not know: how many,
    the most frequent (field, value) named with their counts, the others counted."""
    named = sorted(((n, key) for key, n in values.items() if key is not None), key=lambda t: (-t[0], t[1]))
    shown_values = ", ".join(
        f"{shown(name)} {shown(value)} {n:,}" for n, (name, value) in named[:_UNKNOWN_TYPES_SHOWN]
    )
    if None in values:  # past _UNKNOWN_TYPES_KEPT, or too long to be a value: how many is unknown
        shown_values += (" and " if named else "") + "more values"
    elif len(named) > _UNKNOWN_TYPES_SHOWN:
        shown_values += f" and {counted(len(named) - _UNKNOWN_TYPES_SHOWN, 'more value')}"
    return (
        f"{path}: {counted(sum(values.values()), 'event')} with a value this version does not know "
        f"skipped ({shown_values}; written by another version of ckpt-events?)"
    )


def identity(event: CheckpointEvent) -> Hashable:
    """What makes two events the same event (see the module docstring)."""
    match event:
        case SpanEvent():  # each of its classes has a trace id, a span id and a worker
            return (type(event), event.trace_id, event.span_id, event.kind, event.instance, event.worker)
        case _:
            return msgspec.json.encode(event)


def _one_file(
    path: Path,
    index: int,
    problems: LogProblems,
    offsets: Offsets,
    *,
    sort: bool = False,
    window: int | None = None,
) -> Iterator[_Entry]:
    """One file's (time, file, line, event), each event on its process's aligned clock; with
    ``sort``, sorted by time (ties in line order): within ``window`` nanoseconds (how far back
    it went, read before) when given and no clock is moved, else all of it read first."""
    # The reader's generator itself when nothing is moved or sorted, not one more generator
    # around it: each layer costs every line its resumption. Each path is lazy (a generator).
    if sort:
        if window is not None and not offsets:
            return _reordered(_read_file(path, index, problems), window, problems)
        return _sorted_file(path, index, problems, offsets)
    if not offsets:
        return _read_file(path, index, problems)
    return _shifted_file(path, index, problems, offsets)


def _sorted_file(path: Path, index: int, problems: LogProblems, offsets: Offsets) -> Iterator[_Entry]:
    """``_one_file`` read whole and sorted by time (ties in line order)."""
    # (time, file, line) are distinct per entry: two events are never compared.
    yield from sorted(_one_file(path, index, problems, offsets))


def _shifted_file(path: Path, index: int, problems: LogProblems, offsets: Offsets) -> Iterator[_Entry]:
    """``_read_file``'s entries, each event on its process's clock moved by ``offsets``."""
    last = None
    for time_ns, i, number, event in _read_file(path, index, problems):
        if by := offsets.get(process_of(event)):
            time_ns, event = time_ns + by, shifted(event, by)  # noqa: PLW2901
        if last is not None and time_ns < last:
            problems.disordered = True  # two processes of one file, shifted apart
        last = time_ns
        yield time_ns, i, number, event


def _reordered(entries: Iterator[_Entry], window: int, problems: LogProblems) -> Iterator[_Entry]:
    """``entries`` in time order, given that none is stamped more than ``window`` ns before the
    latest one above it: each is held until one ``window`` past it has been read. Memory is
    what that window holds; an event stamped 1 ms back in a file of 2M held the whole file."""
    held: list[_Entry] = []
    latest = None
    emitted = None
    for entry in entries:
        if emitted is not None and entry[0] < emitted:
            problems.disordered = True  # the file went further back than when it was read first
        if latest is None or entry[0] > latest:
            latest = entry[0]
        heapq.heappush(held, entry)
        while held[0][0] < latest - window:
            out = heapq.heappop(held)
            emitted = out[0]
            yield out
    while held:
        yield heapq.heappop(held)


def _read_file(path: Path, index: int, problems: LogProblems) -> Iterator[_Entry]:
    from ckpt_events.sinks import read_events

    a_log = False  # an event was read: the corrupt lines before it are damage, not a non-log
    last = 0  # the previous event's time: a file going back in time is disordered
    back = 0  # events stamped before the one above them
    latest = 0  # the latest stamp read
    back_ns = 0  # how far back of it an event went at most
    far = 0  # events back of it by more than SILENT_BACK_NS: said
    before_first: list[CorruptLine] = []  # corrupt lines before the first event: torn, or not a log
    try:
        with open(path, "rb") as head:
            first = head.readline(4096)
        if looks_like_otlp(first):
            event: CheckpointEvent
            for number, event in read_otlp(path, problems.skip):
                # A collector writes spans as they end, not as they start: normal, not said.
                if (time_ns := event_time(event)) < last:
                    problems.disordered = True
                last = time_ns
                yield time_ns, index, number, event
            return
        for number, item in read_events(path, on_unknown_fields=problems.unknown_fields_in):
            # One exact class test a line (``isinstance`` on a Struct goes through msgspec's
            # metaclass): every line of every log passes here.
            if type(item) is CorruptLine:
                kind = item.unknown_type
                if kind is None and item.unknown_value is None:
                    if a_log:
                        problems.skip(f"{path}:{number}: corrupt line skipped: {item.error}")
                        continue
                    before_first.append(item)
                    if len(before_first) == PROBE_LINES:
                        break
                    continue
                if not a_log:
                    for line in before_first:
                        problems.skip(f"{path}:{line.line}: corrupt line skipped: {line.error}")
                    a_log = True
                # A well-formed event another version wrote (a type, or a value of a closed
                # vocabulary, this one does not know): the file is a log, and its other events
                # are read (PROBE_LINES of them at its head refused the whole file as "not a
                # ckpt-events JSON-lines log", and each was said as a corrupt line).
                if kind is not None:
                    problems.unknown_type(path, kind)
                elif item.unknown_value is not None:
                    problems.unknown_value(path, *item.unknown_value)
                if (ended := item.ended) is not None:
                    problems.end((ended[0], ended[1]), UnreadEnd(ended[2], _ended_why(item)))
                continue
            if not a_log:
                for line in before_first:
                    problems.skip(f"{path}:{line.line}: corrupt line skipped: {line.error}")
                a_log = True
            # (time, file, line): plain tuples merge without a key function, ties in file
            # order, and two events are never compared.
            if (time_ns := event_time(item)) < last:
                back += 1
                back_ns = max(back_ns, latest - time_ns)
                if latest - time_ns > SILENT_BACK_NS:
                    far += 1
            last = time_ns
            if time_ns > latest:  # noqa: PLR1730 (a call to max() a line costs ~3% of lines/s)
                latest = time_ns
            yield time_ns, index, number, item
        if not a_log and before_first:
            line, damage = before_first[0], before_first[-1]
            if first.startswith(_GZIP_MAGIC) and not damage.excerpt and "gzip stream" in damage.error:
                # The reader's last word on a gzip stream ending early: a log cut short (its
                # compression still running, a full disk), which "not a log" blamed on its content.
                why = damage.error.partition("(")[2].rpartition(")")[0] or damage.error
                problems.refuse(
                    f"{path}: a gzip file cut short or damaged before its first whole line ({why}): "
                    "nothing read, file skipped (still being compressed? read it once it is done)"
                )
            else:
                problems.refuse(
                    f"{path}:{line.line}: not a ckpt-events JSON-lines log ({line.error}); file skipped"
                )
    except OSError as exc:
        problems.unreadable += 1
        problems.refuse(f"{path}: cannot read: {exc.strerror or exc}")
    finally:  # also when the merge stops early: what was read of the file is said
        if back:
            problems.disordered = True
            problems.out_of_order[index] = (str(path), back)
            problems.back_ns[index] = back_ns
            if far:
                problems.far_back[index] = far


def _ended_why(line: CorruptLine) -> str:
    """Why the span a skipped ``*_finished`` line ended has an outcome unknown, in words."""
    if line.unknown_value is not None:
        name, value = line.unknown_value
        return _ended_words(name, value[:_UNKNOWN_VALUE_CHARS])
    return _ended_words(None, (line.unknown_type or "")[:_UNKNOWN_VALUE_CHARS])


# Kept for the few types and values a newer version's log repeats on most of its lines: built
# each line, ``shown`` (reprlib) cost ~10 us of the ~50 a line took. Cut to 64 characters first.
@functools.lru_cache(maxsize=256)
def _ended_words(name: str | None, value: str) -> str:
    """``_ended_why`` of a value of field ``name`` (``None``: of the type) cut to its bound."""
    what = f"a {shown(value)} event, a type" if name is None else f"{shown(value)} at `{name}`, a value"
    return f"it ended with {what} this version does not know (written by a newer version of ckpt-events?)"


def merged_events(
    paths: Iterable[Path],
    problems: LogProblems,
    offsets: Offsets | None = None,
    *,
    exact: bool = False,
    sort: Collection[int] | Mapping[int, int] = (),
) -> Iterator[CheckpointEvent]:
    """The events of every file in time order (ties in file order), each process's stamps
    moved by its ``offsets`` entry, an event from two files once; ``problems.clocks``, if
    set, gathers what the calls prove about each process's clock.

    By default an event's copy is looked for among the events of the same stamp, which finds
    every copy when each file is in time order; ``problems.disordered`` says when one was not
    (a clock that stepped back). ``exact`` looks among the last ``DEDUP_EVENTS`` events
    whatever the order, and counts in ``problems.unchecked`` the events whose copy could have
    been forgotten: read again with it when ``problems.disordered``. The files whose index is in
    ``sort`` (``problems.out_of_order`` of an earlier read) are each read whole and sorted by
    time first, so that a file out of order merges as several in-order files would; given as
    ``problems.back_ns`` of that read (index: how far back the file went), each is sorted in a
    window that long instead, holding only what the window holds."""
    offsets = problems.offsets = dict(offsets or {})
    problems.sorted_files = frozenset(sort)
    windows: Mapping[int, int] = sort if isinstance(sort, Mapping) else {}
    paths = list(paths)
    names = [str(p) for p in paths]
    # One open file per log while they merge: past what the process may open, the rest are
    # each read whole first (and closed), rather than refused with "Too many open files".
    budget = open_files_budget(len(paths))
    files = [
        _one_file(p, i, problems, offsets, sort=i in problems.sorted_files, window=windows.get(i))
        if i < budget
        else iter(list(_one_file(p, i, problems, offsets, sort=i in problems.sorted_files)))
        for i, p in enumerate(paths)
    ]
    # One file is its own merge: not one more generator to resume each line.
    merged: Iterator[_Entry] = files[0] if len(files) == 1 else heapq.merge(*files)
    if problems.runs is not None:
        # What it gathers (each file's first and last stamp, the files a trace links) is the
        # same in any order: folded before the ties are ordered.
        merged = problems.runs.tap(merged)
    clocks = problems.clocks
    add, calls_and_answers = (clocks.add, clocks.TYPES) if clocks is not None else (None, frozenset())
    if exact:
        # Events of one stamp (a coarse clock) in nesting order, not in their lines' order.
        for event in _in_window(in_tie_order(merged), problems, names):
            problems.events += 1
            if add is not None and type(event) in calls_and_answers:
                add(event)
            yield event
        return
    # One loop per event, ties ordered and copies dropped in it: an event's copy has its
    # stamp while files are in order, and an event alone at its stamp (most) needs neither
    # (the ties ordered by a generator of their own and a list per event cost ~20% of lines/s).
    entries = iter(merged)
    pending = next(entries, None)  # the entry read last, alone at its stamp so far
    while pending is not None:
        stamp = pending[0]
        for entry in entries:
            if entry[0] == stamp:
                break
            event = pending[3]
            problems.events += 1
            if add is not None and type(event) in calls_and_answers:
                add(event)
            yield event
            pending, stamp = entry, entry[0]
        else:  # the last entry
            event = pending[3]
            problems.events += 1
            if add is not None and type(event) in calls_and_answers:
                add(event)
            yield event
            return
        group = [pending, entry]  # the entries of one stamp: in nesting order, each once
        pending = None
        for entry in entries:
            if entry[0] != stamp:
                pending = entry
                break
            group.append(entry)
        once = _first_copies(group, problems, names)
        for _, _, _, event in tie_ordered(once) if len(once) > 1 else once:
            problems.events += 1
            if add is not None and type(event) in calls_and_answers:
                add(event)
            yield event


def _first_copies(group: list[_Entry], problems: LogProblems, names: Sequence[str]) -> list[_Entry]:
    """The entries of one stamp (``group``, as read) each once: a copy from another file
    dropped, and a span event's copy from its own file; counted in ``problems``. Before their
    nesting order is read: a group holding a copy is kept as read (``tie_ordered``)."""
    kept = []
    keys: dict[Hashable, int] = {}  # identity -> the file it was first read from
    for entry in group:
        index, event = entry[1], entry[3]
        key = identity(event)
        first = keys.get(key)
        if first is None:
            keys[key] = index
        elif problems.read_again(first, index, names[index], event):
            continue
        kept.append(entry)
    return kept


def nothing_read(logs: Sequence[str], paths: Sequence[Path], problems: LogProblems) -> str:
    """The one line for logs that gave no event: how many files were read, and how many could not be."""
    unreadable = problems.unreadable
    read = counted(max(len(paths) - unreadable, 0), "file")
    also = f", {counted(unreadable, 'file')} that could not be read" if unreadable else ""
    # Every event of another version (a newer fleet's log read by an older ckpt-events): was
    # "holds no checkpoint events", as if the file were empty, though it held 130.
    others = sum(n for types in problems.unknown.values() for n in types.values())
    others += sum(n for values in problems.unknown_values.values() for n in values.values())
    if others:
        return (
            f"{', '.join(logs)} holds no checkpoint events this version of ckpt-events reads: "
            f"{counted(others, 'event')} of types or values it does not know skipped ({read} read{also}); "
            "read it with the version that wrote it, or a later one"
        )
    return f"{', '.join(logs)} holds no checkpoint events ({read} read{also})"


def _in_window(
    merged: Iterator[_Entry], problems: LogProblems, names: Sequence[str]
) -> Iterator[CheckpointEvent]:
    """Drop an event whose identity one of the last ``DEDUP_EVENTS`` events from another file
    had, in any order, and a span event whose identity one from its own file had. An event
    whose stamp lies within a forgotten run of stamps (each run nondecreasing, as the merge
    wrote them) may have had its copy forgotten: counted."""
    seen: dict[Hashable, int] = {}  # identity -> the file it was first read from
    kept: deque[tuple[int, Hashable]] = deque()  # (time, identity), oldest first
    forgotten: list[list[int]] = []  # [first, last] stamp of each forgotten run
    low = 0  # the stamps all forgotten runs lie within
    high = 0
    for time_ns, index, _, event in merged:
        key = identity(event)
        n = len(seen)
        first = seen.setdefault(key, index)
        if len(seen) == n:  # seen before
            if not problems.read_again(first, index, names[index], event):
                yield event
            continue
        if forgotten and low <= time_ns <= high and any(a <= time_ns <= b for a, b in forgotten):
            problems.unchecked += 1
        kept.append((time_ns, key))
        if len(kept) > DEDUP_EVENTS:
            old, gone = kept.popleft()
            del seen[gone]
            if forgotten and old >= forgotten[-1][1]:
                forgotten[-1][1] = old
            elif len(forgotten) < _FORGOTTEN_RUNS:
                forgotten.append([old, old])
            else:  # too many runs to keep apart: one that holds them all (more is counted)
                forgotten[:] = [[min(low, old), max(high, old)]]
            low, high = min(a for a, _ in forgotten), max(b for _, b in forgotten)
        yield event


def read_logs(paths: Sequence[Path], fold: Callable[[Iterator[CheckpointEvent]], T]) -> tuple[T, LogProblems]:
    """``fold`` of the events of every file (``merged_events``, no clock shifted), and what the
    read met. When a file went back in time (``LogProblems.disordered``), the files are folded
    again, the files out of order sorted by time and, when there are several, from an ``exact``
    read, so that an event's copy in another file counts once whatever the order, as ``report``
    reads them: only that second fold (and its problems) is returned. ``fold`` must consume
    the events."""
    problems = LogProblems()
    folded = fold(merged_events(paths, problems))
    if problems.disordered:
        sort = dict(problems.back_ns)
        problems = LogProblems()
        folded = fold(merged_events(paths, problems, exact=len(paths) > 1, sort=sort))
    return folded, problems
