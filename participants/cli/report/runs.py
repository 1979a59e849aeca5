"""Which logs hold one run: files linked by a trace seen in both, for a folder of two fleets.

A fleet's logs (its controller's and every participant's) share traces: a participant's
operation continues the controller's call. Two fleets run at once share none, so the files of
each form one group (``RunLinks``): the report then says each fleet's pause over its own logs'
time, never one fleet's pauses and the other's summed over both (which read 150% of the time).
A file with no trace (counted events alone) joins no group, so bounds no run's time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar, get_args

from ckpt_events import CheckpointEvent, SpanEvent

if TYPE_CHECKING:
    from ckpt_events.participants.cli.report.overview import RunRow

__all__ = ["Fleet", "RunLinks", "fleets"]

_Entry = TypeVar("_Entry", bound=tuple[int, int, int, Any])
#: The classes of the events of a span (a trace, a start), as the reader decodes them.
_SPAN_CLASSES: Final = frozenset(cls for cls in get_args(CheckpointEvent) if issubclass(cls, SpanEvent))


class RunLinks:
    """Groups of files linked by shared traces, and each file's time, from one read of the logs.

    Keeps one int per trace (the file it was first seen in) and two per file."""

    def __init__(self, paths: Sequence[Path]) -> None:
        # A fleet's folder names its logs as another's does (run.jsonl in both): a name two
        # files share would say nothing of which run is which, so those go by their path.
        shared = Counter(path.name for path in paths)
        self.names = [path.name if shared[path.name] == 1 else str(path) for path in paths]
        self._parent = list(range(len(paths)))
        self._file_of: dict[int, int] = {}  # trace id -> the file it was first seen in
        self._first: dict[int, int] = {}  # file -> its earliest stamp (a span's start)
        self._last: dict[int, int] = {}  # file -> its latest stamp

    def tap(self, entries: Iterator[_Entry]) -> Iterator[_Entry]:
        """``entries`` (time, file, line, event) as they are, each folded in on its way."""
        file_of, first, last = self._file_of, self._first, self._last
        for entry in entries:
            time_ns, index, _, event = entry
            # Every line of the report's read passes here: an exact class test, where
            # ``isinstance`` on a Struct goes through msgspec's metaclass.
            if event.__class__ in _SPAN_CLASSES:
                seen = file_of.setdefault(event.trace_id, index)
                if seen != index:
                    self._join(seen, index)
                begin = event.start_ns
            else:
                begin = time_ns
            earliest = first.get(index)
            if earliest is None or begin < earliest:
                first[index] = begin
            if time_ns > last.get(index, time_ns - 1):
                last[index] = time_ns
            yield entry

    def _root(self, index: int) -> int:
        parent = self._parent
        while parent[index] != index:
            parent[index] = parent[parent[index]]
            index = parent[index]
        return index

    def _join(self, a: int, b: int) -> None:
        a, b = self._root(a), self._root(b)
        if a != b:
            self._parent[max(a, b)] = min(a, b)

    def group_of(self, trace_id: int) -> int | None:
        """The group (its first file's index) of the files holding ``trace_id``; ``None`` if
        none does."""
        index = self._file_of.get(trace_id)
        return None if index is None else self._root(index)

    def span(self, group: int) -> tuple[int, int] | None:
        """(first, last) stamp of the files of ``group`` (a span's start, any event's time)."""
        members = [i for i in self._first if self._root(i) == group]
        if not members:
            return None
        return min(self._first[i] for i in members), max(self._last[i] for i in members)

    def files(self, group: int) -> list[str]:
        """The names of the files of ``group``, in the order given: a file's name, or its path
        as given when another file given has that name too."""
        return [self.names[i] for i in sorted(self._first) if self._root(i) == group]


@dataclass(frozen=True)
class Fleet:
    """One run of several in the logs (``RunLinks``): its files, their time and its rows."""

    files: list[str]
    first_ns: int
    last_ns: int
    rows: list[RunRow]


def fleets(rows: Sequence[RunRow], runs: RunLinks) -> list[Fleet]:
    """The runs apart in the logs, when more than one holds a row (else none: one run)."""
    groups: dict[int, list[RunRow]] = {}
    for row in rows:
        found = {g for trace in row.trace_ids if (g := runs.group_of(trace)) is not None}
        if len(found) != 1:  # no file, or files not linked: one run, as before
            return []
        groups.setdefault(found.pop(), []).append(row)
    if len(groups) < 2:
        return []
    found_fleets = []
    for group, mine in groups.items():
        span = runs.span(group)
        if span is None:
            return []
        found_fleets.append(Fleet(runs.files(group), span[0], span[1], mine))
    return sorted(found_fleets, key=lambda fleet: fleet.first_ns)
