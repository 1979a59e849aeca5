"""One generation of the demo's fleet: its servers started, crashed, interrupted and checked.

``generation_fleet`` starts a generation's servers (an inference worker and the participants,
``--instances N`` of each kind) as real uvicorn servers inside this process, with fast
workloads, or with ``--processes`` as ``serve`` processes that ``Fleet.crash`` kills with
SIGKILL; the faults asked for are injected, and with a fault the leases are short. After
discovery, ``check_members`` makes sure every server started answers as itself.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from ckpt_events import Bus
from ckpt_events.participants.cli.demo.plan import (
    FAULT_LEASE_GRACE_S,
    DemoOptions,
    fleet_members,
    lease_target,
)
from ckpt_events.participants.cli.demo.watch import stall_environ
from ckpt_events.participants.cli.fleet import local_fleet, process_fleet, stop_processes, write_token_file
from ckpt_events.participants.controller.coordinator import Coordinator
from ckpt_events.participants.errors import DemoFailed
from ckpt_events.participants.faults import FaultPlan
from ckpt_events.participants.workloads.registry import KINDS

__all__ = ["Fleet", "check_members", "generation_fleet"]

#: In-process workloads run fast: the demo is about the checkpoint, not the simulated work
#: (by each kind's first instance; its other instances run the same).
FAST_WORKLOADS: dict[str, dict[str, Any]] = {
    "environment-0": {"step_seconds": 0.001},
    "model-0": {"max_tokens": 4},
    "agent-0": {"turn_seconds": 0.001},
    "resources-0": {"request_seconds": 0.001},
}


@dataclass(frozen=True)
class Fleet:
    """One generation's servers: their URLs; ``crash`` kills them all (SIGKILL); ``interrupt``
    passes a Ctrl-C on to them (SIGTERM, without waiting: the calls to them then fail fast)."""

    urls: dict[str, str]
    crash: Callable[[], None]
    interrupt: Callable[[], None]


@dataclass(frozen=True)
class _Servers:
    """What one generation starts: its ``members`` (kind, instance) with ``workers`` worker
    processes each, those of ``short`` with a short lease, each writing its log in ``logs``."""

    generation: int
    members: tuple[tuple[str, str], ...]
    workers: int
    short: set[str]
    logs: Path

    def log_of(self, instance: str) -> str:
        """The JSON-lines log of ``instance`` in this generation."""
        return str(self.logs / f"{instance}.gen{self.generation}.jsonl")


@contextlib.asynccontextmanager
async def generation_fleet(
    opts: DemoOptions,
    bus: Bus,
    token: str,
    workdir: Path,
    generation: int,
    stopping: anyio.Event | None,
    faults: FaultPlan,
) -> AsyncIterator[Fleet]:
    """Yield one generation of the fleet, injecting ``faults``; leaving the block stops it."""
    workers = opts.workers if generation == 1 else (opts.restore_workers or opts.workers)
    members = fleet_members(opts.servers(generation))
    # With a fault the leases are short, so it shows in seconds; the lease fault among several
    # servers of a kind shortens one server's lease, so that one alone expires.
    target = lease_target(opts)
    short = {i for _, i in members if opts.fault is not None and target in (None, i)}
    servers = _Servers(generation, members, workers, short, workdir / "logs")
    started = (
        _process_fleet(opts, token, workdir, faults, servers)
        if opts.processes
        else _local_fleet(bus, token, workdir, stopping, faults, servers)
    )
    async with started as fleet:
        yield fleet


@contextlib.asynccontextmanager
async def _local_fleet(
    bus: Bus,
    token: str,
    workdir: Path,
    stopping: anyio.Event | None,
    faults: FaultPlan,
    servers: _Servers,
) -> AsyncIterator[Fleet]:
    """The generation's servers in this process, on ``bus``, with the fast workloads."""
    servers.logs.mkdir(exist_ok=True)
    options = {
        instance: {
            **FAST_WORKLOADS.get(KINDS[kind].instance, {}),
            **({"lease_grace_seconds": FAULT_LEASE_GRACE_S} if instance in servers.short else {}),
        }
        for kind, instance in servers.members
    }
    local = local_fleet(
        token=token,
        bus=bus,
        members=servers.members,
        options=options,
        workers=servers.workers,
        checkpoint_root=workdir / "run",
        stopping=stopping,
        faults=faults,
        # Worker processes have buses of their own: each writes <file>.w<index> for the report.
        worker_env=lambda instance: {"CKPT_EVENTS_JSONL": servers.log_of(instance)},
    )
    async with local as urls:
        # Leaving the block stops the servers (their state is gone); `stopping` already
        # shuts them down gracefully.
        yield Fleet(urls, crash=lambda: None, interrupt=lambda: None)


@contextlib.asynccontextmanager
async def _process_fleet(
    opts: DemoOptions, token: str, workdir: Path, faults: FaultPlan, servers: _Servers
) -> AsyncIterator[Fleet]:
    """The generation's servers as ``serve`` processes; ``crash`` kills them (SIGKILL)."""
    token_file = write_token_file(workdir / "token", token)

    def env(instance: str) -> dict[str, str]:
        extra = {"CKPT_EVENTS_JSONL": servers.log_of(instance)}
        extra.update(faults.environ())  # each process reads it once, at start-up
        extra.update(stall_environ(opts.fault) if opts.watch else {})  # their StallWatch logs too
        if opts.otlp_endpoint:
            extra["OTEL_EXPORTER_OTLP_ENDPOINT"] = opts.otlp_endpoint
            extra["OTEL_SERVICE_NAME"] = f"ckpt-events-demo/{instance}"
        return extra

    workers = servers.workers
    fleet = await process_fleet(
        token_file=token_file,
        log_dir=servers.logs,
        members=servers.members,
        env=env,
        extra_args=lambda instance: [
            *(["--workers", str(workers)] if workers > 1 else []),
            *(["--lease-grace-seconds", str(FAULT_LEASE_GRACE_S)] if instance in servers.short else []),
        ],
        checkpoint_root=workdir / "run",
    )
    crashed = False
    try:

        def crash() -> None:
            nonlocal crashed
            crashed = True
            for process in fleet:
                process.kill()

        def interrupt() -> None:
            for process in fleet:
                process.send(signal.SIGTERM)

        yield Fleet({p.instance: p.url for p in fleet[1:]}, crash, interrupt)
    finally:
        await stop_processes(fleet, kill=crashed)


def check_members(coordinator: Coordinator, started: Mapping[str, str]) -> None:
    """Every server ``started`` (instance -> URL) is a participant and answers as the instance it
    was started as. One that does not shares its port with another (taken between its choice and
    its use), and the two would get each other's commits: with several servers of a kind, each its
    own scope. One whose port another program took first failed to bind, and that program answers
    404 there: discovery drops the server as no participant, and the run went on without it."""
    found = {m.name for m in coordinator.members}
    wrong = [f"{name} is not found at {url}" for name, url in started.items() if name not in found]
    wrong += [f"{m.name} answers as {m.instance}" for m in coordinator.members if m.instance != m.name]
    if wrong:
        raise DemoFailed(
            f"servers missing or answering for others ({', '.join(wrong)}): a port was taken, run again"
        )
