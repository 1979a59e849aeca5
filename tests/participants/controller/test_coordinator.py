"""The coordinator against real participant apps served by uvicorn in this process."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from fastapi import FastAPI

from ckpt_events import (
    Bus,
    CoordinateFinished,
    InvalidValueError,
    OperationFinished,
    OperationStarted,
    StageFinished,
    Telemetry,
)
from ckpt_events.participants.cli.fleet import free_port, local_fleet, serving
from ckpt_events.participants.controller.client import (
    ControlClient,
    ParticipantCallError,
    ParticipantUnreachable,
)
from ckpt_events.participants.controller.coordinator import (
    CheckpointNotPrepared,
    CoordinationError,
    Coordinator,
    Member,
)
from ckpt_events.participants.faults import NO_FAULTS, FaultPlan
from ckpt_events.participants.protocol import EpisodeId, PrepareReply, PrepareRequest
from ckpt_events.testing import capture_events
from ckpt_events.vocab import ErrorCode, Kind
from tests.participants.helpers import ROOT

TOKEN = "coordinator-test-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
FOUR = (
    ("environment", "environment-0"),
    ("model", "model-0"),
    ("agent", "agent-0"),
    ("resources", "resources-0"),
)


@asynccontextmanager
async def coordinated(
    members: Any = FOUR, options: Any = None, faults: FaultPlan = NO_FAULTS
) -> AsyncIterator[tuple[Coordinator, httpx.AsyncClient, list[Any]]]:
    """A fleet on one captured bus (injecting ``faults``), and a coordinator discovered over it."""
    async with capture_events() as (bus, events):
        async with local_fleet(
            token=TOKEN, bus=bus, members=members, options=options, checkpoint_root=ROOT, faults=faults
        ) as urls:
            async with httpx.AsyncClient(headers=AUTH) as http:
                tel = Telemetry(bus, kind="controller", instance="coordination")
                coordinator = await Coordinator.discover(urls, token=TOKEN, telemetry=tel, client=http)
                async with coordinator:
                    yield coordinator, http, events
            await bus.flush()


async def start_work(
    http: httpx.AsyncClient, coordinator: Coordinator, rollout_id: str, steps: int = 3
) -> None:
    for member in coordinator.members:
        reply = await http.post(
            member.url + "/work/start", json={"rollout_id": rollout_id, "attempt": 0, "steps": steps}
        )
        assert reply.status_code == 200, reply.text


async def phases(coordinator: Coordinator) -> dict[str, str]:
    return {m.name: (await coordinator.control.status(m.url)).phase.value for m in coordinator.members}


async def test_discover_sorts_by_stage_and_skips_non_participants() -> None:
    """Members come in prepare order; a server whose /status is 404 is not a participant."""
    shuffled = (FOUR[3], FOUR[2], FOUR[1], FOUR[0])
    async with capture_events() as (bus, _):
        async with (
            local_fleet(token=TOKEN, bus=bus, members=shuffled, checkpoint_root=ROOT) as urls,
            serving(FastAPI()) as plain,
        ):
            async with httpx.AsyncClient(headers=AUTH) as http:
                tel = Telemetry(bus, kind="controller", instance="coordination")
                servers = {**urls, "judge": plain}
                async with await Coordinator.discover(servers, token=TOKEN, telemetry=tel, client=http) as co:
                    assert [m.kind for m in co.members] == [
                        Kind.ENVIRONMENT,
                        Kind.MODEL,
                        Kind.AGENT,
                        Kind.RESOURCES,
                    ]
                    assert "judge" not in {m.name for m in co.members}


async def test_discover_needs_a_model_participant() -> None:
    """A fleet without a model participant is refused."""
    async with capture_events() as (bus, _):
        async with local_fleet(
            token=TOKEN, bus=bus, members=(FOUR[0], FOUR[2]), checkpoint_root=ROOT
        ) as urls:
            tel = Telemetry(bus, kind="controller", instance="coordination")
            with pytest.raises(CoordinationError, match="no model participant"):
                await Coordinator.discover(urls, token=TOKEN, telemetry=tel)


async def test_discover_reports_unreachable_servers_after_bounded_tries() -> None:
    """A server that never answers fails discovery, naming it."""
    tel = Telemetry(None, kind="controller", instance="coordination")
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(CoordinationError) as info:
        await Coordinator.discover({"gone": dead}, token=TOKEN, telemetry=tel, tries=2, timeout=1.0)
    assert info.value.operation == "discover"
    assert list(info.value.failures) == ["gone"]


async def test_prepare_has_one_stage_span_per_kind_even_when_empty() -> None:
    """Stage spans are coordinate.prepare.<kind> for all four kinds, children of coordinate.prepare."""
    async with coordinated(members=FOUR[:2] + FOUR[3:]) as (co, _, events):
        result = await co.prepare("c-stages", deadline_ts=time.time() + 10)
        assert result.prepared
        await co.resume("c-stages", deadline_ts=time.time() + 10)
    (prepare,) = [e for e in events if isinstance(e, CoordinateFinished) and e.operation == "prepare"]
    assert prepare.kind == Kind.CONTROLLER and prepare.prepared is True and prepare.participants == 3
    stages = [e for e in events if isinstance(e, StageFinished)]
    assert [s.stage for s in stages] == [Kind.ENVIRONMENT, Kind.MODEL, Kind.AGENT, Kind.RESOURCES]
    assert [s.participants for s in stages] == [1, 1, 0, 1]
    assert {s.parent_span_id for s in stages} == {prepare.span_id}
    assert {s.trace_id for s in stages} == {prepare.trace_id}


async def test_participant_spans_are_children_of_the_calling_stage() -> None:
    """The traceparent makes each participant's prepare a remote child of its stage span."""
    async with coordinated() as (co, _, events):
        await co.prepare("c-trace", deadline_ts=time.time() + 10)
        await co.resume("c-trace", deadline_ts=time.time() + 10)
    stages = {e.stage: e for e in events if isinstance(e, StageFinished)}
    prepares = [e for e in events if isinstance(e, OperationFinished) and e.operation == "prepare"]
    assert len(prepares) == 4
    for op in prepares:
        assert op.parent_remote and op.parent_span_id == stages[op.kind].span_id
        assert op.trace_id == stages[op.kind].trace_id


