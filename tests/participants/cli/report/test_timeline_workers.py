"""The report shows a multi-worker participant's workers as rows under it, in the breakdown and timeline."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from ckpt_events import Telemetry
from ckpt_events.participants.cli.report.terminal import render
from ckpt_events.participants.cli.report.timeline import breakdown, per_kind, spans_of
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


async def _workers_only() -> list[Any]:
    """A user's own server of two workers, each its own process with ``Telemetry(worker=i)`` and no
    main process that emits (gunicorn -w 2), beside a model that prepares first in the order."""
    async with capture_events() as (bus, events):
        controller = Telemetry(bus, kind="controller", instance="coordination")
        model = Telemetry(bus, kind="model", instance="model-0")
        workers = [Telemetry(bus, kind="judge", instance="judge-0", worker=i) for i in (0, 1)]
        with controller.collection("checkpoint", checkpoint_id="c1") as collection:
            for tel in (model, *workers):
                with tel.operation("commit", checkpoint_id="c1", traceparent=collection.traceparent()) as op:
                    with op.step("upload"):
                        pass
                    op.set(records=3)
    return list(events)


async def test_workers_with_no_main_process_sit_under_their_own_participant() -> None:
    """The workers' rows sat under the row before them, ``model/model-0``: judge-0's commits read
    as the model's workers, and judge-0 was in no row. Its own row now heads them, its records
    its workers' sum, its own times blank (no process of its own timed anything)."""
    events = await _workers_only()
    rows = breakdown(events)
    assert [(r.kind, r.instance, r.worker, r.records) for r in rows] == [
        ("model", "model-0", None, 3),
        ("judge", "judge-0", None, 6),
        ("judge", "judge-0", 0, 3),
        ("judge", "judge-0", 1, 3),
    ]
    assert rows[1].ms == {}
    out = io.StringIO()
    render(Console(file=out, width=200), events)
    lines = out.getvalue().splitlines()
    (head,) = [i for i, line in enumerate(lines) if line.strip().startswith("judge/judge-0")]
    assert lines[head + 1].strip().startswith("└ worker 0")


async def test_a_fleet_row_counts_a_participants_records_once_not_again_for_its_workers() -> None:
    """Past ``FLEET`` participants, a kind's row summed the records of every row, its workers'
    shares too: agent-0's 5 records (2 + 3 in its workers) read 10."""
    rows = per_kind(breakdown(await _one_commit()))
    assert [(r.kind, r.records) for r in rows] == [("agent", 5)]
    only_workers = per_kind(breakdown(await _workers_only()))
    assert [(r.kind, r.records) for r in only_workers] == [("model", 3), ("judge", 6)]
