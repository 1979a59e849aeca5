"""Durations per (participant kind, operation, step) over a run: what ``diff`` compares and what
trends are built from. Read in one pass; each key keeps its durations (one float each)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable

from ckpt_events import (
    CheckpointEvent,
    CollectionFinished,
    CoordinateFinished,
    OperationFinished,
    StageFinished,
    StepFinished,
)
from ckpt_events.participants.cli.report.events import FinishedSpan, duration_ns

__all__ = ["Key", "durations", "percentile"]

#: (participant kind, operation or collection action, step or stage or "").
Key = tuple[str, str, str]


def durations(events: Iterable[CheckpointEvent]) -> dict[Key, list[float]]:
    """Milliseconds of every finished operation, step, stage, coordinate and collection span,
    each by its own process's clock (``duration_ns``; a span whose clock went back during it
    has no known duration and is left out). A step is keyed by its operation, found from its
    parent span."""
    operation_of: dict[int, str] = {}
    steps: list[StepFinished] = []
    out: dict[Key, list[float]] = {}

    def add(key: Key, e: FinishedSpan) -> None:
        if (length := duration_ns(e)) is not None:
            out.setdefault(key, []).append(length / 1e6)

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
