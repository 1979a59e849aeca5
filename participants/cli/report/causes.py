"""Why a checkpoint did not publish: its causes, gathered as the logs stream past and said in
words naming the participant, for its row of the run overview.

What a failure leaves in the log:

- ``lease_expired`` (participant, phase), timed from that participant's prepare;
- ``prepare_not_ready`` (participant, blocker count);
- ``refused`` (code, participant);
- a controller span that records whose calls failed and how (``FAILURES_ATTRIBUTE``: a
  refusal before the body is read, a wrong token, names no checkpoint on the participant's
  side; the controller knows which checkpoint it was for);
- a span with outcome ``error`` (participant, the error's name and message); a controller span
  whose error only follows from a failure below it (a child that failed, or a prepare not
  ready, by the time it ended) is not a cause of its own, unless nothing else is named; one
  that ended first (its own deadline, a cancel) is, and comes first;
- spans started and never finished: the checkpoint is open at the end of the log, or, when it
  ended, a participant's operation never answered its call (its process was killed).

Gathered, never the events of a span: per trace a ``TraceCauses`` (the overview's fold fills
one as the trace streams past), per checkpoint id the counted events that name it
(``CheckpointCauses``). A counted event that names no checkpoint is no row's cause: the
overview counts it run-wide (``overview.Unscoped``).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final, TypeAlias

from ckpt_events import (
    CoordinateFinished,
    LeaseExpired,
    OperationFinished,
    OperationStarted,
    PrepareNotReady,
    Refused,
    StageFinished,
    StepFinished,
)
from ckpt_events.participants.cli.report.cancels import ended
from ckpt_events.participants.cli.report.events import (
    FinishedSpan,
    PointEvent,
    StartedSpan,
    what_of,
    who_of,
    who_wrote,
)
from ckpt_events.participants.cli.words import clipped, counted
from ckpt_events.participants.controller.types import FAILURES_ATTRIBUTE, MemberFailure, read_failures
from ckpt_events.participants.errors import HTTP_STATUS
from ckpt_events.participants.protocol import NOT_READY_WORKER_BLOCKERS, NOT_READY_WORKERS
from ckpt_events.vocab import Operation, Outcome

__all__ = [
    "CAUSES_SHOWN",
    "CAUSE_EVENTS",
    "KEPT_CAUSES",
    "CauseEvent",
    "CheckpointCauses",
    "OwnOperations",
    "SpanError",
    "TraceCauses",
    "causes_of",
    "is_refusal",
    "open_causes",
    "repeated",
    "shown",
    "never_finished_line",
    "unfinished_causes",
]

#: The counted events that name a checkpoint's cause.
CauseEvent: TypeAlias = LeaseExpired | PrepareNotReady | Refused
CAUSE_EVENTS: Final = (LeaseExpired, PrepareNotReady, Refused)
#: Causes shown per row; the rest are counted.
CAUSES_SHOWN: Final = 4
#: A cause's error message is cut (at a word) past this many characters.
_MESSAGE: Final = 160
#: Causes (refusals, lease expiries, prepares not ready) kept per checkpoint id, first in time;
#: the rest are counted (a million refusals naming one checkpoint took 520 MiB).
KEPT_CAUSES: Final = 64
#: (process, checkpoint id) pairs whose latest operation ``OwnOperations`` keeps, the latest used.
_OWN_OPERATIONS: Final = 4096


@dataclass(frozen=True)
class SpanError:
    """A span that ended in error: when, where in its trace, and what it says."""

    time_ns: int
    #: When the span started: the calls it records as failed were made then.
    start_ns: int
    span_id: int
    who: str
    operation: str
    #: ``prepare failed on agent/agent-0 (...)``: the span's own error in words.
    said: str
    #: Whose calls failed and how, as the controller recorded them on this span.
    members: list[MemberFailure]
    #: The span's parent in its trace (a step's: its operation's span).
    parent_span_id: int | None = None
    #: The step's name, for a participant's step (``write``); ``None`` for any other span.
    step: str | None = None
    #: The error's name, without its module path (``ValueError``, ``ProtocolRefusal``).
    error_name: str = ""
    #: ``ValueError: bad rows``: the error's name and message, uncut (a refusal's: its message).
    error: str = ""
    #: The worker of a multi-worker participant that ran the span (``None``: its main process).
    worker: int | None = None

    @property
    def member(self) -> str:
        """``kind/instance``: the participant, whichever of its processes ran the span."""
        return self.who if self.worker is None else self.who.removesuffix(f"/w{self.worker}")

    @property
    def detail(self) -> str:
        """The error's message without its name (a refusal's: without its code)."""
        return self.error.split(": ", 1)[-1]


#: The shared empty values of ``TraceCauses``'s mappings (read-only: never written to).
_NONE_BELOW: Final[Mapping[int, int]] = MappingProxyType({})
_NONE_NOT_READY: Final[Mapping[str, tuple[str, int]]] = MappingProxyType({})


@dataclass(slots=True)
class TraceCauses:
    """What one trace keeps for its row's causes after it streamed past: never its events."""

    #: Each participant's first prepare start, for "N s after its prepare".
    prepares: dict[str, int] = field(default_factory=dict)
    # What only a failed trace holds starts as one shared empty value, its own container made at
    # its first failure: four empty ones made for each trace were 240 bytes a checkpoint.
    #: Every span that ended in error.
    errors: Sequence[SpanError] = ()
    #: Spans with a failure below them (a child that ended in error or a prepare not ready),
    #: each with when the first such child ended: a failure that ended after its parent did
    #: (a participant refusing the resume of a prepare the controller gave up on) followed from
    #: the parent's end, not the other way round.
    first_failed_below: Mapping[int, int] = field(default_factory=lambda: _NONE_BELOW)
    #: ``prepare stopped at stage environment``: each coordinate.prepare that was not prepared
    #: (said only when nothing names why: the participants' logs are not all in).
    stops: Sequence[str] = ()
    #: Per participant, the workers that blocked its prepare at the deadline, in words, and how
    #: many of its blockers they were (``protocol.NOT_READY_WORKERS``): the rest are episodes.
    not_ready_workers: Mapping[str, tuple[str, int]] = field(default_factory=lambda: _NONE_NOT_READY)

    def prepare_finished(self, e: OperationFinished) -> None:
        """Keep which workers a participant's prepare ``e`` said blocked it, if any."""
        attributes = e.attributes or {}
        words, count = attributes.get(NOT_READY_WORKERS), attributes.get(NOT_READY_WORKER_BLOCKERS)
        if isinstance(words, str) and type(count) is int:
            workers = self.not_ready_workers if isinstance(self.not_ready_workers, dict) else {}
            workers[who_wrote(e)] = (words, count)
            self.not_ready_workers = workers

    def span_failed(self, e: FinishedSpan, t: int) -> None:
        """Keep what a finished span ``e`` (ended at ``t``) says if it failed: ended in error, or
        a coordinate.prepare not prepared; a span that did not fail keeps nothing."""
        failed = e.outcome == Outcome.ERROR
        if failed:
            errors = self.errors if isinstance(self.errors, list) else []
            errors.append(_error(e, t))
            self.errors = errors
        # A coordinate.prepare that was not prepared: stopped at a stage.
        if isinstance(e, CoordinateFinished) and e.prepared is False:
            failed = True
            stops = self.stops if isinstance(self.stops, list) else []
            stops.append(f"prepare stopped at stage {e.stopped_at or '?'}, not prepared")
            self.stops = stops
        if e.parent_span_id is not None and failed:
            below = self.first_failed_below if isinstance(self.first_failed_below, dict) else {}
            at = below.get(e.parent_span_id)
            below[e.parent_span_id] = t if at is None else min(at, t)
            self.first_failed_below = below


