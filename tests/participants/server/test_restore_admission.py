"""Work offered while a restore reads is refused: nothing accepted beside a restore runs twice.

A real restore of a real checkpoint, slowed by the ``slow-restore`` fault so that its read
lasts long enough for real work calls to arrive in the middle of it, at one and two workers.
"""

from __future__ import annotations

import tempfile
from typing import Any

import anyio
import pytest

from ckpt_events import Bus, Telemetry
from ckpt_events.participants import create_app
from ckpt_events.participants.faults import NO_FAULTS, FaultPlan
from ckpt_events.participants.server.app import make_workload
from tests.participants.helpers import TOKEN, control, error_code, running, status

pytestmark = pytest.mark.anyio
ROLLOUTS = 400


def _app(workers: int, instance: str, faults: FaultPlan = NO_FAULTS) -> Any:
    bus = Bus()
    options: dict[str, Any] = {}
    if workers > 1:
        options = {
            "workers": workers,
            "worker_factory": lambda i: make_workload(
                "environment", Telemetry(bus, kind="environment", instance=instance)
            ),
        }
    return create_app(
        "environment",
        instance=instance,
        token=TOKEN,
        bus=bus,
        checkpoint_root=tempfile.gettempdir(),
        faults=faults,
        **options,
    )


@pytest.mark.parametrize("workers", [1, 2])
async def test_work_started_during_a_restore_is_refused_and_nothing_runs_twice(tmp_path, workers):
    instance = f"env-race-{workers}"
    async with running(_app(workers, instance)) as client:
        for i in range(ROLLOUTS):
            reply = await client.post("/work/start", json={"rollout_id": f"r{i}", "steps": 5})
            assert reply.status_code == 200, reply.text
        assert (await control(client, "prepare")).json()["phase"] == "prepared"
        assert (await control(client, "commit", checkpoint_dir=str(tmp_path))).status_code == 200

    # 5 ms per record read: the read of 400 records takes about 2 s.
    slow = FaultPlan.parse(f"slow-restore:{instance}:0.005")
    episodes = [{"rollout_id": f"r{i}", "attempt": 0} for i in range(ROLLOUTS)]
    answers: list[tuple[int, str]] = []
    async with running(_app(workers, instance, slow)) as client:
        restored: dict[str, Any] = {}

        async def restore() -> None:
            reply = await control(
                client, "restore", "c2", seconds=60.0, checkpoint_dir=str(tmp_path), episode_ids=episodes
            )
            assert reply.status_code == 200, reply.text
            restored.update(reply.json())

        async with anyio.create_task_group() as tg:
            tg.start_soon(restore)
            await anyio.sleep(0.3)  # the read is under way
            for i in range(3):
                reply = await client.post("/work/start", json={"rollout_id": f"r{i}", "steps": 5})
                answers.append(error_code(reply) if reply.status_code != 200 else (200, "ok"))
                await anyio.sleep(0.1)
            assert not restored, "the restore ended before the work calls: slow it down more"

        assert answers == [(409, "admission_closed")] * 3
        assert len(restored["restored"]) == ROLLOUTS
        assert (await control(client, "resume", "c2")).status_code == 200
        assert (await control(client, "prepare", "c3")).json()["phase"] == "prepared"
        again = await control(client, "commit", "c3", checkpoint_dir=str(tmp_path / "again"))
        assert again.status_code == 200, again.text
        # Every rollout once, as its restored next attempt: no attempt 0 beside it.
        assert again.json()["manifest"]["record_count"] == ROLLOUTS
        assert again.json()["episode_ids"] == sorted(f"r{i}-a1" for i in range(ROLLOUTS))


async def test_status_answers_at_once_while_a_restore_reads(tmp_path):
    """GET /status does not wait for a restore's read and install (it waited out the whole
    restore, 2.8 s here: ``watch``'s 0.8 s poll called a restoring participant unreachable);
    it says what stands: idle, admission closed, nothing installed yet; then restored."""
    instance = "env-status-1"
    async with running(_app(1, instance)) as client:
        for i in range(3):
            assert (await client.post("/work/start", json={"rollout_id": f"r{i}"})).status_code == 200
        assert (await control(client, "prepare")).json()["phase"] == "prepared"
        assert (await control(client, "commit", checkpoint_dir=str(tmp_path))).status_code == 200

    slow = FaultPlan.parse(f"slow-restore:{instance}:1.0")  # a second per record read
    episodes = [{"rollout_id": f"r{i}"} for i in range(3)]
    async with running(_app(1, instance, slow)) as client:
        restored: dict[str, Any] = {}

        async def restore() -> None:
            reply = await control(
                client, "restore", "c2", seconds=60.0, checkpoint_dir=str(tmp_path), episode_ids=episodes
            )
            restored.update(reply.json())

        async with anyio.create_task_group() as tg:
            tg.start_soon(restore)
            await anyio.sleep(0.3)  # the read is under way
            with anyio.fail_after(0.5):
                during = await status(client)
            assert not restored, "the restore ended before the status call: slow it down more"
        assert (during["phase"], during["admission_open"], during["episodes"]) == ("idle", False, 0)
        assert restored["phase"] == "restored"
        assert (await status(client))["phase"] == "restored"
