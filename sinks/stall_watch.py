"""``StallWatch``: one warning per checkpoint operation that stays open past a threshold.

Per event it costs a dict insert (``*Started``) or delete (``*Finished``) under one lock per
batch; a timer thread wakes once a second, or sooner when an operation comes due, and only
while something is open. An
operation open longer than ``after`` seconds is logged once (operation, participant, checkpoint
id, phase, age) and counted as a ``Stalled`` event on ``bus``, so every metric sink counts it in
``gym.checkpoint.events_total`` and the JSON lines keep it; when it ends, a second line says
how long it took. A controller's operation waits on calls: its line says on whom (a
participant's operation of its checkpoint open on this bus, else its open stage, else unknown),
never that the controller stalled; it is still counted (it is open past the threshold). Ages
run on the monotonic clock from when the watch saw the operation start
(plus how late it saw it), so a wall-clock step (NTP, a resumed VM) neither hides a stall nor
makes one. How late is read on the clock the stamps are on (``_wallclock``), less how far it
stepped forward in the last ``_STEP_UNSURE_NS``: a start stamped on the offset before the step
would look an hour late after a step an hour forward.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Final

import anyio.from_thread
import anyio.to_thread

from ckpt_events import (
    Bus,
    CoordinateFinished,
    CoordinateStarted,
    InvalidTypeError,
    OperationFinished,
    OperationStarted,
    StageFinished,
    StageStarted,
    Stalled,
    _wallclock,
)
from ckpt_events._errors import check_number, shown
from ckpt_events._logs import library_logger
from ckpt_events.sinks._open_work import MAX_OPEN
from ckpt_events.vocab import Kind, Operation, Outcome, Phase

__all__ = ["ENV_STALL_AFTER", "StallWatch"]

logger: Final = library_logger("ckpt_events.sinks.stall")

#: Set to a number of seconds, ``configure()`` and ``serve`` subscribe a ``StallWatch(after=...)``.
ENV_STALL_AFTER: Final = "CKPT_EVENTS_STALL_AFTER"
#: The phase a participant is in while an operation runs, when the operation says so itself.
_PHASE_DURING: Final = {Operation.PREPARE: Phase.PREPARING}
#: How long a check waits for the bus to deliver what was emitted before reporting anyway (a
#: stuck sink elsewhere on the bus must not silence the watch).
_CATCH_UP_TIMEOUT: Final = 1.0
#: The shortest the timer sleeps between looks: operations coming due together cost one look.
_MIN_WAIT: Final = 0.01
#: After the wall clock's offset moved (a step followed), how long a start may still come
#: stamped on the old one: every process on the host follows a step within ``RECALIBRATE_NS`` of it, each at
#: its own moment, so stamps of the old offset keep arriving for that long.
_STEP_UNSURE_NS: Final = 2 * _wallclock.RECALIBRATE_NS
#: Whom a controller's operation waits on when none of its calls or stages is seen on this bus.
_UNKNOWN: Final = "unknown"
#: Its warning and end line, by whom it waits on: known, unknown, a participant's own stall.
_SAID: Final = {None: ("stalled: ", "stall"), _UNKNOWN: ("stalled or waiting (unknown): ", "stall or wait")}


def _how_it_ended(event: OperationFinished | CoordinateFinished) -> str:
    """How a stalled operation ended, in words: a prepare that answered not ready, or a
    coordinate.prepare that stopped at a stage, ended ``ok`` as a span, and saying "ok" of the
    very prepare that aborted its checkpoint (``demo --fault stall --watch``) misled."""
    if event.outcome != Outcome.OK:
        return str(event.outcome)
    if isinstance(event, CoordinateFinished) and event.prepared is False:
        return f"not prepared (stopped at stage {event.stopped_at or '?'})"
    if isinstance(event, OperationFinished) and event.operation == Operation.PREPARE and event.blockers:
        return f"not ready ({event.blockers} blocking)"
    return str(event.outcome)


class _Open:
    __slots__ = (
        "checkpoint_id",
        "instance",
        "kind",
        "operation",
        "owner",
        "since_ns",
        "span_id",
        "stalled",
        "start_ns",
        "waiting_on",
        "worker",
    )

    def __init__(self, event: Any, kind: str, since_ns: int, owner: int | None) -> None:
        self.kind = kind
        #: The delivery task that saw it start (its subscription), ``None`` off the event loop.
        self.owner = owner
        self.instance: str = event.instance
        self.operation: Operation = event.operation
        self.checkpoint_id: str | None = event.checkpoint_id
        self.start_ns: int = event.start_ns
        self.span_id: int = event.span_id
        #: The start on the monotonic clock: its age never jumps with the wall clock.
        self.since_ns = since_ns
        self.worker: int | None = event.worker
        self.stalled = False
        #: Of a controller's operation reported: whom it was waiting on then, or ``None``.
        self.waiting_on: str | None = None

    def describe(self) -> str:
        cid = self.checkpoint_id or "-"
        return f"{self.operation} of {self.kind} {self.instance} (checkpoint {cid}"


class StallWatch:
    """A bus sink warning once about each operation open longer than ``after`` seconds.

    ``bus``: where to count ``Stalled`` events (``None``: log only). The timer thread starts
    with the first batch and stops in ``aclose`` (the bus awaits it when it closes). At most
    ``MAX_OPEN`` open operations are watched; the rest are counted in ``untracked``, warned once.
    Before reporting, the timer has ``bus`` deliver what was emitted so far, so an end held up by
    a blocked event loop is not taken for a stall (the watch says the loop was late instead).
    """

    interests: Final = (
        OperationStarted,
        OperationFinished,
        CoordinateStarted,
        CoordinateFinished,
        StageStarted,
        StageFinished,
    )

    def __init__(self, after: float = 30.0, *, bus: Bus | None = None) -> None:
        # Finite: an infinite threshold (or one whose nanoseconds overflow an int) killed the
        # timer thread with an OverflowError at its first check, so nothing was ever reported.
        self.after = check_number(
            after,
            f"after must be a finite number of seconds > 0, not {shown(after)}",
            high=sys.float_info.max,
            low_open=True,
        )
        if bus is not None and not isinstance(bus, Bus):
            # Else the timer thread died of an AttributeError at the first stall, reporting no more.
            raise InvalidTypeError(f"bus must be a ckpt_events.Bus or None, not {shown(bus)}")
        self.bus = bus
        self._open: dict[int, _Open] = {}
        #: Open prepare stages by span id: (their coordinate operation's span id, stage name).
        self._stages: dict[int, tuple[int | None, str]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        #: The delivery tasks (one a subscription) that have handed this watch a batch and not
        #: closed it: a watch subscribed to two buses at once runs until both have closed.
        self._owners: set[int] = set()
        self.stalls = 0
        #: Operations not watched because ``MAX_OPEN`` were open (their ends lost, say).
        self.untracked = 0
        #: The wall clock's offset the last batch saw; until when (monotonic ns) since it moved
        #: a start may be stamped on an older one; how far forward it moved meanwhile.
        self._offset = _wallclock.CALIBRATION.offset
        self._unsure_until = -1
        self._stepped_ahead = 0

    def handle(self, batch: list[Any]) -> None:
        """Track what opens and closes; log the end of an operation that was reported stalled."""
        ended: list[tuple[_Open, int, str]] = []
        opened = self._open
        # Read once a batch: an operation started how long before this monotonic reading
        # (never less than 0: the wall clock may have stepped back since it started), on the
        # stamps' clock. Was: ``time.time_ns``, stepped an hour ahead while the stamps' offset
        # followed up to a second later: a 1.5 s commit begun then was "open for 3600.0 s".
        wall, mono_ns = _wallclock.wall_ns(), time.monotonic_ns()
        offset = _wallclock.CALIBRATION.offset
        if offset != self._offset:
            # Stepped forward: a start stamped on the old offset looks that much later than it
            # was (stepped back: earlier, which ages it less, never a false stall).
            held = self._stepped_ahead if mono_ns < self._unsure_until else 0
            self._stepped_ahead = held + max(0, offset - self._offset)
            self._offset = offset
            self._unsure_until = mono_ns + _STEP_UNSURE_NS
        ahead = self._stepped_ahead if mono_ns < self._unsure_until else 0
        untracked = 0
        owner = _current_task()
        with self._lock:
            if owner is not None:
                self._owners.add(owner)
            for event in batch:
                cls = event.__class__
                if cls is StageStarted:
                    if len(self._stages) < MAX_OPEN:
                        self._stages[event.span_id] = (event.parent_span_id, event.stage)
                    continue
                if cls is StageFinished:
                    self._stages.pop(event.span_id, None)
                    continue
                if cls is OperationStarted or cls is CoordinateStarted:
                    if len(opened) >= MAX_OPEN:
                        untracked += 1
                        continue
                    kind = event.kind if cls is OperationStarted else Kind.CONTROLLER
                    since = mono_ns - max(0, wall - event.start_ns - ahead)
                    opened[event.span_id] = _Open(event, kind, since, owner)
                else:
                    entry = opened.pop(event.span_id, None)
                    if entry is not None and entry.stalled:
                        ended.append((entry, event.end_ns, _how_it_ended(event)))
        if untracked:
            if not self.untracked:
                logger.warning(
                    "stall watch: %d operations open, the most it tracks; later ones are not watched "
                    "(counted in StallWatch.untracked); ends dropped by a full buffer (bus.stats()) "
                    "leave operations open here",
                    MAX_OPEN,
                )
            self.untracked += untracked
        for entry, end_ns, outcome in ended:
            logger.warning(
                "%s ended: %s) ended %s after %.1f s",
                _SAID.get(entry.waiting_on, ("", "wait"))[1],
                entry.describe(),
                outcome,
                (end_ns - entry.start_ns) / 1e9,
            )
        if opened and (self._thread is None or not self._wake.is_set()):
            self._start()
            self._wake.set()

    def _start(self) -> None:
        if self._thread is None:
            # A stop of its own: a thread aclose() gave up waiting for still ends at its next look,
            # while the watch, subscribed again, runs a new one.
            self._stopped = stopped = threading.Event()
            self._thread = threading.Thread(
                target=self._run, args=(stopped,), name="ckpt-events-stall-watch", daemon=True
            )
            self._thread.start()

    def _run(self, stopped: threading.Event) -> None:
        while True:
            self._wake.wait()  # idle until something is open
            if stopped.is_set():
                return
            self.check()
            with self._lock:
                if not self._open:
                    self._wake.clear()
            if stopped.wait(self._next_check()):
                return

    def _next_check(self) -> float:
        """Seconds until the oldest unreported operation comes due, within ``[_MIN_WAIT, 1]``.
        Was: a flat second, so with ``after`` 0.3 an operation open 0.9 s, or with ``after`` 30
        one open 30.5 s, ended between two looks and was never reported."""
        with self._lock:
            oldest = min((e.since_ns for e in self._open.values() if not e.stalled), default=None)
        if oldest is None:
            return 1.0
        due_in = (oldest - time.monotonic_ns()) / 1e9 + self.after
        return min(1.0, max(_MIN_WAIT, due_in))

    def check(self, now_ns: int | None = None) -> int:
        """Report every operation open past ``after`` at ``now_ns`` (Unix ns, default now) not
        reported yet; returns how many. Ages are read on the monotonic clock: ``now_ns`` only
        says how far from the present to look."""
        wall_ns, mono_ns = time.time_ns(), time.monotonic_ns()
        if now_ns is None:
            now_ns = wall_ns
        else:
            mono_ns += now_ns - wall_ns
        threshold = self.after * 1e9  # a float: a huge ``after`` is never reached, not an overflow
        with self._lock:
            any_due = any(not e.stalled and mono_ns - e.since_ns >= threshold for e in self._open.values())
        if any_due:
            self._catch_up()
        with self._lock:
            due = [e for e in self._open.values() if not e.stalled and mono_ns - e.since_ns >= threshold]
            for entry in due:
                entry.stalled = True
                if entry.kind == Kind.CONTROLLER:
                    entry.waiting_on = self._holders(entry)
        for entry in due:
            age = (mono_ns - entry.since_ns) / 1e9
            phase = _PHASE_DURING.get(entry.operation)
            said = phase.value if phase is not None else "-"
            if entry.waiting_on in _SAID:
                logger.warning(
                    "%s%s, phase %s) open for %.1f s (threshold %g s)",
                    _SAID[entry.waiting_on][0],
                    entry.describe(),
                    said,
                    age,
                    self.after,
                )
            else:
                logger.warning(
                    "waiting: %s, phase %s) waiting on %s, open for %.1f s (threshold %g s)",
                    entry.describe(),
                    said,
                    entry.waiting_on,
                    age,
                    self.after,
                )
            if self.bus is not None:
                self.bus.emit(
                    Stalled(
                        entry.kind,
                        entry.instance,
                        now_ns,
                        entry.operation,
                        age,
                        phase,
                        entry.checkpoint_id,
                        entry.worker,
                    )  # positional, in field order
                )
        self.stalls += len(due)
        return len(due)

    def _holders(self, entry: _Open) -> str:
        """Whom a controller's operation waits on (under the lock): the participants' operations
        of its checkpoint open on this bus (in-process servers share it), else its open stage
        (its calls are in other processes), else ``_UNKNOWN``. The controller's operations wait
        on calls (a commit fans out with no stage), so it is never said stalled: ``demo --fault
        stall --watch`` warned "stalled: prepare of controller coordination" beside the stuck
        environment-0, two stalls where one party stalled."""
        cid = entry.checkpoint_id
        names = sorted(
            {
                f"{e.kind}/{e.instance}"
                for e in self._open.values()
                if e.kind != Kind.CONTROLLER and cid is not None and e.checkpoint_id == cid
            }
        )
        if names:
            return ", ".join(names)
        mine = entry.span_id
        stages = sorted(stage for parent, stage in self._stages.values() if parent == mine)
        if stages:
            return f"its {', '.join(stages)} stage (calls not seen here)"
        return _UNKNOWN

    def _catch_up(self) -> None:
        """From the timer thread: have ``bus`` deliver what was emitted so far before a stall is
        reported. Was: an operation that ended while the event loop was blocked (its end emitted,
        not yet delivered) was reported stalled, then "ended ok after 0.0 s"."""
        bus = self.bus
        if bus is None or bus._closed or not bus._off_its_loop():
            return
        began = time.monotonic()
        try:
            bus._flush_from_thread(_CATCH_UP_TIMEOUT)
        except Exception:  # the loop has gone (closed): nothing more will be delivered
            return
        late = time.monotonic() - began
        if late >= self.after:
            logger.warning(
                "stall watch: the event loop answered %.1f s late (it was blocked: every operation "
                "open meanwhile looks stalled; look for a synchronous call holding the loop)",
                late,
            )

    async def aclose(self) -> None:
        """Stop the timer thread (it sleeps at most a second) and forget what is open: their ends
        will not reach this watch. Idempotent; subscribed again, the watch starts afresh.
        Subscribed to two buses at once, closing one forgets only what that one opened."""
        owner = _current_task()
        with self._lock:
            if owner is not None:
                self._owners.discard(owner)
            for key in [k for k, e in self._open.items() if e.owner is None or e.owner == owner]:
                del self._open[key]
            # Was: the first bus to close cleared every open operation and stopped the timer, so
            # a stall on the other bus, still running, was never reported.
            if self._owners and owner is not None:
                return
            self._open.clear()
            self._stages.clear()
        self._stopped.set()
        self._wake.set()
        thread = self._thread
        self._thread = None
        if thread is not None:
            await anyio.to_thread.run_sync(thread.join, 2.0)


def _current_task() -> int | None:
    """The running delivery task's id (one per subscription), ``None`` off the event loop (a
    blocking subscription's thread, a direct call)."""
    try:
        return anyio.get_current_task().id
    except Exception:  # no event loop in this thread
        return None