class OwnOperations:
    """Which trace a participant's counted event belongs to, by that participant's own clock.

    A server counts a refusal as its request's operation ends in error, and a lease it was given
    by an operation; so a counted event belongs to the trace of the latest operation its process
    started naming the same checkpoint id before it, both stamped by one clock. Matching by the
    controller's rows' start times instead put a refusal of a participant whose clock ran minutes
    ahead on the next restore of the same checkpoint. Fed in log order (each process's own events
    in its order); the latest ``_OWN_OPERATIONS`` pairs are kept."""

    def __init__(self) -> None:
        self._latest: OrderedDict[tuple[str, str, int | None, str], int] = OrderedDict()

    def started(self, e: OperationStarted) -> None:
        if e.checkpoint_id:
            key = (str(e.kind), e.instance, e.worker, e.checkpoint_id)
            self._latest.pop(key, None)
            self._latest[key] = e.trace_id
            if len(self._latest) > _OWN_OPERATIONS:
                self._latest.popitem(last=False)

    def trace_of(self, e: PointEvent) -> int | None:
        """The trace ``e`` belongs to; ``None`` when its process started no operation naming its
        checkpoint before it (in these logs)."""
        if not e.checkpoint_id:
            return None
        return self._latest.get((str(e.kind), e.instance, e.worker, e.checkpoint_id))


