"""Where a checkpoint's time went, built from its events alone: the per-participant
breakdown, the counted events, and one trace's spans.

Used by ``ckpt-events demo`` (live events) and ``ckpt-events report LOG.jsonl`` (a recorded
log). The rest of the report lives beside it: ``model`` (the span tree), ``attribution``
(where every millisecond went), ``terminal`` (rich), ``html`` (SVG and HTML) and ``png``.
Nothing here talks to a server or draws.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

from ckpt_events import (
    CollectionFinished,
    CoordinateFinished,
    Event,
    GenerationCut,
    LeaseExpired,
    OperationFinished,
    PrepareNotReady,
    Refused,
    Stalled,
    StepFinished,
)
from ckpt_events.participants.cli.report.cancels import is_cancelled
from ckpt_events.participants.cli.report.events import duration_ns
from ckpt_events.participants.cli.report.model import Span, checkpoint_and_restore, trace_spans
from ckpt_events.participants.cli.report.stall_blame import WAITING, StallBlame
from ckpt_events.participants.cli.words import counted
from ckpt_events.participants.kinds import PREPARE_ORDER, stage_index
from ckpt_events.vocab import CollectionAction, CountedEvent, Kind, Operation, Outcome, Step

__all__ = [
    "BREAKDOWN_COLUMNS",
    "Breakdown",
    "known_sum",
    "Span",
    "breakdown",
    "breakdown_columns",
    "fold_columns",
    "FAILED_LISTED",
    "FLEET",
    "per_kind",
    "shown_rows",
    "count",
    "counts",
    "settle",
    "spans_of",
    "summed_over",
]

#: The user's own steps a breakdown shows as columns (the longest); the rest are summed in one
#: ``+N more steps`` column (``fold_columns``).
OWN_COLUMNS: Final = 12
#: Past this many participants the breakdown shows one row per kind (its longest instance), in
#: the terminal and on the page alike (``shown_rows``).
FLEET: Final = 8
#: A folded kind's failed participants listed under its row, each its own (``per_kind``); the
#: rest are counted on the kind's row. A failure is never folded into a count only.
FAILED_LISTED: Final = 8
#: Operations and steps shown per participant, in the order a checkpoint runs them.
BREAKDOWN_COLUMNS: tuple[str, ...] = tuple(
    str(name)
    for name in (
        Operation.PREPARE,
        Step.WAIT_READY,
        Step.GENERATION_CUT,
        Operation.COMMIT,
        Step.EXPORT,
        Step.WRITE,
        Operation.RESTORE,
        Step.READ,
        Step.INSTALL,
        Operation.RESUME,
    )
)


def _kind_place(kind: str) -> int:
    """Rows in prepare order (a kind the harness does not name after those it does), the
    controller last."""
    return len(PREPARE_ORDER) + 1 if kind == Kind.CONTROLLER else stage_index(kind)


@dataclass
class Breakdown:
    """One participant's totals: milliseconds per operation/step, records committed, bytes written."""

    kind: str
    instance: str
    ms: dict[str, float] = field(default_factory=dict)
    #: ``None`` where no commit said its records (or its bytes, or its ``write`` step): unknown, not
    #: 0 (a user's server that never sets them read "bytes written 0").
    records: int | None = None
    bytes: int | None = None
    #: Its failed operations and steps, the cancelled ones apart (``cancels.is_cancelled``).
    errors: int = 0
    #: The exception types of its failed operations and steps (``error`` where none was said),
    #: the cancelled ones' too.
    error_types: set[str] = field(default_factory=set)
    #: Its cancelled operations and steps: a stop of its server cut them, not a failure of theirs.
    cancelled: int = 0
    #: Failed participants of a ``per_kind`` row not listed under it (past ``FAILED_LISTED``).
    errors_unlisted: int = 0
    #: Participants of a ``per_kind`` row with cancellations and no error, not listed under it.
    cancelled_unlisted: int = 0
    #: The worker process of a multi-worker participant (its row sits under the participant's).
    worker: int | None = None
    #: Operations and steps of unknown duration (the process's clock went back during one):
    #: absent from ``ms``, never a made-up number.
    unknown: set[str] = field(default_factory=set)
    #: How many participants a row of ``per_kind`` stands for (0: one participant's own row).
    folded: int = 0

    @property
    def errors_said(self) -> str:
        """`` (1 error: RuntimeError)``, `` (12 errors; 4 failed participants not listed)`` on a folded
        kind's row, `` (1 cancelled: asyncio.exceptions.CancelledError)`` (apart from the errors:
        ``1 error: KeyError, 1 cancelled: ...``), or ``""`` without either: the words after the
        participant's name."""
        if not self.errors and not self.cancelled:
            return ""
        said = []
        for count, word, cancelled in ((self.errors, "error", False), (self.cancelled, "cancelled", True)):
            if not count:
                continue
            named = sorted(t for t in self.error_types if is_cancelled(t) == cancelled)
            types = f": {', '.join(named)}" if named and not self.folded else ""
            said.append(f"{count:,} {word}{types}" if cancelled else f"{counted(count, word)}{types}")
        # Each unlisted participant counted as what it is: "4 participant with errors or
        # cancellationss" was said of 4 whose requests were all cut.
        unlisted = " and ".join(
            counted(count, who)
            for count, who in (
                (self.errors_unlisted, "failed participant"),
                (self.cancelled_unlisted, "cancelled participant"),
            )
            if count
        )
        return f" ({', '.join(said)}{f'; {unlisted} not listed' if unlisted else ''})"


