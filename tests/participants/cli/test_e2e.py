"""Process-level end to end: real `serve` processes, a checkpoint, SIGKILL, restore, one trace."""

from __future__ import annotations

import signal
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import msgspec
import pytest

from ckpt_events import (
    Bus,
    CollectionFinished,
    CoordinateFinished,
    OperationFinished,
    SpanEvent,
    StageFinished,
    StepFinished,
    Telemetry,
)
from ckpt_events.participants.cli.fleet import ServerProcess, process_fleet, write_token_file
from ckpt_events.participants.controller.collection import Collection, CollectionSummary
from ckpt_events.participants.controller.coordinator import Coordinator
from ckpt_events.sinks.jsonl import CorruptLine, JsonLinesSink, read_events
from ckpt_events.vocab import Kind, Operation, Step
from tests.participants.helpers import ROOT

pytestmark = pytest.mark.e2e

TOKEN = "e2e-control-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
ROLLOUTS = 8
STEPS = 12
PARTICIPANTS = (
    ("environment", "environment-0"),
    ("model", "model-0"),
    ("agent", "agent-0"),
    ("resources", "resources-0"),
)


async def start_fleet(tmp: Path, generation: int) -> list[ServerProcess]:
    """The inference worker and the four participants as `serve` processes, each with its own log."""
    token_file = write_token_file(tmp / "token", TOKEN)
    logs = tmp / "logs"
    logs.mkdir(exist_ok=True)

    def env(instance: str) -> dict[str, str]:
        return {
            "CKPT_EVENTS_JSONL": str(logs / f"{instance}.gen{generation}.jsonl"),
            "CKPT_EVENTS_SPAN_GROUPS": "default,checkpoint",
        }

    return await process_fleet(
        token_file=token_file, log_dir=logs, members=PARTICIPANTS, env=env, checkpoint_root=ROOT
    )


def read_log(path: Path) -> list[Any]:
    if not path.exists():
        return []
    events = [event for _, event in read_events(path)]
    assert not any(isinstance(event, CorruptLine) for event in events)
    return events


def read_logs(logs: Path, pattern: str = "*.jsonl") -> list[Any]:
    return [event for path in sorted(logs.glob(pattern)) for event in read_log(path)]


async def until(condition: Callable[[], bool], timeout: float) -> None:
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.05)


async def test_checkpoint_crash_restore_across_processes(tmp_path: Path) -> None:
    """Rollouts survive SIGKILL of every process; one checkpoint is one trace across all of them."""
    logs = tmp_path / "logs"
    run_dir = tmp_path / "run"
    figures: dict[str, Any] = {}
    with anyio.fail_after(120):
        async with Bus() as bus, httpx.AsyncClient(headers=AUTH) as http:
            bus.subscribe(JsonLinesSink(tmp_path / "logs-controller.jsonl"), name="jsonl")
            tel = Telemetry(bus, kind="controller", instance="coordination")

            # Generation 1: run, checkpoint mid-flight and stop, then crash every process.
            fleet = await start_fleet(tmp_path, 1)
            try:
                async with coordinator(fleet, tel, http) as co:
                    # Two at a time: rollouts are still waiting when the first two finish, however loaded
                    # the machine (all eight at once could all finish before the checkpoint).
                    col = Collection(
                        co, run_dir, telemetry=tel, rollouts=ROLLOUTS, steps=STEPS, concurrency=2
                    )
                    first, crash_id = await run_then_checkpoint(
                        col, figures, "checkpoint_before_crash", stop=True
                    )
                assert first.stopped and first.completed < ROLLOUTS
            finally:
                for process in fleet:
                    process.kill()
            assert all(p.proc.returncode == -9 for p in fleet)
            manifest = msgspec.json.decode((run_dir / crash_id / "collection.json").read_bytes())
            continued = [e["rollout_id"] for e in manifest["continued"]]
            assert continued, "the checkpoint was taken mid-flight"

            # Generation 2: fresh processes restore LATEST, take another checkpoint, finish.
            fleet = await start_fleet(tmp_path, 2)
            try:
                async with coordinator(fleet, tel, http) as co:
                    col = Collection(co, run_dir, telemetry=tel, rollouts=ROLLOUTS, steps=STEPS)
                    second, checkpoint_id = await run_then_checkpoint(col, figures, "checkpoint", stop=False)
                    assert second.restored_from == crash_id and second.completed == ROLLOUTS
                    assert all(second.attempts[r] == 1 for r in continued)
                    for member in co.members:
                        status = await co.control.status(member.url)
                        assert status.phase.value == "idle"
                        late = await http.post(
                            member.url + "/work/advance", json={"rollout_id": continued[0], "attempt": 0}
                        )
                        assert late.status_code == 409 and late.json()["error"]["code"] == "stale_attempt"
                    await col.forget_finished()
            finally:
                for process in fleet:
                    process.terminate()
            # uvicorn shuts down on SIGTERM, then re-raises it: a clean stop exits by that signal.
            assert {p.proc.returncode for p in fleet} <= {0, -signal.SIGTERM}, [
                p._stderr_tail() for p in fleet
            ]

    controller = read_log(tmp_path / "logs-controller.jsonl")
    # Generation 2 shut down cleanly, so its logs are complete (generation 1 was SIGKILLed).
    gen2 = read_logs(logs, "*.gen2.jsonl")

    # One trace per checkpoint: the controller's spans and every participant's, across processes.
    (ckpt,) = [
        e
        for e in controller
        if isinstance(e, CollectionFinished) and e.checkpoint_id == checkpoint_id and e.action == "checkpoint"
    ]
    in_trace = [e for e in controller + gen2 if getattr(e, "trace_id", None) == ckpt.trace_id]
    assert {(e.kind, e.instance) for e in in_trace} == {(Kind.CONTROLLER, "coordination")} | {
        (Kind(k), i) for k, i in PARTICIPANTS
    }
    spans = [e for e in gen2 if isinstance(e, SpanEvent) and e.checkpoint_id == checkpoint_id]
    assert len(spans) >= 4 * 3 * 2 and {e.trace_id for e in spans} == {ckpt.trace_id}
    (restore,) = [e for e in controller if isinstance(e, CollectionFinished) and e.action == "restore"]
    assert restore.checkpoint_id == crash_id and restore.rows == len(continued)
    restored = [e for e in gen2 if isinstance(e, OperationFinished) and e.operation is Operation.RESTORE]
    assert len(restored) == 4 and {e.trace_id for e in restored} == {restore.trace_id}

    # Every operation and step of SPEC section 2 appears, on the participants and the controller.
    operations = {e.operation for e in gen2 if isinstance(e, OperationFinished)}
    assert operations >= set(Operation) - {Operation.RENEW}
    assert {e.step for e in gen2 if isinstance(e, StepFinished)} == set(Step)
    coordinated = {e.operation for e in controller if isinstance(e, CoordinateFinished)}
    assert coordinated == set(Operation)  # renew too: the controller names the time it takes
    stages = [e.stage for e in controller if isinstance(e, StageFinished)]
    assert stages == [Kind.ENVIRONMENT, Kind.MODEL, Kind.AGENT, Kind.RESOURCES] * 2
    actions = {e.action for e in controller if isinstance(e, CollectionFinished)}
    assert actions == {"checkpoint", "restore", "publish"}

    print_figures(figures, ckpt, restore, controller, gen2, read_logs(logs, "*.gen1.jsonl"))


