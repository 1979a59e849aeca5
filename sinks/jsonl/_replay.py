"""Replay a JSON-lines log into sinks or a bus: record offline, export later.

A replayed log gives the same spans and metric totals as the live run, because each
finished event carries everything its span or measurement needs. A span still open at the end
of the log (its process was killed mid-operation) is replayed too, closed as truncated
(``OpenSpans``): ended at its process's last event, status ERROR, ``nemo.gym.checkpoint.truncated``.
Not so at the end of a rotated file (``x.jsonl.1``): its process went on writing in the newer
file of its rotation, where those spans may well end, so they are counted as ``cut`` instead.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterable
from typing import IO, Any, Final, get_args

import msgspec

from ckpt_events import Bus, CheckpointEvent, Event, InvalidTypeError, resolve_interests
from ckpt_events._errors import check_int
from ckpt_events.sinks.jsonl._open_spans import OpenSpans
from ckpt_events.sinks.jsonl._reader import CorruptLine, read_events

__all__ = ["ReplayResult", "is_rotated", "replay"]

_EVENT_TYPES: Final[tuple[type[Event], ...]] = get_args(CheckpointEvent)
DEFAULT_BATCH: Final = 4096


class ReplayResult(msgspec.Struct, frozen=True):
    """What a replay read: events replayed, the lines that did not decode, the spans the log
    left open that were replayed closed as truncated (counted apart from ``events``), and the
    spans open at the end of a rotated file (``cut``), not replayed: where they end is in the
    newer file of its rotation, which was not given, so they are not known to be left open."""

    events: int
    corrupt: tuple[CorruptLine, ...]
    truncated: int = 0
    cut: int = 0


class _Target:
    """One sink with the event classes it wants, or a bus (which routes by itself)."""

    def __init__(self, target: Any) -> None:
        self.bus = target if isinstance(target, Bus) else None
        if self.bus is None and not callable(getattr(target, "handle", None)):
            raise InvalidTypeError(f"replay targets are sinks (with handle(batch)) or a Bus, not {target!r}")
        self.sink = target
        self.wants = resolve_interests(target) if self.bus is None else frozenset(_EVENT_TYPES)
        self.batch: list[Any] = []

    async def deliver(self) -> None:
        batch = self.batch
        self.batch = []
        if not batch:
            return
        if self.bus is not None:
            for event in batch:
                self.bus.emit(event)
            await self.bus.flush()
            return
        result = self.sink.handle(batch)
        if inspect.isawaitable(result):
            await result


async def replay(
    source: str | os.PathLike[str] | IO[bytes],
    *targets: Any,
    batch_size: int = DEFAULT_BATCH,
    close_open: bool = True,
) -> ReplayResult:
    """Feed every event of a JSON-lines log to each target, in file order and in batches.

    A target is a sink (its ``interests`` are honoured; sync or async ``handle``) or a
    started ``Bus`` (events are emitted and flushed). Corrupt lines are skipped and
    returned. Sinks are not closed: their owner does that (e.g. ``SpanSink.shutdown()``).
    With ``close_open`` (the default), the spans the log leaves open follow its last event,
    closed as truncated (``OpenSpans.close``), unless the log is a rotated file (named
    ``<name>.<digits>``, as ``JsonLinesSink(max_bytes=...)`` and logrotate name them, gzipped or
    not): its writer went on in a newer file, so they are only counted, in ``ReplayResult.cut``.
    """
    check_int(batch_size, f"batch_size must be a positive int, not {batch_size!r}", minimum=1)
    chosen = [_Target(t) for t in targets]
    corrupt: list[CorruptLine] = []
    count = 0
    open_spans = OpenSpans() if close_open else None
    for _, item in _lines(source):
        if isinstance(item, CorruptLine):
            corrupt.append(item)
            continue
        count += 1
        if open_spans is not None:
            open_spans.add(item)
        cls = item.__class__
        for target in chosen:
            if cls in target.wants:
                target.batch.append(item)
                if len(target.batch) >= batch_size:
                    await target.deliver()
    truncated = open_spans.close() if open_spans is not None else []
    cut = 0
    if truncated and is_rotated(source):
        # Was: exported as failures left open, though their ends are in the next file.
        cut, truncated = len(truncated), []
    for item in truncated:
        for target in chosen:
            if item.__class__ in target.wants:
                target.batch.append(item)
    for target in chosen:
        await target.deliver()
    return ReplayResult(events=count, corrupt=tuple(corrupt), truncated=len(truncated), cut=cut)


def is_rotated(log: str | os.PathLike[str] | IO[bytes]) -> bool:
    """Whether ``log`` (a path, or a file with its path as ``name``) is named as a rotated file
    (``<name>.<digits>``, e.g. ``run.jsonl.1``, or ``run.jsonl.1.gz`` as logrotate's
    ``compress`` leaves it): one its writer went on from, not its last."""
    name = getattr(log, "name", None) if not isinstance(log, str | os.PathLike) else os.fspath(log)
    if not isinstance(name, str):
        return False
    stem, dot, suffix = os.path.basename(name).removesuffix(".gz").rpartition(".")
    return bool(stem) and bool(dot) and suffix.isascii() and suffix.isdigit()


def _lines(source: str | os.PathLike[str] | IO[bytes]) -> Iterable[tuple[int, Any]]:
    return read_events(source)
