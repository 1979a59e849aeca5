"""``create_worker_app``: a participant whose episodes live in N workers behind one port.

The main process serves the whole HTTP API: the control routes go to one ``ControlPlane``
over a ``WorkerPool``; the work routes are forwarded, by capture key, to the worker that owns
the episode (the pool's ``Placement``, which must be sticky: a session's state lives in one
worker, and a restore puts sessions back on their pre-crash owner, which connection-hashing
``SO_REUSEPORT`` cannot do). Workers are processes (``worker_command``) or, for tests, tasks
in this process (``worker_factory``). Each worker writes its own records file of a commit and
reads its own share of a restore; the manifest's parts name each file's worker, so a restore
puts every session back on the worker that wrote it.
"""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, Final

import anyio
import anyio.to_thread
import msgspec
from anyio.abc import TaskGroup
from fastapi import FastAPI

from ckpt_events import Bus, InvalidValueError, OperationSpan, Telemetry
from ckpt_events.checks import library_logger
from ckpt_events.participants.fastapi import Incoming
from ckpt_events.participants.faults import NO_FAULTS, FaultPlan, slow_down
from ckpt_events.participants.protocol import (
    EpisodeId,
    PrepareReport,
    RestoreRequest,
    WorkAdvanceReply,
    WorkerEndpoint,
    WorkStartReply,
)
from ckpt_events.participants.server.builder import build_app
from ckpt_events.participants.server.checks import check_restore_keys
from ckpt_events.participants.server.control import ControlPlane, Exported, Restored, Status
from ckpt_events.participants.server.lease import on_monotonic
from ckpt_events.participants.server.limits import DEFAULT_MAX_BODY_BYTES
from ckpt_events.participants.server.replies import store_refusals
from ckpt_events.participants.server.routes import work_router
from ckpt_events.participants.server.store import (
    WriteResult,
    WriteStop,
    discard_parts,
    participant_beneath,
    prepare_directory,
    publish_parts,
    sweep_parts,
)
from ckpt_events.participants.server.store_files import RECORDS_MAX_BYTES, Beneath, resolve_under
from ckpt_events.participants.server.store_read import files_of, read_manifest
from ckpt_events.participants.server.work import EpisodeView
from ckpt_events.participants.server.workers.coordinator import ENV_SOCKET, WorkerCoordinator
from ckpt_events.participants.server.workers.placement import Placement
from ckpt_events.participants.server.workers.pool import WorkerPool
from ckpt_events.participants.server.workers.share import noted
from ckpt_events.participants.server.workers.supervisor import WorkerSupervisor
from ckpt_events.participants.server.workers.worker import run_worker
from ckpt_events.participants.server.workers.worker_http import ENV_WORKER_HOST, ENV_WORKER_TOKEN
from ckpt_events.participants.workloads.base import Workload
from ckpt_events.vocab import Operation, Phase

__all__ = ["PooledWork", "WorkerControlPlane", "create_worker_app"]

log = library_logger("ckpt_events.workers")

_JOIN_SECONDS: Final = 30.0
#: How long one readiness wait may last before the prepare loop looks again (as at N = 1).
_WAIT_SLICE: Final = 1.0


