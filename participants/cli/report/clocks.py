"""Clocks across processes: how far each participant's wall clock sits from its caller's, from
what the logs prove, and nothing else.

A participant's operation that answers a controller's call (its parent is the controller's
client span, a prepare stage or a fanned-out coordinate operation, reached by ``traceparent``)
ran inside that call: its request arrived (``received_ns``, else its start) after the call
started and it ended before the call ended. Each such pair bounds the participant's clock
offset ``d`` (added to its stamps) to ``[call.start - op.arrival, call.end - op.end]``. The
pairs of one process narrow the range (one constant skew per process; Jaeger's clock-skew
adjuster shifts span by span the same way). When the range holds 0, the clocks already agree
with everything the logs show and nothing is shifted; when it does not, the process is shifted
by the middle of the range (the unknown transit split evenly between request and reply); when
no single shift fits every pair (a clock that stepped during the run), nothing is shifted and
the report says so.
A ``serve --workers`` worker answers its main process, not the controller, so no call bounds
its clock: it runs on its main process's host, and is shifted with it (its prepares, left
unshifted, made a 9 ms checkpoint's pause 40 s).

A span's duration is read from its own process's clock alone (``events.duration_ns``); a
figure spanning processes (the fleet's pause, a waterfall, the logs' time) needs this
alignment, and where an operation still sits outside its call (``outside``) that figure is
unknown. Memory is bounded: the calls waiting for their answers (and answers for their
calls) are the last ``PENDING`` of each.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Final, TypeAlias

import msgspec

from ckpt_events import (
    CheckpointEvent,
    CollectionFinished,
    CollectionStarted,
    CoordinateFinished,
    CoordinateStarted,
    GenerationCut,
    LeaseExpired,
    OperationFinished,
    OperationStarted,
    PrepareNotReady,
    Refused,
    StageFinished,
    StageStarted,
    Stalled,
    StepFinished,
    StepStarted,
)
from ckpt_events.participants.cli.report.events import who_of
from ckpt_events.participants.cli.words import counted
from ckpt_events.vocab import Kind, Outcome, SpanKind, span_kind_of

__all__ = ["ClockEvidence", "Offsets", "Process", "process_of", "shifted"]

#: A process: participant kind, instance, worker index.
Process: TypeAlias = tuple[str, str, int | None]
#: Nanoseconds to add to each process's wall-clock stamps.
Offsets: TypeAlias = Mapping[Process, int]
#: Calls kept waiting for an answer (and answers for their call): a participant whose clock is
#: ahead logs its answers after the call ended, one behind logs them before it started.
PENDING: Final = 1024
#: Aligned clocks named one a line; the rest are counted.
SHOWN: Final = 5
#: The upper bound a call that ended in error gives: none. The controller gave up on it (its
#: own deadline, a cancel, a timeout) and the participant may still have been working after.
_UNBOUNDED: Final = 1 << 62


def process_of(e: CheckpointEvent) -> Process:
    """The process that wrote ``e``."""
    return (str(e.kind), e.instance, e.worker)


def _who(process: Process) -> str:
    kind, instance, worker = process
    return "controller" if kind == Kind.CONTROLLER else who_of(kind, instance, worker)


def _seconds(ns: float) -> str:
    if abs(ns) >= 1e9:
        return f"{ns / 1e9:+.1f} s"
    if abs(ns) >= 50_000:
        return f"{ns / 1e6:+.1f} ms"
    return f"{ns / 1e3:+.1f} us"  # a shift of microseconds read "by +0.0 ms": aligned by nothing?


def shifted(e: CheckpointEvent, by: int) -> CheckpointEvent:
    """``e`` with every wall-clock stamp moved by ``by`` ns (durations unchanged)."""
    replace = msgspec.structs.replace
    match e:
        case OperationFinished(received_ns=received) if received is not None:
            return replace(e, start_ns=e.start_ns + by, end_ns=e.end_ns + by, received_ns=received + by)
        case (
            OperationFinished()
            | StepFinished()
            | CoordinateFinished()
            | StageFinished()
            | CollectionFinished()
        ):
            return replace(e, start_ns=e.start_ns + by, end_ns=e.end_ns + by)
        case OperationStarted() | StepStarted() | CoordinateStarted() | StageStarted() | CollectionStarted():
            return replace(e, start_ns=e.start_ns + by)
        case LeaseExpired() | PrepareNotReady() | Refused() | GenerationCut() | Stalled():
            return replace(e, time_ns=e.time_ns + by)


@dataclass
class _Range:
    low: int
    high: int
    pairs: int = 1


@dataclass
class ClockEvidence:
    """Per participant process, the offsets its calls allow (see the module docstring).

    Feed it every event (``add``); ``offsets()`` says what to shift, ``lines()`` what was done."""

    #: The event types ``add`` looks at (a caller may skip the others).
    TYPES: ClassVar[frozenset[type]] = frozenset((OperationFinished, StageFinished, CoordinateFinished))
    ranges: dict[Process, _Range] = field(default_factory=dict)
    #: Traces where an operation sat outside its call by these stamps (a clock no shift fits).
    outside: set[int] = field(default_factory=set)
    #: The workers seen (``serve --workers``): each is shifted with its main process.
    workers: set[Process] = field(default_factory=set)
    #: (start, end) of each call; its end ``None`` when it ended in error (no upper bound).
    _calls: OrderedDict[tuple[int, int], tuple[int, int | None]] = field(default_factory=OrderedDict)
    _answers: OrderedDict[tuple[int, int], list[tuple[Process, int, int]]] = field(
        default_factory=OrderedDict
    )

    def add(self, e: CheckpointEvent) -> None:
        # Exact class tests: a class pattern on a Struct goes through msgspec's metaclass, and
        # the report's read passes here for every end of an operation, a stage, a coordination.
        if type(e) is OperationFinished:
            if e.worker is not None:
                self.workers.add(process_of(e))
            parent = e.parent_span_id
            if e.parent_remote is True and isinstance(parent, int) and e.kind != Kind.CONTROLLER:
                # Its request arrived inside the call too: a 30 ms wait, its operation alone
                # aligned, sat 12.5 ms before the call began ('17.5 ms unattributed' of 45 ms).
                begin = e.start_ns if e.received_ns is None else min(e.received_ns, e.start_ns)
                call = self._calls.get((e.trace_id, parent))
                if call is not None:
                    self._pair(e.trace_id, process_of(e), call, begin, e.end_ns)
                    return
                waiting = self._answers.get((e.trace_id, parent))
                if waiting is None:
                    waiting = self._answers[(e.trace_id, parent)] = []
                    if len(self._answers) > PENDING:
                        self._answers.popitem(last=False)
                waiting.append((process_of(e), begin, e.end_ns))
        elif type(e) is StageFinished or type(e) is CoordinateFinished:
            self._call(e)

    def _call(self, e: StageFinished | CoordinateFinished) -> None:
        """A controller's call (a client span): pair it with the answers that came before it."""
        if span_kind_of(e) is not SpanKind.CLIENT:
            return
        key = (e.trace_id, e.span_id)
        call = self._calls[key] = (e.start_ns, e.end_ns if e.outcome != Outcome.ERROR else None)
        if len(self._calls) > PENDING:
            self._calls.popitem(last=False)
        for process, start, end in self._answers.pop(key, ()):
            self._pair(e.trace_id, process, call, start, end)

    def _pair(
        self, trace_id: int, process: Process, call: tuple[int, int | None], start: int, end: int
    ) -> None:
        low, high = call[0] - start, _UNBOUNDED if call[1] is None else call[1] - end
        if low > 0 or high < 0:
            self.outside.add(trace_id)
        bound = self.ranges.get(process)
        if bound is None:
            self.ranges[process] = _Range(low, high)
        else:
            bound.low = max(bound.low, low)
            bound.high = min(bound.high, high)
            bound.pairs += 1

    def offsets(self) -> dict[Process, int]:
        """Each process whose clock the logs prove off, and the shift that puts every one of
        its operations inside its call; processes that agree, or that no one shift fits, are
        left out."""
        own = {
            # Bounded below only (every call it answered ended in error): the least shift.
            p: (r.low + r.high) // 2 if r.high < _UNBOUNDED else r.low
            for p, r in self.ranges.items()
            if r.low <= r.high and not r.low <= 0 <= r.high
        }
        # A worker no call bounds shares its main process's host, so its clock.
        inherited = {
            w: by
            for w in self.workers
            if w not in self.ranges and (by := own.get((w[0], w[1], None))) is not None
        }
        return own | inherited

    def bounds(self, process: Process) -> tuple[int, int | None] | None:
        """The shifts the calls still allow ``process``'s stamps as read (high ``None``: no upper
        bound, every call it answered ended in error); ``None`` when no call bounds its clock
        (a worker goes by its main process's) or no one shift fits it."""
        r = self.ranges.get(process) or self.ranges.get((process[0], process[1], None))
        if r is None or r.low > r.high:
            return None
        return r.low, None if r.high >= _UNBOUNDED else r.high

    def unaligned(self) -> list[Process]:
        """The processes no one shift fits (a clock that moved during the run)."""
        return [p for p, r in self.ranges.items() if r.low > r.high]

    def lines(self, applied: Offsets) -> list[str]:
        """One line per process aligned (by ``applied``, the offsets this read used), the
        largest shifts first and past ``SHOWN`` counted, and one per process no shift fits."""
        out = []
        # A worker shifted with its main process is said on its main process's line.
        with_main: Counter[Process] = Counter(
            (p[0], p[1], None)
            for p, by in applied.items()
            if p[2] is not None and p not in self.ranges and applied.get((p[0], p[1], None)) == by
        )
        lines = {p: by for p, by in applied.items() if not (p[2] is not None and p not in self.ranges)}
        ordered = sorted(lines.items(), key=lambda kv: (-abs(kv[1]), str(kv[0])))
        for process, by in ordered[:SHOWN]:
            r = self.ranges.get(process)
            pairs = f"{r.pairs} of its operations" if r is not None else "its operations"
            workers = f" (and its {counted(n, 'worker')}')" if (n := with_main[process]) else ""
            out.append(
                f"aligned {_who(process)}'s clock{workers} by {_seconds(-by)} (shifted its stamps "
                f"{_seconds(by)}: {pairs} must sit inside the controller's calls)"
            )
        if rest := ordered[SHOWN:]:
            most = _seconds(abs(rest[0][1])).removeprefix("+")
            out.append(f"... and {len(rest)} more clocks aligned, none by more than {most}")
        for process, r in sorted(self.ranges.items(), key=lambda kv: str(kv[0])):
            if r.low > r.high:
                out.append(
                    f"could not align {_who(process)}'s clock: no one shift puts its "
                    f"{r.pairs} operations inside the controller's calls (they disagree by "
                    f"{(r.low - r.high) / 1e6:,.1f} ms: a clock that stepped?); the figures across "
                    "processes that involve it are unknown where it answered outside a call"
                )
        return out
