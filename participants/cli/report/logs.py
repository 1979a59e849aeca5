"""Every process's logs in: files, globs and directories merged into one time-ordered stream.

A file is a JSON-lines log of the jsonl sink, or a collector's OTLP JSON file (``sinks.otlp.read_otlp``),
told apart by its first line. A JSON-lines file is judged by its first line that decodes
(within ``PROBE_LINES``), so a torn first line (a cut copy, a crash) costs that line, not the file.

Each file is read lazily and the files are merged by event time (``heapq.merge`` of one
iterator per file), so memory holds one pending event per file, never a whole log. An event
read twice (the same file named twice, a copy in two directories) is kept once: identical
events share their time stamp, so only events whose stamps collide are compared.
"""

from __future__ import annotations

import glob
import heapq
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from ckpt_events.participants.cli.words import counted
from ckpt_events.sinks.otlp import looks_like_otlp, read_otlp

__all__ = ["LogProblems", "event_time", "expand_logs", "merged_events"]

#: How many problem lines are shown; the rest are counted.
SHOWN = 5
#: A file is a log if an event decodes within its first this many non-blank lines; the corrupt
#: lines before it are skipped and counted. A crash tears one line (a crash loop a few), and
#: prose or binary data is refused after this many lines instead of being read to its end.
PROBE_LINES = 16


def event_time(event: Any) -> int:
    """When an event happened: the end of a finished span, the instant of a counted event,
    the start of a started span."""
    stamp: int = getattr(event, "end_ns", None) or getattr(event, "time_ns", None) or event.start_ns
    return stamp


def expand_logs(specs: Sequence[str]) -> tuple[list[Path], list[str]]:
    """Paths for files, globs and directories (every regular file in it, sorted), each once,
    and one line per spec that named nothing."""
    paths: list[Path] = []
    missing: list[str] = []
    for spec in specs:
        if os.path.isdir(spec):
            found = sorted(p for p in Path(spec).iterdir() if p.is_file() and not p.name.startswith("."))
        elif os.path.isfile(spec):
            found = [Path(spec)]
        else:
            found = [Path(p) for p in sorted(glob.glob(spec)) if os.path.isfile(p)]
        if not found:
            missing.append(f"{spec}: no such file, directory or matching glob")
        paths.extend(found)
    seen: set[Path] = set()
    unique = []
    for path in paths:
        if (resolved := path.resolve()) not in seen:
            seen.add(resolved)
            unique.append(path)
    return unique, missing


@dataclass
class LogProblems:
    """What was not a log: files refused whole and lines skipped, each counted with the first
    few kept (a folder of 10,000 non-logs, or 5 MB of noise after one good line, is a few lines)."""

    refused: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    refused_files: int = 0
    skipped: int = 0
    duplicates: int = 0
    events: int = 0

    def refuse(self, line: str) -> None:
        self.refused_files += 1
        if len(self.refused) < SHOWN:
            self.refused.append(line)

    def skip(self, line: str) -> None:
        self.skipped += 1
        if len(self.lines) < SHOWN:
            self.lines.append(line)

    def summary(self) -> list[str]:
        """One line per problem shown, and one counting the rest of each kind."""
        out = list(self.refused)
        if self.refused_files > len(self.refused):
            out.append(f"... and {counted(self.refused_files - len(self.refused), 'more file')} refused")
        out += self.lines
        if self.skipped > len(self.lines):
            out.append(f"... and {counted(self.skipped - len(self.lines), 'more line')} skipped")
        return out


def _one_file(path: Path, index: int, problems: LogProblems) -> Iterator[tuple[int, int, int, Any]]:
    from ckpt_events.sinks import CorruptLine, read_events

    decoded = 0
    before_first: list[CorruptLine] = []  # corrupt lines before the first event: torn, or not a log
    try:
        with open(path, "rb") as head:
            first = head.readline(4096)
        if looks_like_otlp(first):
            for number, event in read_otlp(path, problems.skip):
                yield event_time(event), index, number, event
            return
        for number, item in read_events(path):
            if isinstance(item, CorruptLine):
                if decoded:
                    problems.skip(f"{path}:{number}: corrupt line skipped: {item.error}")
                    continue
                before_first.append(item)
                if len(before_first) == PROBE_LINES:
                    break
                continue
            if not decoded:
                for line in before_first:
                    problems.skip(f"{path}:{line.line}: corrupt line skipped: {line.error}")
            decoded += 1
            # (time, file, line): plain tuples merge without a key function, ties in file
            # order, and two events are never compared.
            yield event_time(item), index, number, item
        if not decoded and before_first:
            line = before_first[0]
            problems.refuse(
                f"{path}:{line.line}: not a ckpt-events JSON-lines log ({line.error}); file skipped"
            )
    except OSError as exc:
        problems.refuse(f"{path}: cannot read: {exc.strerror or exc}")


def merged_events(paths: Iterable[Path], problems: LogProblems) -> Iterator[Any]:
    """The events of every file in time order (ties in file order), duplicates dropped."""
    streams = [_one_file(p, i, problems) for i, p in enumerate(paths)]
    group_time: int | None = None
    group: list[Any] = []
    group_keys: set[bytes] | None = None
    encode = msgspec.json.encode
    for time_ns, _, _, event in heapq.merge(*streams):
        if time_ns != group_time:
            group_time, group, group_keys = time_ns, [event], None
        else:
            if group_keys is None:
                group_keys = {encode(e) for e in group}
            key = encode(event)
            if key in group_keys:
                problems.duplicates += 1
                continue
            group_keys.add(key)
            group.append(event)
        problems.events += 1
        yield event
