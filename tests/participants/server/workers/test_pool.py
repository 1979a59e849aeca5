"""The multi-worker participant in process: real Unix sockets in tmp, workers as tasks."""

from __future__ import annotations

import json
import socket
import tempfile
from typing import Any

import anyio
import pytest
from anyio.abc import SocketAttribute

from ckpt_events import Bus, Telemetry
from ckpt_events.participants import create_app
from ckpt_events.participants.protocol import MAX_RETIRED_KEYS_SHOWN, EpisodeId
from ckpt_events.participants.server.app import make_workload
from ckpt_events.participants.server.store import participant_dir
from tests.participants.helpers import (
    TOKEN,
    control,
    error_code,
    post_json,
    retired_counts_during,
    running,
    status,
)

pytestmark = pytest.mark.anyio


def _app(workers: int, *, bus: Bus | None = None, instance: str = "env-0", **options: Any) -> Any:
    the_bus = bus or Bus()
    return create_app(
        "environment",
        instance=instance,
        token=TOKEN,
        workers=workers,
        checkpoint_root=tempfile.gettempdir(),  # holds every tmp_path
        worker_factory=lambda i: make_workload(
            "environment", Telemetry(the_bus, kind="environment", instance=instance), **options
        ),
        **options,
    )


async def _start(client: Any, rollout_id: str, steps: int = 3, attempt: int = 0) -> Any:
    reply = await client.post(
        "/work/start", json={"rollout_id": rollout_id, "steps": steps, "attempt": attempt}
    )
    assert reply.status_code == 200, reply.text
    return reply.json()


async def test_work_is_spread_and_a_checkpoint_gathers_every_worker(tmp_path):
    """Sessions land on both workers; prepare counts workers; commit writes one manifest of all."""
    app = _app(2)
    async with running(app) as client:
        for i in range(6):
            await _start(client, f"r{i}")
            assert (await client.post("/work/advance", json={"rollout_id": f"r{i}"})).json()["boundary"] == 1
        views = [(await client.get(f"/work/r{i}")).json() for i in range(6)]
        assert {v["worker"] for v in views} == {0, 1}
        prepared = await control(client, "prepare")
        assert prepared.status_code == 200, prepared.text
        report = prepared.json()["report"]
        assert prepared.json()["phase"] == "prepared" and report["counts"]["workers"] == 2
        assert report["counts"]["episodes"] == 6
        assert error_code(await client.post("/work/start", json={"rollout_id": "late", "steps": 1})) == (
            409,
            "admission_closed",
        )
        committed = await control(client, "commit", checkpoint_dir=str(tmp_path))
        assert committed.status_code == 200, committed.text
        manifest = committed.json()["manifest"]
        assert manifest["record_count"] == 6 and manifest["records_file"] == ""
        # One records file per worker, written by that worker, listed in worker order.
        directory = participant_dir(tmp_path, "environment", "env-0")
        assert [p["worker"] for p in manifest["parts"]] == [0, 1]
        by_worker = {
            p["worker"]: {
                json.loads(line)["episode_id"]["rollout_id"]
                for line in (directory / p["records_file"]).read_bytes().splitlines()
            }
            for p in manifest["parts"]
        }
        assert by_worker == {w: {v["rollout_id"] for v in views if v["worker"] == w} for w in (0, 1)}
        assert json.loads((directory / "manifest.json").read_bytes()) == manifest
        assert (await control(client, "resume")).json()["idempotent"] is False
        await _start(client, "after")


async def test_restore_into_another_worker_count_keeps_owners_and_fences(tmp_path):
    """A 2-worker commit restores into 3 workers: owners kept, attempt 0 is stale everywhere."""
    async with running(_app(2)) as client:
        for i in range(5):
            await _start(client, f"r{i}")
        owners = {f"r{i}": (await client.get(f"/work/r{i}")).json()["worker"] for i in range(5)}
        assert (await control(client, "prepare")).json()["phase"] == "prepared"
        assert (await control(client, "commit", checkpoint_dir=str(tmp_path))).status_code == 200
    async with running(_app(3)) as client:
        episodes = [{"rollout_id": f"r{i}", "attempt": 0} for i in range(5)]
        reply = await control(client, "restore", "c2", checkpoint_dir=str(tmp_path), episode_ids=episodes)
        assert reply.status_code == 200, reply.text
        assert reply.json()["restored"] == sorted(f"r{i}-a1" for i in range(5))
        for rid, owner in owners.items():
            assert (await client.get(f"/work/{rid}-a1")).json()["worker"] == owner
        assert (await control(client, "resume", "c2")).status_code == 200
        assert (
            await client.post("/work/advance", json={"rollout_id": "r0", "attempt": 1})
        ).status_code == 200
        late_start = {"rollout_id": "r1", "attempt": 0, "steps": 3}
        assert error_code(await client.post("/work/start", json=late_start)) == (409, "stale_attempt")
        late_advance = {"rollout_id": "r2", "attempt": 0}
        assert error_code(await client.post("/work/advance", json=late_advance)) == (409, "stale_attempt")
        assert (await status(client))["retired_rollouts"] == {f"r{i}": 0 for i in range(5)}