#: The operations' names: a step of the same name gets a column of its own (``breakdown``).
_OPERATION_NAMES: Final = frozenset(str(o) for o in Operation)


def breakdown(events: Iterable[Event], checkpoint_id: str | None = None) -> list[Breakdown]:
    """Per-participant totals over every operation and step (of one checkpoint, if given);
    a multi-worker participant's workers get a row each, right under the participant's."""
    rows: dict[tuple[str, str, int | None], Breakdown] = {}
    # The error types of each open span's failed steps, by (trace, span): an exception that
    # left a step and then its operation is one error, not two (63 failed requests read
    # "126 errors"); a step's error the span caught and another of its own are two. Steps
    # only: a step is its participant's own, a called participant's operation is not.
    failed_under: dict[tuple[int, int], set[str]] = {}
    # Each write step's row and bytes, by (trace, its commit's span), until its commit ends.
    written: dict[tuple[int, int | None], tuple[Breakdown, int]] = {}
    for event in events:
        match event:
            case OperationFinished(operation=op) | StepFinished(step=op) if (
                checkpoint_id is None or event.checkpoint_id == checkpoint_id
            ):
                key = (event.kind, event.instance, event.worker)
                row = rows.setdefault(key, Breakdown(event.kind, event.instance, worker=event.worker))
                name = str(op)
                if isinstance(event, StepFinished) and name in _OPERATION_NAMES:
                    # A user's step named as an operation (a database's "commit" in a commit):
                    # its own column, not added to the operation's (a 30 ms commit read 40).
                    name = f"{name} (step)"
                # By the participant's own clock; one of unknown duration makes the total unknown.
                if (length := duration_ns(event)) is None:
                    row.unknown.add(name)
                row.ms[name] = row.ms.get(name, 0.0) + (length or 0) / 1e6
                under = failed_under.pop((event.trace_id, event.span_id), None)
                if event.outcome == Outcome.ERROR:
                    error_type = event.error_type or "error"
                    if (under is None or error_type not in under) and is_cancelled(error_type):
                        row.cancelled += 1
                    elif under is None or error_type not in under:
                        row.errors += 1
                    row.error_types.add(error_type)
                    if isinstance(event, StepFinished) and event.parent_span_id is not None:
                        failed_under.setdefault((event.trace_id, event.parent_span_id), set()).add(error_type)
                # What a checkpoint holds: records committed and bytes written (a restore
                # reads the same ones back, so counting both would double them).
                if (
                    isinstance(event, OperationFinished)
                    and op == Operation.COMMIT
                    and event.records is not None
                ):
                    row.records = (row.records or 0) + event.records
                # Bytes written: the commit's own figure (a user's server sets it on the commit,
                # as bytes_total counts it; its "upload" step read "-"), else its write step's,
                # which ends before it.
                if isinstance(event, StepFinished) and op == Step.WRITE and event.bytes is not None:
                    written[event.trace_id, event.parent_span_id] = (row, event.bytes)
                elif isinstance(event, OperationFinished) and op == Operation.COMMIT:
                    step = written.pop((event.trace_id, event.span_id), None)
                    if event.bytes is not None:
                        row.bytes = (row.bytes or 0) + event.bytes
                    elif step is not None:
                        step[0].bytes = (step[0].bytes or 0) + step[1]
            case _:
                pass
    for row, size in written.values():  # a write whose commit is not in the events
        row.bytes = (row.bytes or 0) + size
    for row in rows.values():
        for name in row.unknown:
            del row.ms[name]
    # A participant whose every event came from its workers (a user's gunicorn -w N, each
    # worker its own Telemetry(worker=i)) gets its own row to head theirs: its records and bytes
    # its workers' sums, no times of its own. Without it, its workers sat under the row before
    # them, another participant's.
    for kind, instance, worker in list(rows):
        if worker is not None and (kind, instance, None) not in rows:
            shares = [r for (k, i, w), r in rows.items() if (k, i) == (kind, instance) and w is not None]
            rows[kind, instance, None] = Breakdown(
                kind,
                instance,
                records=known_sum(r.records for r in shares),
                bytes=known_sum(r.bytes for r in shares),
            )
    return sorted(
        fold_columns(list(rows.values())),
        key=lambda r: (_kind_place(r.kind), r.kind, r.instance, -1 if r.worker is None else r.worker),
    )


