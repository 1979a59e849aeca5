"""The run overview: one row per checkpoint and per restore, its outcome and, when it did not
publish, its cause in words naming the participant.

A row is a root span (a span whose parent is not in the logs): a collection checkpoint or
restore, or a coordinate operation run on its own. What a failure leaves in the log:

- ``lease_expired`` (participant, phase), timed from that participant's prepare;
- ``prepare_not_ready`` (participant, blocker count);
- ``refused`` (code, participant);
- a span with outcome ``error`` (participant, exception type);
- spans started and never finished: the checkpoint is open at the end of the log.

A restore names the checkpoint it restored: the collection restore carries that
checkpoint's id as its ``checkpoint_id``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from ckpt_events import (
    CollectionAction,
    CollectionFinished,
    CollectionStarted,
    CoordinateFinished,
    CoordinateStarted,
    Kind,
    LeaseExpired,
    Operation,
    OperationFinished,
    OperationStarted,
    Outcome,
    PrepareNotReady,
    Refused,
    StepFinished,
)
from participants.cli.report_model import trace_spans, who_of
from participants.cli.run_logs import event_time

__all__ = ["Run", "RunRow", "overview"]

PUBLISHED: Final = "published"
RESTORED: Final = "restored"
ABORTED: Final = "aborted"
FAILED: Final = "failed"
OPEN: Final = "open at end of log"
#: Causes shown per row; the rest are counted.
_CAUSES = 4


@dataclass
class RunRow:
    """One checkpoint or restore of the run."""

    what: str
    checkpoint_id: str | None
    start_ns: int
    end_ns: int | None = None
    outcome: str = OPEN
    causes: list[str] = field(default_factory=list)
    slowest: str = ""
    #: How long admission was closed: from the first participant's prepare to the last one's
    #: resume; ``None`` without both.
    paused_ms: float | None = None
    #: (trace id, span id) of each root span: a checkpoint run by a bare coordinator has one
    #: root per coordinate operation (prepare, commit, resume), all with its checkpoint id.
    roots: list[tuple[int, int]] = field(default_factory=list)
    coordinated: bool = False
    #: A restore's longest read or install step, in ms (``None``: not a restore, or none seen).
    dominant_ms: float | None = None

    @property
    def trace_ids(self) -> set[int]:
        return {trace for trace, _ in self.roots}

    @property
    def ms(self) -> float | None:
        return None if self.end_ns is None else (self.end_ns - self.start_ns) / 1e6

    @property
    def published(self) -> bool:
        return self.outcome in (PUBLISHED, RESTORED)


@dataclass
class Run:
    """Every row in time order, and the events they were built from."""

    rows: list[RunRow]
    events: list[Any]
    last_ns: int
    first_ns: int

    by_trace: dict[int, list[Any]] = field(default_factory=dict)
    by_checkpoint: dict[str, list[Any]] = field(default_factory=dict)

    def events_of(self, row: RunRow) -> list[Any]:
        """The row's spans (its traces) and the counted events naming its checkpoint id, in
        time order."""
        out = [e for trace in row.trace_ids for e in self.by_trace.get(trace, ())]
        out.extend(self.by_checkpoint.get(row.checkpoint_id or "", ()) if row.checkpoint_id else ())
        out.sort(key=event_time)
        return out


def _who(e: Any) -> str:
    return "controller" if e.kind is Kind.CONTROLLER else who_of(e.kind, e.instance, e.worker)


def _what(root: Any) -> str:
    if isinstance(root, CollectionStarted | CollectionFinished):
        return str(root.action.value)
    return "restore" if root.operation is Operation.RESTORE else "checkpoint"


def overview(events: Iterable[Any]) -> Run:
    """Rows for every root span, in start order, with outcome, causes and slowest path."""
    kept = list(events)
    started: dict[tuple[int, int], Any] = {}
    finished: dict[tuple[int, int], Any] = {}
    # Keyed by (trace id, span id): a span id is unique only within its trace.
    span_ids: set[tuple[int, int]] = set()
    by_trace: dict[int, list[Any]] = {}
    by_checkpoint: dict[str, list[Any]] = {}
    for e in kept:
        if not hasattr(e, "trace_id"):
            by_checkpoint.setdefault(e.checkpoint_id or "", []).append(e)
        if hasattr(e, "span_id"):
            by_trace.setdefault(e.trace_id, []).append(e)
            span_ids.add((e.trace_id, e.span_id))
            (finished if hasattr(e, "end_ns") else started)[(e.trace_id, e.span_id)] = e
    last_ns = max((event_time(e) for e in kept), default=0)
    first_ns = min((getattr(e, "start_ns", None) or event_time(e) for e in kept), default=0)
    rows: list[RunRow] = []
    roots: list[Any] = []
    for e in [*started.values(), *(f for s, f in finished.items() if s not in started)]:
        if (e.trace_id, e.parent_span_id) in span_ids:
            continue
        if isinstance(e, CollectionStarted | CollectionFinished):
            if e.action not in (CollectionAction.CHECKPOINT, CollectionAction.RESTORE):
                continue
        elif not isinstance(e, CoordinateStarted | CoordinateFinished):
            continue
        roots.append(e)
    roots.sort(key=lambda e: e.start_ns)
    for e in roots:
        what = _what(e)
        last = rows[-1] if rows else None
        coordinate = isinstance(e, CoordinateStarted | CoordinateFinished)
        if coordinate and last is not None and last.coordinated and last.checkpoint_id == e.checkpoint_id \
                and (e.operation is Operation.RESTORE) == (last.what == "restore"):  # fmt: skip
            last.roots.append((e.trace_id, e.span_id))
            continue
        row = RunRow(
            what, e.checkpoint_id, e.start_ns, roots=[(e.trace_id, e.span_id)], coordinated=coordinate
        )
        rows.append(row)
    run = Run(rows, kept, last_ns, first_ns, by_trace, by_checkpoint)
    for row in rows:
        _judge(run, row, started, finished)
    return run


def _judge(
    run: Run, row: RunRow, started: dict[tuple[int, int], Any], finished: dict[tuple[int, int], Any]
) -> None:
    mine = run.events_of(row)
    root_ids = set(row.roots)
    ends = [f for f in mine if hasattr(f, "end_ns") and (f.trace_id, f.span_id) in root_ids]
    causes: list[str] = []
    aborted_by = False  # a participant not ready at the deadline, or a lease that ran out
    row.paused_ms = _paused_ms(mine)
    prepares = {
        _who(e): e.start_ns
        for e in mine
        if isinstance(e, OperationStarted) and e.operation is Operation.PREPARE
    }
    for e in mine:
        match e:
            case LeaseExpired():
                since = e.time_ns - prepares[_who(e)] if _who(e) in prepares else None
                after = "" if since is None else f", {since / 1e9:.1f} s after its prepare"
                causes.append(f"lease expired on {_who(e)} in phase {e.phase.value}{after}")
                aborted_by = True
            case PrepareNotReady():
                aborted_by = True
                causes.append(f"not ready at its deadline: {_who(e)} blocked by {e.blockers} episodes")
            case Refused():
                causes.append(f"refused ({e.code.value}) by {_who(e)}")
            case _ if hasattr(e, "end_ns") and e.outcome is Outcome.ERROR:
                name = span_name_or_kind(e)
                kind = e.error_type or "error"
                causes.append(f"{name} failed on {_who(e)} ({kind}: {_clip(e.error_message)})")
    if len(ends) < len(root_ids):
        row.outcome = OPEN
        traces = row.trace_ids
        open_spans = [s for sid, s in started.items() if sid[0] in traces and sid not in finished]
        open_spans.sort(key=lambda s: s.start_ns)
        silent = sorted({_who(s) for s in open_spans if isinstance(s, OperationStarted)})
        for s in open_spans[:_CAUSES]:
            age_ms = (run.last_ns - s.start_ns) / 1e6
            causes.append(f"{span_name_or_kind(s)} on {_who(s)} still open, {age_ms:.1f} ms")
        if len(open_spans) > _CAUSES:
            causes.append(f"... {len(open_spans) - _CAUSES} more open spans")
        if silent:
            causes.append("never answered: " + ", ".join(silent))
        row.end_ns = None
    else:
        row.end_ns = max(f.end_ns for f in ends)
        if any(f.outcome is Outcome.ERROR for f in ends):
            # The protocol's own aborts surface as the controller's error (not prepared, or a
            # commit refused after the lease): the abort is the outcome, not a failure.
            row.outcome = ABORTED if aborted_by else FAILED
        elif any(
            getattr(f, "published", None) is False or getattr(f, "prepared", None) is False for f in ends
        ):
            row.outcome = ABORTED
        elif row.coordinated and row.what == "checkpoint" and not _committed(ends):
            row.outcome = ABORTED
            causes = causes or ["prepared, never committed"]
        else:
            row.outcome = RESTORED if "restore" in row.what else PUBLISHED
    if row.published:
        longest = max(ends, key=lambda f: f.end_ns - f.start_ns)
        row.slowest = _slowest(mine, longest.trace_id)
        if row.what == "restore" and (dominant := _restore_dominant(mine, row)):
            row.slowest = f"dominated by {dominant}; critical path {row.slowest}"
        causes = []
    more = [f"... and {len(causes) - _CAUSES} more"] if len(causes) > _CAUSES else []
    row.causes = causes[:_CAUSES] + more


def _restore_dominant(events: Sequence[Any], row: RunRow) -> str:
    """The longest read or install step of a restore: participant, ms, records and MB/s."""
    steps = [e for e in events if isinstance(e, StepFinished) and e.step in ("read", "install")]
    if not steps:
        return ""
    top = max(steps, key=lambda e: e.end_ns - e.start_ns)
    ms = row.dominant_ms = (top.end_ns - top.start_ns) / 1e6
    parts = [f"{getattr(top, 'records', None) or 0} records"]
    if (size := getattr(top, "bytes", None)) and ms > 0:
        parts.append(f"{size / 1e6 / (ms / 1e3):.2f} MB/s")
    return f"{_who(top)} {top.step} {ms:.1f} ms ({', '.join(parts)})"


def _paused_ms(events: Sequence[Any]) -> float | None:
    first = min(
        (e.start_ns for e in events if isinstance(e, OperationStarted) and e.operation is Operation.PREPARE),
        default=None,
    )
    last = max(
        (e.end_ns for e in events if isinstance(e, OperationFinished) and e.operation is Operation.RESUME),
        default=None,
    )
    return None if first is None or last is None or last < first else (last - first) / 1e6


def _committed(roots: Sequence[Any]) -> bool:
    return any(getattr(f, "operation", None) is Operation.COMMIT for f in roots)


def span_name_or_kind(e: Any) -> str:
    for attr in ("operation", "step", "stage", "action"):
        if (value := getattr(e, attr, None)) is not None:
            return str(value.value)
    return type(e).__name__


def _clip(text: str | None, most: int = 60) -> str:
    text = text or ""
    return text if len(text) <= most else text[: most - 1] + "…"


def _slowest(events: Sequence[Any], trace_id: int) -> str:
    """The participant and stage on the critical path (the chain of last-ending spans)."""
    path = [s for s in trace_spans(events, trace_id) if s.slowest]
    participant = next((s for s in reversed(path) if s.participant), None)
    stage = next((s for s in path if s.depth == 1), None)
    parts = []
    if stage is not None:
        parts.append(f"{stage.short} {stage.ms:.1f} ms")
    if participant is not None:
        parts.append(f"{participant.who} {participant.short} {participant.ms:.1f} ms")
    return ", slowest ".join(parts) if parts else ""