async def test_checkpoint_commits_everyone_and_resumes(tmp_path: Path) -> None:
    """A full checkpoint writes every manifest, commits the given episodes, and leaves all idle."""
    async with coordinated() as (co, http, events):
        await start_work(http, co, "r1")
        await start_work(http, co, "r2")
        published: list[str] = []

        async def publish(prepared: Any, commits: Any) -> None:
            published.append(sorted(commits))

        prepared, commits = await co.checkpoint(
            "c-full",
            str(tmp_path),
            deadline_ts=time.time() + 10,
            episodes=lambda p: [EpisodeId("r1")],
            publish=publish,
        )
        assert prepared.prepared and published == [sorted(m.name for m in co.members)]
        assert {name: reply.episode_ids for name, reply in commits.items()} == {
            m.name: ["r1"] for m in co.members
        }
        assert set((await phases(co)).values()) == {"idle"}
    for member in FOUR:
        assert (tmp_path / "gym" / member[0] / member[1] / "manifest.json").is_file()
    (commit,) = [e for e in events if isinstance(e, CoordinateFinished) and e.operation == "commit"]
    assert commit.episodes == 1 and commit.participants == 4


async def test_prepare_stops_at_the_first_stage_not_ready_and_aborts() -> None:
    """A blocked environment stops prepare there; nobody later is prepared and all resume."""
    slow = {"environment-0": {"step_seconds": 1.5}}
    async with coordinated(options=slow) as (co, http, events):
        await start_work(http, co, "r1")
        env = co.of_kind("environment")[0]
        async with httpx.AsyncClient(headers=AUTH) as other, anyio.create_task_group() as tg:
            # A unit of work in flight keeps the episode running past the prepare deadline.
            running = anyio.Event()

            async def run_step() -> None:
                running.set()
                await other.post(
                    env.url + "/work/advance", json={"rollout_id": "r1", "attempt": 0}, timeout=10
                )

            tg.start_soon(run_step)
            await running.wait()
            await anyio.sleep(0.2)
            with pytest.raises(CheckpointNotPrepared) as info:
                await co.checkpoint("c-blocked", "/nonexistent", deadline_ts=time.time() + 0.3)
            tg.cancel_scope.cancel()
        result = info.value.result
        assert result.stopped_at == Kind.ENVIRONMENT and not result.prepared
        assert result.blockers() == {"environment-0": ["r1"]}
        assert set(result.replies) == {"environment-0"}
        assert set((await phases(co)).values()) == {"idle"}
    (prepare,) = [e for e in events if isinstance(e, CoordinateFinished) and e.operation == "prepare"]
    assert prepare.prepared is False and prepare.stopped_at == Kind.ENVIRONMENT
    assert [e.stage for e in events if isinstance(e, StageFinished)] == [Kind.ENVIRONMENT]
    assert not [e for e in events if isinstance(e, OperationFinished) and e.operation == "commit"]


