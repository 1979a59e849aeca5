"""``participants.server.workers.worker``: ``WorkerHost`` answers the coordinator's messages with a
real workload, in process; its checkpoint shares write and read real records files."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from ckpt_events import Bus, OperationFinished, Telemetry, format_traceparent
from ckpt_events.participants.errors import ProtocolRefusal, WorkerChannelError
from ckpt_events.participants.protocol import (
    MAX_RETIRED_KEYS_SHOWN,
    EpisodeId,
    PrepareReport,
    RecordsPart,
    RetireReply,
)
from ckpt_events.participants.server.app import make_workload
from ckpt_events.participants.server.store_read import Share
from ckpt_events.participants.server.workers.frames import (
    Advance,
    Advanced,
    Close,
    Closed,
    Discard,
    Forget,
    Get,
    Hello,
    InstallStaged,
    Mark,
    Message,
    Open,
    PartShare,
    Report,
    Request,
    Retire,
    Stage,
    Staged,
    Start,
    Started,
    Stop,
    WorkerState,
    WritePart,
    WrittenPart,
)
from ckpt_events.participants.server.workers.worker import WorkerHost
from ckpt_events.participants.workloads import EnvironmentWorkload
from ckpt_events.testing import capture_events

pytestmark = pytest.mark.anyio

CALLER = format_traceparent(0x1234, 0x5678)


def _host(bus: Bus, index: int = 1) -> WorkerHost:
    tel = Telemetry(bus, kind="environment", instance="environment-0", worker=index)
    return WorkerHost(make_workload("environment", tel, step_seconds=0.0), index)


async def _ask(host: WorkerHost, body: Request[Any], traceparent: str | None = None) -> Any:
    return await host.handle(Message(1, body, traceparent))


async def test_the_server_s_state_sets_admission_and_every_retired_mark() -> None:
    """``apply_state`` closes (or opens) admission and marks each retired attempt."""
    async with Bus() as bus:
        host = _host(bus)
        host.apply_state(WorkerState(admission_open=False, marks={"r1": 2}))
        assert not host.workload.admission_open
        assert host.workload.fence.is_retired(EpisodeId("r1", 2))
        assert not host.workload.fence.is_retired(EpisodeId("r1", 3))
        host.apply_state(WorkerState())
        assert host.workload.admission_open
        await host.workload.aclose()


async def test_work_messages_start_advance_and_show_episodes() -> None:
    """start, advance and get answer with the episode; an unknown one gives ``None``."""
    async with Bus() as bus:
        host = _host(bus, index=3)
        assert await _ask(host, Start(EpisodeId("r1"), 2)) == Started("r1", 0)
        assert await _ask(host, Advance(EpisodeId("r1"))) == Advanced(1, False)
        assert await _ask(host, Advance(EpisodeId("r1"))) == Advanced(2, True)
        assert await _ask(host, Advance(EpisodeId("nobody"))) is None
        view = await _ask(host, Get("r1"))
        assert (view.boundary, view.steps, view.worker) == (2, 2, 3)
        assert await _ask(host, Get("nobody")) is None
        await host.workload.aclose()


async def test_admission_marks_and_stops_change_the_workload() -> None:
    """close/open admission, mark/forget a retired attempt, stop an episode."""
    async with Bus() as bus:
        host = _host(bus)
        wl = host.workload
        assert await _ask(host, Close()) is None and not wl.admission_open
        with pytest.raises(ProtocolRefusal, match="admission_closed"):
            await _ask(host, Start(EpisodeId("r1"), 2))
        assert await _ask(host, Open()) is None and wl.admission_open
        await _ask(host, Mark(EpisodeId("r9", 1)))
        assert wl.fence.is_retired(EpisodeId("r9", 1))
        await _ask(host, Forget(["r9"]))
        assert not wl.fence.is_retired(EpisodeId("r9", 1))
        await _ask(host, Start(EpisodeId("r1"), 2))
        assert await _ask(host, Stop(["r1"])) is None
        assert wl.episodes["r1"].stopped
        await wl.aclose()


async def test_prepare_and_report_answer_the_workload_s_report_as_a_child_span() -> None:
    """``closed`` runs the prepare share under the frame's traceparent; ``report`` answers too."""
    async with capture_events([OperationFinished]) as (bus, events):
        host = _host(bus, index=2)
        await _ask(host, Start(EpisodeId("r1"), 2))
        report = await _ask(host, Closed("c1", 2e9), CALLER)
        assert isinstance(report, PrepareReport) and report.ready and report.blocker_count == 0
        assert await _ask(host, Report(wait=0.0)) == host.workload.report()
        await host.workload.aclose()
        await bus.flush()
    [prepare] = events
    assert (prepare.operation, prepare.checkpoint_id, prepare.worker) == ("prepare", "c1", 2)
    assert (prepare.trace_id, prepare.parent_span_id, prepare.parent_remote) == (0x1234, 0x5678, True)


