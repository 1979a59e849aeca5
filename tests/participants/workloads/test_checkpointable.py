"""``participants.workloads.checkpointable``: which workloads move their own records."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt_events import Bus, Telemetry
from ckpt_events.participants.server.app import make_workload
from ckpt_events.participants.server.workers.coordinator import WorkerCoordinator
from ckpt_events.participants.server.workers.pool import WorkerPool
from ckpt_events.participants.workloads.checkpointable import CheckpointableWorkload, ControlledWorkload
from ckpt_events.participants.workloads.registry import KINDS

pytestmark = pytest.mark.anyio


async def test_every_kind_s_workload_is_checkpointable_and_the_worker_pool_is_not(tmp_path: Path) -> None:
    """Each kind's ``Workload`` exports and installs records; a pool only controls its workers."""
    async with Bus() as bus:
        for row in KINDS:
            tel = Telemetry(bus, kind=str(row.kind), instance=row.instance)
            workload = make_workload(str(row.kind), tel)
            assert isinstance(workload, CheckpointableWorkload), row.kind
            controlled: ControlledWorkload = workload
            assert controlled.kind == row.kind
            await workload.aclose()
        checker = make_workload("environment", Telemetry(bus, kind="environment", instance="e"))
        pool = WorkerPool(checker, WorkerCoordinator(1, socket_dir=tmp_path))
        assert not isinstance(pool, CheckpointableWorkload)
        assert not isinstance(object(), CheckpointableWorkload)
        await checker.aclose()