def fold_columns(rows: list[Breakdown], shown: int = OWN_COLUMNS) -> list[Breakdown]:
    """``rows`` with the user's own operations and steps past the ``shown`` longest (summed over
    every row) added up into one ``+N more steps`` column: a server that names a step after a
    rollout id made a column per name (20,000 steps: a 40,000-line report in 19 s). Two or
    more are folded, never one (its own column is as wide as the fold's). A row's
    folded figure is unknown (``?``) where one of its folded durations is."""
    totals: dict[str, float] = {}
    for row in rows:
        for name in (*row.ms, *row.unknown):
            if name not in BREAKDOWN_COLUMNS:
                totals[name] = totals.get(name, 0.0) + row.ms.get(name, 0.0)
    # One name past ``shown`` is shown: ``+1 more steps`` would take its column and hide it.
    if len(totals) <= shown + 1:
        return rows
    kept = set(sorted(totals, key=lambda name: (-totals[name], name))[:shown])
    folded = f"+{len(totals) - shown:,} more steps"
    for row in rows:
        gone = [name for name in (*row.ms, *row.unknown) if name in totals and name not in kept]
        if not gone:
            continue
        ms = sum(row.ms.pop(name, 0.0) for name in gone)
        row.ms[folded] = ms
        if row.unknown.intersection(gone):
            row.unknown.difference_update(gone)
            row.unknown.add(folded)
            del row.ms[folded]
    return rows


def shown_rows(rows: list[Breakdown]) -> list[Breakdown]:
    """``rows`` as a report shows them: past ``FLEET`` participants, one row per kind
    (``per_kind``) and its failed participants' own, else as they are."""
    return per_kind(rows) if len({(r.kind, r.instance) for r in rows}) > FLEET else rows


def per_kind(rows: list[Breakdown]) -> list[Breakdown]:
    """A wide fleet's breakdown as one row per kind: each column's longest instance (``ms``),
    records and bytes summed; ``folded`` and the instance field (``x5000 (longest)``) say how
    many participants were folded. Under a kind's row, its first ``FAILED_LISTED`` failed
    participants' own rows (their workers' too), so who failed is named, never only counted;
    those with cancellations only (``cancels.is_cancelled``) after every failed one."""
    kinds: dict[str, list[Breakdown]] = {}
    for row in rows:
        kinds.setdefault(row.kind, []).append(row)
    out = []
    for kind, members in kinds.items():
        ms: dict[str, float] = {}
        for row in members:
            for column, value in row.ms.items():
                ms[column] = max(value, ms.get(column, 0.0))
        # The longest instance is unknown where one instance's duration is.
        unknown: set[str] = set().union(*(row.unknown for row in members))
        for column in unknown:
            ms.pop(column, None)
        instances = len({row.instance for row in members})
        failed = dict.fromkeys(row.instance for row in members if row.errors)
        # A participant whose requests a stop cut is listed after every one that failed: ten cut
        # listed first left the two that raised unnamed.
        cut = [i for i in dict.fromkeys(r.instance for r in members if r.cancelled) if i not in failed]
        listed = set([*failed, *cut][:FAILED_LISTED])
        out.append(
            Breakdown(
                kind,
                f"x{instances} (longest)",
                ms,
                # A participant's own row holds its workers' records and bytes: theirs again
                # doubled them (5 records in 2 workers read 10).
                known_sum(r.records for r in members if r.worker is None),
                known_sum(r.bytes for r in members if r.worker is None),
                sum(r.errors for r in members),
                unknown=unknown,
                cancelled=sum(r.cancelled for r in members),
                folded=instances,
                errors_unlisted=len(failed.keys() - listed),
                cancelled_unlisted=len(set(cut) - listed),
            )
        )
        out.extend(row for row in members if row.instance in listed)
    return out


