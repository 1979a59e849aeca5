"""Replay a JSON-lines log into sinks or a bus: record offline, export later.

A replayed log gives the same spans and metric totals as the live run, because each
finished event carries everything its span or measurement needs. A span still open at the end
of the log (its process was killed mid-operation) is replayed too, closed as truncated
(``OpenSpans``): ended at its process's last event, status ERROR, ``nemo.gym.checkpoint.truncated``.
Not so at the end of a rotated file (``x.jsonl.1``, ``x.jsonl-20261203``): its process went on
writing in the newer file of its rotation, where those spans may well end, so they are counted
as ``cut`` instead.

A target whose ``handle`` raises is isolated as the bus isolates a sink: logged once, counted
(``ReplayResult.failed``), and handed its later batches still; the other targets get every event.

A log is read far faster than a collector takes its spans, and an exporting sink queues a bounded
number (``OtlpSpanSink``: 8,192; OpenTelemetry's ``BatchSpanProcessor``: 2,048) and drops the rest:
a target with ``force_flush`` (a sink, or a sink of a Bus target) is handed at most what its queue
holds at a time (``max_queue``, else ``max_export_batch``) and waited for until it exported that.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Awaitable, Callable
from typing import IO, Any, Final, get_args

import anyio.from_thread
import anyio.to_thread
import msgspec

from ckpt_events import (
    Bus,
    CheckpointEvent,
    Event,
    InvalidTypeError,
    InvalidValueError,
    Sink,
    resolve_interests,
)
from ckpt_events._errors import check_int, shown
from ckpt_events._logs import library_logger, one_line
from ckpt_events._public_home import publish
from ckpt_events.sinks.jsonl._open_spans import OpenSpans
from ckpt_events.sinks.jsonl._reader import CorruptLine, read_events
from ckpt_events.sinks.jsonl._rotation import rotated_name

__all__ = ["ReplayFailure", "ReplayResult", "is_rotated", "replay"]

logger: Final = library_logger("ckpt_events.sinks.jsonl")

_EVENT_TYPES: Final[tuple[type[Event], ...]] = get_args(CheckpointEvent)
DEFAULT_BATCH: Final = 4096
#: The corrupt lines ``ReplayResult.corrupt`` keeps (the first ones); ``corrupt_lines`` counts all.
MAX_CORRUPT: Final = 1000
#: The longest a replay waits for one sink's ``force_flush`` (ours end by their own timeout
#: first: ``OtlpSpanSink``'s 10 s, ``SpanSink``'s 30 s); past it, that sink is not waited for again.
FLUSH_WAIT: Final = 60.0


class ReplayFailure(msgspec.Struct, frozen=True):
    """A target whose ``handle`` raised: its place among ``replay``'s targets (from 0), its class
    name, the first error it raised in one line (``ValueError: boom``), and the events and
    batches it was handed in calls that raised (what it may not have taken)."""

    target: int
    name: str
    error: str
    failed: int
    failed_batches: int


class ReplayResult(msgspec.Struct, frozen=True):
    """What a replay read: events replayed, the lines that did not decode (the first
    ``MAX_CORRUPT`` of them; ``corrupt_lines`` counts them all), the spans the log
    left open that were replayed closed as truncated (counted apart from ``events``), and the
    spans open at the end of a rotated file (``cut``), not replayed: where they end is in the
    newer file of its rotation, which was not given, so they are not known to be left open.
    ``failed`` has one ``ReplayFailure`` per target whose ``handle`` raised, in target order:
    empty when every target took every batch. ``unknown_fields`` counts the events (among
    ``events``) read without fields this version does not know, a newer version's
    (``read_events(on_unknown_fields=...)``): replayed, but what those fields said is lost."""

    events: int
    corrupt: tuple[CorruptLine, ...]
    truncated: int = 0
    cut: int = 0
    failed: tuple[ReplayFailure, ...] = ()
    corrupt_lines: int = 0
    unknown_fields: int = 0


class _Target:
    """One sink with the event classes it wants, or a bus (which routes by itself)."""

    def __init__(self, index: int, target: Any) -> None:
        self.bus = target if isinstance(target, Bus) else None
        if self.bus is None and not callable(getattr(target, "handle", None)):
            raise InvalidTypeError(
                f"replay targets are sinks (with handle(batch)) or a Bus, not {shown(target)}"
            )
        if self.bus is not None and (self.bus._closed or self.bus._tg is None):
            # Was: a closed bus dropped every event and the result said all were replayed; one
            # never started held them unhandled, dropping what its buffers could not hold.
            state = "closed" if self.bus._closed else "not started"
            raise InvalidValueError(
                f"replay target {index} is a Bus {state}: replay onto a running one, inside "
                "`async with Bus() as bus:` (or pass the sinks themselves)"
            )
        self.index = index
        self.sink = target
        self.wants = resolve_interests(target) if self.bus is None else frozenset(_EVENT_TYPES)
        self.batch: list[Any] = []
        self.error: str | None = None  # the first one, in one line
        self.failed = 0
        self.failed_batches = 0
        # Sinks whose force_flush did not end in time (or raised): not waited for again, so a
        # stuck collector costs one flush timeout, not one per batch of the log.
        self.behind: set[int] = set()

    async def deliver(self) -> None:
        batch = self.batch
        self.batch = []
        if not batch:
            return
        if self.bus is not None:
            await self._hand(batch)
            return
        # Was: the whole batch at once, then the next: 44,640 of a 60,000-span log dropped by an
        # OtlpSpanSink's queue (and by a BatchSpanProcessor's, while SpanSink counted them exported).
        flushable = _flushable(self.sink)
        size = (_queue_bound(self.sink) if flushable else None) or len(batch)
        for start in range(0, len(batch), size):
            await self._hand(batch[start : start + size])
            if flushable:
                await self._wait_exported([self.sink])

    async def _hand(self, batch: list[Any]) -> None:
        try:
            if self.bus is not None:
                await _emit_all(self.bus, batch, self._wait_exported)
                return
            result = self.sink.handle(batch)
            if inspect.isawaitable(result):
                await result
        except Exception as exc:  # not cancellation nor Ctrl-C: those stop the caller's own replay
            # Was: the first raise ended the replay, and every other target lost the rest of the log.
            self.failed += len(batch)
            self.failed_batches += 1
            if self.error is None:
                self.error = one_line(exc)
                logger.exception(
                    "replay target %d (%s) failed to handle a batch of %d events; its failures are "
                    "counted in ReplayResult.failed and not logged again",
                    self.index,
                    type(self.sink).__name__,
                    len(batch),
                )

    async def _wait_exported(self, sinks: list[Any]) -> None:
        """Wait, each within its own timeout and at most ``FLUSH_WAIT`` seconds, until each of
        ``sinks`` with ``force_flush`` (sync, run in a worker thread, or async) exported what it
        was handed; one that does not in time, or raises, is not waited for again (what it drops,
        it counts)."""
        for sink in sinks:
            if not _flushable(sink) or id(sink) in self.behind:
                continue
            done: object = False
            with anyio.move_on_after(FLUSH_WAIT):
                try:
                    if inspect.iscoroutinefunction(sink.force_flush):
                        done = await sink.force_flush()
                    else:
                        done = await anyio.to_thread.run_sync(sink.force_flush, abandon_on_cancel=True)
                except Exception:
                    self.behind.add(id(sink))
                    logger.exception(
                        "replay: force_flush of %s raised; the rest of the log is handed to it "
                        "without waiting",
                        type(sink).__name__,
                    )
                    continue
            if done is False:  # False, or the wait ran out (a force_flush returning None is done)
                self.behind.add(id(sink))
                logger.warning(
                    "replay: %s did not say it exported what it was handed within its timeout; the "
                    "rest of the log is handed to it without waiting (what it drops, it counts)",
                    type(sink).__name__,
                )

    def failure(self) -> ReplayFailure | None:
        if self.error is None:
            return None
        return ReplayFailure(
            target=self.index,
            name=type(self.sink).__name__,
            error=self.error,
            failed=self.failed,
            failed_batches=self.failed_batches,
        )


async def replay(
    source: str | os.PathLike[str] | IO[bytes],
    *targets: Sink | Bus,
    batch_size: int = DEFAULT_BATCH,
    close_open: bool = True,
) -> ReplayResult:
    """Feed every event of a JSON-lines log to each target, in file order and in batches.

    A target is a sink (its ``interests`` are honoured; sync or async ``handle``) or a
    started ``Bus`` (events are emitted and flushed). Corrupt lines are skipped, counted and
    returned (the first ``MAX_CORRUPT``); events holding fields this version does not know are
    replayed without them and counted (``ReplayResult.unknown_fields``). Sinks are not closed:
    their owner does that (e.g. ``SpanSink.shutdown()``).
    A target whose ``handle`` raises is logged once (logger ``ckpt_events.sinks.jsonl``) and
    listed in ``ReplayResult.failed`` with its first error; it is still handed its later
    batches, as the bus hands them to a sink that raised (so a replay matches the live run),
    and the other targets get every event whatever it does.
    With ``close_open`` (the default), the spans the log leaves open follow its last event,
    closed as truncated (``OpenSpans.close``), unless the log is named as a rotated file
    (``is_rotated``: ``<name>.<digits>`` as ``JsonLinesSink(max_bytes=...)`` and logrotate name
    them, or ``<name>-<date>`` as logrotate's ``dateext`` does, gzipped or not): its writer went on
    in a newer file, so they are only counted, in ``ReplayResult.cut``.
    """
    check_int(batch_size, f"batch_size must be a positive int, not {shown(batch_size)}", minimum=1)
    chosen = [_Target(i, t) for i, t in enumerate(targets)]
    corrupt: list[CorruptLine] = []
    corrupt_lines = 0
    count = 0
    open_spans = OpenSpans() if close_open else None
    unknown_fields = 0

    def without_fields(number: int, kind: str, names: tuple[str, ...]) -> None:
        # Was: dropped without a word, where the ``replay`` command counts and says them.
        nonlocal unknown_fields
        unknown_fields += 1

    for _, item in read_events(source, on_unknown_fields=without_fields):
        if isinstance(item, CorruptLine):
            # Counted past MAX_CORRUPT, not kept: a log of damage held every line (37 MB of
            # broken lines, 560 MB), where reading it holds one run of lines.
            corrupt_lines += 1
            if len(corrupt) < MAX_CORRUPT:
                corrupt.append(item)
            if open_spans is not None and item.ended is not None:
                open_spans.end(*item.ended[:2])  # ended, with what this version cannot read
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
    failed = tuple(f for f in (target.failure() for target in chosen) if f is not None)
    return ReplayResult(
        events=count,
        corrupt=tuple(corrupt),
        truncated=len(truncated),
        cut=cut,
        failed=failed,
        corrupt_lines=corrupt_lines,
        unknown_fields=unknown_fields,
    )


async def _emit_all(
    bus: Bus, batch: list[Any], wait_exported: Callable[[list[Any]], Awaitable[None]]
) -> None:
    """Emit ``batch`` onto ``bus`` and wait until its sinks handled it, flushing before the
    smallest buffer of the bus could fill (a buffer smaller than the batch dropped the rest),
    nor the smallest export queue of its sinks with ``force_flush`` (``wait_exported`` waits
    for those after each part)."""
    sinks = [sub.sink for sub in bus._subscriptions]
    bounds = [sub._buffer.capacity for sub in bus._subscriptions]
    bounds += [bound for bound in map(_queue_bound, filter(_flushable, sinks)) if bound is not None]
    room = min(bounds, default=len(batch))
    for start in range(0, len(batch), room):
        if bus._closed:
            raise InvalidValueError("the bus closed during the replay: the rest of the log was not replayed")
        for event in batch[start : start + room]:
            bus.emit(event)
        await _flush(bus)
        await wait_exported(sinks)


def _flushable(sink: object) -> bool:
    return callable(getattr(sink, "force_flush", None))


def _queue_bound(sink: object) -> int | None:
    """How many spans ``sink`` takes at a time without dropping: its ``max_queue``
    (``OtlpSpanSink``), else its ``max_export_batch`` (``SpanSink``: what it hands a processor at
    a time, within a ``BatchSpanProcessor``'s default queue of 2,048), else not known (``None``)."""
    for name in ("max_queue", "max_export_batch"):
        value = getattr(sink, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


async def _flush(bus: Bus) -> None:
    """``bus.flush()``, also for a bus whose loop runs in another thread (``EventCapture``'s):
    there the flush runs on that loop, waited for from a worker thread so this loop goes on."""
    if not bus._off_its_loop():
        await bus.flush()
        return
    # Was: bus.flush() raised "flush on the event loop's thread", and every delivered event was
    # reported as failed.
    await anyio.to_thread.run_sync(bus._flush_from_thread, abandon_on_cancel=True)


def is_rotated(log: str | os.PathLike[str] | IO[bytes]) -> bool:
    """Whether ``log`` (a path, or a file with its path as ``name``) is named as a rotated file
    (``sinks.jsonl.rotated_name``: ``run.jsonl.1``, ``run.jsonl-20261203`` as logrotate's
    ``dateext`` names it, either with ``.gz`` as its ``compress`` leaves it): one its writer went
    on from, not its last."""
    name = getattr(log, "name", None) if not isinstance(log, str | os.PathLike) else os.fspath(log)
    return isinstance(name, str) and rotated_name(name) is not None


# Pickles, reprs and tracebacks name the public module (_public_home.py says why).
publish("ckpt_events.sinks", ReplayFailure, ReplayResult)
# Not ckpt_events.sinks: its submodule ckpt_events.sinks.replay, once imported, shadows the function there.
publish("ckpt_events.sinks.replay", is_rotated, replay)