class WorkerControlPlane(ControlPlane[Any]):
    """The control plane of a multi-worker server: the workers write and read the records.

    A commit's export and write are one step in every worker at once (each its own records
    file), then this process publishes the manifest listing the parts. A restore reads the
    manifest here, then every worker reads and checks its share at once (``stage``), and
    only when all have does each install (``install_staged``): all or nothing, as at N = 1.
    """

    pool: WorkerPool
    #: The directories of commits cancelled while their workers wrote (the server stopping):
    #: swept of unnamed parts once the workers have stopped (``sweep_aborted``).
    aborted: set[Beneath]

    async def sweep_aborted(self) -> None:
        """Delete the parts workers placed after their commit was cancelled (call it once no
        worker runs: a part is placed by its worker alone, so none can come after)."""
        aborted = sorted(self.aborted, key=str)
        self.aborted = set()
        for where in aborted:
            await anyio.to_thread.run_sync(sweep_parts, where)

    def _operation(
        self, trace: Incoming, operation: Operation, checkpoint_id: str
    ) -> AbstractContextManager[OperationSpan]:
        """As at N = 1, and noted: the pool's frames carry it to the workers' shares."""
        return noted(super()._operation(trace, operation, checkpoint_id), checkpoint_id, trace)

    async def _export(self, o: OperationSpan, episode_ids: list[EpisodeId] | None) -> Exported:
        self.pool.check_all_connected("commit")
        return Exported([], [], episode_ids)

    async def _write(
        self,
        o: OperationSpan,
        directory: Beneath,
        cid: str,
        exported: Exported,
        stop: WriteStop,
        deadline_ts: float,
    ) -> tuple[WriteResult, list[str]]:
        kind = str(self.workload.kind)
        instance = self.tel.instance
        with o.step("write") as s, store_refusals():
            started = time.monotonic()
            where = await anyio.to_thread.run_sync(
                functools.partial(
                    prepare_directory, directory, kind=kind, instance=instance, on_step=self.faults.on_step
                )
            )
            try:
                parts = await self.pool.write_parts(where, exported.scope, deadline_ts)
            except BaseException as exc:
                # Shielded: cancelled (the server stopping), the delete was itself cancelled at
                # once and the parts already placed stayed. Local deletes: milliseconds.
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(discard_parts, where, self.pool.written)
                if isinstance(exc, anyio.get_cancelled_exc_class()):
                    # A worker still writing (stopped, woken only as the server stops) placed its
                    # part after this delete, unnamed: swept once the workers have stopped.
                    self.aborted.add(where)
                    # Nobody is left to read a reply: the log is where the operator learns it.
                    log.warning(
                        "commit of checkpoint %s cancelled while its workers wrote: aborted, no "
                        "manifest published, %d part(s) already written deleted (a part still "
                        "being written is deleted once its worker has stopped)",
                        cid,
                        len(self.pool.written),
                    )
                raise
            result = await anyio.to_thread.run_sync(
                functools.partial(
                    publish_parts,
                    where,
                    kind=kind,
                    instance=instance,
                    checkpoint_id=cid,
                    parts=[part for part, _ in parts],
                    stop=stop,
                    on_step=self.faults.on_step,
                )
            )
            await slow_down(self.write_factor, started)
            s.set(records=result.manifest.record_count, bytes=result.bytes)
        return result, sorted(key for _, keys in parts for key in keys)

    async def status(self) -> Status:
        """As at N = 1, with each worker's own work port."""
        reply, report_age = await super().status()
        coordinator = self.pool.coordinator
        connected = set(coordinator.connected())
        workers = [
            WorkerEndpoint(index=i, connected=i in connected, url=coordinator.urls.get(i))
            for i in range(coordinator.workers)
        ]
        return Status(msgspec.structs.replace(reply, workers=workers), report_age)

    def _not_ready_workers(self) -> tuple[str, int] | None:
        return self.pool.not_ready_workers()

    async def _wait_ready(self, cid: str, deadline_ts: float) -> PrepareReport:
        """As at N = 1, but a worker lost while admission is closed ends the wait at once: it
        cannot become ready before resume, so prepare answers "not ready" (``worker-lost``) now."""
        report = self.pool.report()
        ends = on_monotonic(deadline_ts)  # a wall-clock step while it waits does not move it
        while not report.ready and not self.pool.lost and self.checkpoint_id == cid:
            remaining = ends - time.monotonic()
            if remaining <= 0 or self.phase is not Phase.PREPARING:
                break
            await self.pool.wait_changed(min(remaining, _WAIT_SLICE))
            report = self.pool.report()
        if not report.ready and not self.pool.lost and self.checkpoint_id == cid and time.monotonic() >= ends:
            # The blocker counts them; /status shows a hung worker connected: only this names it.
            # Said only of a wait that ran to its deadline (one cut short by a lost worker or a
            # resume is not theirs to answer for).
            for index, how in self.pool.unreported().items():
                log.warning(
                    "prepare of checkpoint %s: worker %d did not report by the deadline (%s): not ready",
                    cid,
                    index,
                    how,
                )
        return report

    async def _read_and_install(
        self, o: OperationSpan, req: RestoreRequest, scope: set[EpisodeId]
    ) -> Restored:
        kind = str(self.workload.kind)
        instance = self.tel.instance
        with o.step("read") as s, store_refusals():
            directory = resolve_under(self.checkpoint_root, req.checkpoint_dir)
            manifest = await anyio.to_thread.run_sync(
                functools.partial(read_manifest, directory, kind=kind, instance=instance)
            )
            where = participant_beneath(directory, kind, instance)
            found, size = await self.pool.stage(where, files_of(manifest), scope, req.deadline_ts)
            try:
                check_restore_keys({e.capture_key for e in scope}, found, manifest.checkpoint_id)
            except BaseException:
                self.pool.discard()
                raise
            s.set(records=manifest.record_count, bytes=size)
        with o.step("install") as s:
            keys = await self.pool.install_staged(req.deadline_ts)
            s.set(records=len(keys))
        return Restored(keys, manifest.checkpoint_id, size)