@dataclass
class CheckpointCauses:
    """The counted events that name a cause, by checkpoint id: the first ``KEPT_CAUSES`` read
    are kept, the rest only counted (``over``). An event equal in every field to one kept (of the
    same trace) is counted beside it, wherever it comes: a counted event has no id, so a copy (the
    log joined to itself) and a real repeat stamped alike are one cause, said with its count (the
    stall demo's log 1,000 times in one file said its cause 4 times "... and 996 more")."""

    #: Per checkpoint id, each kept (event, the trace it belongs to if known: ``OwnOperations``)
    #: in the order read, with how many events equal to it (of the same trace) were read.
    kept: dict[str, dict[tuple[CauseEvent, int | None], int]] = field(default_factory=dict)
    over: Counter[str] = field(default_factory=Counter)
    #: ``over`` by (checkpoint id, start of the latest root naming it read before, the trace it
    #: belongs to if known): an id reused by a later run counts its flood on that run's row, not
    #: the first's, and a flood by a clock running ahead on its own restore's, not the next.
    over_since: Counter[tuple[str, int | None, int | None]] = field(default_factory=Counter)

    def add(
        self, checkpoint_id: str, e: CauseEvent, since: int | None = None, trace: int | None = None
    ) -> None:
        """Keep ``e`` for ``checkpoint_id``, or count it past ``KEPT_CAUSES`` (``since``: the
        start of the latest root span naming that id read before it; ``trace``: the trace it
        belongs to, if known)."""
        kept = self.kept.setdefault(checkpoint_id, {})
        if (e, trace) in kept:  # a copy or a repeat of one kept
            kept[(e, trace)] += 1
        elif len(kept) < KEPT_CAUSES:
            kept[(e, trace)] = 1
        else:  # a flood naming one checkpoint: counted, never kept
            self.over[checkpoint_id] += 1
            self.over_since[(checkpoint_id, since, trace)] += 1

    def of(self, checkpoint_id: str | None) -> list[CauseEvent]:
        """The events kept for ``checkpoint_id`` in the order read (``[]`` for none)."""
        return [e for e, _, _ in self.traced(checkpoint_id)]

    def traced(self, checkpoint_id: str | None) -> list[tuple[CauseEvent, int | None, int]]:
        """The events kept for ``checkpoint_id``, each with the trace it belongs to, if known,
        and how many events equal to it were read (itself included)."""
        if not checkpoint_id:
            return []
        return [(e, trace, n) for (e, trace), n in self.kept.get(checkpoint_id, {}).items()]


