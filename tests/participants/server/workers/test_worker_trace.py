"""One checkpoint of a 2-worker participant is one trace: each worker's share is a child span."""

from __future__ import annotations

import tempfile
from typing import Any

import pytest

from ckpt_events import Bus, OperationFinished, StepFinished, Telemetry, format_traceparent
from ckpt_events.participants import create_app
from ckpt_events.participants.server.app import make_workload
from ckpt_events.testing import capture_events
from tests.participants.helpers import AUTH, TOKEN, control, running

pytestmark = pytest.mark.anyio
CONTROLLER_TRACE = 0x4BF92F3577B34DA6A3CE929D0E0E4736
CONTROLLER_SPAN = 0x00F067AA0BA902B7


def _app(bus: Bus) -> Any:
    return create_app(
        "environment",
        instance="env-0",
        token=TOKEN,
        bus=bus,
        workers=2,
        checkpoint_root=tempfile.gettempdir(),  # holds every tmp_path
        worker_factory=lambda i: make_workload(
            "environment", Telemetry(bus, kind="environment", instance="env-0", worker=i)
        ),
    )


async def test_each_workers_share_is_a_child_of_the_coordinators_operation(tmp_path: Any) -> None:
    """prepare, commit, restore: the coordinator's span is the parent of one share per worker."""
    header = {**AUTH, "traceparent": format_traceparent(CONTROLLER_TRACE, CONTROLLER_SPAN)}
    async with capture_events() as (bus, events):
        async with running(_app(bus)) as client:
            for i in range(4):
                reply = await client.post("/work/start", json={"rollout_id": f"r{i}", "steps": 2})
                assert reply.status_code == 200, reply.text
            assert (await control(client, "prepare", headers=header)).json()["phase"] == "prepared"
            commit = await control(client, "commit", checkpoint_dir=str(tmp_path), headers=header)
            assert commit.status_code == 200, commit.text
        await bus.flush()
    operations = [e for e in events if type(e) is OperationFinished]
    for name in ("prepare", "commit"):
        [coordinator] = [e for e in operations if e.operation == name and e.worker is None]
        shares = [e for e in operations if e.operation == name and e.worker is not None]
        assert coordinator.trace_id == CONTROLLER_TRACE and coordinator.parent_span_id == CONTROLLER_SPAN
        assert sorted(e.worker for e in shares) == [0, 1], name
        for share in shares:
            assert (share.trace_id, share.parent_span_id) == (CONTROLLER_TRACE, coordinator.span_id)
            assert share.parent_remote and share.checkpoint_id == "c1"
    commit_shares = [e for e in operations if e.operation == "commit" and e.worker is not None]
    assert sum(e.records or 0 for e in commit_shares) == 4
    exports = [e for e in events if type(e) is StepFinished and e.step == "export" and e.worker is not None]
    assert sorted(e.worker for e in exports) == [0, 1]
    assert {e.parent_span_id for e in exports} == {e.span_id for e in commit_shares}


async def test_a_restore_share_joins_the_controllers_trace_even_without_a_sink_here(tmp_path: Any) -> None:
    """With no sink on the coordinator's bus, the worker shares take the incoming traceparent."""
    header = {**AUTH, "traceparent": format_traceparent(CONTROLLER_TRACE, CONTROLLER_SPAN)}
    async with Bus() as bus:
        async with running(_app(bus)) as client:
            await client.post("/work/start", json={"rollout_id": "r0", "steps": 2})
            assert (await control(client, "prepare")).json()["phase"] == "prepared"
            assert (await control(client, "commit", checkpoint_dir=str(tmp_path))).status_code == 200
    async with capture_events() as (worker_bus, events), Bus() as main_bus:
        app = create_app(
            "environment",
            instance="env-0",
            token=TOKEN,
            bus=main_bus,
            workers=2,
            checkpoint_root=tempfile.gettempdir(),
            worker_factory=lambda i: make_workload(
                "environment", Telemetry(worker_bus, kind="environment", instance="env-0", worker=i)
            ),
        )
        async with running(app) as client:
            episodes = [{"rollout_id": "r0", "attempt": 0}]
            reply = await control(
                client, "restore", "c2", checkpoint_dir=str(tmp_path), episode_ids=episodes, headers=header
            )
            assert reply.status_code == 200, reply.text
        await worker_bus.flush()
    # Each worker's share is two operations: it reads and checks (stage), then installs.
    shares = [e for e in events if type(e) is OperationFinished and e.operation == "restore"]
    assert sorted(e.worker for e in shares) == [0, 0, 1, 1]
    for share in shares:
        assert share.checkpoint_id == "c2"
        assert (share.trace_id, share.parent_span_id, share.parent_remote) == (
            CONTROLLER_TRACE,
            CONTROLLER_SPAN,
            True,
        )
    holding = [e for e in shares if e.records == 1]
    assert len(holding) == 2 and len({e.worker for e in holding}) == 1
    steps = [e.step for e in events if type(e) is StepFinished and e.worker == holding[0].worker]
    assert steps == ["read", "install"]


async def test_every_workers_share_carries_its_frames_arrival_and_its_loop_lag(tmp_path: Any) -> None:
    """prepare, commit, retire and restore shares have ``received_ns`` (the frame read, at or
    before the share starts) and ``loop_lag_ms``, as the main port's operations do."""
    async with capture_events() as (bus, events):
        async with running(_app(bus)) as client:
            for i in range(4):
                reply = await client.post("/work/start", json={"rollout_id": f"r{i}", "steps": 2})
                assert reply.status_code == 200, reply.text
            assert (await control(client, "prepare")).json()["phase"] == "prepared"
            assert (await control(client, "commit", checkpoint_dir=str(tmp_path))).status_code == 200
            assert (await control(client, "resume")).status_code == 200
            retired = await control(client, "retire", "c2", episode_ids=[{"rollout_id": "r0"}])
            assert retired.status_code == 200, retired.text
        async with running(_app(bus)) as fresh:
            episodes = [{"rollout_id": f"r{i}"} for i in range(1, 4)]
            restored = await control(
                fresh, "restore", "c3", checkpoint_dir=str(tmp_path), episode_ids=episodes
            )
            assert restored.status_code == 200, restored.text
        await bus.flush()
    shares = [e for e in events if type(e) is OperationFinished and e.worker is not None]
    assert {e.operation for e in shares} == {"prepare", "commit", "retire", "restore"}
    for share in shares:
        assert share.received_ns is not None and share.received_ns <= share.start_ns, share
        assert share.loop_lag_ms is not None and share.loop_lag_ms >= 0, share