@asynccontextmanager
async def coordinator(
    fleet: list[ServerProcess], tel: Telemetry, http: httpx.AsyncClient
) -> AsyncIterator[Coordinator]:
    urls = {p.instance: p.url for p in fleet[1:]}
    async with await Coordinator.discover(urls, token=TOKEN, telemetry=tel, client=http) as co:
        yield co


async def run_then_checkpoint(
    col: Collection, figures: dict[str, Any], name: str, *, stop: bool
) -> tuple[CollectionSummary, str]:
    """Run ``col``; once two rollouts finished somewhere, checkpoint it (timed into ``figures``)."""
    out: dict[str, Any] = {}

    async def run() -> None:
        out["summary"] = await col.run()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        await until(lambda: sum(bool(r.done_at) for r in col.rollouts.values()) >= 2, 30)
        started = time.perf_counter()
        checkpoint_id = await col.checkpoint(stop=stop)
        figures[name] = time.perf_counter() - started
    return out["summary"], checkpoint_id


def print_figures(
    figures: dict[str, Any],
    ckpt: Any,
    restore: Any,
    controller: list[Any],
    events: list[Any],
    gen1: list[Any],
) -> None:
    """The scenario's figures (shown with ``pytest -s``)."""
    print(f"\nrollouts {ROLLOUTS} x {STEPS} steps; in flight at the checkpoint {ckpt.in_flight}")
    print(f"restored rows {restore.rows}, restarts {restore.restarts}")
    for name, seconds in figures.items():
        print(f"{name} (prepare, commit, publish, resume) {seconds * 1000:.0f} ms wall")
    print(f"generation-1 log lines on disk after SIGKILL: {len(gen1)}")
    for e in events:
        if isinstance(e, OperationFinished) and e.operation in (Operation.COMMIT, Operation.RESTORE):
            print(f"  {e.instance:<14} {e.operation.value:<8} records {e.records} bytes {e.bytes}")
    durations: dict[str, list[float]] = defaultdict(list)
    for e in controller + events:
        if isinstance(e, OperationFinished):
            durations[f"{e.kind}.{e.operation.value}"].append((e.end_ns - e.start_ns) / 1e6)
        elif isinstance(e, CoordinateFinished):
            durations[f"controller.coordinate.{e.operation.value}"].append((e.end_ns - e.start_ns) / 1e6)
        elif isinstance(e, StepFinished):
            durations[f"{e.kind}.{e.step}"].append((e.end_ns - e.start_ns) / 1e6)
    for name in sorted(durations):
        values = durations[name]
        print(f"  {name:<36} n={len(values):<3} max {max(values):8.2f} ms")