async def test_a_commit_share_is_staged_then_installed_by_another_worker(tmp_path: Path) -> None:
    """write_part writes this worker's records file; another worker stages it (nothing installed
    yet), then installs it as attempt + 1 (minus what is dropped); discard takes it out again."""
    async with Bus() as bus:
        writer = _host(bus, index=0)
        for rollout in ("r1", "r2"):
            await _ask(writer, Start(EpisodeId(rollout), 3))
            await _ask(writer, Advance(EpisodeId(rollout)))
        written = await _ask(writer, WritePart([str(tmp_path)], None, "c1", None), CALLER)
        assert isinstance(written, WrittenPart)
        assert (written.record_count, written.keys) == (2, ["r1", "r2"])
        assert (tmp_path / written.records_file).stat().st_size == written.bytes

        reader = _host(bus, index=1)
        part = RecordsPart(0, written.records_file, written.records_sha256, written.record_count)
        staged = await _ask(reader, Stage([str(tmp_path)], [PartShare(part, Share())], "c2"))
        assert staged == Staged(["r1", "r2"], written.bytes)
        assert reader.workload.episodes == {}
        installed = await _ask(reader, InstallStaged(["r2"], "c2"))
        assert installed == ["r1-a1"] and not reader.workload.admission_open
        assert reader.workload.episodes["r1-a1"].boundary == 1
        assert reader.workload.fence.is_retired(EpisodeId("r1", 0))
        assert await _ask(reader, Discard()) is None
        assert reader.workload.episodes == {}
        await writer.workload.aclose()
        await reader.workload.aclose()


async def test_install_without_a_stage_and_a_kind_a_worker_does_not_take_are_unknown() -> None:
    """``install_staged`` before ``stage`` and a ``hello`` are refused as unknown kinds."""
    async with Bus() as bus:
        host = _host(bus)
        with pytest.raises(WorkerChannelError) as info:
            await _ask(host, InstallStaged([], "c1"))
        assert str(info.value) == "install_staged without a stage"
        with pytest.raises(WorkerChannelError) as hello:
            await _ask(host, Hello(0))
        assert str(hello.value) == "hello"
        await host.workload.aclose()


async def test_a_staged_share_that_does_not_check_is_refused_and_nothing_is_staged(tmp_path: Path) -> None:
    """A records file whose digest does not match is refused (a protocol refusal): nothing installs."""
    async with Bus() as bus:
        writer = _host(bus, index=0)
        await _ask(writer, Start(EpisodeId("r1"), 3))
        written = await _ask(writer, WritePart([str(tmp_path)], None, "c1", None))
        reader = _host(bus, index=1)
        bad = RecordsPart(0, written.records_file, "0" * 64, written.record_count)
        with pytest.raises(ProtocolRefusal) as info:
            await _ask(reader, Stage([str(tmp_path)], [PartShare(bad, Share())], "c2"))
        assert info.value.code == "invalid_checkpoint_state"
        with pytest.raises(WorkerChannelError, match="install_staged without a stage"):
            await _ask(reader, InstallStaged([], "c2"))
        await writer.workload.aclose()
        await reader.workload.aclose()


async def test_a_big_retire_answers_a_count_and_the_first_keys() -> None:
    """A worker's reply to a retire of 5,000 ids is their count and the first 100 keys (a
    few KB, whatever the number): it carried every key back to the server (0.7-2.6 MB a
    worker at 64,000 ids), which answers from the ids it sent instead."""
    rollouts = [f"r{i:05d}" for i in range(5000)]
    async with Bus() as bus:
        host = _host(bus)
        reply = await _ask(host, Retire([EpisodeId(r, 1) for r in reversed(rollouts)], "c1"))
        keys = [f"{r}-a1" for r in rollouts[:MAX_RETIRED_KEYS_SHOWN]]
        assert reply == RetireReply(retired=keys, retired_count=len(rollouts))
        assert len(msgspec.msgpack.encode(reply)) < 2000
        await host.workload.aclose()


async def test_retire_marks_and_frees_the_attempts() -> None:
    """``retire`` answers the retired capture keys and drops their episodes."""
    async with Bus() as bus:
        host = _host(bus)
        await _ask(host, Start(EpisodeId("r1"), 2))
        assert await _ask(host, Retire([EpisodeId("r1")], "c1")) == RetireReply(["r1"], retired_count=1)
        assert "r1" not in host.workload.episodes
        assert host.workload.fence.is_retired(EpisodeId("r1"))
        await host.workload.aclose()


class _SlowReports(EnvironmentWorkload):
    """An environment whose readiness takes 20 ms to compute (as ~300,000 episodes' would),
    counting each computation."""

    computed = 0

    def report(self) -> PrepareReport:
        self.computed += 1
        time.sleep(0.02)  # holds the loop, as the real computation does
        return super().report()


async def test_report_rounds_compute_readiness_paced() -> None:
    """The server's Report rounds, back to back for a second while episodes keep changing,
    compute readiness about once a pacing interval (10 times its 20 ms, at most 0.2 s): ~6
    times. Was: twice a round, unpaced (~45 times; 62-68 % of a worker's loop at
    20,000-50,000 changing episodes)."""
    async with Bus() as bus:
        tel = Telemetry(bus, kind="environment", instance="environment-0", worker=1)
        workload = _SlowReports(tel, step_seconds=0.002)
        host = WorkerHost(workload, 1)
        keys = [f"r{i}" for i in range(20)]
        for key in keys:
            workload.start(EpisodeId(key), 10**6)
        ends = time.monotonic() + 1.0

        async def churn(key: str) -> None:
            for _ in range(10_000):
                if time.monotonic() >= ends:
                    break
                await workload.advance(EpisodeId(key))

        rounds = 0
        async with anyio.create_task_group() as tg:
            for key in keys:
                tg.start_soon(churn, key)
            while rounds < 1000 and time.monotonic() < ends:
                await _ask(host, Report(1.0))
                rounds += 1
        assert rounds >= 2 and workload.computed <= 12, (rounds, workload.computed)
        await workload.aclose()
