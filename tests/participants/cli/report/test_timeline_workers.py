"""The report shows a multi-worker participant's workers as rows under it, in the breakdown and timeline."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from ckpt_events import Telemetry
from ckpt_events.participants.cli.report.terminal import render
from ckpt_events.participants.cli.report.timeline import breakdown, spans_of
from ckpt_events.testing import capture_events


async def _one_commit() -> list[Any]:
    async with capture_events() as (bus, events):
        controller = Telemetry(bus, kind="controller", instance="coordination")
        main = Telemetry(bus, kind="agent", instance="agent-0")
        shares = [Telemetry(bus, kind="agent", instance="agent-0", worker=i) for i in (1, 0)]
        # Under a collection checkpoint: the report draws the waterfalls of checkpoints and restores.
        with (
            controller.collection("checkpoint", checkpoint_id="c1") as collection,
            main.operation("commit", checkpoint_id="c1", traceparent=collection.traceparent()) as op,
        ):
            for share in shares:
                with share.operation("commit", checkpoint_id="c1", traceparent=op.traceparent()) as s:
                    s.set(records=2 + (share.worker or 0))
            op.set(records=5)
    return list(events)


async def test_breakdown_gives_each_worker_a_row_right_under_its_participant() -> None:
    """Rows: the participant (worker None), then worker 0, then worker 1, with their own records."""
    rows = breakdown(await _one_commit())
    assert [(r.instance, r.worker, r.records) for r in rows] == [
        ("agent-0", None, 5),
        ("agent-0", 0, 2),
        ("agent-0", 1, 3),
    ]


async def test_timeline_names_the_worker_and_nests_its_share() -> None:
    """The waterfall's who column names the worker; its share sits one level under the operation."""
    events = await _one_commit()
    spans = spans_of(events)
    assert sorted((s.who, s.depth) for s in spans) == [
        ("agent/agent-0", 1),
        ("agent/agent-0/w0", 2),
        ("agent/agent-0/w1", 2),
        ("controller", 0),
    ]
    out = io.StringIO()
    render(Console(file=out, width=200), events)
    assert "└ worker 0" in out.getvalue() and "commit agent-0/w1" in out.getvalue()
