"""The phase machine of one participant: prepare, commit, restore, resume (an abort), retire
and forget, with their admission checks, replays and fencing.

One lock serializes transitions. Prepare waits for readiness outside it, so a resume (or
the lease running out) cuts the wait short; the commit's write also runs outside it, and a
``WriteStop`` makes sure no manifest is published once resume has run; one linked just before
is withdrawn (``lease.withdraw_linked``) when the commit is refused (or cancelled before its
answer), so the disk never holds a checkpoint whose commit was not answered as committed.
Retries replay from a ``ReplyCache``; the store's errors are answered as refusals
(``replies.store_refusals``). The lease itself (its clock, its wake-up, the wording of its
end) is ``lease.Lease``; this machine checks it under its lock and aborts on its end.
"""

from __future__ import annotations

import functools
import heapq
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Final, Generic, NamedTuple, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread

from ckpt_events import OperationSpan, Telemetry
from ckpt_events.checks import library_logger
from ckpt_events.participants.errors import ProtocolRefusal
from ckpt_events.participants.fastapi import Incoming
from ckpt_events.participants.faults import NO_FAULTS, FaultPlan, slow_down
from ckpt_events.participants.protocol import (
    MAX_FORGOTTEN_SHOWN,
    MAX_RETIRED_SHOWN,
    NOT_READY_WORKER_BLOCKERS,
    NOT_READY_WORKERS,
    CommitReply,
    CommitRequest,
    EpisodeId,
    ForgetReply,
    ForgetRequest,
    PrepareReply,
    PrepareReport,
    PrepareRequest,
    RenewReply,
    RenewRequest,
    RestoreReply,
    RestoreRequest,
    ResumeReply,
    ResumeRequest,
    RetireReply,
    RetireRequest,
    StatusReply,
    encode,
)
from ckpt_events.participants.server.checks import (
    check_commit_scope,
    check_deadline,
    check_outside,
    check_restore_not_retired,
    check_restore_scope,
)
from ckpt_events.participants.server.gc_pause import freeze, gc_paused, thaw
from ckpt_events.participants.server.lease import Lease, on_monotonic, withdraw_linked
from ckpt_events.participants.server.pacing import timed_report
from ckpt_events.participants.server.replies import ReplayArgs, ReplyCache, store_refusals
from ckpt_events.participants.server.store import WriteResult, WriteStop, write_checkpoint
from ckpt_events.participants.server.store_files import RECORDS_MAX_BYTES, Beneath, resolve_under
from ckpt_events.participants.server.store_read import read_checkpoint, read_manifest
from ckpt_events.participants.workloads.base import RETIRE_CHUNK, Record
from ckpt_events.participants.workloads.checkpointable import CheckpointableWorkload, ControlledWorkload
from ckpt_events.vocab import ErrorCode, Operation, Phase

log: Final = library_logger("ckpt_events.participants.server.control")

__all__ = ["ControlPlane", "Exported", "Restored", "Status", "on_monotonic"]

_WAIT_SLICE: Final = 1.0


_ACTIVE: Final = frozenset({Phase.PREPARING, Phase.PREPARED, Phase.COMMITTED, Phase.RESTORED})


class Exported(NamedTuple):
    """What a commit's ``export`` step hands its ``write`` step: encoded records and their
    sorted keys, or (a plane whose workers write their own records) only the scope."""

    lines: list[bytes]
    keys: list[str]
    scope: list[EpisodeId] | None = None


class Status(NamedTuple):
    """``GET /status``'s reply, and the age of its live ``report`` in seconds (``None`` when
    not preparing: the last prepare's answer, or none)."""

    reply: StatusReply
    report_age: float | None


class _Latest(NamedTuple):
    """The newest live readiness while preparing: for which checkpoint, computed when
    (``perf_counter``), and until when ``/status`` may show it again (the prepare's pacing)."""

    checkpoint_id: str | None
    report: PrepareReport
    at: float
    fresh_until: float


class Restored(NamedTuple):
    """What a restore installed: the capture keys, the checkpoint read, and its bytes."""

    keys: list[str]
    source_checkpoint_id: str
    bytes: int


