"""Commit and restore done by the workers: one records file per worker, all or nothing.

The app runs in process with its workers as tasks behind a real Unix socket; a worker is
"killed" by shutting its end of the socket, as when its process dies.
"""

from __future__ import annotations

import socket
import tempfile
import threading
import time
from typing import Any

import anyio
import msgspec
import pytest
from anyio.abc import SocketAttribute

from ckpt_events import Bus, Telemetry
from ckpt_events.participants import create_app
from ckpt_events.participants.errors import CheckpointWriteError
from ckpt_events.participants.faults import NO_FAULTS, FaultPlan
from ckpt_events.participants.protocol import RecordsPart
from ckpt_events.participants.server.app import make_workload
from ckpt_events.participants.server.store import MANIFEST_NAME, RECORDS_FILE, participant_dir, parts_digest
from ckpt_events.participants.workloads.environment import EnvironmentWorkload
from tests.participants.helpers import TOKEN, control, error_code, running, status, wait_until

pytestmark = pytest.mark.anyio


class _FullDisk(EnvironmentWorkload):
    """A user's workload whose install fails after its checks passed (its device is full)."""

    async def install(self, records: Any, states: Any) -> list[str]:
        raise CheckpointWriteError("no room left to install", published=False)


class _FullHalfway(EnvironmentWorkload):
    """A user's workload whose first install puts in half its share, then finds its device full."""

    failed = False

    async def install(self, records: Any, states: Any) -> list[str]:
        if self.failed:
            return await super().install(records, states)
        self.failed = True
        await super().install(records[: len(records) // 2], states[: len(states) // 2])
        raise CheckpointWriteError("no room left to install the rest", published=False)


class _Fleet:
    """A multi-worker app whose worker workloads the test can look into."""

    def __init__(
        self,
        workers: int,
        instance: str = "env-0",
        faults: FaultPlan = NO_FAULTS,
        install_fails_on: int | None = None,
        failing: type[EnvironmentWorkload] = _FullDisk,
        **extra: Any,
    ) -> None:
        bus = Bus()
        self.workloads: list[Any] = []

        def factory(index: int) -> Any:
            tel = Telemetry(bus, kind="environment", instance=instance)
            workload = failing(tel) if index == install_fails_on else make_workload("environment", tel)
            self.workloads.append(workload)
            return workload

        options: dict[str, Any] = {"workers": workers, "worker_factory": factory} if workers > 1 else {}
        self.app = create_app(
            "environment",
            instance=instance,
            token=TOKEN,
            bus=bus,
            checkpoint_root=tempfile.gettempdir(),
            faults=faults,
            **options,
            **extra,
        )

    def installed(self) -> list[str]:
        return sorted(key for w in self.workloads for key in w.episodes)

    async def kill(self, index: int) -> None:
        coordinator = self.app.state.coordinator
        coordinator.channels[index].stream.extra(SocketAttribute.raw_socket).shutdown(socket.SHUT_RDWR)
        with anyio.fail_after(5):
            while index in coordinator.connected():
                await anyio.sleep(0.01)


async def _commit(client: Any, directory: Any, rollouts: int) -> dict[str, Any]:
    for i in range(rollouts):
        reply = await client.post("/work/start", json={"rollout_id": f"r{i}", "steps": 4})
        assert reply.status_code == 200, reply.text
    assert (await control(client, "prepare")).json()["phase"] == "prepared"
    committed = await control(client, "commit", checkpoint_dir=str(directory))
    assert committed.status_code == 200, committed.text
    return committed.json()  # type: ignore[no-any-return]


def _episodes(rollouts: int) -> list[dict[str, Any]]:
    return [{"rollout_id": f"r{i}", "attempt": 0} for i in range(rollouts)]


@pytest.mark.parametrize(("made_by", "restored_into"), [(2, 3), (1, 2), (1, 4), (2, 1), (3, 2)])
async def test_a_restore_into_any_worker_count_puts_every_session_somewhere_exactly_once(
    tmp_path, made_by, restored_into
):
    rollouts = 23
    first = _Fleet(made_by)
    async with running(first.app) as client:
        committed = await _commit(client, tmp_path, rollouts)
    assert len(committed["manifest"].get("parts", [])) == (made_by if made_by > 1 else 0)
    again = _Fleet(restored_into)
    async with running(again.app) as client:
        reply = await control(
            client, "restore", "c2", checkpoint_dir=str(tmp_path), episode_ids=_episodes(rollouts)
        )
        assert reply.status_code == 200, reply.text
        expected = sorted(f"r{i}-a1" for i in range(rollouts))
        assert reply.json()["restored"] == expected
        if restored_into > 1:
            assert again.installed() == expected  # no session in two workers
            counts = [len(w.episodes) for w in again.workloads]
            if made_by == 1:  # one file shared out: balanced to within one session
                assert max(counts) - min(counts) <= 1, counts
        assert (await status(client))["episodes"] == rollouts


async def test_a_worker_lost_during_a_parallel_commit_publishes_nothing_and_leaves_no_part(tmp_path):
    started = threading.Event()

    def slow_rename(name: str) -> None:
        if name == "rename_records":
            started.set()
            time.sleep(0.5)  # both workers hold their part here while worker 1 is killed

    fleet = _Fleet(2, faults=FaultPlan(on_step=slow_rename))
    async with running(fleet.app) as client:
        for i in range(8):
            assert (
                await client.post("/work/start", json={"rollout_id": f"r{i}", "steps": 4})
            ).status_code == 200
        assert (await control(client, "prepare", seconds=30.0)).json()["phase"] == "prepared"
        replies: list[Any] = []

        async def commit() -> None:
            replies.append(await control(client, "commit", seconds=30.0, checkpoint_dir=str(tmp_path)))

        async with anyio.create_task_group() as tg:
            tg.start_soon(commit)
            with anyio.fail_after(10):
                while not started.is_set():
                    await anyio.sleep(0.01)
            await fleet.kill(1)
        assert error_code(replies[0]) == (503, "checkpoint_coordinator_unavailable"), replies[0].text
        await anyio.sleep(0.7)  # the killed worker's thread finishes its rename
    directory = participant_dir(tmp_path, "environment", "env-0")
    assert not (directory / MANIFEST_NAME).exists()
    # The surviving worker's part is deleted; the lost worker's, renamed after its death, is an
    # orphan the next commit's sweep removes (at most one file, never named by a manifest).
    assert len([p for p in directory.iterdir() if RECORDS_FILE.fullmatch(p.name)]) <= 1


async def test_a_multi_worker_commit_refused_after_its_link_withdraws_manifest_and_parts(tmp_path):
    """The lease runs out after the main process linked the manifest listing the workers' parts:
    the commit is refused, and the manifest and every part are withdrawn (none restorable).
    Was: both stayed, a checkpoint the controller aborted that a restore would install."""

    def slow_fsync(name: str) -> None:
        if name == "fsync_dir_manifest":
            time.sleep(1.5)  # linked: the lease (1.1 s away) runs out meanwhile

    fleet = _Fleet(2, faults=FaultPlan(on_step=slow_fsync), lease_grace_seconds=0.1)
    async with running(fleet.app) as client:
        for i in range(8):
            assert (
                await client.post("/work/start", json={"rollout_id": f"r{i}", "steps": 4})
            ).status_code == 200
        assert (await control(client, "prepare", seconds=1.0)).json()["phase"] == "prepared"
        reply = await control(client, "commit", seconds=1.0, checkpoint_dir=str(tmp_path))
        assert error_code(reply) == (409, "stale_checkpoint"), reply.text
        assert "outlived its lease during commit, its manifest withdrawn" in reply.json()["error"]["detail"]
    directory = participant_dir(tmp_path, "environment", "env-0")
    assert list(directory.iterdir()) == []


async def test_a_worker_lost_during_a_parallel_restore_installs_nothing_anywhere(tmp_path):
    rollouts = 40
    async with running(_Fleet(2).app) as client:
        await _commit(client, tmp_path, rollouts)
    # 20 ms per record read: each worker's share of 20 takes about 0.4 s to read.
    fleet = _Fleet(2, faults=FaultPlan.parse("slow-restore:env-0:0.02"))
    async with running(fleet.app) as client:
        replies: list[Any] = []

        async def restore() -> None:
            replies.append(
                await control(
                    client,
                    "restore",
                    "c2",
                    seconds=30.0,
                    checkpoint_dir=str(tmp_path),
                    episode_ids=_episodes(rollouts),
                )
            )

        async with anyio.create_task_group() as tg:
            tg.start_soon(restore)
            await anyio.sleep(0.15)
            await fleet.kill(1)
        assert error_code(replies[0]) == (503, "checkpoint_coordinator_unavailable"), replies[0].text
        with anyio.fail_after(5):  # worker 0 drops what it staged once its read ends
            while fleet.workloads[0].episodes or fleet.app.state.workload.owners:
                await anyio.sleep(0.05)
        await anyio.sleep(0.6)
        assert fleet.installed() == [] and (await status(client))["episodes"] == 0
        # Still fresh and idle, admission open again: work is taken, nothing half-restored.
        assert (await status(client))["phase"] == "idle"
        assert (await client.post("/work/start", json={"rollout_id": "new", "steps": 2})).status_code == 200


async def test_a_restore_whose_workers_are_slow_answers_by_its_deadline_not_the_reply_wait(tmp_path):
    """Workers still reading when the restore's deadline passes: 503 by deadline + 2 s (was the
    fixed 30 s reply wait, whatever the deadline), and nothing is installed anywhere."""
    rollouts = 40
    async with running(_Fleet(2).app) as client:
        await _commit(client, tmp_path, rollouts)
    # 0.2 s per record read: each worker's share of 20 takes about 4 s, past the 1 s deadline.
    fleet = _Fleet(2, faults=FaultPlan.parse("slow-restore:env-0:0.2"))
    async with running(fleet.app) as client:
        started = time.monotonic()
        reply = await control(
            client,
            "restore",
            "c2",
            seconds=1.0,
            checkpoint_dir=str(tmp_path),
            episode_ids=_episodes(rollouts),
        )
        answered = time.monotonic() - started
        assert error_code(reply) == (503, "checkpoint_coordinator_unavailable"), reply.text
        assert 1.0 <= answered < 1.0 + 2.0 + 1.5, answered
        with anyio.fail_after(10):  # the workers' reads end; what they staged is dropped
            while fleet.app.state.workload.owners or fleet.installed():
                await anyio.sleep(0.05)
        assert (await status(client))["episodes"] == 0


async def test_a_part_that_does_not_check_refuses_the_restore_on_every_worker(tmp_path):
    rollouts = 10
    async with running(_Fleet(2).app) as client:
        committed = await _commit(client, tmp_path, rollouts)
    directory = participant_dir(tmp_path, "environment", "env-0")
    part = directory / committed["manifest"]["parts"][1]["records_file"]
    part.write_bytes(part.read_bytes().replace(b"r", b"R", 1))
    fleet = _Fleet(2)
    async with running(fleet.app) as client:
        reply = await control(
            client, "restore", "c2", checkpoint_dir=str(tmp_path), episode_ids=_episodes(rollouts)
        )
        assert error_code(reply) == (422, "invalid_checkpoint_state"), reply.text
        assert "SHA-256" in reply.json()["error"]["detail"]
        await anyio.sleep(0.2)
        assert fleet.installed() == [] and (await status(client))["episodes"] == 0


@pytest.mark.parametrize("field", ["worker", "record_count"])
async def test_a_part_number_no_frame_can_carry_is_refused_not_a_500(tmp_path, field):
    """A manifest edited to a worker index or count past 64 bits is 422 naming the field, on
    every worker (it once reached the frames to the workers: 500 and a traceback)."""
    rollouts = 6
    async with running(_Fleet(2).app) as client:
        await _commit(client, tmp_path, rollouts)
    path = participant_dir(tmp_path, "environment", "env-0") / MANIFEST_NAME
    manifest = msgspec.json.decode(path.read_bytes())
    manifest["parts"][1][field] = 2**64
    if field == "record_count":  # consistent otherwise: only the number is wrong
        manifest["record_count"] = sum(p["record_count"] for p in manifest["parts"])
    path.write_bytes(msgspec.json.encode(manifest))
    fleet = _Fleet(2)
    async with running(fleet.app) as client:
        reply = await control(
            client, "restore", "c2", checkpoint_dir=str(tmp_path), episode_ids=_episodes(rollouts)
        )
        assert error_code(reply) == (422, "invalid_checkpoint_state"), reply.text
        assert reply.json()["error"]["detail"].startswith(f"manifest {'part ' * (field == 'worker')}{field} ")
        assert fleet.installed() == [] and (await status(client))["episodes"] == 0


async def test_a_one_process_participant_restores_a_multi_worker_checkpoint(tmp_path):
    async with running(_Fleet(2).app) as client:
        committed = await _commit(client, tmp_path, 9)
    manifest = msgspec.json.decode(
        (participant_dir(tmp_path, "environment", "env-0") / MANIFEST_NAME).read_bytes()
    )
    assert (
        manifest == committed["manifest"]
        and parts_digest([RecordsPart(**p) for p in manifest["parts"]]) == manifest["records_sha256"]
    )
    async with running(_Fleet(1).app) as client:
        reply = await control(client, "restore", "c2", checkpoint_dir=str(tmp_path), episode_ids=_episodes(9))
        assert reply.status_code == 200, reply.text
        assert len(reply.json()["restored"]) == 9


async def test_a_restore_one_worker_fails_to_install_fences_nothing(tmp_path):
    """Worker 1's install fails after worker 0 installed its share: the restore is refused, and
    neither the main process (it fenced the scope before the workers installed) nor worker 0 (its
    install fenced its share) keeps a mark: attempt 0 of a rollout of it starts again."""
    rollouts = 6
    async with running(_Fleet(2).app) as client:
        await _commit(client, tmp_path, rollouts)
    fleet = _Fleet(2, install_fails_on=1)
    async with running(fleet.app) as client:
        reply = await control(
            client, "restore", "c2", checkpoint_dir=str(tmp_path), episode_ids=_episodes(rollouts)
        )
        assert "no room left to install" in reply.json()["error"]["detail"], reply.text
        assert (await status(client))["retired_rollouts"] == {}
        await wait_until(lambda: not any(len(w.fence) for w in fleet.workloads))  # after the discard
        for i in range(rollouts):
            again = await client.post("/work/start", json={"rollout_id": f"r{i}", "attempt": 0, "steps": 4})
            assert again.status_code == 200, again.text


async def test_a_worker_whose_install_fails_halfway_keeps_nothing_and_the_restore_is_retried(tmp_path):
    """Worker 1's install puts in half its share, then raises: the restore is refused, no worker
    keeps an episode or a mark, and the same restore sent again restores every rollout. Was:
    worker 1 kept the episodes it installed before the raise (its discard took out only what a
    finished install returned), unplaced, beside the retry's."""
    rollouts = 8
    async with running(_Fleet(2).app) as client:
        await _commit(client, tmp_path, rollouts)
    fleet = _Fleet(2, install_fails_on=1, failing=_FullHalfway)
    async with running(fleet.app) as client:
        episodes = _episodes(rollouts)
        reply = await control(client, "restore", "c2", checkpoint_dir=str(tmp_path), episode_ids=episodes)
        assert "no room left to install the rest" in reply.json()["error"]["detail"], reply.text
        await wait_until(lambda: not any(len(w.fence) for w in fleet.workloads))  # after the discard
        assert fleet.installed() == []
        again = await control(client, "restore", "c2", checkpoint_dir=str(tmp_path), episode_ids=episodes)
        assert again.status_code == 200, again.text
        assert fleet.installed() == sorted(f"r{i}-a1" for i in range(rollouts))


async def test_a_part_placed_after_its_commit_was_cancelled_is_deleted_once_the_workers_stop(
    tmp_path, caplog
):
    """The server stopping cancels a commit while worker 1 still writes (in the real case it was
    SIGSTOPped and woken only by the stop): the parent deletes the parts it was told of, then
    worker 1 places its own, which nobody named. It is deleted once the workers have stopped:
    it was left beside the checkpoint (1 run in 20 of a real ``serve --workers 2`` under load)."""
    lock = threading.Lock()
    renames: list[str] = []
    held = threading.Event()
    release = threading.Event()

    def hold_the_second(name: str) -> None:
        if name == "rename_records":
            with lock:
                renames.append(name)
                second = len(renames) == 2
            if second:
                held.set()
                release.wait(10)  # this worker is still writing when the commit is cancelled

    fleet = _Fleet(2, faults=FaultPlan(on_step=hold_the_second))
    directory = participant_dir(tmp_path, "environment", "env-0")

    def parts() -> list[str]:
        return sorted(p.name for p in directory.iterdir() if RECORDS_FILE.fullmatch(p.name))

    async with running(fleet.app) as client:
        for i in range(8):
            reply = await client.post("/work/start", json={"rollout_id": f"r{i}", "steps": 4})
            assert reply.status_code == 200
        assert (await control(client, "prepare", seconds=30.0)).json()["phase"] == "prepared"
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: control(client, "commit", seconds=30.0, checkpoint_dir=str(tmp_path)))
            await wait_until(lambda: held.is_set() and len(parts()) == 1)  # worker 0's part placed
            tg.cancel_scope.cancel()  # as uvicorn cancels a request still running at its shutdown
        release.set()
        # Worker 1 placed its part: nobody named it. Its thread finishes the write after the
        # release: 3 s timed out once beside a loaded suite's other worker (CI), 10 s now.
        await wait_until(lambda: len(parts()) == 1, timeout=10.0)
        late = parts()
    assert late and parts() == [], f"{late} left behind"
    assert not (directory / MANIFEST_NAME).exists()
    [said] = [r.getMessage() for r in caplog.records if "checkpoint c1" in r.getMessage()]
    assert "cancelled while its workers wrote: aborted, no manifest published" in said, said
