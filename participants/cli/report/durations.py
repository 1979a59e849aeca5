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

__all__ = ["Durations", "DurationsFold", "Key", "durations", "percentile"]

#: (participant kind, operation or collection action, step or stage or "").
Key = tuple[str, str, str]


@dataclass
class Durations:
    """A run's spans by key: the ok ones' milliseconds, and how many failed."""

    ok: dict[Key, list[float]] = field(default_factory=dict)
    #: Failed spans per key (``outcome`` error); their durations say how soon they failed, not
    #: how long the work takes, so they are counted, never timed.
    failed: dict[Key, int] = field(default_factory=dict)
    #: Ok spans of unknown duration per key (their process's clock went back during them):
    #: counted, never timed.
    unknown: dict[Key, int] = field(default_factory=dict)

    def keys(self) -> set[Key]:
        """Every key with a span, ok or failed."""
        return self.ok.keys() | self.failed.keys()

    def __bool__(self) -> bool:
        return bool(self.ok or self.failed)


def durations(events: Iterable[CheckpointEvent]) -> Durations:
    """Milliseconds of every finished ok operation, step, stage, coordinate and collection span,
    each by its own process's clock (``duration_ns``; a span whose clock went back during it
    has no known duration and is left out, counted in ``unknown``), and the failed ones
    counted. A step is keyed by its operation, found from its parent span."""
    fold = DurationsFold()
    for e in events:
        fold.add(e)
    return fold.result()


class DurationsFold:
    """``durations`` fed one event at a time, for a pass over the logs that feeds other folds
    too (the report of a user's own server streams its logs once for all of its tables)."""

    def __init__(self) -> None:
        self._operation_of: dict[int, str] = {}
        self._steps: list[StepFinished] = []
        self._out = Durations()

    def _add(self, key: Key, e: FinishedSpan) -> None:
        out = self._out
        if e.outcome != Outcome.OK:
            out.failed[key] = out.failed.get(key, 0) + 1
        elif (length := duration_ns(e)) is not None:
            out.ok.setdefault(key, []).append(length / 1e6)
        else:
            out.unknown[key] = out.unknown.get(key, 0) + 1

    def add(self, e: CheckpointEvent) -> None:
        match e:
            case OperationFinished():
                self._operation_of[e.span_id] = str(e.operation)
                self._add((str(e.kind), str(e.operation), ""), e)
            case StepFinished():
                self._steps.append(e)  # its operation finishes after it
            case CoordinateFinished():
                self._add(("controller", f"coordinate.{e.operation!s}", ""), e)
            case StageFinished():
                self._add(("controller", "stage", str(e.stage)), e)
            case CollectionFinished():
                self._add(("controller", f"collection.{e.action!s}", ""), e)
            case _:
                pass

    def result(self) -> Durations:
        """What was fed: the steps are keyed by their operation now that it has finished."""
        for e in self._steps:
            self._add((str(e.kind), self._operation_of.get(e.parent_span_id or 0, "?"), str(e.step)), e)
        self._steps = []
        return self._out


def percentile(values: list[float], share: float) -> float:
    """The nearest-rank percentile (``share`` in 0..1) of a non-empty list."""
    ordered = sorted(values)
    # The ceil(share * n)-th smallest; the tolerance keeps a product like 0.95 * 20 (18.999...) on
    # its whole rank.
    rank = math.ceil(share * len(ordered) - 1e-9)
    return ordered[min(len(ordered) - 1, max(0, rank - 1))]


def median(values: list[float]) -> float:
    return statistics.median(values)