def known_sum(values: Iterable[int | None]) -> int | None:
    """The sum of the known ``values``; ``None`` when none is known."""
    known = [value for value in values if value is not None]
    return sum(known) if known else None


def summed_over(events: Iterable[Event]) -> str:
    """What a ``breakdown`` of ``events`` adds up, in words: ``summed over 3 checkpoints and 1
    restore`` (collection checkpoints and restores; without a collection, a bare coordinator's
    prepares and restores); ``""`` when there is neither."""
    collected = {CollectionAction.CHECKPOINT: 0, CollectionAction.RESTORE: 0}
    coordinated = {Operation.PREPARE: 0, Operation.RESTORE: 0}
    for event in events:
        match event:
            case CollectionFinished(action=action) if action in collected:
                collected[action] += 1
            case CoordinateFinished(operation=operation) if operation in coordinated:
                coordinated[operation] += 1
            case _:
                pass
    checkpoints = collected[CollectionAction.CHECKPOINT] or coordinated[Operation.PREPARE]
    restores = collected[CollectionAction.RESTORE] or coordinated[Operation.RESTORE]
    if not checkpoints and not restores:
        return ""
    return f"summed over {counted(checkpoints, 'checkpoint')} and {counted(restores, 'restore')}"


def breakdown_columns(rows: Iterable[Breakdown]) -> list[str]:
    """The columns a table of ``rows`` shows: ``BREAKDOWN_COLUMNS`` that any row has, then the
    operations and steps of the user's own (an ``upload`` step), by name, then the
    ``+N more steps`` that ``fold_columns`` added up, last."""
    seen = {name for row in rows for name in (*row.ms, *row.unknown)}
    ours = [c for c in BREAKDOWN_COLUMNS if c in seen]
    # "+" sorts before every name a user may give (a-z0-9_-): last, by the key.
    return ours + sorted(seen.difference(BREAKDOWN_COLUMNS), key=lambda c: (c.startswith("+"), c))


def counts(events: Iterable[Event]) -> dict[str, Counter[str]]:
    """The counted events: refusals by code, lease expiries, not-ready prepares, cuts, stalls
    (a controller's that waited on a participant under ``WAITING``: ``stall_blame``)."""
    out: defaultdict[str, Counter[str]] = defaultdict(Counter)
    blame = StallBlame()
    for event in events:
        count(out, event, blame)
    settle(out, blame)
    return dict(out)


def count(out: defaultdict[str, Counter[str]], event: Event, blame: StallBlame) -> None:
    """Add ``event`` to ``out`` if it is a counted event (``counts`` one event at a time, for a
    pass over the logs that folds something else too); a controller's stall is held in
    ``blame`` until ``settle``."""
    if blame.add(event):
        return
    match event:
        case Refused(code=code):
            out[CountedEvent.REFUSED][str(code)] += 1
        case LeaseExpired(phase=phase):
            out[CountedEvent.LEASE_EXPIRED][f"{event.kind}/{phase}"] += 1
        case PrepareNotReady(blockers=blockers):
            out[CountedEvent.PREPARE_NOT_READY][str(event.kind)] += 1
            out["prepare_not_ready_blockers"][str(event.kind)] += blockers
        case GenerationCut(disposition=disposition, calls=calls):
            out[CountedEvent.GENERATION_CUT][str(disposition)] += calls
        case Stalled(operation=operation):
            out[CountedEvent.STALLED][f"{event.kind}/{operation}"] += 1
        case _:
            pass


def settle(out: defaultdict[str, Counter[str]], blame: StallBlame) -> None:
    """Count the controller's stalls ``blame`` held: a stall when nothing of its checkpoint was
    in flight, else under ``WAITING`` with whom it waited on (or that it is unknown)."""
    stalled, waiting = blame.result()
    if stalled:
        out[CountedEvent.STALLED].update(stalled)
    if waiting:
        out[WAITING].update(waiting)


def spans_of(events: Sequence[Event], trace_id: int | None = None) -> list[Span]:
    """The finished spans of one trace (default: the last collection checkpoint's, else the
    last coordinate commit's, else a user's server's last restore), each child right under its
    parent, siblings in start order."""
    if trace_id is None:
        checkpoint, restore = checkpoint_and_restore(events)
        trace_id = checkpoint if checkpoint is not None else restore
    return [] if trace_id is None else trace_spans(events, trace_id)
