"""The per-operation table of a participant's own operations: one row per (kind, operation,
step), with how many ran, how many failed (and were cancelled, apart), and the p50, p95 and
max of the ok ones.

What a user's own server (the README's quickstart: no controller) needs from its log: the
per-participant breakdown sums every request ("commit 293.2" is ten commits added together),
where this says what one request takes. Built from ``durations`` (what ``diff`` compares), so
the two commands agree on every figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from ckpt_events.participants.cli.report.durations import Durations, median, percentile
from ckpt_events.participants.cli.words import counted
from ckpt_events.vocab import Kind

__all__ = [
    "FAILED_SHOWN",
    "ROWS_SHOWN",
    "OperationRow",
    "counted_figures",
    "operation_columns",
    "operation_rows",
    "unknown_line",
]

#: Rows the table shows: every operation's, then the slowest steps (by max); the rest are
#: summed in one ``+N more steps`` row (a step named per rollout id made 20,000 rows).
ROWS_SHOWN: Final = 40
#: Steps with errors shown before the slowest, whatever their time (``ROWS_SHOWN`` may be passed).
FAILED_SHOWN: Final = 8


@dataclass(frozen=True)
class OperationRow:
    """One (kind, operation, step) of participants' spans; ``step`` is ``""`` for the operation."""

    kind: str
    operation: str
    step: str
    #: Every finished span of the key: ok, failed, and of unknown duration.
    count: int
    #: Spans that ended in error, the cancelled ones apart: counted, never timed (how soon a
    #: commit failed is no commit's time).
    errors: int
    #: Ok spans whose duration is unknown (their process's clock went back during them).
    unknown: int
    #: The median (as ``diff``'s), the nearest-rank 95th percentile and the max of the ok spans
    #: of known duration; ``None`` when there is none.
    p50_ms: float | None
    p95_ms: float | None
    max_ms: float | None
    #: Spans that were cancelled (``cancels.is_cancelled``): counted apart from ``errors``.
    cancelled: int = 0


def operation_rows(found: Durations) -> list[OperationRow]:
    """Participants' keys of ``found`` (the controller's stages and coordinate spans are the
    checkpoint rows' own), by kind and operation, each operation's row before its steps."""
    keys = {*found.ok, *found.failed, *found.unknown}
    rows = []
    ours = (k for k in keys if k[0] != Kind.CONTROLLER)
    for key in sorted(ours, key=lambda k: (k[0], k[1], k[2] != "", k[2])):
        ok = found.ok.get(key, [])
        failed = found.failed.get(key, 0)
        cancelled = found.cancelled.get(key, 0)
        unknown = found.unknown.get(key, 0)
        rows.append(
            OperationRow(
                *key,
                count=len(ok) + failed + unknown,
                errors=failed - cancelled,
                cancelled=cancelled,
                unknown=unknown,
                p50_ms=median(ok) if ok else None,
                p95_ms=percentile(ok, 0.95) if ok else None,
                max_ms=max(ok) if ok else None,
            )
        )
    return _folded(rows, ROWS_SHOWN)


def _folded(rows: list[OperationRow], shown: int) -> list[OperationRow]:
    """``rows`` past ``shown``: every operation's row, the first ``FAILED_SHOWN`` steps with
    errors, the slowest steps (by their max, then their count) up to ``shown`` rows, in
    ``rows``' order, and one last row that sums the rest's counts, errors and unknown spans,
    with the longest of their max (p50 and p95 of spans apart are not one figure: ``None``).
    Two or more rows are summed, never one."""
    if len(rows) <= shown:
        return rows
    steps = sorted(
        (r for r in rows if r.step), key=lambda r: (-(r.max_ms or 0.0), -r.count, r.kind, r.operation, r.step)
    )
    keep = {id(r) for r in rows if not r.step}
    # A step that failed keeps its row (the first ``FAILED_SHOWN``), never only a count.
    keep.update(id(r) for r in [r for r in rows if r.step and (r.errors or r.cancelled)][:FAILED_SHOWN])
    keep.update(id(r) for r in [r for r in steps if id(r) not in keep][: max(0, shown - len(keep))])
    rest = [r for r in rows if id(r) not in keep]
    if len(rest) < 2:  # ``+1 more steps`` would take the one row's place and hide its name
        return rows
    maxes = [r.max_ms for r in rest if r.max_ms is not None]
    more = OperationRow(
        kind="",
        operation="",
        step=f"+{len(rest):,} more steps",
        count=sum(r.count for r in rest),
        errors=sum(r.errors for r in rest),
        unknown=sum(r.unknown for r in rest),
        p50_ms=None,
        p95_ms=None,
        max_ms=max(maxes) if maxes else None,
        cancelled=sum(r.cancelled for r in rest),
    )
    return [r for r in rows if id(r) in keep] + [more]


def operation_columns(rows: Sequence[OperationRow]) -> tuple[str, ...]:
    """The counted columns of the table: ``n``, ``errors``, and ``cancelled`` when a row has one."""
    return ("n", "errors", "cancelled") if any(r.cancelled for r in rows) else ("n", "errors")


def counted_figures(row: OperationRow, columns: Sequence[str]) -> list[str]:
    """``row``'s figures of ``columns`` (``operation_columns``), as the table shows them."""
    by = {"n": row.count, "errors": row.errors, "cancelled": row.cancelled}
    return [f"{by[c]:,}" for c in columns]


def unknown_line(rows: list[OperationRow]) -> str | None:
    """What the table says under it of spans of unknown duration, if any: counted, not timed."""
    unknown = sum(row.unknown for row in rows)
    if not unknown:
        return None
    spans = counted(unknown, "span")
    return f"{spans} of unknown duration (a clock went back during it) counted in n, not timed"
