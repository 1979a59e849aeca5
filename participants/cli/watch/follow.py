"""``LogFollower``: JSON-lines logs followed the way ``tail -F`` follows them, for ``watch``.

A followed file is known by its device and inode, and held open, so that:

- renamed by a rotation (``JsonLinesSink(max_bytes=...)``, logrotate), it is read to its end from
  the open file before the file now at its name; found again under a rotated name (``.1``, or
  ``-20261203`` with logrotate's ``dateext``: ``sinks.jsonl.rotated_name``), in a folder or among
  the followed file's rotated names, it goes on from its offset, never from 0;
- copied then truncated (logrotate's ``copytruncate``), the copy is recognised by its first line
  and read from the offset the original had reached, then the original again from its start.

A gzipped file (logrotate's ``compress``: ``.gz``) is never appended to, so it is not followed:
the first read folds it whole, and one appearing later is a copy of a rotation already read
(``delaycompress`` compresses ``.1`` or ``-20261203`` at the next rotation), so it is left alone.

A log whose newest file given is a rotated one (``run.jsonl.1`` given without ``run.jsonl``) went
on in a file not read: work open at that file's end may have finished there. Its spans are
handed on in ``cut`` (with that file), and a note says which file to add, so the view shows
their age as unknown rather than aging them into a stall.

The first read folds everything the logs hold (the followed files and their rotated names) in
bounded memory (``Backlog``): what it hands on is the work still open, its stall reports and the
last few outcomes of each participant, never a prefix of the log read as if it were the whole.
A backlog larger than ``budget`` bytes takes several reads, and nothing is handed on until it is
read to its end (a note says how far it is); ``budget=None`` reads it all at once (``--once``).
``aread()`` is ``read()`` with a checkpoint after each chunk (``MAX_READ`` bytes), so a cancellation
(Ctrl-C) ends a read of a multi-GB backlog within one chunk, not at its end.
"""

from __future__ import annotations

import glob
import io
import os
import stat
from collections.abc import Generator, Sequence
from pathlib import Path
from typing import IO, Final, Self

import anyio

from ckpt_events import (
    CoordinateStarted,
    Event,
    OperationStarted,
)
from ckpt_events.checks import shown
from ckpt_events.participants.cli.watch.backlog import Backlog, merged_by_stamp
from ckpt_events.participants.cli.watch.skipped import count_type, count_value, skipped_note
from ckpt_events.participants.cli.watch.sources import VIEW_EVENTS
from ckpt_events.sinks.jsonl import MAX_LINE, CorruptLine, oldest_first, read_events, rotated_name

__all__ = [
    "ENDED_KEPT",
    "MAX_FILES",
    "MAX_READ",
    "LogFollower",
]

#: Bytes read from one followed log per read, so a huge backlog cannot stall the view.
MAX_READ: Final = 8 * 1024 * 1024
#: Files held open at most (a folder of 64 servers' logs and their three rotations is 256).
MAX_FILES: Final = 512
#: The spans whose end was a line this version could not read handed on by one read at most
#: (``LogFollower.ended``), as ``report`` holds at once (``LogProblems.ended``): ~26 MB.
ENDED_KEPT: Final = 65_536
#: A file's first line (at most this many bytes) recognises its copy.
_HEAD: Final = 4096
#: Reads a file rotated away and read to its end is kept open for, in case its writer still appends.
_DETACHED_READS: Final = 2


class _File:
    """One followed file, held open: where reading stands, and the line it starts with."""

    __slots__ = ("detached", "file", "head", "identity", "offset", "partial", "path", "skipping")

    def __init__(self, file: IO[bytes], identity: tuple[int, int], path: str, offset: int) -> None:
        self.file = file
        self.identity = identity
        self.path = path
        self.offset = offset
        self.partial = b""
        self.skipping = False  # inside a line longer than MAX_LINE, dropped up to its newline
        self.head: bytes | None = None  # its first line (or _HEAD bytes of it), once read
        self.detached = 0  # reads since no followed name leads to it


