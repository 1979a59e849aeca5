"""One worker of a multi-worker server: its share of the episodes, reached over frames.

``run_worker`` connects to the coordinator's socket, says ``hello`` (its index), takes the
server's state (admission, retired marks: a worker that joins late gets every mark) and
then answers the coordinator's messages with its own ``Workload`` until the socket ends.
Its share of a checkpoint (``closed``: prepare, ``write_part``: commit, ``stage`` and
``install_staged``: restore, ``retire``) runs as a child span of the coordinator's operation
span: the frame carries the coordinator's traceparent, and the worker's ``Telemetry`` names the
worker (``worker=index``). A worker writes and reads its own records file: a commit's records
never pass through the main process, which only publishes the manifest listing the parts.
A restore is two steps, so that it installs everywhere or nowhere: every worker reads and
checks its share (``stage``), and only when all have does each install what it staged;
``discard`` drops a staged (or freshly installed) share when another worker failed.
"""

from __future__ import annotations

import functools
import os
import time
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Final

import anyio
import anyio.lowlevel
import anyio.to_thread

from ckpt_events import OperationFinished, OperationSpan
from ckpt_events.participants.fastapi import Incoming
from ckpt_events.participants.faults import NO_FAULTS, FaultPlan
from ckpt_events.participants.loop_lag import LoopLagMonitor
from ckpt_events.participants.protocol import EpisodeId, PrepareReport, encode
from ckpt_events.participants.server.gc_pause import gc_paused
from ckpt_events.participants.server.pacing import timed_report
from ckpt_events.participants.server.replies import store_refusals
from ckpt_events.participants.server.store import discard_parts, write_part
from ckpt_events.participants.server.store_files import RECORDS_MAX_BYTES, Beneath
from ckpt_events.participants.server.store_read import read_part
from ckpt_events.participants.server.work import episode_view
from ckpt_events.participants.server.workers.channel import FrameChannel, UnknownKind, current_arrival
from ckpt_events.participants.server.workers.frames import (
    DEFAULT_MAX_FRAME,
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
    Report,
    Retire,
    Shutdown,
    Stage,
    Staged,
    Start,
    Started,
    Stop,
    WorkerState,
    WritePart,
    WrittenPart,
)
from ckpt_events.participants.workloads.base import Workload
from ckpt_events.vocab import Operation

if TYPE_CHECKING:
    from ckpt_events.participants.server.workers.worker_http import WorkerHttp

__all__ = ["WorkerHost", "run_worker"]

_REPORT_WAIT_CAP: Final = 0.5


