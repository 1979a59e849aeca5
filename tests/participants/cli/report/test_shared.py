"""``report.shared``: in a trace several rows share, each span is the row's whose root it descends from."""

from __future__ import annotations

from ckpt_events import CollectionFinished, OperationFinished, StepFinished
from ckpt_events.participants.cli.report.overview import RunRow
from ckpt_events.participants.cli.report.shared import owned, shared_line, shared_traces
from ckpt_events.vocab import CollectionAction, Kind, Operation, Step

TRACE = 0xAB


def _root(span: int, action: CollectionAction, cid: str) -> CollectionFinished:
    return CollectionFinished(
        kind=Kind.CONTROLLER,
        instance="controller",
        trace_id=TRACE,
        span_id=span,
        start_ns=span,
        end_ns=span + 10,
        action=action,
        checkpoint_id=cid,
        parent_span_id=1,
        parent_remote=True,
    )


def _op(span: int, parent: int, cid: str, operation: Operation = Operation.COMMIT) -> OperationFinished:
    return OperationFinished(
        kind=Kind.MODEL,
        instance="model-0",
        trace_id=TRACE,
        span_id=span,
        start_ns=span,
        end_ns=span + 1,
        operation=operation,
        checkpoint_id=cid,
        parent_span_id=parent,
    )


def test_each_span_goes_to_the_row_whose_root_it_descends_from() -> None:
    """Two checkpoints and a restore in one trace: a span goes to its root's row, through any
    depth; one whose parent is missing goes to the one row of its checkpoint id, or to none when
    two rows carry that id; a loop of parent ids ends."""
    first = RunRow("checkpoint", "c1", 0, roots=[(TRACE, 10)])
    restore = RunRow("restore", "c1", 0, roots=[(TRACE, 20)])
    second = RunRow("checkpoint", "c2", 0, roots=[(TRACE, 30)])
    alone = RunRow("checkpoint", "c3", 0, roots=[(0xCD, 10)])
    shared = shared_traces([first, restore, second, alone])
    assert set(shared) == {TRACE} and shared[TRACE] == {10: first, 20: restore, 30: second}
    step = StepFinished(
        kind=Kind.MODEL,
        instance="model-0",
        trace_id=TRACE,
        span_id=12,
        start_ns=12,
        end_ns=13,
        step=Step.WRITE,
        checkpoint_id=None,
        parent_span_id=11,
    )
    events = [
        _root(10, CollectionAction.CHECKPOINT, "c1"),
        _op(11, 10, "c1"),
        step,  # no checkpoint id: its parent's row
        _root(20, CollectionAction.RESTORE, "c1"),
        _op(21, 20, "c1", Operation.RESTORE),
        _root(30, CollectionAction.CHECKPOINT, "c2"),
        _op(31, 99, "c2"),  # its parent not in the logs: the one row of c2
        _op(32, 98, "c1"),  # its parent not in the logs, and two rows carry c1: none
        _op(40, 41, "c1"),  # a loop of parent ids, no root: none
        _op(41, 40, "c1"),
    ]
    spans = {e.span_id: row for e, row in owned(events, shared[TRACE])}  # type: ignore[attr-defined]
    assert spans == {10: first, 11: first, 12: first, 20: restore, 21: restore, 30: second, 31: second}
    line = shared_line([first, restore, second, alone], restore)
    assert line is not None
    assert line.startswith("its trace is shared with #1 (checkpoint c1), #3 (checkpoint c2):")
    assert shared_line([first, restore, second, alone], alone) is None