async def test_a_prepare_cancelled_by_its_caller_resumes_everyone() -> None:
    """A caller's timeout cancels prepare while the environment waits on a step: it is resumed,
    not left preparing with admission closed (refusing every other checkpoint) for its lease."""
    slow = {"environment-0": {"step_seconds": 1.5}}
    async with coordinated(members=FOUR[:2], options=slow) as (co, http, _):
        await start_work(http, co, "r1")
        env = co.of_kind("environment")[0]
        async with httpx.AsyncClient(headers=AUTH) as other, anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: other.post(env.url + "/work/advance", json={"rollout_id": "r1"}, timeout=10)
            )
            await anyio.sleep(0.2)  # the step is running: prepare waits for it
            with anyio.move_on_after(0.3) as waited:
                await co.checkpoint("c-cancelled", "/nonexistent", deadline_ts=time.time() + 10)
            assert waited.cancelled_caught
            statuses = [await co.control.status(m.url) for m in co.members]
            tg.cancel_scope.cancel()
    assert [(s.phase.value, s.checkpoint_id, s.admission_open) for s in statuses] == [
        ("idle", None, True),
        ("idle", None, True),
    ]


async def test_restore_is_all_or_nothing(tmp_path: Path) -> None:
    """One corrupt participant directory: the next attempts are retired everywhere, all resume."""
    async with coordinated() as (co, http, _):
        await start_work(http, co, "r1")
        await co.checkpoint("c-src", str(tmp_path), deadline_ts=time.time() + 10)
    records = next((tmp_path / "gym" / "agent" / "agent-0").glob("records-*.jsonl"))
    data = bytearray(records.read_bytes())
    data[5] ^= 0x01
    records.write_bytes(bytes(data))
    async with coordinated() as (co, http, events):
        with pytest.raises(CoordinationError) as info:
            await co.restore("restore-1", str(tmp_path), [EpisodeId("r1")], deadline_ts=time.time() + 10)
        assert list(info.value.failures) == ["agent-0"]
        assert set((await phases(co)).values()) == {"idle"}
        for member in co.members:
            status = await co.control.status(member.url)
            assert status.retired_rollouts == {"r1": 1}
            late = await http.post(
                member.url + "/work/start", json={"rollout_id": "r1", "attempt": 1, "steps": 3}
            )
            assert late.status_code == 409 and late.json()["error"]["code"] == "stale_attempt"
    retired = [e for e in events if isinstance(e, OperationFinished) and e.operation == "retire"]
    assert len(retired) == 4


