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