class LogFollower:
    """Follows JSON-lines logs named by files, globs or folders (their ``*.jsonl*`` files), each
    with its rotated names (``name.1``, ``name.2``...). ``read()`` returns the events gained since
    the last call (the files' merged by stamp, each file's in its own order); ``notes`` says, one
    line per file, what happened to it on that call (rotated, copied, truncated, gone, corrupt
    lines, backlog still being read), and on every call what the backlog left out.

    ``budget``: at most this many bytes are read from one file per call (``None``: to its end).
    Every call is bounded: by ``budget`` and by the files' sizes when it starts. ``close()`` (or
    leaving ``with``) closes the files held open.
    """

    def __init__(self, specs: Sequence[str], *, budget: int | None = MAX_READ) -> None:
        self.specs = list(specs)
        self.budget = budget
        self._files: dict[tuple[int, int], _File] = {}
        self._backlog: Backlog | None = Backlog()  # until the first read reaches the logs' ends
        #: The gzipped files found by the first read, folded whole into its backlog.
        self._gzipped: list[str] | None = []
        self.notes: dict[str, str] = {}
        #: What the backlog left out: said on every read, not on the first alone (the view's
        #: counts of open work lack it for as long as it is watched).
        self._lasting: dict[str, str] = {}
        #: The logs named as files (not folders or globs) that could not be read on the last
        #: call, and why: ``--once`` fails for them, a live watch waits for them.
        self.unreadable: dict[str, str] = {}
        #: Corrupt lines skipped in each file on this call, over all its chunks (one note each).
        self._corrupt: dict[str, int] = {}
        #: Per file, the events of types another version wrote, by type (``count_type``).
        self._unknown: dict[str, dict[str | None, int]] = {}
        #: Events of known types holding a value another version wrote, by (field, value).
        self._values: dict[str, dict[tuple[str, str], int]] = {}
        #: Events read without fields this version does not know (a newer version's), over the
        #: whole watch, and those fields by name (``count_type``): one lasting note.
        self._field_events = 0
        self._fields: dict[str | None, int] = {}
        self._sources: dict[object, int] = {}  # the backlog's files (``Backlog.source``)
        #: Per log whose newest file given is a rotated one (its writer went on in a file not
        #: given), that file.
        self._cut_logs: dict[str, str] = {}
        #: The spans this call hands on opened in a log of ``_cut_logs``, each with its newest
        #: file given: whether they finished in the file not given is unknown.
        self.cut: dict[tuple[int, int], str] = {}
        #: The spans whose end this call read in a line this version could not decode (another
        #: version's ``*_finished`` event), each with its end: they ended, with an outcome unknown.
        #: The backlog's are folded into it instead (``Backlog.end``). At most ``ENDED_KEPT``.
        self.ended: dict[tuple[int, int], int] = {}
        #: Such spans not handed on past ``ENDED_KEPT`` in one read, over the whole watch: one
        #: of them whose start was read may be shown open (said in a lasting note).
        self.ended_dropped = 0

    def close(self) -> None:
        """Close every file held open. Idempotent."""
        for followed in self._files.values():
            followed.file.close()
        self._files.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _paths(self) -> list[str]:
        """Every file to follow (gzipped ones too: ``_look`` sets them apart), each rotation
        before the name it rotated from (oldest first)."""
        found: list[str] = []
        for spec in self.specs:
            if os.path.isdir(spec):
                found.extend(str(p) for p in Path(spec).glob("*.jsonl*") if p.is_file())
            elif glob.has_magic(spec):
                found.extend(glob.glob(spec))
            else:
                found.append(spec)
        rotated: list[str] = []
        for path in found:
            if path not in self.specs and rotated_name(path) is not None:
                continue  # a rotation found in a folder: its log's rotations are found with it
            # Its rotations (name.1, name-20261203): named after it, so by the name alone; a name
            # that only ends like a date (name-2026-notes, other-20261203) is not one of them.
            names = glob.glob(glob.escape(path) + "[-_.]*")
            rotated.extend(n for n in names if (r := rotated_name(n)) is not None and r.log == path)
        return sorted(dict.fromkeys(found + rotated), key=oldest_first)

    def read(self) -> list[Event]:
        """The events appended since the last call, over every followed file."""
        steps = self._steps()
        while True:  # bounded: one step per chunk of the files' sizes at the call's start
            try:
                next(steps)
            except StopIteration as done:
                events: list[Event] = done.value
                return events

    async def aread(self) -> list[Event]:
        """``read()``, with a checkpoint after each chunk it folds: cancelled (Ctrl-C) on a
        multi-GB backlog, it ends within one chunk (a fraction of a second), not at the logs' end.
        A cancelled read leaves the follower part-way: close it."""
        steps = self._steps()
        while True:  # bounded as read()
            try:
                next(steps)
            except StopIteration as done:
                events: list[Event] = done.value
                return events
            await anyio.lowlevel.checkpoint()

    def _steps(self) -> Generator[None, None, list[Event]]:
        """``read()``, yielding after each chunk read (its result is the generator's value)."""
        self.notes = dict(self._lasting)
        self.unreadable = {}
        self._corrupt = {}
        self._unknown = {}
        self._values = {}
        self.cut = {}
        self.ended = {}
        order = self._look()
        behind = 0
        if self._gzipped is not None and self._backlog is not None:
            for path in self._gzipped:
                yield from self._fold_whole(path, self._backlog)
        self._gzipped = None  # found later, a gzipped file is a copy of a rotation read already
        each: list[list[Event]] = []
        for followed in order:
            got: list[Event] = []
            behind += yield from self._read_file(followed, got)
            if got:
                each.append(got)
                if (backup := self._cut_logs.get(_log_of(followed.path))) is not None:
                    self.cut.update(
                        ((e.trace_id, e.span_id), backup)
                        for e in got
                        if isinstance(e, OperationStarted | CoordinateStarted)
                    )
        # The files' new lines merged by stamp, each file's in its own order: read one file after
        # the other, a worker's log (a file per worker, one instance) went back by the interval
        # (was: past a second, --interval 3, a clock stepped back, its hung work never STALLED).
        events = merged_by_stamp(each)
        for key in [k for k, f in self._files.items() if f.detached > _DETACHED_READS]:
            self._files.pop(key).file.close()
        backlog = self._backlog
        if backlog is None:
            return events
        if behind:
            read = sum(f.offset for f in self._files.values())
            self.notes["(backlog)"] = (
                f"reading the logs' backlog: {read / 2**20:.0f} of {(read + behind) / 2**20:.0f} MiB read; "
                "open work is shown once it is all read"
            )
            return []
        self._backlog = None
        self._lasting.update(backlog.notes())
        self.notes.update(self._lasting)
        # Each file the backlog folded, by its number: a gzipped one by its path, else by identity.
        where = {number: key for key, number in self._sources.items() if isinstance(key, str)}
        where.update(
            (self._sources[f.identity], f.path) for f in self._files.values() if f.identity in self._sources
        )
        for span, source in backlog.opened().items():
            if (backup := self._cut_logs.get(_log_of(where.get(source, "")))) is not None:
                self.cut[span] = backup
        return backlog.events()

    def _look(self) -> list[_File]:
        """Match the files now at the followed names to the files held open; open the new ones.
        Returns what to read, in order: files rotated away first, then oldest name first."""
        first = self._backlog is not None and not self._files
        at: dict[tuple[int, int], str] = {}
        paths = self._paths()
        self._cut_logs = _cut_logs(paths)
        for log, backup in self._cut_logs.items():
            # Said on every read: the view's ages of that log's open work lack it all along.
            add = (
                f"add {log} to --follow"
                if os.path.exists(log)
                else f"{log}, which it rotated from, is not here"
            )
            self.notes[backup] = (
                f"{backup}: the newest file given of {log}, and a rotated one: work open at its end may have "
                f"finished in a newer file, so its age is unknown ({add})"
            )
        for path in paths:
            if path.endswith(".gz"):
                if self._gzipped is not None:
                    self._gzipped.append(path)
                continue
            try:
                info = os.stat(path)
            except OSError as exc:
                if path in self.specs:
                    why = self.unreadable[path] = str(exc.strerror or exc)
                    waiting = "" if self.budget is None else "; waiting for it"  # None: --once
                    self.notes[path] = f"{path}: cannot read ({why}){waiting}"
                continue
            if stat.S_ISDIR(info.st_mode):
                continue  # a folder a glob matched: its logs are named by the folder itself
            if not stat.S_ISREG(info.st_mode):
                # Was: opened as a file, and a FIFO with no writer blocked open() for ever, with
                # Ctrl-C too; a device or socket has no size to follow either.
                what = "a FIFO" if stat.S_ISFIFO(info.st_mode) else "a socket or device"
                why = f"{what}, not a log file: follow the file the sink writes"
                if path in self.specs:
                    self.unreadable[path] = why
                self.notes[path] = f"{path}: cannot read ({why})"
                continue
            at.setdefault((info.st_dev, info.st_ino), path)
        heads = {f.head: f for f in self._files.values() if f.head is not None}
        order: list[_File] = []
        for followed in self._files.values():
            if followed.identity not in at:
                followed.detached += 1
                if followed.detached == 1:
                    self.notes.setdefault(
                        followed.path,
                        f"{followed.path}: rotated away or deleted; its end is read from the open file",
                    )
                order.append(followed)
        for identity, path in at.items():
            known = self._files.get(identity)
            if known is not None:
                if known.path != path:
                    self.notes[path] = (
                        f"{path}: is {known.path} rotated (same inode): read on from byte {known.offset:,}"
                    )
                known.path = path
                known.detached = 0
                order.append(known)
            else:
                if len(self._files) >= MAX_FILES:
                    self.notes["(files)"] = f"following {MAX_FILES} files at most: {path} and others not read"
                    continue
                try:
                    file = open(path, "rb")  # noqa: SIM115 - held open across reads, closed by close()
                except OSError as exc:
                    self.notes[path] = f"{path}: cannot read ({exc.strerror or exc})"
                    if path in self.specs:
                        self.unreadable[path] = str(exc.strerror or exc)
                    continue
                new = self._files[identity] = _File(file, identity, path, 0)
                if not first:
                    self._copied_from(new, heads)
                order.append(new)
        return order

    def _fold_whole(self, path: str, backlog: Backlog) -> Generator[None, None, None]:
        """Fold a gzipped log into the first read's backlog, whole (it is never appended to),
        yielding after each batch."""
        corrupt = 0
        types: dict[str | None, int] = {}
        values: dict[tuple[str, str], int] = {}
        batch: list[Event] = []
        backlog.source = self._source_of(path)
        try:
            # bounded: one pass over a file of a given size
            for _, item in read_events(path, on_unknown_fields=self._unknown_fields):
                if isinstance(item, CorruptLine):
                    if item.unknown_type is not None:
                        count_type(types, item.unknown_type)
                    elif item.unknown_value is not None:
                        count_value(values, item.unknown_value)
                    else:
                        corrupt += 1
                    if item.ended is not None:
                        backlog.end(item.ended[:2], item.ended[2])
                elif isinstance(item, VIEW_EVENTS):
                    batch.append(item)
                    if len(batch) >= 4096:
                        backlog.add_all(batch)
                        batch.clear()
                        yield
        except OSError as exc:
            self.notes[path] = f"{path}: cannot read ({exc.strerror or exc})"
        backlog.add_all(batch)
        if corrupt or types or values:
            self.notes[path] = skipped_note(path, corrupt, types, values)

    def _unknown_fields(self, number: int, kind: str, names: tuple[str, ...]) -> None:
        """Count an event read without ``names``, fields this version does not know, and say
        so in one lasting note (was: dropped without a word)."""
        self._field_events += 1
        for name in names:
            count_type(self._fields, name)
        named = sorted(
            ((n, name) for name, n in self._fields.items() if name is not None), key=lambda t: (-t[0], t[1])
        )
        listed = ", ".join(f"{shown(name)} {n:,}" for n, name in named[:3])
        more = " and more" if len(named) > 3 or None in self._fields else ""
        self.notes[_FIELDS_NOTE] = self._lasting[_FIELDS_NOTE] = (
            f"{self._field_events} event(s) carried fields this version does not know "
            f"({listed or 'fields not kept'}{more}): read without them (written by a newer "
            "version of ckpt-events? upgrade to read them)"
        )

    def _end(self, span: tuple[int, int], end_ns: int) -> None:
        """Hand on that ``span`` ended in a line this version could not read, at most
        ``ENDED_KEPT`` a read (was: all, a read of 1,000,000 such lines held them all); the
        others counted and said in a lasting note."""
        # The newest let go, not the oldest: a dict's first entry deleted again and again is
        # found past the holes left before it (``LogProblems.end``).
        if len(self.ended) >= ENDED_KEPT and span not in self.ended:
            self.ended_dropped += 1
            self.notes[_ENDED_NOTE] = self._lasting[_ENDED_NOTE] = (
                f"{self.ended_dropped:,} more span(s) than the {ENDED_KEPT:,} handed on per read ended in "
                "lines this version cannot read: such a span shown open may have ended (read the logs "
                "with the version of ckpt-events that wrote them)"
            )
            return
        self.ended[span] = end_ns

    def _source_of(self, key: object) -> int:
        """A number for each file the backlog folds (by identity; a gzipped one by its path)."""
        return self._sources.setdefault(key, len(self._sources))

    def _copied_from(self, new: _File, heads: dict[bytes, _File]) -> None:
        """A file that is a copy of one read so far (copy-truncate) starts where that one stands."""
        if not heads:
            return
        start = _read_at(new.file, 0, _HEAD)
        for head, original in heads.items():
            if start.startswith(head):
                size = os.fstat(new.file.fileno()).st_size
                new.offset = min(original.offset, size)
                new.head = head
                new.partial = original.partial if new.offset == original.offset else b""
                self.notes[new.path] = (
                    f"{new.path}: a copy of {original.path} (copy-truncate rotation): "
                    f"read from byte {new.offset:,}"
                )
                return

    def _read_file(self, followed: _File, events: list[Event]) -> Generator[None, None, int]:
        """Read ``followed`` on, up to ``budget`` bytes, yielding after each chunk; the bytes
        left behind."""
        try:
            size = os.fstat(followed.file.fileno()).st_size
            if size < followed.offset or (
                followed.head is not None and _read_at(followed.file, 0, len(followed.head)) != followed.head
            ):
                self.notes[followed.path] = f"{followed.path}: truncated, reading again from the start"
                followed.offset = 0
                followed.partial = b""
                followed.head = None
                followed.skipping = False
            end = size if self.budget is None else min(size, followed.offset + self.budget)
            while followed.offset < end:  # bounded: each pass moves the offset on, up to `end`
                chunk = _read_at(followed.file, followed.offset, min(MAX_READ, end - followed.offset))
                if not chunk:
                    break
                followed.offset += len(chunk)
                self._decode(followed, chunk, events)
                if self._backlog is not None:  # folded chunk by chunk: memory stays one chunk's
                    self._backlog.source = self._source_of(followed.identity)
                    self._backlog.add_all(events)
                    events.clear()
                yield
            if self.budget is None and followed.partial and followed.offset == end:
                # --once reads no further: a last line with no newline (a file cut or written by
                # hand) is read as a line, as ``report`` reads it, or counted corrupt. Was: held
                # unread and unsaid, so a commit whose end it was showed as open work.
                self._decode(followed, b"\n", events)
                if self._backlog is not None:
                    self._backlog.source = self._source_of(followed.identity)
                    self._backlog.add_all(events)
                    events.clear()
            if followed.head is None and followed.offset > 0:
                start = _read_at(followed.file, 0, _HEAD)
                cut = start.find(b"\n")
                if cut >= 0 or len(start) == _HEAD:  # a whole first line, or _HEAD bytes of it
                    followed.head = start[: cut + 1] if cut >= 0 else start
        except OSError as exc:
            self.notes[followed.path] = f"{followed.path}: cannot read ({exc.strerror or exc})"
            return 0
        if followed.detached and followed.offset < size:
            followed.detached = 1  # still being read: not closed yet
        return size - followed.offset

    def _decode(self, followed: _File, chunk: bytes, events: list[Event]) -> None:
        data = followed.partial + chunk
        start = 0
        if followed.skipping:
            start = data.find(b"\n") + 1
            if start == 0:
                followed.partial = b""
                return
            followed.skipping = False
        cut = data.rfind(b"\n") + 1
        followed.partial = data[max(cut, start) :]
        corrupt = 0
        types = self._unknown.setdefault(followed.path, {})
        values = self._values.setdefault(followed.path, {})
        before = sum(values.values()) + sum(types.values())
        if len(followed.partial) > MAX_LINE:  # a line past the reader's bound: dropped to its end
            followed.partial = b""
            followed.skipping = True
            corrupt += 1
        if cut > start:
            for _, item in read_events(io.BytesIO(data[start:cut]), on_unknown_fields=self._unknown_fields):
                if isinstance(item, CorruptLine):
                    # Another version's event (a type, or a value of a closed vocabulary, this
                    # one does not know): skipped, but not damage.
                    if item.unknown_type is not None:
                        count_type(types, item.unknown_type)
                    elif item.unknown_value is not None:
                        count_value(values, item.unknown_value)
                    else:
                        corrupt += 1
                    if item.ended is not None:
                        # Was: skipped with the span it ended, which showed as open work
                        # ("age unknown (later work finished since: restarted?)").
                        if self._backlog is not None:
                            self._backlog.end(item.ended[:2], item.ended[2])
                        else:
                            self._end(item.ended[:2], item.ended[2])
                elif isinstance(item, VIEW_EVENTS):
                    events.append(item)
        if corrupt or sum(values.values()) + sum(types.values()) > before:
            # Summed over the call's chunks: each chunk's own count, set alone, said "1 corrupt
            # line(s)" for a log of 4 whose last 8 MiB chunk held one.
            path = followed.path
            total = self._corrupt[path] = self._corrupt.get(path, 0) + corrupt
            self.notes[path] = skipped_note(path, total, types, values)


def _log_of(path: str) -> str:
    """The log ``path`` is a file of: itself, or the log it was rotated from."""
    rotated = rotated_name(path)
    return path if rotated is None else rotated.log


def _cut_logs(paths: Sequence[str]) -> dict[str, str]:
    """Per log whose newest file among ``paths`` (oldest first, as ``_paths`` sorts them) is a
    rotated one, that file: the log's writer went on in a newer file, not among them."""
    newest: dict[str, str] = {}
    for path in paths:
        newest[_log_of(path)] = path
    return {log: path for log, path in newest.items() if path != log}


#: The key of the note on fields this version does not know (no file's path: one for all).
_FIELDS_NOTE: Final = "(fields unknown)"
#: The key of the note on spans ended in lines this version cannot read, past ``ENDED_KEPT``.
_ENDED_NOTE: Final = "(ended unknown)"


def _read_at(file: IO[bytes], offset: int, size: int) -> bytes:
    file.seek(offset)
    return file.read(size)
