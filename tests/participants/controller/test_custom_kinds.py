"""A kind of the user's own served and coordinated: a ``judge`` prepares after the kinds the
harness names, resumes before them, and its events carry its kind."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from ckpt_events import OperationFinished, StageFinished, Telemetry
from ckpt_events.participants.cli.fleet import local_fleet
from ckpt_events.participants.controller.coordinator import Coordinator
from ckpt_events.participants.kinds import PREPARE_ORDER
from ckpt_events.participants.workloads.registry import KindRegistry, KindRow
from ckpt_events.testing import capture_events
from ckpt_events.vocab import Kind
from tests.participants.helpers import AUTH, TOKEN
from tests.participants.workloads.test_registry import ToyWorkload


class ModelToy(ToyWorkload):
    """The toy workload in the model's slot (discovery wants a model)."""

    kind = Kind.MODEL


class JudgeWorkload(ToyWorkload):
    """The toy workload, served as a kind of the user's own."""

    kind = "judge"


FLEET = KindRegistry(
    [
        KindRow(Kind.MODEL, ModelToy, instance="model-0", colour="#2563eb"),
        KindRow("judge", JudgeWorkload, instance="judge-0", colour="#ff00aa"),
    ]
)


async def test_a_judge_is_discovered_prepared_last_and_resumed_first(tmp_path: Path) -> None:
    """Discovery takes the judge's ``/status``; prepare runs its stage after every named kind's,
    resume calls it before the model; its operations are events of kind ``judge``."""
    async with capture_events() as (bus, events):
        async with local_fleet(token=TOKEN, bus=bus, kinds=FLEET, checkpoint_root=tmp_path) as urls:
            async with httpx.AsyncClient(base_url=urls["judge-0"], headers=AUTH) as client:
                reply = await client.post("/work/start", json={"rollout_id": "r1", "steps": 3})
                assert reply.status_code == 200, reply.text
            tel = Telemetry(bus, kind="controller", instance="coordination")
            found = await Coordinator.discover(urls.values(), token=TOKEN, telemetry=tel)
            async with found as coordinator:
                assert [(m.instance, m.kind) for m in coordinator.members] == [
                    ("model-0", "model"),
                    ("judge-0", "judge"),
                ]
                assert [m.instance for m in coordinator.of_kind("judge")] == ["judge-0"]
                await coordinator.checkpoint("c1", str(tmp_path / "ckpt"), deadline_ts=time.time() + 30)
    stages = [e.stage for e in events if isinstance(e, StageFinished)]
    assert stages == [*PREPARE_ORDER, "judge"]
    finished = [e for e in events if isinstance(e, OperationFinished)]
    judge = [e.operation for e in finished if e.kind == "judge"]
    assert judge == ["prepare", "commit", "resume"] and all(
        e.instance == "judge-0" for e in finished if e.kind == "judge"
    )
    resumes = {e.kind: e.start_ns for e in finished if e.operation == "resume"}
    assert resumes["judge"] < resumes["model"]