def causes_of(
    traces: Sequence[TraceCauses],
    events: Sequence[CauseEvent],
    *,
    clocks_agree: bool = True,
    counts: Sequence[int] | None = None,
) -> tuple[list[str], bool]:
    """A row's causes from its ``traces`` and the counted ``events`` kept for its checkpoint,
    in time order (a controller error that only follows from a failure below it is said when
    nothing else is), and whether a counted one aborted it: a participant not ready at the
    deadline, or a lease that ran out.

    Without ``clocks_agree`` (a participant of the row answered outside the controller's call:
    a clock no one shift aligns), stamps of two processes do not order them: the causes that
    aborted it come first, each kind in time order (a lease expiry stamped 5 s late by a clock
    that stepped came after the refusals that followed from it, and was cut from the row).

    ``counts``: beside each of ``events``, how many equal to it were read (1 each if not given).
    A cause said more than once (copies of an event, or events alike) is said once, at its first
    time, with its count (``repeated``)."""
    timed, recorded, following = _span_causes(traces)
    counted_causes, aborted_by = _counted_causes(traces, events, recorded)
    aborting = {c for _, c, aborts, _ in counted_causes if aborts}
    ones = [(at, c, 1) for at, c in timed]
    ones += [(at, c, (1 if counts is None else counts[i])) for at, c, _, i in counted_causes]
    ones.sort(key=lambda c: c[0] if clocks_agree else (c[1] not in aborting, c[0]))
    said: dict[str, int] = {}
    for _, c, n in ones:
        said[c] = said.get(c, 0) + n
    return [repeated(c, n) for c, n in said.items()] or following, aborted_by


def repeated(cause: str, n: int) -> str:
    """``cause``, with how many times the logs said it when more than once: ``... (x1,000 in the
    logs: copies, or events alike)``."""
    return cause if n <= 1 else f"{cause} (x{n:,} in the logs: copies, or events alike)"


def shown(causes: Sequence[str], over: int) -> list[str]:
    """The first ``CAUSES_SHOWN`` of ``causes``, then ``... and N more`` for the rest and the
    ``over`` counted past ``KEPT_CAUSES`` (all of them when fewer causes than that are shown:
    1 cause and 1,000 over said "... and 997 more")."""
    rest = max(len(causes) - CAUSES_SHOWN, 0) + over
    more = [f"... and {rest:,} more"] if rest > 0 else []
    return [*causes[:CAUSES_SHOWN], *more]


def open_causes(spans: Iterable[StartedSpan], last_ns: int, *, cut: bool = False) -> list[str]:
    """Why a row is open, from its ``spans`` still open when the logs end at ``last_ns``: the
    first few, oldest first, with their age then, and the participants that never answered.
    ``cut``: a log given ends in a rotated file, its newer file not given, so an answer may be
    there: the participants are said to have none in the logs given, not to have never answered."""
    causes = []
    open_spans = sorted(spans, key=lambda s: s.start_ns)
    silent = sorted({who_wrote(s) for s in open_spans if isinstance(s, OperationStarted)})
    for s in open_spans[:CAUSES_SHOWN]:
        age_ms = (last_ns - s.start_ns) / 1e6
        causes.append(f"{what_of(s)} on {who_wrote(s)} still open, {age_ms:.1f} ms")
    if len(open_spans) > CAUSES_SHOWN:
        causes.append(f"... {counted(len(open_spans) - CAUSES_SHOWN, 'more open span')}")
    if silent and cut:
        # Was "never answered", though the answer was in the newer file not given.
        causes.append("no answer in the logs given (a log ends in a rotated file): " + ", ".join(silent))
    elif silent:
        causes.append("never answered: " + ", ".join(silent))
    return causes


def unfinished_causes(spans: Iterable[StartedSpan]) -> list[str]:
    """Why a row that ended is short of an answer, from its participants' operations that never
    finished (their process killed mid-call, their log cut): the first few, oldest first. Not
    aged by the end of the logs: a participant started again went on logging after it."""
    unfinished = sorted((s for s in spans if isinstance(s, OperationStarted)), key=lambda s: s.start_ns)
    # "no end in the logs", not "never finished": a log cut or not given ends it the same way.
    causes = [
        f"{what_of(s)} on {who_wrote(s)} has no end in the logs (its process killed mid-call?)"
        for s in unfinished[:CAUSES_SHOWN]
    ]
    if len(unfinished) > CAUSES_SHOWN:
        causes.append(
            f"... {counted(len(unfinished) - CAUSES_SHOWN, 'more operation')} with no end in the logs"
        )
    return causes