class WorkerHost:
    """Answers the coordinator's messages with ``workload`` (worker ``index`` of the server)."""

    def __init__(
        self,
        workload: Workload[Any, Any],
        index: int,
        *,
        max_records_bytes: int = RECORDS_MAX_BYTES,
        monitor: LoopLagMonitor | None = None,
        faults: FaultPlan = NO_FAULTS,
        http: WorkerHttp | None = None,
    ) -> None:
        self.workload = workload
        #: This worker's own port, if it serves one (cut on ``Shutdown``).
        self.http = http
        self.index = index
        self.max_records_bytes = max_records_bytes
        #: This worker's loop lag, recorded on each of its operations (``loop_lag_ms``).
        self.monitor = monitor
        #: What is injected into this worker's share (a slow read, a failing disk step).
        self.faults = faults
        #: A restore's share read and checked by ``stage``, installed by ``install_staged``.
        self._staged: tuple[list[Any], list[Any]] | None = None
        #: The keys the last ``install_staged`` installed (``discard`` takes them out again).
        self._installed: list[str] = []
        #: The fence's marks of those rollouts before that install marked them (``None``: no
        #: mark), which ``discard`` puts back: a refused restore fences nothing.
        self._fenced_before: dict[str, int | None] = {}
        #: The earliest ``perf_counter`` a ``Report`` computes readiness again (``pacing``).
        self._report_not_before = 0.0

    def apply_state(self, state: WorkerState) -> None:
        """The server's state from the coordinator's ``hello`` reply."""
        for rollout_id, attempt in state.marks.items():
            self.workload.fence.mark(EpisodeId(rollout_id, attempt))
        if state.admission_open:
            self.workload.open_admission()
        else:
            self.workload.close_admission()

    def _share(
        self, operation: Operation, checkpoint_id: str | None, message: Message
    ) -> AbstractContextManager[OperationSpan]:
        """This worker's share of a coordinator operation: a child of it (the frame's traceparent),
        with the frame's arrival (``received_ns``) and this worker's loop lag while it runs, as
        an operation of the main port has its request's."""
        incoming = Incoming.from_headers(
            message.traceparent, received_ns=current_arrival(), monitor=self.monitor
        )
        return incoming.operation(self.workload.tel, operation, checkpoint_id=checkpoint_id)

    async def handle(self, message: Message) -> Any:
        """The reply to ``message`` (of its request's reply type); ``UnknownKind`` for a request
        a worker does not take."""
        wl = self.workload
        match message.body:
            case Start(episode_id=episode_id, steps=steps):
                episode = wl.start(episode_id, steps)
                return Started(episode.key, episode.boundary)
            case Advance(episode_id=episode_id):
                try:
                    episode = await wl.advance(episode_id)
                except LookupError:
                    return None
                return Advanced(episode.boundary, episode.done)
            case Get(key=key):
                found = wl.get(key)
                return None if found is None else episode_view(wl, found, self.index)
            case Close():
                wl.close_admission()
                return None
            case Open():
                wl.open_admission()
                return None
            case Closed(checkpoint_id=cid, deadline_ts=deadline_ts):
                with self._share(Operation.PREPARE, cid, message) as op:
                    await wl.on_admission_closed(op, cid, deadline_ts)
                    report = wl.report()
                    op.set(blockers=report.blocker_count)
                return report
            case Report(wait=wait):
                return await self._report(min(wait, _REPORT_WAIT_CAP))
            case WritePart() as request:
                return await self._write_part(request, message)
            case Stop(keys=keys):
                wl.stop(keys)
                return None
            case Shutdown():
                return [] if self.http is None else self.http.cut()
            case Stage() as request:
                return await self._stage(request, message)
            case InstallStaged() as request:
                return await self._install_staged(request, message)
            case Discard():
                self._discard()
                return None
            case Retire(episode_ids=episode_ids, checkpoint_id=cid):
                with self._share(Operation.RETIRE, cid, message):
                    return await wl.retire(episode_ids)
            case Mark(episode_id=episode_id):
                wl.fence.mark(episode_id)
                return None
            case Forget(rollout_ids=rollout_ids):
                wl.fence.forget_all(rollout_ids)
                return None
            case _:
                raise UnknownKind(message.kind)

    async def _report(self, wait: float) -> PrepareReport:
        """The readiness after waiting up to ``wait`` seconds for a change if not ready, each
        report paced as the prepare's wait at N = 1 (``pacing``): the server asks round after
        round while a prepare waits, and each round computed it twice, unpaced."""
        ends = time.perf_counter() + wait
        report = await self._paced_report(ends)
        if report.ready:
            return report
        await self.workload.wait_changed(ends - time.perf_counter())
        return await self._paced_report(ends)

    async def _paced_report(self, ends: float) -> PrepareReport:
        """The readiness, computed once the pacing allows, or at ``ends`` (``perf_counter``)."""
        pause = min(self._report_not_before, ends) - time.perf_counter()
        if pause > 0:
            await anyio.sleep(pause)
        report, not_before = timed_report(self.workload)
        self._report_not_before = not_before
        return report

    # -- this worker's share of a commit and a restore --------------------------------------

    async def _write_part(self, request: WritePart, message: Message) -> WrittenPart:
        """Export this worker's episodes in scope and write them as one records file."""
        wl = self.workload
        with self._share(Operation.COMMIT, request.checkpoint_id, message) as op:
            with op.step("export") as step, gc_paused():
                records = await wl.export(request.scope)
                keys = [r.episode_id.capture_key for r in records]
                lines = [encode(r) for r in records]
                del records
                step.set(records=len(lines))
            with op.step("write") as step, store_refusals(), gc_paused():
                # Walked from the root again here, never through a symlink: see store_files.
                where = Beneath.from_wire(request.directory)
                with anyio.CancelScope(shield=True):  # the thread runs on anyway: keep its result
                    part = await anyio.to_thread.run_sync(
                        functools.partial(
                            write_part, where, lines, place_by=request.place_by, on_step=self.faults.on_step
                        )
                    )
                try:
                    await anyio.lowlevel.checkpoint_if_cancelled()
                except anyio.get_cancelled_exc_class():
                    # Cancelled while writing (the server's socket ended: it stopped), the part
                    # was placed all the same, and nobody would ever name or delete it.
                    discard_parts(where, [part.records_file])
                    raise
                step.set(records=part.record_count, bytes=part.bytes)
            op.set(records=part.record_count, bytes=part.bytes)
        return WrittenPart(*part, keys=keys, extras=wl.commit_extras(keys))

    async def _stage(self, request: Stage, message: Message) -> Staged:
        """Read and check this worker's share of a checkpoint; nothing is installed yet."""
        wl = self.workload
        self._discard()
        directory = Beneath.from_wire(request.directory)
        pause = self.faults.read_pause(wl.tel.instance)
        with (
            self._share(Operation.RESTORE, request.checkpoint_id, message) as op,
            op.step("read") as step,
            gc_paused(),
        ):
            chosen: list[Any] = []
            seen: set[EpisodeId] = set()  # across this worker's parts: an episode in two does not check
            size = 0
            count = 0
            for shared in request.parts:
                part, share = shared.part, shared.share
                with store_refusals():
                    records, part_size = await anyio.to_thread.run_sync(
                        functools.partial(
                            read_part,
                            directory,
                            part,
                            kind=str(wl.kind),
                            record_type=wl.record_type,
                            max_records_bytes=self.max_records_bytes,
                            share=share,
                            seen=seen,
                            pause=pause,
                        )
                    )
                count += len(records)
                size += part_size
                chosen += records
                del records
            with store_refusals():
                # Every record of the share checks before any worker installs anything.
                states = [wl.check_record(r) for r in chosen]
            step.set(records=count, bytes=size)
            op.set(records=len(chosen), bytes=size)
        self._staged = (chosen, states)
        return Staged([r.episode_id.capture_key for r in chosen], size)

    async def _install_staged(self, request: InstallStaged, message: Message) -> list[str]:
        """Install what ``stage`` read (admission closes first), as attempt + 1 of each."""
        if self._staged is None:
            raise UnknownKind("install_staged without a stage")  # answered, never installed
        records, states = self._staged
        self._staged = None
        if drop := set(request.drop):  # read and checked, but out of the restore's scope
            kept = [
                (r, s) for r, s in zip(records, states, strict=True) if r.episode_id.capture_key not in drop
            ]
            records, states = [r for r, _ in kept], [s for _, s in kept]
        wl = self.workload
        held = wl.fence.snapshot()
        fenced_before = {r.episode_id.rollout_id: held.get(r.episode_id.rollout_id) for r in records}
        with (
            self._share(Operation.RESTORE, request.checkpoint_id, message) as op,
            op.step("install") as step,
            store_refusals(),  # a workload's InvalidCheckpointError is 422, as at N = 1, not a failure
        ):
            wl.close_admission()
            # All or nothing: an install that raises part way is taken out here, as ``discard``
            # takes out one that finished (it knows only the keys a finished install returned).
            with wl.installing():
                self._installed = await wl.install(records, states)
            self._fenced_before = fenced_before  # for discard: one that raised put its marks back
            step.set(records=len(records))
            op.set(records=len(records))
        return self._installed

    def _discard(self) -> None:
        """Drop a staged share, and take out what the last install put in (never ran work)."""
        self._staged = None
        for key in self._installed:
            self.workload.episodes.pop(key, None)
        self._installed = []
        fence = self.workload.fence
        for rollout_id, attempt in self._fenced_before.items():
            fence.forget(rollout_id)
            if attempt is not None:
                fence.mark(EpisodeId(rollout_id, attempt))
        self._fenced_before = {}