class PooledWork:
    """The work calls of a multi-worker server's main port: each goes to the worker that holds
    the session (``Placement``), and each reply names that worker's own port (``worker_url``)."""

    def __init__(self, placement: Placement) -> None:
        self.placement = placement

    async def start(self, episode_id: EpisodeId, steps: int) -> WorkStartReply:
        started = await self.placement.start(episode_id, steps)
        key = started.capture_key
        return WorkStartReply(
            capture_key=key, boundary=started.boundary, worker_url=self.placement.worker_url(key)
        )

    async def advance(self, episode_id: EpisodeId) -> WorkAdvanceReply:
        advanced = await self.placement.advance(episode_id)
        url = self.placement.worker_url(episode_id.capture_key)
        return WorkAdvanceReply(boundary=advanced.boundary, done=advanced.done, worker_url=url)

    async def view(self, key: str) -> EpisodeView | None:
        return await self.placement.get(key)


def _workers_spent(
    app: FastAPI,
    pool: WorkerPool,
    then: Callable[[str], None] | None,
    joining: anyio.CancelScope,
    why: str,
) -> None:
    app.state.fatal = why
    pool.spent = why
    # No worker is coming: the start-up stops waiting for them to join (it waited out the join
    # deadline, and the server stopped 16 s after it said it was stopping).
    joining.cancel()
    if then is not None:
        then(why)