def never_finished_line(spans: Iterable[StartedSpan]) -> str:
    """For a row that published: its spans started and never finished in the logs, counted and
    the first few named (operations first, oldest first); ``""`` when there are none. Was said
    nowhere: a commit whose end never came read as a checkpoint with nothing amiss."""
    left = sorted(spans, key=lambda s: (not isinstance(s, OperationStarted), s.start_ns))
    if not left:
        return ""
    named = ", ".join(f"{what_of(s)} on {who_wrote(s)}" for s in left[:CAUSES_SHOWN])
    more = f" and {len(left) - CAUSES_SHOWN:,} more" if len(left) > CAUSES_SHOWN else ""
    return f"{counted(len(left), 'span')} never finished (the log ends / the process died?): {named}{more}"


def _counted_causes(
    traces: Sequence[TraceCauses], events: Sequence[CauseEvent], recorded: Sequence[str]
) -> tuple[list[tuple[int, str, bool, int]], bool]:
    """(time, cause, whether it aborted the checkpoint, the event's place in ``events``) of the
    counted ``events`` kept for a row's checkpoint (a refusal the controller ``recorded`` is said
    by its record), and whether one aborted it."""
    prepares: dict[str, int] = {}
    workers: dict[str, tuple[str, int]] = {}
    for trace in traces:
        for who, at in trace.prepares.items():
            prepares[who] = min(at, prepares.get(who, at))
        workers.update(trace.not_ready_workers)
    timed: list[tuple[int, str, bool, int]] = []
    aborted_by = False
    for i, e in enumerate(events):
        match e:
            case LeaseExpired():
                since = e.time_ns - prepares[who_wrote(e)] if who_wrote(e) in prepares else None
                after = "" if since is None else f", {since / 1e9:.1f} s after its prepare"
                timed.append(
                    (e.time_ns, f"lease expired on {who_wrote(e)} in phase {e.phase}{after}", True, i)
                )
                aborted_by = True
            case PrepareNotReady():
                blocked = (
                    f"not ready at its deadline: {who_wrote(e)} blocked by {counted(e.blockers, 'episode')}"
                )
                if (stuck := workers.get(who_wrote(e))) is not None:
                    # A worker that did not report (frozen, overloaded) or was lost is one blocker,
                    # not an episode: say which.
                    episodes = e.blockers - stuck[1]
                    also = f" and {counted(episodes, 'episode')}" if episodes > 0 else ""
                    blocked = f"not ready at its deadline: {who_wrote(e)} blocked by {stuck[0]}{also}"
                timed.append((e.time_ns, blocked, True, i))
                aborted_by = True
            case Refused():
                status = HTTP_STATUS.get(e.code)
                refused = f"{who_wrote(e)} refused: {e.code}" + ("" if status is None else f" ({status})")
                # The controller's record of the same refusal says more (its detail, when).
                if not any(c.startswith(refused) for c in recorded):
                    timed.append((e.time_ns, refused, False, i))
    return timed, aborted_by


#: The error a participant's refused call ends with (``participants.errors.ProtocolRefusal``).
_REFUSAL: Final = "ProtocolRefusal"


def _error_name(e: FinishedSpan) -> str:
    """The name of the error ``e`` ended with, without its module path (``error`` if none)."""
    return (e.error_type or "error").rsplit(".", 1)[-1]


def is_refusal(e: FinishedSpan) -> bool:
    """Whether ``e`` is the span of a call a participant refused (``ProtocolRefusal``): it did
    nothing, and its message starts with the refusal's code."""
    return e.outcome == Outcome.ERROR and _error_name(e) == _REFUSAL


def _error(e: FinishedSpan, t: int) -> SpanError:
    """What a span that ended in error says: its error's name (not its module path; a
    refusal's code is the start of its message) and message, cut at a word."""
    name = _error_name(e)
    message = e.error_message or ""
    what = message if name == _REFUSAL and message else f"{name}: {message}" if message else name
    said = f"{what_of(e)} {ended(name)} on {who_wrote(e)} ({clipped(what, _MESSAGE)})"
    members = read_failures((e.attributes or {}).get(FAILURES_ATTRIBUTE))
    step = e.step if isinstance(e, StepFinished) else None
    return SpanError(
        t,
        e.start_ns,
        e.span_id,
        who_wrote(e),
        _operation_of(e),
        said,
        members,
        e.parent_span_id,
        step,
        name,
        what,
        e.worker,
    )


