"""Rows that share one trace: whose span is whose.

A fleet that gives one ``traceparent`` to several collections (a job traced as one span) puts a
checkpoint and its restore, or every checkpoint of the job, in one trace. A row's detail drew
every span of its traces, so each of them showed all of them (a checkpoint's breakdown counted
the restore's reads). In a shared trace a span is the row's whose root it descends from (by its
parent ids); one whose ancestry reaches no row's root (its parent rotated out of the logs) is
the row's that carries its checkpoint id, when one row of that trace does, else no row's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Final, TypeVar

from ckpt_events import (
    CheckpointEvent,
    CollectionFinished,
    CollectionStarted,
    CoordinateFinished,
    CoordinateStarted,
    OperationFinished,
    OperationStarted,
    StageFinished,
    StageStarted,
    StepFinished,
    StepStarted,
)
from ckpt_events.participants.cli.text import short_id

if TYPE_CHECKING:
    from ckpt_events.participants.cli.report.overview import RunRow

__all__ = ["owned", "owner_by_parents", "shared_line", "shared_traces"]

_Owner = TypeVar("_Owner")

#: The other rows a row's line names; the rest are counted.
_NAMED: Final = 3


def shared_traces(rows: Iterable[RunRow]) -> dict[int, dict[int, RunRow]]:
    """Each trace that holds more than one row's root: its root span ids, each to its row."""
    rows = list(rows)
    sharing = Counter(trace for row in rows for trace in row.trace_ids)
    out: dict[int, dict[int, RunRow]] = {}
    for row in rows:
        for trace, span in row.roots:
            if sharing[trace] > 1:
                out.setdefault(trace, {})[span] = row
    return out


def owned(
    events: Sequence[CheckpointEvent], roots: dict[int, RunRow]
) -> Iterator[tuple[CheckpointEvent, RunRow]]:
    """The span events of one shared trace (``roots``: its root span ids, each to its row), each
    with the row it belongs to; those that belong to no row are left out."""
    parents: dict[int, int | None] = {}
    checkpoints: dict[int, str | None] = {}
    for e in events:
        span, parent, checkpoint_id = _link(e)
        if span is not None:
            parents.setdefault(span, parent)
            checkpoints.setdefault(span, checkpoint_id)
    by_id: dict[str | None, dict[int, RunRow]] = {}
    for row in roots.values():
        by_id.setdefault(row.checkpoint_id, {})[id(row)] = row
    owners: dict[int, RunRow | None] = {}
    for span in parents:
        owners[span] = owner_by_parents(span, parents, roots, owners)
    for span, owner in owners.items():
        if owner is None and len(rows := by_id.get(checkpoints.get(span), {})) == 1:
            owners[span] = next(iter(rows.values()))
    for e in events:
        span = _link(e)[0]
        if span is not None and (owner := owners.get(span)) is not None:
            yield e, owner


def owner_by_parents(
    span: int,
    parents: dict[int, int | None],
    roots: dict[int, _Owner],
    owners: dict[int, _Owner | None],
) -> _Owner | None:
    """The owner (a row) of the root ``span`` descends from, by parent ids (``None``: none);
    every span on the way gets the answer too (``owners``). Bounded by the spans: a loop of
    parent ids ends it."""
    path: list[int] = []
    seen: set[int] = set()
    at: int | None = span
    owner: _Owner | None = None
    while at is not None and at not in seen:
        if at in roots:
            owner = roots[at]
            break
        if at in owners:
            owner = owners[at]
            break
        seen.add(at)
        path.append(at)
        at = parents.get(at)
    for step in path:
        owners[step] = owner
    return owner


def _link(event: CheckpointEvent) -> tuple[int | None, int | None, str | None]:
    """(span id, parent span id, checkpoint id) of a span's event; ``None``s for a counted one."""
    match event:
        case (
            OperationStarted()
            | OperationFinished()
            | StepStarted()
            | StepFinished()
            | CoordinateStarted()
            | CoordinateFinished()
            | StageStarted()
            | StageFinished()
            | CollectionStarted()
            | CollectionFinished()
        ):
            return event.span_id, event.parent_span_id, event.checkpoint_id
        case _:
            return None, None, None


def shared_line(rows: Sequence[RunRow], row: RunRow) -> str | None:
    """What a row's detail says when its trace holds other rows' roots too (``None``: it does
    not): the rows it shares it with, numbered as in the overview, and that only its own spans
    are shown."""
    others = [
        (number, other)
        for number, other in enumerate(rows, 1)
        if other is not row and other.trace_ids & row.trace_ids
    ]
    if not others:
        return None
    named = ", ".join(
        f"#{n} ({other.what} {short_id(other.checkpoint_id, '-')})" for n, other in others[:_NAMED]
    )
    more = f" and {len(others) - _NAMED} more" if len(others) > _NAMED else ""
    return (
        f"its trace is shared with {named}{more}: shown are the spans under its own root "
        "(one traceparent given to several collections)"
    )
