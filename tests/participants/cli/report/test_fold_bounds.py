"""The ``+N more steps`` folds of a user's own steps at their bounds: a fold of one name takes
that name's place and hides it (13 own steps showed 12 and ``+1 more steps``, as wide as the 13),
and a clock that went back in a folded step makes the fold unknown, never a short sum."""

from __future__ import annotations

import msgspec
import pytest

from ckpt_events import StepFinished
from ckpt_events.participants.cli.report.durations import durations
from ckpt_events.participants.cli.report.operations import ROWS_SHOWN, operation_rows
from ckpt_events.participants.cli.report.timeline import OWN_COLUMNS, breakdown, breakdown_columns
from ckpt_events.testing import EventCapture


def _commit(steps: int, went_back: frozenset[str] = frozenset()) -> list:
    """One agent commit with ``steps`` own steps ``own-00``...; a step named in ``went_back``
    ends 1 s before it started (its process's clock went back)."""
    with EventCapture() as capture:
        agent = capture.telemetry("agent", "agent-0")
        with agent.operation("commit", checkpoint_id="c1") as op:
            for i in range(steps):
                with op.step(f"own-{i:02d}"):
                    pass
        events = capture.events
    return [
        msgspec.structs.replace(e, end_ns=e.start_ns - 10**9)
        if isinstance(e, StepFinished) and str(e.step) in went_back
        else e
        for e in events
    ]


@pytest.mark.parametrize(
    ("steps", "named", "folded"), [(12, 12, None), (13, 13, None), (14, 12, "+2 more steps")]
)
def test_the_breakdown_folds_two_or_more_own_steps_never_one(
    steps: int, named: int, folded: str | None
) -> None:
    """12 and 13 own steps are each a column by name; 14 are 12 and ``+2 more steps``."""
    assert OWN_COLUMNS == 12
    columns = breakdown_columns(breakdown(_commit(steps)))
    assert sum(c.startswith("own-") for c in columns) == named
    assert [c for c in columns if c.startswith("+")] == ([folded] if folded else [])


@pytest.mark.parametrize(
    ("steps", "rows", "folded"), [(39, 40, None), (40, 41, None), (41, 41, "+2 more steps")]
)
def test_the_table_sums_two_or_more_step_rows_never_one(steps: int, rows: int, folded: str | None) -> None:
    """The commit's row and 40 step rows are 41 rows by name; 41 step rows are the commit's,
    39 steps and ``+2 more steps`` counting both."""
    assert ROWS_SHOWN == 40
    table = operation_rows(durations(_commit(steps)))
    assert len(table) == rows
    more = [r for r in table if r.step.startswith("+")]
    assert [r.step for r in more] == ([folded] if folded else [])
    assert sum(r.count for r in table) == steps + 1


def test_a_folded_step_of_unknown_duration_makes_the_fold_unknown() -> None:
    """The longest-named step's clock went back: the fold is ``?``, not the sum of the other."""
    row = breakdown(_commit(14, went_back=frozenset({"own-00"})))[0]
    assert "+2 more steps" in row.unknown and "+2 more steps" not in row.ms
    assert not any(name.startswith("own-") for name in row.unknown)
