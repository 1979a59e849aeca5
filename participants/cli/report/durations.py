"""Durations per (participant kind, operation, step) over a run: what ``diff`` compares and what
trends are built from. Read in one pass; each key keeps its ok spans' durations (one float each)
and counts its failed spans apart: a commit that failed after 2 ms is not a fast commit."""

from __future__ import annotations

import math
import statistics
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from ckpt_events import (
    CheckpointEvent,
    CollectionFinished,
    CoordinateFinished,
    OperationFinished,
    StageFinished,
    StepFinished,
)
from ckpt_events.participants.cli.report.cancels import is_cancelled
from ckpt_events.participants.cli.report.events import FinishedSpan, duration_ns
from ckpt_events.vocab import Outcome

__all__ = ["Durations", "DurationsFold", "Key", "durations", "percentile"]

#: (participant kind, operation or collection action, step or stage or "").
Key = tuple[str, str, str]
#: Operations finished lately, by trace and span id, for a step read after its operation: a log
#: merged out of order. A step is written before its operation finishes, so this is rarely read; it is
#: bounded (every operation's id kept grew the report of a user's own server by 11 MiB from
#: 50,000 to 200,000 lines).
RECENT_OPERATIONS: Final = 4096


@dataclass
class Durations:
    """A run's spans by key: the ok ones' milliseconds, and how many failed."""

    ok: dict[Key, list[float]] = field(default_factory=dict)
    #: Failed spans per key (``outcome`` error); their durations say how soon they failed, not
    #: how long the work takes, so they are counted, never timed.
    failed: dict[Key, int] = field(default_factory=dict)
    #: Of ``failed``, those cancelled (``cancels.is_cancelled``): a stop cut them.
    cancelled: dict[Key, int] = field(default_factory=dict)
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
        # A step finishes before its operation: it waits for it here, by the operation's trace
        # and span id (a span id is unique in its trace only: two processes' operations of one
        # span id keyed a step under the other's), and is keyed when the operation finishes.
        # Held are the steps of the operations still open, not every operation read.
        self._waiting: dict[tuple[int, int], list[StepFinished]] = {}
        self._recent: OrderedDict[tuple[int, int], str] = OrderedDict()
        self._out = Durations()

    def _add(self, key: Key, e: FinishedSpan) -> None:
        out = self._out
        if e.outcome != Outcome.OK:
            out.failed[key] = out.failed.get(key, 0) + 1
            if is_cancelled(e.error_type):
                out.cancelled[key] = out.cancelled.get(key, 0) + 1
        elif (length := duration_ns(e)) is not None:
            out.ok.setdefault(key, []).append(length / 1e6)
        else:
            out.unknown[key] = out.unknown.get(key, 0) + 1

    def _step(self, e: StepFinished, operation: str) -> None:
        self._add((str(e.kind), operation, str(e.step)), e)

    def add(self, e: CheckpointEvent) -> None:
        match e:
            case OperationFinished():
                operation = str(e.operation)
                for step in self._waiting.pop((e.trace_id, e.span_id), ()):
                    self._step(step, operation)
                recent = self._recent
                recent[(e.trace_id, e.span_id)] = operation
                if len(recent) > RECENT_OPERATIONS:
                    recent.popitem(last=False)
                self._add((str(e.kind), operation, ""), e)
            case StepFinished():
                parent = (e.trace_id, e.parent_span_id or 0)
                if (finished := self._recent.get(parent)) is not None:
                    self._step(e, finished)  # read after its operation
                else:
                    self._waiting.setdefault(parent, []).append(e)
            case CoordinateFinished():
                self._add(("controller", f"coordinate.{e.operation!s}", ""), e)
            case StageFinished():
                self._add(("controller", "stage", str(e.stage)), e)
            case CollectionFinished():
                self._add(("controller", f"collection.{e.action!s}", ""), e)
            case _:
                pass

    def result(self) -> Durations:
        """What was fed: a step whose operation never finished in the logs is keyed ``?``."""
        for steps in self._waiting.values():
            for e in steps:
                self._step(e, "?")
        self._waiting = {}
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