async def test_a_lost_worker_blocks_prepare_and_the_next_checkpoint_succeeds(tmp_path):
    """A worker whose socket ends mid-prepare is worker-lost; after resume and rejoin all is ready."""
    app = _app(2, step_seconds=0.0)
    async with running(app) as client:
        coordinator = app.state.coordinator
        await _start(client, "r0")
        prepare = await control(client, "prepare", seconds=60.0)
        assert prepare.json()["phase"] == "prepared"
        # The worker's end of the socket goes away, as when its process is killed.
        coordinator.channels[1].stream.extra(SocketAttribute.raw_socket).shutdown(socket.SHUT_RDWR)
        with anyio.fail_after(5):
            while 1 in coordinator.connected():
                await anyio.sleep(0.01)
        report = app.state.workload.report()
        assert "environment-worker-lost" in report.blockers and not report.ready
        commit = await control(client, "commit", checkpoint_dir=str(tmp_path))
        assert error_code(commit)[0] in (409, 503)
        assert not (participant_dir(tmp_path, "environment", "env-0") / "manifest.json").exists()
        assert (await control(client, "resume")).status_code == 200
        unreported = await control(client, "prepare", "c2", seconds=0.6)
        assert "environment-workers-unreported:1" in unreported.json()["report"]["blockers"]


async def test_status_shows_the_workers_readiness_while_the_first_prepare_waits():
    """With 2 workers, /status during a waiting prepare names the step still running on one of them."""
    # A 3 s step: at 0.6 s a loaded machine (load average 8) ended it before /status was read.
    app = _app(2, step_seconds=3.0)
    async with running(app) as client:
        await _start(client, "slow", steps=2)
        async with anyio.create_task_group() as tg:
            tg.start_soon(post_json, client, "/work/advance", {"rollout_id": "slow"})
            replies: list[Any] = []

            async def prepare() -> None:
                await anyio.sleep(0.1)  # the step has reached its worker
                replies.append((await control(client, "prepare", seconds=5)).json())

            tg.start_soon(prepare)
            with anyio.fail_after(2.5):
                # Until both workers have reported: read first, a loaded suite run's report said
                # only "workers-unreported:2" (the workers' own reports on their way).
                while (
                    (waiting := await status(client))["phase"] != "preparing"
                    or waiting["report"] is None
                    or any("unreported" in blocker for blocker in waiting["report"]["blockers"])
                ):
                    await anyio.sleep(0.02)
            assert not replies, "the prepare was meant to be still waiting"
            assert waiting["report"]["ready"] is False and waiting["report"]["blockers"] == ["slow"]
        assert replies[0]["phase"] == "prepared"


async def test_a_forget_tells_each_worker_in_a_frame_a_chunk_not_a_frame_a_rollout():
    """Forgetting 3,000 rollouts on 2 workers sends each worker 3 frames (1,024 ids a frame),
    not 3,000 (each with its reply); the workers' marks are cleared: the rollouts start again."""
    count = 3000
    app = _app(2)
    async with running(app) as client:
        ids = [f"r{i}" for i in range(count)]
        retired = await control(client, "retire", episode_ids=[{"rollout_id": r, "attempt": 0} for r in ids])
        assert retired.status_code == 200, retired.text
        refused = await client.post("/work/start", json={"rollout_id": "r7", "steps": 1})
        assert error_code(refused) == (409, "stale_attempt")
        channels = app.state.workload.coordinator.channels
        sent = {i: c._next_id for i, c in channels.items()}
        forgot = await control(client, "forget", rollout_ids=ids)
        assert forgot.status_code == 200, forgot.text
        assert {i: c._next_id - sent[i] for i, c in channels.items()} == {0: 3, 1: 3}
        for rollout_id in ("r0", "r7", "r2999"):
            await _start(client, rollout_id, steps=1)


async def test_a_big_retire_lets_status_answer_part_way_and_fences_every_worker():
    """A retire of 20,000 ids on 2 workers gives the main loop back as the server's marks go
    up: /status calls sent beside it see a retired_count between none and all, the reply is
    whole, and a retired attempt's start is refused stale_attempt on each worker. Was: each id
    got its own mark and retention pass without a yield (64,000 ids held the loop ~50 ms), so
    /status answered before or after, never in between."""
    count = 20_000
    rollouts = [f"r{i:05d}" for i in range(count)]
    bus = Bus()
    made: list[Any] = []

    def worker(index: int) -> Any:
        made.append(make_workload("environment", Telemetry(bus, kind="environment", instance="env-0")))
        return made[-1]

    app = create_app(
        "environment",
        instance="env-0",
        token=TOKEN,
        workers=2,
        checkpoint_root=tempfile.gettempdir(),
        worker_factory=worker,
    )
    async with running(app) as client:
        # One session on each worker first: the retire must reach both, and free them.
        held = ["r00000", "r00001", "r00002", "r00003"]
        for rollout_id in held:
            await _start(client, rollout_id)
        owners = {(await client.get(f"/work/{r}")).json()["worker"] for r in held}
        assert owners == {0, 1}
        episodes = [{"rollout_id": r, "attempt": 0} for r in rollouts]
        reply, seen = await retired_counts_during(
            client, lambda: control(client, "retire", episode_ids=episodes)
        )
        assert reply.status_code == 200, reply.text
        assert reply.json() == {"retired": rollouts[:MAX_RETIRED_KEYS_SHOWN], "retired_count": count}
        assert (await status(client))["retired_count"] == count
        for rollout_id in [*held, "r09999", "r19999"]:
            assert (await client.get(f"/work/{rollout_id}")).status_code == 404
            refused = await client.post("/work/start", json={"rollout_id": rollout_id, "steps": 1})
            assert error_code(refused) == (409, "stale_attempt")
        # Past the main process's gate, each worker's own fence holds every mark too.
        assert len(made) == 2
        for workload in made:
            assert len(workload.fence) == count
            assert all(workload.fence.is_retired(EpisodeId(r, 0)) for r in rollouts)
            assert not workload.episodes
    assert any(0 < n < count for n in seen), (len(seen), sorted(set(seen)))