def _operation_of(e: FinishedSpan) -> str:
    if isinstance(e, StageFinished):
        return Operation.PREPARE.value  # a stage of coordinate.prepare
    return what_of(e)


#: How the controller's record of a call it got no answer to starts (``fan_out.described``): a
#: failure of that participant's operation is then not what the record says, but one of its own.
_NO_ANSWER: Final = ("no whole reply from ", "unreachable at ")
#: Workers named in a record's words; the rest are counted.
_WORKERS_SHOWN: Final = 4

#: A controller's record of a member's failure: (``kind/instance``, what it said).
_Record: TypeAlias = tuple[str, str]


@dataclass
class _Said:
    """What a record says beside its words: the participant's steps that failed it (operation,
    step, error's name) and the workers whose share of it failed."""

    steps: list[tuple[str, str, str]] = field(default_factory=list)
    workers: list[int] = field(default_factory=list)


def _span_causes(traces: Sequence[TraceCauses]) -> tuple[list[tuple[int, str]], list[str], list[str]]:
    """(time, cause) of the spans that failed in ``traces``, the causes the controller recorded
    (one per member and what it said, with every operation it said it in), and the errors of
    controller spans that only follow from a failure below them."""
    timed: list[tuple[int, str]] = []
    following: list[str] = []
    # (who, said) -> (first time, operations): a refusal at prepare and again at the resume
    # after the abort is one cause. A recorded failure is timed from the start of the span that
    # recorded it, when its call was made: a participant frozen through its prepare is said when
    # the call went unanswered (its timeout ends the span seconds later), so another's lease that
    # ran out while the controller waited on it comes after it, as a consequence.
    recorded: dict[_Record, tuple[int, list[str]]] = {}
    # Per trace, (who, operation) -> the records of it made in that trace.
    records_in: list[dict[tuple[str, str], list[_Record]]] = []
    for trace in traces:
        in_trace: dict[tuple[str, str], list[_Record]] = {}
        for error in trace.errors:
            for m in error.members:
                key = (who_of(m.kind, m.instance, None), m.said)
                at, operations = recorded.setdefault(key, (error.start_ns, []))
                recorded[key] = (min(at, error.start_ns), operations)
                if error.operation not in operations:
                    operations.append(error.operation)
                in_trace.setdefault((key[0], error.operation), []).append(key)
        records_in.append(in_trace)
    # A participant's failed operation that the controller recorded as its answer is said once,
    # by the record (its code and HTTP status; the participant's message is its detail). A call
    # the controller got no answer to (its timeout came first) records no failure of the
    # operation: one that failed all the same failed otherwise, and is said on its own.
    named = {
        (who, operation)
        for (who, said), (_, operations) in recorded.items()
        if not said.startswith(_NO_ANSWER)
        for operation in operations
    }
    # And so are the step that failed it and its workers' shares: the record says which step,
    # the error's name, and which workers.
    said_with: dict[_Record, _Said] = {}
    for trace, in_trace in zip(traces, records_in, strict=True):
        spans = {error.span_id: error for error in trace.errors}
        folded = _folded(trace.errors, spans, in_trace, named)
        # A step of an operation said on its own, that failed it (the same error), is said by it.
        steps_of: dict[int, list[str]] = {}
        merged: set[int] = set()
        for error in trace.errors:
            parent = spans.get(error.parent_span_id) if error.parent_span_id is not None else None
            if (
                error.step is not None
                and error.span_id not in folded
                and parent is not None
                and parent.step is None
                and not parent.members
                and parent.span_id not in folded
                and parent.who == error.who
                and parent.error == error.error
            ):
                steps_of.setdefault(parent.span_id, []).append(error.step)
                merged.add(error.span_id)
        for error in trace.errors:
            if error.span_id in steps_of:
                steps = ", ".join(dict.fromkeys(steps_of[error.span_id]))
                what = f"{error.operation} {ended(error.error_name)} on {error.who} at step {steps}"
                timed.append((error.time_ns, f"{what} ({clipped(error.error, _MESSAGE)})"))
                continue
            if error.span_id in merged:
                continue
            if error.members or error.span_id in folded:
                if (record := folded.get(error.span_id)) is not None:
                    with_record = said_with.setdefault(record[0], _Said())
                    if error.step is not None:
                        with_record.steps.append((record[1], error.step, error.error_name))
                    if error.worker is not None:
                        with_record.workers.append(error.worker)
                continue
            below = trace.first_failed_below.get(error.span_id)
            if error.who == "controller" and below is not None and below <= error.time_ns:
                following.append(error.said)
            else:
                timed.append((error.time_ns, error.said))
    following = following or [stop for trace in traces for stop in trace.stops]
    said = []
    for key, (at, operations) in recorded.items():
        who, what = key
        cause = f"{who} {clipped(what, _MESSAGE)} (at {_at(operations, said_with.get(key, _Said()))})"
        timed.append((at, cause))
        said.append(cause)
    return timed, said, following


