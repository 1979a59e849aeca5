"""What ``watch``'s view remembers of one participant between refreshes (``Seen``): its phase, its
open work (``Open``) and the finished work that passed it, and what its clocks are known to be:
the offsets its polls measured, and each writer's newest stamp in its logs (``written``), which
bounds how far its clock can be ahead of ours while it runs forward (``STEP_BACK_S``).

``FleetView`` (``view``) folds polls and events into these and draws them.
"""

from __future__ import annotations

import collections
from typing import Final

from ckpt_events.vocab import Operation

__all__ = [
    "ADMITTING",
    "STEP_BACK_S",
    "STEP_FORWARD_S",
    "Done",
    "Open",
    "Seen",
    "Writer",
    "correction",
    "passes",
    "written",
]

#: Clock samples kept per participant; the one with the shortest round trip is used (as NTP's
#: clock filter does).
_CLOCK_SAMPLES: Final = 8
#: Finished operations kept per participant to tell open work it passed (a backlog hands on 8).
_DONE_KEPT: Final = 16
#: A writer's stamp this far (seconds) before one it wrote earlier: its clock was stepped back. A
#: process writes its events in the order they happen, to within a batch (milliseconds).
STEP_BACK_S: Final = 1.0
#: An open span's age by the wall clocks (ours, its writer's stamps) this far (seconds) past what
#: our monotonic clock measured since we first read its start: a clock stepped forward (NTP, a VM
#: resumed), ours or its writer's. Reads lag writes by a refresh and a flush (about 2 s).
STEP_FORWARD_S: Final = 5.0
#: How far (seconds) two of a participant's clock samples may disagree beyond their errors and
#: still be of one clock: drift over the samples kept is milliseconds (500 ppm at most by NTP).
_CLOCK_DRIFT_S: Final = 0.05
#: Writers (a participant's worker processes) whose stamps are followed; past it, the first forgotten.
_WRITERS_KEPT: Final = 64


class Open:
    __slots__ = (
        "back",
        "checkpoint_id",
        "cut",
        "operation",
        "parent",
        "passed",
        "read_age",
        "read_mono",
        "stalled",
        "start_ns",
        "stepped",
        "trace_id",
        "worker",
    )

    def __init__(
        self, operation: str, checkpoint_id: str | None, start_ns: int, worker: int | None, read_mono: float
    ) -> None:
        self.operation = operation
        self.checkpoint_id = checkpoint_id
        self.start_ns = start_ns
        self.worker = worker
        self.stalled = False
        #: The same process slot started later work and finished it (see ``passes``).
        self.passed = False
        #: Its writer's stamps went back in time since it opened: its start is of another clock.
        self.stepped = False
        #: Its writer's stamps went back past ``STEP_BACK_S`` since it opened, and it is not yet
        #: known whether its clock stepped back (``stepped``) or a batch was written late.
        self.back = False
        #: The rotated file it was read from, the newest given of its log (``LogFollower.cut``):
        #: it may have ended in a newer file not read, so its age is unknown. ``None``: not so.
        self.cut: str | None = None
        #: Our monotonic clock when its start was first read, and its least age then (seconds; 0
        #: when its writer's stamps ran ahead of our clock then): what it is at least now, whatever
        #: a wall clock did since.
        self.read_mono = read_mono
        self.read_age = 0.0
        #: Its trace, and the span that called it (``None``: not given): the controller's open
        #: work it is a call of (``FleetView`` tells what the controller waits on by them).
        self.trace_id = 0
        self.parent: int | None = None


#: A finished operation, as open work is compared with it: (start, worker, operation, checkpoint
#: id), kept only for a prepare or restore that ended well (``ADMITTING``).
Done = tuple[int, int | None, str, str | None]
#: The operations that admit a checkpoint: one that ended well was not refused as a conflict.
ADMITTING: Final = frozenset((Operation.PREPARE.value, Operation.RESTORE.value))


