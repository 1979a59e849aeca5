"""The run overview: one fold of the logs into rows, read again for the detail of chosen rows (the
causes of a row that did not publish are ``test_causes``'s)."""

from __future__ import annotations

from typing import Any

import anyio

from ckpt_events.participants.cli.report.overview import overview
from ckpt_events.vocab import ErrorCode


def test_a_list_of_events_is_read_again_whole_after_a_cause_names_a_checkpoint() -> None:
    """``overview(list)`` keeps the list as its own ``again``: a later read of the run gives every
    event back (a local name reused for a checkpoint's causes once made it give those instead)."""
    from tests.participants.cli.report_events import checkpoint_and_restore

    events = anyio.run(checkpoint_and_restore)
    telemetry_events: list[Any] = []

    async def refused() -> None:
        from ckpt_events import Telemetry
        from ckpt_events.testing import capture_events

        async with capture_events() as (bus, got):
            Telemetry(bus, kind="agent", instance="agent-0").refused(
                ErrorCode.UNAUTHORIZED, checkpoint_id="c1"
            )
        telemetry_events.extend(got)

    anyio.run(refused)
    run = overview([*events, *telemetry_events])
    assert len(run.all_events()) == len(events) + len(telemetry_events)


def test_traces_let_go_past_the_unrooted_bound_are_said() -> None:
    """4,100 participants' traces whose root never comes, after a checkpoint and a restore: the
    fold keeps 4,096 of them waiting for a root and lets the 4 oldest go, and says so in one line
    (they were let go silently)."""
    from ckpt_events import OperationFinished
    from ckpt_events.vocab import Kind, Operation, Outcome
    from tests.participants.cli.report_events import checkpoint_and_restore

    events: list[Any] = anyio.run(checkpoint_and_restore)
    start = max(getattr(e, "end_ns", 0) for e in events) + 1_000
    rootless = [
        OperationFinished(
            kind=Kind.ENVIRONMENT,
            instance="environment-0",
            trace_id=(1 << 100) + n,
            span_id=n + 1,
            start_ns=start + n * 1_000,
            end_ns=start + n * 1_000 + 500,
            operation=Operation.PREPARE,
            checkpoint_id=f"elsewhere-{n}",
            parent_span_id=(1 << 62) + n,
            parent_remote=True,
            outcome=Outcome.OK,
        )
        for n in range(4_100)
    ]
    run = overview([*events, *rootless])
    assert run.rows  # the checkpoint and the restore
    assert run.unrooted_let_go == 4
    said = run.let_go_line()
    assert said is not None and said.startswith("4 traces with no root span were let go past 4,096")
    assert overview(events).let_go_line() is None