def _folded(
    errors: Sequence[SpanError],
    spans: Mapping[int, SpanError],
    in_trace: Mapping[tuple[str, str], list[_Record]],
    named: set[tuple[str, str]],
) -> dict[int, tuple[_Record, str] | None]:
    """The participants' failed spans of one trace (``errors``; ``spans``, the same by span id) that
    are a failure the controller recorded, by span id: each with that record and its operation
    (``None``: a record made in another trace of the row). A participant's operation is its record's
    if the controller recorded it as the answer (``named``); a worker's share of it, if the
    operation failed with the worker's error (a multi-worker participant's refusal says its worker's
    message); a step, if its operation (or share) failed with the step's error. Any other is a
    failure of its own: a step its operation outlived, a share or an operation that failed
    otherwise."""
    folded: dict[int, tuple[_Record, str] | None] = {}
    for error in errors:
        if error.members or error.step is not None or error.worker is not None:
            continue
        if (error.who, error.operation) in named:
            records = [
                r for r in in_trace.get((error.who, error.operation), []) if not r[1].startswith(_NO_ANSWER)
            ]
            # Two records of one operation in one trace: the one that says this error's message.
            record = next((r for r in records if error.detail in r[1]), records[0]) if records else None
            folded[error.span_id] = None if record is None else (record, error.operation)
    # A worker's share, then a step (of a share or of an operation): each after its parent.
    for error in sorted(errors, key=lambda e: e.step is not None):
        if error.members or error.span_id in folded or error.parent_span_id is None:
            continue
        parent = spans.get(error.parent_span_id)
        if parent is None or parent.step is not None or folded.get(parent.span_id) is None:
            continue
        if error.step is not None:
            same = parent.who == error.who and parent.error == error.error
        else:  # a worker's share of its participant's operation
            same = (
                error.worker is not None
                and parent.worker is None
                and parent.who == error.member
                and parent.operation == error.operation
                and error.detail in parent.error
            )
        if same:
            folded[error.span_id] = folded[parent.span_id]
    return folded


def _at(operations: Sequence[str], said: _Said) -> str:
    """``commit step write, raising ValueError, in workers w0, w1``: the ``operations`` a record
    was said at, each with the steps (operation, step, error's name) that failed it, and the
    workers whose share failed; a refusal's name is not said (the record's code is)."""
    where = []
    for operation in operations:
        failed = list(dict.fromkeys(step for at, step, _ in said.steps if at == operation))
        where.append(f"{operation} step {', '.join(failed)}" if failed else operation)
    names = list(dict.fromkeys(name for _, _, name in said.steps if name != _REFUSAL))
    workers = [f"w{w}" for w in sorted(set(said.workers))]
    more = len(workers) - _WORKERS_SHOWN
    shown_workers = ", ".join(workers[:_WORKERS_SHOWN]) + (f" and {more:,} more" if more > 0 else "")
    return (
        " and ".join(where)
        + (f", raising {', '.join(names)}" if names else "")
        + (f", in worker{'s' if len(workers) > 1 else ''} {shown_workers}" if workers else "")
    )