async def test_a_restore_cancelled_by_its_caller_is_undone(tmp_path: Path) -> None:
    """A caller's timeout cancels restore while the model still reads: the environment, which
    installed its share, is retired and resumed, not left restored for its lease."""
    async with coordinated(members=FOUR[:2]) as (co, http, _):
        await start_work(http, co, "r1")
        await co.checkpoint("c-src", str(tmp_path), deadline_ts=time.time() + 10)
    slow = FaultPlan.parse("slow-restore:model-0:0.6")  # the model reads its one record in 0.6 s
    async with coordinated(members=FOUR[:2], faults=slow) as (co, _, _):
        with anyio.move_on_after(0.3) as waited:
            await co.restore("restore-c", str(tmp_path), [EpisodeId("r1")], deadline_ts=time.time() + 10)
        assert waited.cancelled_caught
        statuses = [await co.control.status(m.url) for m in co.members]
    assert [(s.phase.value, s.episodes, s.retired_rollouts) for s in statuses] == [
        ("idle", 0, {"r1": 1}),
        ("idle", 0, {"r1": 1}),
    ]


async def test_retire_and_forget_go_callers_before_callees() -> None:
    """Environment first, then agent, then model and resources together."""
    async with coordinated() as (co, http, events):
        await start_work(http, co, "r1")
        await co.retire([EpisodeId("r1")], checkpoint_id="ret-1", deadline_ts=time.time() + 10)
        await co.forget(["r1"], checkpoint_id="ret-1", deadline_ts=time.time() + 10)
    for operation in ("retire", "forget"):
        started = [e for e in events if isinstance(e, OperationStarted) and e.operation == operation]
        finished = {
            e.kind: e for e in events if isinstance(e, OperationFinished) and e.operation == operation
        }
        order = {e.kind: e.start_ns for e in started}
        assert finished[Kind.ENVIRONMENT].end_ns <= order[Kind.AGENT]
        assert finished[Kind.AGENT].end_ns <= min(order[Kind.MODEL], order[Kind.RESOURCES])
    (retire,) = [e for e in events if isinstance(e, CoordinateFinished) and e.operation == "retire"]
    (forget,) = [e for e in events if isinstance(e, CoordinateFinished) and e.operation == "forget"]
    assert retire.episodes == 1 and forget.rollouts == 1


async def test_client_maps_error_bodies_to_codes() -> None:
    """A wrong token is 401 unauthorized; a past deadline is 409 deadline_exceeded."""
    async with coordinated(members=FOUR[1:2]) as (co, _, _events):
        url = co.members[0].url
        async with ControlClient("wrong-token") as bad:
            with pytest.raises(ParticipantCallError) as info:
                await bad.status(url)
        assert info.value.status == 401 and info.value.code is ErrorCode.UNAUTHORIZED
        request = PrepareRequest(checkpoint_id="c-late", deadline_ts=time.time() - 1)
        with pytest.raises(ParticipantCallError) as info:
            await co.control.call(url, "prepare", request, PrepareReply, deadline_ts=time.time() + 5)
        assert info.value.status == 409 and info.value.code is ErrorCode.DEADLINE_EXCEEDED


async def test_client_reports_unreachable_participants() -> None:
    """No HTTP answer at all is ParticipantUnreachable, a ParticipantCallError without a code."""
    async with ControlClient(TOKEN) as client:
        with pytest.raises(ParticipantUnreachable) as info:
            await client.status(f"http://127.0.0.1:{free_port()}", timeout=2.0)
    assert info.value.code is None


def test_members_given_directly_are_distinct() -> None:
    """Discovery refuses two servers that would be one member; a coordinator built from members
    took them: replies of two members named alike were taken for each other's, and two members
    of one kind and instance committed into one directory. Both are ``InvalidValueError``."""
    tel = Telemetry(Bus(), kind="controller", instance="coordination")
    agent = Member(name="agent-0", kind="agent", instance="agent-0", url="http://127.0.0.1:1")
    named_alike = Member(name="agent-0", kind="agent", instance="agent-1", url="http://127.0.0.1:2")
    same_instance = Member(name="agent-again", kind="agent", instance="agent-0", url="http://127.0.0.1:1")
    with pytest.raises(InvalidValueError, match="two members are named 'agent-0'"):
        Coordinator([agent, named_alike], token=TOKEN, telemetry=tel)
    with pytest.raises(InvalidValueError, match="'agent-0' and 'agent-again' are both agent/agent-0"):
        Coordinator([agent, same_instance], token=TOKEN, telemetry=tel)
