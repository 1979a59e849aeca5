"""The critical path in words: the longest stage on the chain that set the root's end (walked
back through earlier stages, not only the last-ending child), and the longest participant
operation on it with its step."""

from __future__ import annotations

from typing import Any

from ckpt_events import CollectionFinished, CoordinateFinished, OperationFinished, StepFinished
from ckpt_events.participants.cli.report.paths import slowest
from ckpt_events.vocab import CollectionAction, Kind, Operation, Step

MS = 1_000_000
T = 7


def _coordinate(span: int, operation: Operation, start: int, end: int) -> CoordinateFinished:
    return CoordinateFinished(Kind.CONTROLLER, "c", T, span, start * MS, end * MS, operation, "k", 1)


def _operation(span: int, parent: int, kind: Kind, operation: Operation, start: int, end: int) -> Any:
    return OperationFinished(kind, f"{kind.value}-0", T, span, start * MS, end * MS, operation, "k", parent)


def test_a_long_stage_before_a_short_last_one_is_named() -> None:
    """Prepare 0-100 (the model's prepare 10-90, its generation cut 20-80), commit 100-130,
    resume 130-135 ends last: prepare is the longest stage on the path, the model's prepare the
    longest operation, the cut its step; a span that ended after the next stage began (a stray
    renew 95-120, overlapping the commit) is off the path."""
    spans = [
        CollectionFinished(Kind.CONTROLLER, "c", T, 1, 0, 135 * MS, CollectionAction.CHECKPOINT, "k"),
        _coordinate(2, Operation.PREPARE, 0, 100),
        _operation(10, 2, Kind.MODEL, Operation.PREPARE, 10, 90),
        StepFinished(Kind.MODEL, "model-0", T, 11, 20 * MS, 80 * MS, Step.GENERATION_CUT, "k", 10),
        _operation(12, 2, Kind.AGENT, Operation.PREPARE, 92, 99),
        _coordinate(3, Operation.COMMIT, 100, 130),
        _operation(13, 3, Kind.ENVIRONMENT, Operation.COMMIT, 101, 129),
        _coordinate(4, Operation.RENEW, 95, 120),
        _coordinate(5, Operation.RESUME, 130, 135),
        _operation(14, 5, Kind.AGENT, Operation.RESUME, 131, 134),
    ]
    said = slowest(spans, T)
    assert (
        said == "coordinate.prepare 100.0 ms, slowest model/model-0 prepare 80.0 ms (generation_cut 60.0 ms)"
    )
    # Without the long prepare, the commit is the longest stage and its environment operation.
    assert slowest([spans[0], *spans[5:]], T) == (
        "coordinate.commit 30.0 ms, slowest environment/environment-0 commit 28.0 ms"
    )
    assert slowest([], T) == ""