async def run_worker(
    socket_path: str,
    index: int,
    workload: Workload[Any, Any],
    *,
    max_frame: int = DEFAULT_MAX_FRAME,
    secret: str,
    token: str | None = None,
    host: str | None = None,
    header_timeout: float | None = None,
    faults: FaultPlan = NO_FAULTS,
) -> None:
    """Serve as worker ``index`` until the coordinator's socket ends (``secret``: what the
    coordinator gave this start of the worker, said in its ``hello``).

    With ``token`` the worker also serves the work routes on its own port (on ``host``, closing
    connections that send no complete request head within ``header_timeout``: default 5 s),
    announced in its ``hello``; without, every work call reaches it through the main process.
    """
    try:
        stream = await anyio.connect_unix(socket_path)
    except OSError as exc:
        # anyio's error names no path; the worker's one line (``worker_process``) says which.
        why = f"cannot connect to the server's worker socket ({exc.strerror or exc})"
        raise OSError(exc.errno, why, socket_path) from None
    http = None
    if token is not None:
        from ckpt_events.participants.server.connection_guard import ConnectionLimits
        from ckpt_events.participants.server.workers.worker_http import WorkerHttp

        limits = None if header_timeout is None else ConnectionLimits(header_timeout=header_timeout)
        http = WorkerHttp(workload, index, token=token, host=host or "127.0.0.1", connections=limits)
    # One loop-lag sampler per worker, for its own port's operations and its checkpoint shares.
    monitor = LoopLagMonitor() if http is None else http.monitor
    host_ = WorkerHost(workload, index, monitor=monitor, faults=faults, http=http)
    channel = FrameChannel(stream, host_.handle, name=f"worker {index}", max_frame=max_frame)
    async with anyio.create_task_group() as tg:
        # Sampling before the first frame is read: an operation begun before its first turn had no
        # loop_lag_ms (not sampled whole).
        # On demand: sampled while an operation is open, no timer while the worker idles.
        run = functools.partial(monitor.run, on_demand=True)
        await tg.start(run, functools.partial(workload.tel.bus.wants, OperationFinished))
        tg.start_soon(channel.run)
        if http is not None:
            tg.start_soon(http.serve)
        try:
            hello = Hello(index, secret, os.getpid(), None if http is None else http.url)
            state = await channel.request(hello, timeout=10.0)
            host_.apply_state(state)
            await channel.wait_closed()
        finally:
            if http is not None:
                http.stop()
            tg.cancel_scope.cancel()
            await workload.aclose()