def create_worker_app(
    checker: Workload[Any, Any],
    *,
    token: str,
    workers: int,
    own_bus: bool = False,
    configure_sinks: Callable[[Bus], Any] | None = None,
    lease_grace_seconds: float = 600.0,
    worker_command: Callable[[int], Sequence[str]] | None = None,
    worker_factory: Callable[[int], Workload[Any, Any]] | None = None,
    reply_seconds: float = 30.0,
    checkpoint_root: Path,
    max_records_bytes: int = RECORDS_MAX_BYTES,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    worker_host: str = "127.0.0.1",
    on_workers_spent: Callable[[str], None] | None = None,
    faults: FaultPlan = NO_FAULTS,
) -> FastAPI:
    """The main process of a participant with ``workers`` workers (``checker`` is a local
    workload of the kind, its ``tel`` the server's; with ``own_bus`` the lifespan enters that
    bus and calls ``configure_sinks`` on it). Worker processes serve their sessions' work
    calls on their own ports, bound on ``worker_host``; worker tasks (``worker_factory``) are
    reached through the main process only. A worker whose restart budget is spent is noted on
    ``app.state.fatal`` and is a blocker (``<kind>-worker-restarts-spent``) of every later
    prepare; ``on_workers_spent(why)`` is called too (``ckpt-events serve`` ends its server
    with it; an app in a bigger process must not signal it). ``faults`` goes to the
    plane and to worker tasks; a worker process reads its own at start-up."""
    tel: Telemetry = checker.tel
    the_bus: Bus = tel.bus
    coordinator = WorkerCoordinator(workers, reply_seconds=reply_seconds)
    # Was accepted: with neither, its start waited _JOIN_SECONDS for workers nothing started,
    # then every prepare was 503; with both, the command was ignored.
    if worker_command is None and worker_factory is None:
        raise InvalidValueError(
            f"workers={workers} needs its workers started: worker_command= (processes) or "
            "worker_factory= (tasks in this process)"
        )
    if worker_command is not None and worker_factory is not None:
        raise InvalidValueError(f"workers={workers} takes worker_command= or worker_factory=, not both")
    pool = WorkerPool(checker, coordinator)
    plane = WorkerControlPlane(
        tel,
        pool,
        lease_grace_seconds=float(lease_grace_seconds),
        checkpoint_root=checkpoint_root,
        max_records_bytes=max_records_bytes,
        faults=faults,
    )
    plane.pool = pool
    plane.aborted = set()

    @asynccontextmanager
    async def serve_workers(app: FastAPI, tg: TaskGroup) -> AsyncIterator[None]:
        supervisor: WorkerSupervisor | None = None
        joining = anyio.CancelScope()
        try:
            # The coordinator's socket and in-process workers end first (each worker process
            # reads the end), then the worker processes are stopped, then the aborted commits'
            # directories are swept: in that order, whatever the scheduler's.
            async with anyio.create_task_group() as tasks:
                await tasks.start(coordinator.serve)
                if worker_factory is not None:
                    for index in range(workers):
                        secret = coordinator.new_secret(index)
                        tasks.start_soon(
                            functools.partial(run_worker, secret=secret, faults=faults),
                            coordinator.socket_path,
                            index,
                            worker_factory(index),
                        )
                elif worker_command is not None:
                    env = {
                        **getattr(worker_command, "env", {}),
                        ENV_SOCKET: coordinator.socket_path,
                        # Each worker serves its sessions' work calls on its own port, with this token.
                        ENV_WORKER_TOKEN: token,
                        ENV_WORKER_HOST: worker_host,
                    }
                    supervisor = WorkerSupervisor(
                        workers,
                        worker_command,
                        env=env,
                        secret_for=coordinator.new_secret,
                        on_spent=functools.partial(_workers_spent, app, pool, on_workers_spent, joining),
                    )
                    app.state.supervisor = supervisor
                    tg.start_soon(supervisor.run)
                try:
                    with joining:
                        await coordinator.wait_connected(workers, _JOIN_SECONDS)
                    yield
                finally:
                    coordinator.stopping = True
                    # Before the socket ends: a worker's port cuts what it still serves as its
                    # worker ends, and the server's one line counts those cuts too.
                    await coordinator.shut_down_ports()
                    tasks.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                # Every worker stopped first: a stopped one (SIGSTOP) woken only as the server
                # stopped could place its part of a commit this process had given up on.
                if supervisor is not None:
                    await supervisor.stop()
                await plane.sweep_aborted()

    return build_app(
        title=f"ckpt-events {checker.kind} participant {tel.instance} ({workers} workers)",
        tel=tel,
        plane=plane,
        work=pool,
        work_router=work_router(PooledWork(pool.placement), token),
        token=token,
        max_body_bytes=max_body_bytes,
        bus=the_bus,
        own_bus=own_bus,
        configure_sinks=configure_sinks,
        body=serve_workers,
        state={"coordinator": coordinator},
    )
