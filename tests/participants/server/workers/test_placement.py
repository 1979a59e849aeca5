"""Placement: which worker holds each session, the parts a restore gives each worker, and the
work calls routed to the owner (in process: real Unix sockets in tmp, workers as tasks)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest

from ckpt_events import Bus, Telemetry
from ckpt_events.participants import create_app
from ckpt_events.participants.errors import ProtocolRefusal
from ckpt_events.participants.protocol import EpisodeId, RecordsPart
from ckpt_events.participants.server.app import make_workload
from ckpt_events.participants.server.store_read import Share
from ckpt_events.participants.server.workers.coordinator import WorkerCoordinator
from ckpt_events.participants.server.workers.placement import Placement, assign_parts
from ckpt_events.participants.workloads.fence import RetiredAttempts
from ckpt_events.vocab import ErrorCode
from tests.participants.helpers import TOKEN, control, error_code, running

pytestmark = pytest.mark.anyio


def _admit_all(episode_id: EpisodeId) -> None:
    """A gate that lets every work call through."""


def _placement(tmp_path: Path, workers: int = 2) -> Placement:
    return Placement(WorkerCoordinator(workers, socket_dir=tmp_path), _admit_all)


def test_parts_are_assigned_so_that_every_record_is_read_exactly_once():
    """One file is shared out over every worker; the parts of several go back to their writers."""
    one = [RecordsPart(0, "records.jsonl", "0" * 64, 10)]
    assert assign_parts(one, 1) == {0: [(one[0], Share())]}
    assert assign_parts(one, 3) == {i: [(one[0], Share(3, i))] for i in range(3)}
    two = [RecordsPart(w, f"records-{w}.jsonl", "0" * 64, 5) for w in (0, 1)]
    # Back to the worker that wrote each; a worker that did not exist then reads nothing.
    assert assign_parts(two, 3) == {0: [(two[0], Share())], 1: [(two[1], Share())], 2: []}
    assert assign_parts(two, 1) == {0: [(two[0], Share()), (two[1], Share())]}


def test_placing_grouping_and_dropping_sessions(tmp_path):
    """place, by_worker, unplace, drop_worker and drop_retired change only what they name."""
    placement = _placement(tmp_path)
    placement.place(0, ["a", "b"])
    placement.place(1, ["c", "d-a1"])
    assert placement.by_worker(["a", "c", "b", "nobody"]) == {0: ["a", "b"], 1: ["c"]}
    placement.unplace(["b", "nobody"])
    assert placement.owners == {"a": 0, "c": 1, "d-a1": 1}
    fence = RetiredAttempts()
    fence.mark(EpisodeId("d", 1))
    placement.drop_retired(fence)
    assert placement.owners == {"a": 0, "c": 1}
    placement.drop_worker(1)
    assert placement.owners == {"a": 0}
    placement.coordinator.urls[0] = "http://127.0.0.1:9000"
    assert placement.worker_url("a") == "http://127.0.0.1:9000"
    assert placement.worker_url("c") is None


def test_a_retired_uuid_ending_in_a_and_digits_drops_only_its_own_session(tmp_path):
    """drop_retired parses each key back: a UUID rollout ending in ``a`` and 11 digits is
    that rollout at attempt 0 (not attempt 4299078061 of its stem), its attempt 1 stays."""
    rollout = "4f1c2d3e-1ad2-421e-afa9-a04299078061"
    stem = rollout.rsplit("-a", 1)[0]
    placement = _placement(tmp_path)
    placement.place(0, [rollout, f"{rollout}-a1", stem])
    fence = RetiredAttempts()
    fence.mark(EpisodeId(rollout, 0))
    placement.drop_retired(fence)
    assert placement.owners == {f"{rollout}-a1": 0, stem: 0}


async def test_a_work_call_is_refused_by_the_gate_before_any_worker_is_asked(tmp_path):
    """The gate's refusal is the call's; a refused call neither places nor counts as served."""

    def closed(episode_id: EpisodeId) -> None:
        raise ProtocolRefusal(ErrorCode.ADMISSION_CLOSED, "closed")

    placement = Placement(WorkerCoordinator(2, socket_dir=tmp_path), closed)
    for call in (placement.start(EpisodeId("r0", 0), 3), placement.advance(EpisodeId("r0", 0))):
        with pytest.raises(ProtocolRefusal) as refused:
            await call
        assert refused.value.code is ErrorCode.ADMISSION_CLOSED
    assert placement.owners == {} and not placement.served


async def test_with_no_worker_a_start_is_503_and_an_unplaced_session_is_not_found(tmp_path):
    """No worker connected: start is 503; advance of a session nobody holds is LookupError, get None."""
    placement = _placement(tmp_path)
    with pytest.raises(ProtocolRefusal) as refused:
        await placement.start(EpisodeId("r0", 0), 3)
    assert refused.value.code is ErrorCode.CHECKPOINT_COORDINATOR_UNAVAILABLE
    with pytest.raises(LookupError):
        await placement.advance(EpisodeId("r0", 0))
    assert await placement.get("r0") is None
    assert placement.owners == {}


def _app(workers: int) -> Any:
    bus = Bus()
    return create_app(
        "environment",
        instance="env-0",
        token=TOKEN,
        workers=workers,
        checkpoint_root=tempfile.gettempdir(),
        worker_factory=lambda i: make_workload(
            "environment", Telemetry(bus, kind="environment", instance="env-0")
        ),
    )


async def test_new_sessions_go_to_the_least_loaded_worker_and_stay_there():
    """Nine sessions on three workers: three each, and each call finds its session's owner."""
    app = _app(3)
    async with running(app) as client:
        for i in range(9):
            reply = await client.post("/work/start", json={"rollout_id": f"r{i}", "steps": 3})
            assert reply.status_code == 200, reply.text
        placement = app.state.workload.placement
        assert sorted(placement.owners.values()) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
        for i in range(9):
            assert (await client.post("/work/advance", json={"rollout_id": f"r{i}"})).status_code == 200
            view = (await client.get(f"/work/r{i}")).json()
            assert view["worker"] == placement.owners[f"r{i}"] and view["boundary"] == 1
        assert placement.served


async def test_a_retired_session_leaves_the_placement():
    """retire forgets the owner of each retired session; a later call for it is stale_attempt."""
    app = _app(2)
    async with running(app) as client:
        for i in range(2):
            assert (
                await client.post("/work/start", json={"rollout_id": f"r{i}", "steps": 3})
            ).status_code == 200
        retired = await control(client, "retire", episode_ids=[{"rollout_id": "r0", "attempt": 0}])
        assert retired.status_code == 200, retired.text
        assert list(app.state.workload.placement.owners) == ["r1"]
        assert error_code(await client.post("/work/advance", json={"rollout_id": "r0"})) == (
            409,
            "stale_attempt",
        )
