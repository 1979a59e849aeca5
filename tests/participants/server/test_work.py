"""LocalWork serves a workload in process; episode_view is what GET /work/{key} answers."""

from __future__ import annotations

import msgspec
import pytest

from ckpt_events import Telemetry
from ckpt_events.participants.errors import ProtocolRefusal
from ckpt_events.participants.protocol import EpisodeId, WorkAdvanceReply, WorkStartReply
from ckpt_events.participants.server.app import make_workload
from ckpt_events.participants.server.work import EpisodeView, LocalWork, WorkService, episode_view
from ckpt_events.vocab import ErrorCode


def _work(worker: int | None = None) -> LocalWork:
    tel = Telemetry(None, kind="resources", instance="res-0")
    return LocalWork(make_workload("resources", tel, request_seconds=0), worker=worker)


async def test_start_then_advance_reports_the_episode_boundary() -> None:
    """start answers the capture key at boundary 0; each advance moves one boundary until done."""
    work: WorkService = _work()
    assert await work.start(EpisodeId("r1", 2), 2) == WorkStartReply(capture_key="r1-a2", boundary=0)
    assert await work.advance(EpisodeId("r1", 2)) == WorkAdvanceReply(boundary=1, done=False)
    assert await work.advance(EpisodeId("r1", 2)) == WorkAdvanceReply(boundary=2, done=True)
    assert await work.advance(EpisodeId("r1", 2)) == WorkAdvanceReply(boundary=2, done=True)


async def test_advancing_an_unknown_episode_is_a_lookup_error_naming_its_key() -> None:
    """No such episode: LookupError whose argument is the capture key (the router's 404)."""
    with pytest.raises(LookupError) as info:
        await _work().advance(EpisodeId("nobody", 1))
    assert info.value.args == ("nobody-a1",)


async def test_start_refuses_while_admission_is_closed() -> None:
    """The workload's admission check comes through as its ProtocolRefusal."""
    work = _work()
    work.workload.close_admission()
    with pytest.raises(ProtocolRefusal) as info:
        await work.start(EpisodeId("r1"), 3)
    assert info.value.code is ErrorCode.ADMISSION_CLOSED


async def test_view_describes_a_held_episode_and_none_for_an_unknown_one() -> None:
    """The view carries the episode's id, progress, status, kind and state; unknown keys are None."""
    work = _work()
    await work.start(EpisodeId("r1"), 3)
    await work.advance(EpisodeId("r1"))
    assert await work.view("r1") == EpisodeView(
        capture_key="r1",
        rollout_id="r1",
        attempt=0,
        boundary=1,
        steps=3,
        done=False,
        status="idle",
        kind="resources",
        state={"session_id": "res-r1", "counter": 1, "document": ["line 1 of r1"]},
    )
    assert await work.view("r2") is None


async def test_a_workers_view_names_its_worker_and_a_single_process_one_omits_it() -> None:
    """worker=3 is carried into the view; with no worker the JSON has no worker field."""
    for worker in (None, 3):
        work = _work(worker)
        await work.start(EpisodeId("r1", 1), 2)
        view = await work.view("r1-a1")
        assert view is not None and view.worker == worker
        encoded = msgspec.json.decode(msgspec.json.encode(view))
        assert encoded.get("worker") == worker and ("worker" in encoded) == (worker is not None)


async def test_episode_view_reads_the_workload_and_the_episode() -> None:
    """episode_view uses the workload's kind and describe(); attempt and rollout come from the id."""
    work = _work()
    await work.start(EpisodeId("x", 4), 5)
    episode = work.workload.get("x-a4")
    assert episode is not None
    view = episode_view(work.workload, episode, worker=0)
    assert (view.rollout_id, view.attempt, view.steps, view.kind, view.worker) == ("x", 4, 5, "resources", 0)
    assert view.state == work.workload.describe(episode)


def test_an_episode_view_decodes_strictly() -> None:
    """The view's wire form refuses unknown fields and a negative boundary (it crosses processes)."""
    good = {
        "capture_key": "r1",
        "rollout_id": "r1",
        "attempt": 0,
        "boundary": 0,
        "steps": 1,
        "done": False,
        "status": "idle",
        "kind": "resources",
        "state": {},
    }
    assert msgspec.json.decode(msgspec.json.encode(good), type=EpisodeView).worker is None
    for bad in ({**good, "extra": 1}, {**good, "boundary": -1}, {**good, "steps": 0}):
        with pytest.raises(msgspec.ValidationError):
            msgspec.json.decode(msgspec.json.encode(bad), type=EpisodeView)