def passes(item: Open, done: Done) -> bool:
    """Whether ``done`` (a prepare or restore that ended well) shows ``item`` is no longer
    running: the same participant and worker started it later, for another checkpoint or the
    same operation again. A participant admits one checkpoint at a time (another id is refused
    as a conflict while one is active, a restore only from idle), so the process that opened
    ``item`` is gone (killed, then restarted under its name to a new log) or moved on: whether
    ``item`` still runs is unknown, never a stall."""
    start, worker, operation, checkpoint_id = done
    return (
        start > item.start_ns
        and worker == item.worker
        and (checkpoint_id != item.checkpoint_id or operation == item.operation)
    )


class Writer:
    """One writer's (a worker process's) clock as its logs show it: the newest stamp it wrote, and
    the least its clock can be ahead of ours (seconds; negative: behind): an event stamped t that
    we read at r was written by r, so its clock was >= t - r ahead, while it runs forward."""

    __slots__ = ("ahead", "back_ahead", "back_newest_ns", "back_ns", "newest_ns")

    def __init__(self, newest_ns: int, ahead: float) -> None:
        self.newest_ns = newest_ns
        self.ahead = ahead
        #: Its stamps went back past ``STEP_BACK_S`` to this one (``None``: they did not): its clock
        #: stepped back, or one of its processes wrote a batch late (its loop held up). Which is
        #: told by the stamps that follow: back near ``newest_ns``, a late batch; running on a
        #: second from here without coming back, a step.
        self.back_ns: int | None = None
        #: The newest stamp, and the least its clock can be ahead, since they went back.
        self.back_newest_ns = 0
        self.back_ahead = 0.0


class Seen:
    """What the view remembers of one participant between refreshes."""

    __slots__ = (
        "at_start",
        "clocks",
        "done",
        "ended",
        "grace",
        "lease_at",
        "logged",
        "open",
        "outcomes",
        "phase",
        "since",
        "stepped",
        "untracked",
        "writers",
    )

    def __init__(self) -> None:
        self.phase: tuple[str, str | None] | None = None
        #: Events from the logs were read about it (else it is known from its polls alone).
        self.logged = False
        #: Our monotonic clock when its phase was first seen (a wall clock may step since).
        self.since = 0.0
        #: The phase was already there at the first poll, or at the first answer after a gap in
        #: its answers: its time is at least what is shown.
        self.at_start = False
        self.lease_at: float | None = None
        self.grace: float | None = None
        self.open: dict[tuple[int, int], Open] = {}
        #: The last spans seen to end (``FleetView`` bounds them), oldest first.
        self.ended: collections.OrderedDict[tuple[int, int], None] = collections.OrderedDict()
        self.untracked = 0
        #: Its last ``LAST_CHECKPOINTS`` outcomes by end time (end, arrival, line), in that order:
        #: two workers' logs are read one after the other.
        self.outcomes: list[tuple[int, int, str]] = []
        #: Its latest finished operations, for work opened before them (``passes``).
        self.done: collections.deque[Done] = collections.deque(maxlen=_DONE_KEPT)
        #: (offset, error) of its last polls: its clock minus our monotonic clock, in seconds,
        #: so a sample stays true when our wall clock steps (``clock``), and only samples that
        #: agree with the newest within their errors (``polled``).
        self.clocks: collections.deque[tuple[float, float]] = collections.deque(maxlen=_CLOCK_SAMPLES)
        #: Its writers' clocks by its logs (``written``), by worker.
        self.writers: dict[int | None, Writer] = {}
        #: A writer's stamps went back in time: its clocks are not one forward-running clock.
        self.stepped = False

    def ahead(self, worker: int | None) -> float | None:
        """The least its clock can be ahead of ours by its logs, for work ``worker`` opened: by
        every writer's stamps (one host's clock), by ``worker``'s own once one stepped back."""
        if self.stepped:
            writer = self.writers.get(worker)
            return None if writer is None else writer.ahead
        return max((writer.ahead for writer in self.writers.values()), default=None)

    def ahead_since_back(self, worker: int | None) -> float | None:
        """While ``worker``'s stamps are back past ``STEP_BACK_S`` and it is not yet known whether
        its clock stepped back or one of its processes wrote a batch late: the least its clock
        can be ahead of ours by the stamps since (``None`` when they are not back)."""
        writer = self.writers.get(worker)
        return None if writer is None or writer.back_ns is None else writer.back_ahead

    def polled(self, offset: float, error: float, base: float) -> None:
        """Fold in a poll's clock sample: ``offset`` (its clock minus our wall clock, within
        ``error``) measured when our wall clock was ``base`` seconds ahead of our monotonic one.
        Earlier samples that disagree with it past both errors (its clock stepped since, or
        drifted past ``_CLOCK_DRIFT_S``) are dropped: they say nothing of its clock now."""
        sample = offset + base
        kept = [(s, e) for s, e in self.clocks if abs(s - sample) <= e + error + _CLOCK_DRIFT_S]
        self.clocks.clear()
        self.clocks.extend(kept)
        self.clocks.append((sample, error))

    def clock(self, base: float) -> tuple[float, float] | None:
        """(correction, uncertainty) for its times against our wall clock, in seconds, when ours
        is ``base`` seconds ahead of our monotonic clock (``now - mono``); ``None`` when never
        polled with a time. An offset within its own error is taken as none (clocks in sync).
        Its samples are against our monotonic clock: one taken before our wall clock stepped
        (NTP, a VM resumed) made every age after the step off by the step (was: a prepare open
        6 s shown 60.1 min STALLED after an hour's step)."""
        if not self.clocks:
            return None
        sample, error = min(self.clocks, key=lambda sample: sample[1])
        offset = sample - base
        return (0.0, abs(offset) + error) if abs(offset) <= error else (offset, error)


