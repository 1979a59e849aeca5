"""Durations per (participant kind, operation, step) over a run: what ``diff`` compares and what
trends are built from. Read in one pass; each key keeps its ok spans' durations (one float each)
and counts its failed spans apart: a commit that failed after 2 ms is not a fast commit."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field

from ckpt_events import (
    CheckpointEvent,
    CollectionFinished,
    CoordinateFinished,
    OperationFinished,
    StageFinished,
    StepFinished,
)
from ckpt_events.participants.cli.report.events import FinishedSpan, duration_ns
from ckpt_events.vocab import Outcome

__all__ = ["Durations", "Key", "durations", "percentile"]

#: (participant kind, operation or collection action, step or stage or "").
Key = tuple[str, str, str]


@dataclass
class Durations:
    """A run's spans by key: the ok ones' milliseconds, and how many failed."""

    ok: dict[Key, list[float]] = field(default_factory=dict)
    #: Failed spans per key (``outcome`` error); their durations say how soon they failed, not
    #: how long the work takes, so they are counted, never timed.
    failed: dict[Key, int] = field(default_factory=dict)

    def keys(self) -> set[Key]:
        """Every key with a span, ok or failed."""
        return self.ok.keys() | self.failed.keys()

    def __bool__(self) -> bool:
        return bool(self.ok or self.failed)


def durations(events: Iterable[CheckpointEvent]) -> Durations:
    """Milliseconds of every finished ok operation, step, stage, coordinate and collection span,
    each by its own process's clock (``duration_ns``; a span whose clock went back during it
    has no known duration and is left out), and the failed ones counted. A step is keyed by
    its operation, found from its parent span."""
    operation_of: dict[int, str] = {}
    steps: list[StepFinished] = []
    out = Durations()

    def add(key: Key, e: FinishedSpan) -> None:
        if e.outcome != Outcome.OK:
            out.failed[key] = out.failed.get(key, 0) + 1
        elif (length := duration_ns(e)) is not None:
            out.ok.setdefault(key, []).append(length / 1e6)

    for e in events:
        match e:
            case OperationFinished():
                operation_of[e.span_id] = str(e.operation)
                add((str(e.kind), str(e.operation), ""), e)
            case StepFinished():
                steps.append(e)  # its operation finishes after it
            case CoordinateFinished():
                add(("controller", f"coordinate.{e.operation!s}", ""), e)
            case StageFinished():
                add(("controller", "stage", str(e.stage)), e)
            case CollectionFinished():
                add(("controller", f"collection.{e.action!s}", ""), e)
    for e in steps:
        add((str(e.kind), operation_of.get(e.parent_span_id or 0, "?"), str(e.step)), e)
    return out


def percentile(values: list[float], share: float) -> float:
    """The nearest-rank percentile (``share`` in 0..1) of a non-empty list."""
    ordered = sorted(values)
    # The ceil(share * n)-th smallest; the tolerance keeps a product like 0.95 * 20 (18.999...) on
    # its whole rank.
    rank = math.ceil(share * len(ordered) - 1e-9)
    return ordered[min(len(ordered) - 1, max(0, rank - 1))]


def median(values: list[float]) -> float:
    return statistics.median(values)
