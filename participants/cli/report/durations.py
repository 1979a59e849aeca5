"""Durations per (participant kind, operation, step) over a run: what ``diff`` compares and what
trends are built from. Read in one pass; each key keeps its durations (one float each)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

from ckpt_events import CollectionFinished, CoordinateFinished, OperationFinished, StageFinished, StepFinished

__all__ = ["Key", "durations", "percentile"]

#: (participant kind, operation or collection action, step or stage or "").
Key = tuple[str, str, str]


def durations(events: Iterable[Any]) -> dict[Key, list[float]]:
    """Milliseconds of every finished operation, step, stage, coordinate and collection span.
    A step is keyed by its operation, found from its parent span."""
    operation_of: dict[int, str] = {}
    steps: list[Any] = []
    out: dict[Key, list[float]] = {}

    def add(key: Key, e: Any) -> None:
        out.setdefault(key, []).append((e.end_ns - e.start_ns) / 1e6)

    for e in events:
        match e:
            case OperationFinished():
                operation_of[e.span_id] = e.operation.value
                add((str(e.kind), e.operation.value, ""), e)
            case StepFinished():
                steps.append(e)  # its operation finishes after it
            case CoordinateFinished():
                add(("controller", f"coordinate.{e.operation.value}", ""), e)
            case StageFinished():
                add(("controller", "stage", str(e.stage)), e)
            case CollectionFinished():
                add(("controller", f"collection.{e.action.value}", ""), e)
    for e in steps:
        add((str(e.kind), operation_of.get(e.parent_span_id or 0, "?"), str(e.step)), e)
    return out


def percentile(values: list[float], share: float) -> float:
    """The nearest-rank percentile (``share`` in 0..1) of a non-empty list."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered) + 0.5) - 1))]


def median(values: list[float]) -> float:
    return statistics.median(values)