def _restore_args(req: RestoreRequest) -> ReplayArgs:
    """What a replay of ``req`` must match: its directory and its scope (by capture key); built
    only for a replay or once the restore is done, never for a call refused before."""
    return (req.checkpoint_dir, frozenset(e.capture_key for e in req.episode_ids))


S = TypeVar("S")  # the workload's episode state, carried from check_record to install
T = TypeVar("T")


class ControlPlane(Generic[S]):
    """The checkpoint state machine of ``workload``; every method is one control route."""

    def __init__(
        self,
        tel: Telemetry,
        workload: ControlledWorkload,
        *,
        lease_grace_seconds: float,
        checkpoint_root: Path,
        max_records_bytes: int = RECORDS_MAX_BYTES,
        faults: FaultPlan = NO_FAULTS,
    ) -> None:
        self.tel = tel
        self.workload = workload
        self.checkpoint_root = checkpoint_root
        self.max_records_bytes = max_records_bytes
        #: What is injected (``NO_FAULTS``: nothing): a slow write or read, a failing disk step.
        self.faults = faults
        #: Whether a restore froze the heap (``gc_pause.freeze``): ``thaw`` undoes it at the end.
        self._froze = False
        #: How many times as long each commit's write takes (1; more with a ``slow`` fault).
        self.write_factor = faults.write_factor(tel.instance)
        self.phase = Phase.IDLE
        self.checkpoint_id: str | None = None
        self._lease = Lease(lease_grace_seconds)
        self._lock = anyio.Lock()
        self._commit_lock = anyio.Lock()
        self._replies = ReplyCache()
        self._stop = WriteStop()
        self._report: PrepareReport | None = None
        self._latest: _Latest | None = None

    @property
    def lease_grace_seconds(self) -> float:
        """How long past a checkpoint's ``deadline_ts`` its lease lasts."""
        return self._lease.grace_seconds

    @property
    def lease_expires_at(self) -> float | None:
        """When the active checkpoint's lease runs out (a Unix time); ``None`` while idle."""
        return self._lease.expires_at

    def _operation(
        self, trace: Incoming, operation: Operation, checkpoint_id: str
    ) -> AbstractContextManager[OperationSpan]:
        """The span of one control call, a child of the caller's (a ``WorkerControlPlane`` also
        notes it, so its workers' shares join it)."""
        return trace.operation(self.tel, operation, checkpoint_id=checkpoint_id)

    # -- shared checks ----------------------------------------------------------------------

    def _admit(
        self, op: Operation, checkpoint_id: str, allowed: frozenset[Phase] | set[Phase], cached: T | None
    ) -> T | None:
        """The admission checks in protocol order; returns ``cached`` (the reply to replay) if any."""
        if checkpoint_id in self._replies.resumed:
            raise ProtocolRefusal(
                ErrorCode.STALE_CHECKPOINT, f"checkpoint {checkpoint_id} was already resumed"
            )
        if self.checkpoint_id is not None and self.checkpoint_id != checkpoint_id:
            raise ProtocolRefusal(
                ErrorCode.CHECKPOINT_CONFLICT,
                f"checkpoint {self.checkpoint_id} is active, not {checkpoint_id}",
            )
        if cached is not None:
            return cached
        if self.phase not in allowed:
            raise ProtocolRefusal(
                ErrorCode.INVALID_PHASE, f"{op.value} is not allowed in phase {self.phase.value}"
            )
        return None

    def _not_ready_workers(self) -> tuple[str, int] | None:
        """The workers blocking a prepare, in words, and how many blockers they are (a
        ``--workers`` server's); ``None``: only episodes block, as here."""
        return None

    async def check_lease(self) -> None:
        """Resume on our own if the lease ran out (an abort), counting ``lease_expired``."""
        if self.phase is not Phase.IDLE and self._lease.ended():
            self.tel.lease_expired(self.phase, checkpoint_id=self.checkpoint_id)
            await self._abort("outlived its lease", self._lease.advice())

    async def _abort(self, cause: str = "was resumed", advice: Callable[[], str] | None = None) -> None:
        """What resume does: stop the writer, reopen admission, go idle, fence the id;
        ``cause`` and ``advice`` say why to a commit still running (``WriteStop.stop``). It
        returns only once the stop took effect: no manifest is linked after."""
        if not self._stop.stop(cause, advice, blocking=False):
            # The writer is linking the manifest: waited for on the loop, a 300 ms link held
            # every request 300 ms. Shielded: a resume half done would leave the writer free.
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(functools.partial(self._stop.stop, cause, advice))
        checkpoint_id = self.checkpoint_id
        self.phase = Phase.IDLE
        self.checkpoint_id = None
        self._lease.clear()
        self._report = None

        if checkpoint_id is not None:
            self._replies.remember_resumed(checkpoint_id)
            self._replies.drop(checkpoint_id)

        self.workload.open_admission()
        self._lease.wake()

    async def watch_lease(self) -> None:
        """Run for the app's lifetime: resume when the lease runs out, even with no calls, and
        forget the retired marks past their retention (at least once a second)."""
        while True:
            async with self._lock:
                await self.check_lease()
                self.workload.fence.expire()
                changed = self._lease.changed
                ends = self._lease.ends if self.phase is not Phase.IDLE else None

            wait = _WAIT_SLICE if ends is None else min(_WAIT_SLICE, max(ends - time.monotonic(), 0.0))
            with anyio.move_on_after(wait):
                await changed.wait()

    # -- routes -----------------------------------------------------------------------------

    def readiness(self) -> tuple[PrepareReport | None, float | None]:
        """The readiness ``/status`` shows, and its age (seconds; ``None`` unless live). While
        preparing, the workload's report: the newest one (a waiting prepare's, or an earlier
        call's) while it is fresh by the prepare's pacing and not ready, else computed now.
        Computed at every call, it cost 9-10 ms a call at 100,000 episodes; a ready report
        is never reused, so readiness lost since is never shown as ready. Otherwise the last
        prepare's answer (``None`` before one)."""
        if self.phase is not Phase.PREPARING:
            return self._report, None
        latest, now = self._latest, time.perf_counter()
        if (
            latest is not None
            and latest.checkpoint_id == self.checkpoint_id
            and not latest.report.ready
            and now <= latest.fresh_until
        ):
            return latest.report, now - latest.at
        report, _ = self._timed_report()
        return report, 0.0

    async def status(self) -> Status:
        """Where the state machine stands; the retired marks summarised (a count and the
        newest ``MAX_RETIRED_SHOWN``), so the reply stays small whatever their number.

        It never waits for a transition in progress (a restore's read and install, a commit's
        export hold the lock for as long as they take): it answers what stands now, leaving
        the lease check and the marks' expiry to the next call. A lease it finds ended while
        a commit links its manifest waits for that link (off the loop), as a resume does."""
        if self._lock.locked():
            return self._status_now()
        async with self._lock:
            await self.check_lease()
            self.workload.fence.expire()
            return self._status_now()

    def _status_now(self) -> Status:
        """``GET /status``'s reply from the state as it stands (no await: one consistent view)."""
        fence = self.workload.fence
        report, age = self.readiness()
        reply = StatusReply(
            kind=str(self.workload.kind),
            instance=self.tel.instance,
            phase=self.phase,
            checkpoint_id=self.checkpoint_id,
            lease_expires_at=self.lease_expires_at,
            admission_open=self.workload.admission_open,
            episodes=len(self.workload.episodes),
            retired_rollouts=fence.newest(MAX_RETIRED_SHOWN),
            retired_count=len(fence),
            retired_expired=fence.expired,
            report=report,
        )
        return Status(reply, age)

    async def prepare(self, req: PrepareRequest, trace: Incoming) -> PrepareReply:
        cid = req.checkpoint_id
        with self._operation(trace, Operation.PREPARE, cid) as o:
            async with self._lock:
                await self.check_lease()
                cached = self._admit(
                    Operation.PREPARE, cid, {Phase.IDLE, Phase.PREPARING}, self._replies.prepare.get(cid)
                )
                if cached is not None:
                    o.set(phase=cached.phase, blockers=cached.report.blocker_count)
                    return cached

                check_deadline(req.deadline_ts)
                self._lease.extend(req.deadline_ts)
                first = self.phase is Phase.IDLE
                if first:
                    self.phase = Phase.PREPARING
                    self.checkpoint_id = cid
                    self._latest = None
                    self._stop = WriteStop()
                    self.workload.close_admission()
                stop = self._stop  # says why, if the checkpoint is aborted while this one waits

            try:
                if first:
                    await self.workload.on_admission_closed(o, cid, req.deadline_ts)
                with o.step("wait_ready"):
                    report = await self._wait_ready(cid, req.deadline_ts)
            except Exception:
                # A prepare that fails reopens admission: nothing may stay parked for it.
                async with self._lock:
                    if self.checkpoint_id == cid and self.phase is Phase.PREPARING:
                        await self._abort()
                raise

            async with self._lock:
                # The lease as of this answer: one that ended after the wait, before
                # watch_lease's turn, was answered as if it stood (aborted just after).
                await self.check_lease()
                # An identical prepare that finished first: this one gets the same answer.
                if self.checkpoint_id == cid and (done := self._replies.prepare.get(cid)) is not None:
                    o.set(phase=done.phase, blockers=done.report.blocker_count)
                    return done
                if self.checkpoint_id != cid or self.phase is not Phase.PREPARING:
                    # Its stop says why: a resume, or the lease running out (not "resumed").
                    raise ProtocolRefusal(
                        ErrorCode.STALE_CHECKPOINT,
                        f"checkpoint {cid} {stop.cause} while preparing{stop.advice()}",
                    )
                self._report = report
                if report.ready:
                    self.phase = Phase.PREPARED
                    reply = PrepareReply(phase=Phase.PREPARED, report=report)
                    self._replies.prepare[cid] = reply
                else:
                    reply = PrepareReply(phase=Phase.PREPARING, report=report)
                    self.tel.prepare_not_ready(report.blocker_count, checkpoint_id=cid)
                    if (workers := self._not_ready_workers()) is not None:
                        o.set_attribute(NOT_READY_WORKERS, workers[0])
                        o.set_attribute(NOT_READY_WORKER_BLOCKERS, workers[1])

            o.set(phase=reply.phase, blockers=report.blocker_count)
            return reply

    async def _wait_ready(self, cid: str, deadline_ts: float) -> PrepareReport:
        report, not_before = self._timed_report()
        ends = on_monotonic(deadline_ts)  # a wall-clock step while it waits does not move it
        # Bounded by the deadline; wakes on an episode change (paced), and at least once a second.
        while not report.ready and self.checkpoint_id == cid and self.phase is Phase.PREPARING:
            remaining = ends - time.monotonic()
            if remaining <= 0:
                break
            await self.workload.wait_changed(min(remaining, _WAIT_SLICE))
            pause = min(not_before - time.perf_counter(), ends - time.monotonic())
            if pause > 0:
                # A resume (or a renew) cuts the pause short: the loop's checks come first.
                changed = self._lease.changed
                with anyio.move_on_after(pause):
                    await changed.wait()
            report, not_before = self._timed_report()
        return report

    def _timed_report(self) -> tuple[PrepareReport, float]:
        """The workload's readiness now, and the earliest ``perf_counter`` a waiting prepare
        computes it again (see ``pacing``); kept until then for ``/status``."""
        report, not_before = timed_report(self.workload)
        self._latest = _Latest(self.checkpoint_id, report, time.perf_counter(), not_before)
        return report, not_before

    async def renew(self, req: RenewRequest, trace: Incoming) -> RenewReply:
        cid = req.checkpoint_id
        with self._operation(trace, Operation.RENEW, cid):
            async with self._lock:
                await self.check_lease()
                self._admit(Operation.RENEW, cid, _ACTIVE, None)
                check_deadline(req.deadline_ts)
                self._lease.extend(req.deadline_ts)
                assert self.lease_expires_at is not None
                return RenewReply(lease_expires_at=self.lease_expires_at)

    async def commit(self, req: CommitRequest, trace: Incoming) -> CommitReply:
        cid = req.checkpoint_id
        scope = None if req.episode_ids is None else frozenset(e.capture_key for e in req.episode_ids)
        args: ReplayArgs = (req.checkpoint_dir, scope)
        with self._operation(trace, Operation.COMMIT, cid) as o:
            # Commits run one at a time: a retry waits for the write in progress, then replays.
            async with self._commit_lock:
                async with self._lock:
                    await self.check_lease()
                    replay = self._admit(
                        Operation.COMMIT, cid, {Phase.PREPARED}, self._replies.commit.get(cid)
                    )
                    if replay is not None:
                        cached, cached_args = replay
                        if cached_args != args:
                            raise ProtocolRefusal(
                                ErrorCode.CHECKPOINT_CONFLICT,
                                f"checkpoint {cid} was committed with another directory or scope",
                            )
                        # A replay writes nothing: records and bytes left unset, so
                        # records_total and bytes_total (and the report) count the commit once.
                        return cached

                    check_deadline(req.deadline_ts)
                    if not self.workload.report().ready:
                        raise ProtocolRefusal(ErrorCode.INVALID_PHASE, "readiness regressed since prepare")
                    with store_refusals():
                        directory = resolve_under(self.checkpoint_root, req.checkpoint_dir)
                    check_commit_scope(scope, self.workload.episodes)
                    # Only once its arguments check: a refused commit changes nothing.
                    self._lease.extend(req.deadline_ts)
                    # An episode named twice is exported once: a records file that repeats one
                    # never restores (``store_read`` refuses the repeat).
                    episodes = None if req.episode_ids is None else list(dict.fromkeys(req.episode_ids))
                    exported = await self._export(o, episodes)
                    stop = self._stop

                result, keys = await self._write(o, directory, cid, exported, stop, req.deadline_ts)
                try:
                    reply = await self._answer(req, args, directory, result, keys, stop)
                except anyio.get_cancelled_exc_class():
                    # Cancelled before its answer (the server stopping): the participant stays
                    # prepared and nobody hears committed, so the manifest must not stand.
                    if result.linked:
                        withdrawn = await withdraw_linked(directory, result)
                        log.warning(
                            "commit of checkpoint %s cancelled after its manifest was linked: aborted%s",
                            cid,
                            withdrawn,
                        )
                    raise

            o.set(records=result.manifest.record_count, bytes=result.bytes)
            return reply

    async def _answer(
        self,
        req: CommitRequest,
        args: ReplayArgs,
        directory: Beneath,
        result: WriteResult,
        keys: list[str],
        stop: WriteStop,
    ) -> CommitReply:
        """Decide a written commit's answer under the lock: committed (recorded for replays), or
        refused, its manifest withdrawn, when it was aborted (resumed, or its lease ran out)."""
        cid = req.checkpoint_id
        async with self._lock:
            # The lease as of this answer: one that ended while the write ran, before
            # watch_lease's turn, was answered committed (the abort came just after).
            await self.check_lease()
            if self.checkpoint_id != cid or self.phase is not Phase.PREPARED:
                # The commit's own stop says why: a resume, or its lease running out.
                withdrawn = await withdraw_linked(directory, result) if result.linked else ""
                raise ProtocolRefusal(
                    ErrorCode.STALE_CHECKPOINT,
                    f"checkpoint {cid} {stop.cause} during commit{withdrawn}{stop.advice()}",
                )
            if req.stop:
                self.workload.stop(keys)
            self.phase = Phase.COMMITTED
            reply = CommitReply(
                phase=Phase.COMMITTED,
                manifest=result.manifest,
                episode_ids=keys,
                bytes=result.bytes,
                **self.workload.commit_extras(keys),
            )
            self._replies.commit[cid] = (reply, args)
        return reply

    def _records(self) -> CheckpointableWorkload[S]:
        """The workload as one whose records this plane moves (a plane over a workload that
        moves its own, the worker pool, overrides the steps that would call this)."""
        if not isinstance(self.workload, CheckpointableWorkload):
            raise TypeError(f"{type(self.workload).__name__} does not export or install records itself")
        return self.workload

    async def _export(self, o: OperationSpan, episode_ids: list[EpisodeId] | None) -> Exported:
        """The ``export`` step, under the lock while prepared: the records, encoded."""
        with o.step("export") as s, gc_paused():
            records = await self._records().export(episode_ids)
            lines = [encode(r) for r in records]
            keys = sorted(r.episode_id.capture_key for r in records)
            del records  # freed while the collector is off: it never scans their lists
            s.set(records=len(lines))
        return Exported(lines, keys)

    async def _write(
        self,
        o: OperationSpan,
        directory: Beneath,
        cid: str,
        exported: Exported,
        stop: WriteStop,
        deadline_ts: float,
    ) -> tuple[WriteResult, list[str]]:
        """The ``write`` step, outside the lock: records, then the manifest (never after ``stop``).
        ``deadline_ts`` is the commit's (a plane whose workers write waits for them until it)."""
        with o.step("write") as s, store_refusals(), gc_paused():
            started = time.monotonic()
            result = await anyio.to_thread.run_sync(
                functools.partial(
                    write_checkpoint,
                    directory,
                    kind=str(self.workload.kind),
                    instance=self.tel.instance,
                    checkpoint_id=cid,
                    lines=exported.lines,
                    stop=stop,
                    on_step=self.faults.on_step,
                )
            )
            await slow_down(self.write_factor, started)
            s.set(records=len(exported.lines), bytes=result.bytes)
        return result, exported.keys

    async def restore(self, req: RestoreRequest, trace: Incoming) -> RestoreReply:
        cid = req.checkpoint_id
        with self._operation(trace, Operation.RESTORE, cid) as o:
            async with self._lock:
                await self.check_lease()
                replay = self._admit(Operation.RESTORE, cid, {Phase.IDLE}, self._replies.restore.get(cid))
                if replay is not None:
                    cached, cached_args = replay
                    if cached_args != _restore_args(req):
                        raise ProtocolRefusal(
                            ErrorCode.CHECKPOINT_CONFLICT,
                            f"checkpoint {cid} was restored from another directory or scope",
                        )
                    # A replay reads nothing: records_total counts the restore once.
                    return cached

                check_deadline(req.deadline_ts)
                self._check_fresh()
                # The directory first: a missing or unusable one (a typo, a commit that never
                # finished) is refused before any work per episode (1 s at 300,000 ids).
                await self._check_manifest(req.checkpoint_dir)
                # The manifest was read in a thread: work may have been accepted meanwhile.
                self._check_fresh()
                scope = set(req.episode_ids)
                check_restore_not_retired(scope, self.workload.fence)

                # Admission closes from the moment a restore is admitted: work accepted beside
                # it would run twice (once as itself, once as its restored next attempt).
                self.workload.close_admission()
                try:
                    restored = await self._read_and_install(o, req, scope)
                except BaseException:
                    # Nothing was installed (``installing()`` took out a partial install): still
                    # fresh, still idle.
                    self.workload.open_admission()
                    raise

                self.phase = Phase.RESTORED
                self.checkpoint_id = cid
                self._stop = WriteStop()
                self._lease.extend(req.deadline_ts)
                reply = RestoreReply(
                    phase=Phase.RESTORED,
                    restored=restored.keys,
                    source_checkpoint_id=restored.source_checkpoint_id,
                )
                self._replies.restore[cid] = (reply, _restore_args(req))

            o.set(records=len(restored.keys), bytes=restored.bytes)
            return reply

    def _check_fresh(self) -> None:
        """A restore runs only in a participant that has served no work."""
        if self.workload.served or self.workload.episodes:
            raise ProtocolRefusal(
                ErrorCode.INVALID_PHASE, "restore needs a fresh participant: this one has served work"
            )

    async def _check_manifest(self, checkpoint_dir: str) -> None:
        """This participant's manifest under ``checkpoint_dir`` reads and checks (in a thread: a
        slow disk never holds the loop), else ``invalid_checkpoint_state``; the read step reads
        it again with the records."""
        with store_refusals():
            directory = resolve_under(self.checkpoint_root, checkpoint_dir)
            await anyio.to_thread.run_sync(
                functools.partial(
                    read_manifest, directory, kind=str(self.workload.kind), instance=self.tel.instance
                )
            )

    async def _read_and_install(
        self, o: OperationSpan, req: RestoreRequest, scope: set[EpisodeId]
    ) -> Restored:
        """The ``read`` step (every record in scope checks first), then the ``install`` step."""
        with o.step("read") as s, store_refusals(), gc_paused():
            result = await anyio.to_thread.run_sync(
                functools.partial(
                    read_checkpoint,
                    resolve_under(self.checkpoint_root, req.checkpoint_dir),
                    kind=str(self.workload.kind),
                    instance=self.tel.instance,
                    record_type=self.workload.record_type,
                    max_records_bytes=self.max_records_bytes,
                    pause=self.faults.read_pause(self.tel.instance),
                )
            )
            chosen: list[Record] = [r for r in result.records if r.episode_id in scope]
            check_restore_scope(scope, chosen, result.manifest.checkpoint_id)
            # Every record in scope checks before anything is installed.
            workload = self._records()
            states = [workload.check_record(r) for r in chosen]
            s.set(records=len(result.records), bytes=result.bytes)

        # store_refusals: a workload's InvalidCheckpointError at install is 422, as at read.
        with o.step("install") as s, store_refusals(), gc_paused():
            with workload.installing():  # all or nothing: a raise part way takes it all out
                keys = await workload.install(chosen, states)
            s.set(records=len(chosen))
            # The installed state stays: later collections need not scan it. Frozen
            # before the collector is back on, or its first young collection would.
            freeze()
            self._froze = True
        return Restored(keys, result.manifest.checkpoint_id, result.bytes)

    def thaw(self) -> None:
        """At the app's end: give what this participant's restore froze back to the collector,
        or the ended app (reached from what was frozen) is never freed."""
        if self._froze:
            self._froze = False
            thaw()

    async def resume(self, req: ResumeRequest, trace: Incoming) -> ResumeReply:
        """Resume is always safe to repeat: an id resumed already replies ``idempotent``."""
        cid = req.checkpoint_id
        with self._operation(trace, Operation.RESUME, cid) as o:
            async with self._lock:
                await self.check_lease()
                if cid in self._replies.resumed:
                    idempotent = True
                elif self.checkpoint_id is not None and self.checkpoint_id != cid:
                    raise ProtocolRefusal(
                        ErrorCode.CHECKPOINT_CONFLICT, f"checkpoint {self.checkpoint_id} is active, not {cid}"
                    )
                elif self.phase is Phase.IDLE:
                    self._replies.remember_resumed(cid)
                    idempotent = True
                else:
                    await self._abort()
                    idempotent = False
            o.set(phase=Phase.IDLE)
            return ResumeReply(phase=Phase.IDLE, idempotent=idempotent)

    async def _check_outside(self, op: Operation, deadline_ts: float) -> None:
        await self.check_lease()
        check_outside(op, self.phase, deadline_ts)

    async def retire(self, req: RetireRequest, trace: Incoming) -> RetireReply:
        cid = req.checkpoint_id
        with self._operation(trace, Operation.RETIRE, cid) as o:
            async with self._lock:
                await self._check_outside(Operation.RETIRE, req.deadline_ts)
                retired = await self.workload.retire(req.episode_ids)
            o.set(episodes=retired.retired_count)
            return retired

    async def forget(self, req: ForgetRequest, trace: Incoming) -> ForgetReply:
        cid = req.checkpoint_id
        with self._operation(trace, Operation.FORGET, cid) as o:
            async with self._lock:
                await self._check_outside(Operation.FORGET, req.deadline_ts)
                # In chunks of the request's order, the loop free between them (as retire
                # marks): a work call in between sees each rollout's mark either still there or
                # cleared. Not sorted first: sorting 64,000 ids held the loop ~20 ms in one
                # piece; the reply's first ids in sorted order are kept chunk by chunk instead.
                fence = self.workload.fence
                ids = req.rollout_ids
                seen: set[str] = set()
                first: list[str] = []
                for at in range(0, len(ids), RETIRE_CHUNK):
                    chunk = [r for r in dict.fromkeys(ids[at : at + RETIRE_CHUNK]) if r not in seen]
                    seen.update(chunk)
                    # One call a chunk: a multi-worker server tells its workers in one frame.
                    fence.forget_all(chunk)
                    first = heapq.nsmallest(MAX_FORGOTTEN_SHOWN, first + chunk)
                    await anyio.lowlevel.checkpoint()
            o.set(rollouts=len(seen))
            return ForgetReply(forgotten=first, forgotten_count=len(seen))