def written(seen: Seen, stamp_ns: int, read_at: float, worker: int | None) -> None:
    """Fold an event ``worker`` stamped ``stamp_ns``, read by ``read_at`` (ours), into the least
    its clock can be ahead of ours. Stamps ``STEP_BACK_S`` before the newest it wrote that run on
    a second without coming back: its clock was stepped back, what it wrote before says nothing of
    its clock now, and its open work's starts are of the clock before the step. Stamps that come
    back were a batch written late (several processes appending to one log): no step."""
    ahead = stamp_ns / 1e9 - read_at
    writer = seen.writers.get(worker)
    if writer is None:
        if len(seen.writers) >= _WRITERS_KEPT:
            del seen.writers[next(iter(seen.writers))]
        seen.writers[worker] = Writer(stamp_ns, ahead)
        return
    back = writer.newest_ns - stamp_ns
    if back <= STEP_BACK_S * 1e9:
        if writer.back_ns is not None:
            # Back near its newest stamp: what went back was a batch written late (several
            # processes appending to one log, one of them held up), not a clock stepped back. Was:
            # taken for a step at once, so another process's work, hung 20 s, was "age unknown
            # (clock stepped back?)" for ever.
            writer.back_ns = None
            for item in seen.open.values():
                item.back = item.back and item.worker != worker
        writer.newest_ns = max(writer.newest_ns, stamp_ns)
        writer.ahead = max(writer.ahead, ahead)
        return
    if writer.back_ns is None:
        writer.back_ns = writer.back_newest_ns = stamp_ns
        writer.back_ahead = ahead
        for item in seen.open.values():
            item.back = item.back or item.worker == worker
    else:
        writer.back_ns = min(writer.back_ns, stamp_ns)
        writer.back_newest_ns = max(writer.back_newest_ns, stamp_ns)
        writer.back_ahead = max(writer.back_ahead, ahead)
    if writer.back_newest_ns - writer.back_ns < STEP_BACK_S * 1e9:
        return
    # Its stamps ran on a second without coming back: its clock stepped back. Was: the stamps
    # before the step, 300 s ahead, made work opened after it 5 min STALLED.
    seen.stepped = True
    for item in seen.open.values():
        item.stepped = item.stepped or (item.worker == worker and item.back)
        item.back = item.back and item.worker != worker
    writer.newest_ns = writer.back_newest_ns
    writer.ahead = writer.back_ahead
    writer.back_ns = None


def correction(seen: Seen, base: float) -> float:
    clock = seen.clock(base)
    return 0.0 if clock is None else clock[0]
