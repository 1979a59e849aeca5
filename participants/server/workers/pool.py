"""``WorkerPool``: the workload the coordinator's control plane drives, spread over N workers.

It is a ``ControlledWorkload``: the control plane of a multi-worker server is the same
``ControlPlane`` as at N = 1. The pool is the fan-out to every worker at once: the server's
retired marks (each mark is posted to every worker, and a late worker gets them all with its
``hello``), admission (posted to every worker in order), the readiness of the whole server
(ready only when every worker reported ready for this checkpoint), and the commit's parts and
the restore's stage and install done by all workers together. Which worker holds which session
is its ``placement`` (``placement.Placement``, which also routes the work calls). A worker not
heard from is ``<kind>-workers-unreported:<n>``; one lost while admission was closed is
``<kind>-worker-lost`` until resume. A socket that fails is 503 ``checkpoint_coordinator_unavailable``.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final, TypeVar

import anyio
import anyio.lowlevel

from ckpt_events import OperationSpan
from ckpt_events.checks import library_logger
from ckpt_events.participants.errors import ProtocolRefusal, WorkerChannelError
from ckpt_events.participants.protocol import MAX_BLOCKERS, EpisodeId, PrepareReport, RecordsPart, RetireReply
from ckpt_events.participants.server.store_files import Beneath
from ckpt_events.participants.server.workers.coordinator import WorkerCoordinator
from ckpt_events.participants.server.workers.frames import (
    Close,
    Closed,
    Discard,
    Forget,
    InstallStaged,
    Mark,
    Open,
    PartShare,
    Report,
    Request,
    Retire,
    Stage,
    Stop,
    WorkerState,
    WritePart,
    WrittenPart,
)
from ckpt_events.participants.server.workers.placement import Placement, assign_parts
from ckpt_events.participants.server.workers.share import current_share
from ckpt_events.participants.workloads.base import RETIRE_CHUNK, Record, RetiredKeys, Workload
from ckpt_events.participants.workloads.fence import RetiredAttempts
from ckpt_events.vocab import ErrorCode

__all__ = ["WorkerPool"]

log = library_logger("ckpt_events.workers")

_NOT_REPORTED: Final = PrepareReport(ready=False)
#: Sessions a lost worker's log line names; the rest are counted.
_LOST_NAMED: Final = 10
#: How long after a commit's deadline a worker may still place its records file.
_PART_GRACE_SECONDS: Final = 1.0
#: How long after that the main process waits for the worker's reply: a part placed in time
#: is announced within it (a local socket: milliseconds), so the commit answers by deadline + 2 s.
_PART_REPLY_SECONDS: Final = 1.0
R = TypeVar("R")
#: How long after a restore's deadline its workers' ``stage`` and ``install_staged`` may still
#: answer (as a commit's parts: deadline + 2 s), never the fixed reply deadline.
_RESTORE_GRACE_SECONDS: Final = 2.0


def _share() -> tuple[str | None, str | None]:
    """(checkpoint id, traceparent) of the coordinator operation this call is part of."""
    share = current_share()
    return (None, None) if share is None else (share.checkpoint_id, share.traceparent())


def _unavailable(exc: Exception) -> ProtocolRefusal:
    return ProtocolRefusal(ErrorCode.CHECKPOINT_COORDINATOR_UNAVAILABLE, str(exc))


def _until(deadline_ts: float) -> float:
    """How long a restore's workers may take to answer: until its deadline, and a grace."""
    return max(0.0, deadline_ts - time.time()) + _RESTORE_GRACE_SECONDS


class _PostedMarks(RetiredAttempts):
    """The server's marks; each change is also posted to every connected worker."""

    def __init__(self, pool: WorkerPool) -> None:
        super().__init__()
        self._pool = pool

    def mark(self, episode: EpisodeId) -> None:
        super().mark(episode)
        self._pool.broadcast(Mark(episode))

    def forget(self, rollout_id: str) -> bool:
        found = super().forget(rollout_id)
        self._pool.broadcast(Forget([rollout_id]))
        return found

    def forget_all(self, rollout_ids: Sequence[str]) -> int:
        found = sum(RetiredAttempts.forget(self, rollout_id) for rollout_id in rollout_ids)
        self._pool.broadcast(Forget(list(rollout_ids)))
        return found


class WorkerPool:
    """The episodes of one server spread over ``coordinator.workers`` worker processes."""

    def __init__(self, checker: Workload[Any, Any], coordinator: WorkerCoordinator) -> None:
        self.checker = checker  # a local workload of the kind: only check_record is used
        self.coordinator = coordinator
        self.placement = Placement(coordinator, self.admit)
        self.fence: RetiredAttempts = _PostedMarks(self)
        self.admission_open = True
        #: Why the workers' restart budget is spent, once it is (a blocker of every prepare then).
        self.spent: str | None = None
        #: The records files the last ``write_parts`` got written (deleted if not published).
        self.written: list[str] = []
        #: After a ``stage``: per worker, the keys it staged that are out of the restore's scope.
        self._staged: dict[int, list[str]] = {}
        self._staged_scope: set[EpisodeId] = set()
        self._reports: dict[int, PrepareReport] = {}
        self._lost: set[int] = set()
        self._extras: dict[str, Any] = {}
        coordinator.state_provider = self.state
        coordinator.on_lost = self._on_lost

    # -- identity ---------------------------------------------------------------------------

    @property
    def kind(self) -> str:
        return self.checker.kind

    @property
    def record_type(self) -> type[Record]:
        return self.checker.record_type

    @property
    def owners(self) -> dict[str, int]:
        """Which worker holds each session (``placement.owners``)."""
        return self.placement.owners

    @property
    def episodes(self) -> dict[str, int]:
        return self.placement.owners

    @property
    def served(self) -> bool:
        """Whether a work call was admitted (a restore needs a fresh participant)."""
        return self.placement.served

    @property
    def lost(self) -> bool:
        """A worker was lost while admission was closed (``<kind>-worker-lost`` until resume)."""
        return bool(self._lost)

    def state(self) -> WorkerState:
        """What a worker gets when it joins."""
        return WorkerState(self.admission_open, self.fence.snapshot())

    def broadcast(self, body: Request[None]) -> None:
        for index in self.coordinator.connected():
            try:
                self.coordinator.channels[index].post(body)
            except WorkerChannelError:
                pass  # it is being lost; it gets the state again when it rejoins

    def _on_lost(self, index: int) -> None:
        gone = self.placement.drop_worker(index)
        if gone:
            # Each answers 404 from now on: the operator learns which, and how many, here.
            more = f" and {len(gone) - _LOST_NAMED} more" if len(gone) > _LOST_NAMED else ""
            log.warning(
                "worker %d lost %d session%s with it: %s%s",
                index,
                len(gone),
                "" if len(gone) == 1 else "s",
                ", ".join(gone[:_LOST_NAMED]),
                more,
            )
        self._reports.pop(index, None)
        if not self.admission_open:
            self._lost.add(index)

    # -- admission and readiness ------------------------------------------------------------

    def close_admission(self) -> None:
        self.admission_open = False
        self._reports.clear()
        self.broadcast(Close())

    def open_admission(self) -> None:
        self.admission_open = True
        self._lost.clear()
        self._reports.clear()
        self.broadcast(Open())

    def admit(self, episode_id: EpisodeId) -> None:
        """The gate of a work call (``placement``'s): refused if ``episode_id``'s attempt is
        retired, or while a checkpoint holds admission closed."""
        self.fence.check(episode_id)
        if not self.admission_open:
            raise ProtocolRefusal(ErrorCode.ADMISSION_CLOSED, "a checkpoint is open: retry after it resumes")

    async def _ask_each(
        self,
        body: Request[R] | Callable[[int], Request[R]],
        indexes: Iterable[int],
        traceparent: str | None = None,
        timeout: float | None = None,
        replies: dict[int, R] | None = None,
    ) -> tuple[dict[int, R], ProtocolRefusal | None]:
        """Ask every worker in ``indexes`` at once (``body``, or ``body(index)`` if callable),
        each within ``timeout`` (default: the reply deadline). Returns the replies (put in
        ``replies`` as they come, if given: a caller cancelled meanwhile still sees them), and
        the refusal of the lowest-numbered worker that refused, did not answer or answered with
        a bad reply (503), if any."""
        replies = {} if replies is None else replies
        refusals: dict[int, ProtocolRefusal] = {}
        seconds = self.coordinator.reply_seconds if timeout is None else timeout

        async def ask(index: int) -> None:
            message = body if isinstance(body, Request) else body(index)
            try:
                channel = self.coordinator.channel(index)
                replies[index] = await channel.request(message, timeout=seconds, traceparent=traceparent)
            except ProtocolRefusal as exc:
                refusals[index] = exc
            except WorkerChannelError as exc:
                refusals[index] = _unavailable(exc)

        async with anyio.create_task_group() as tg:
            for index in indexes:
                tg.start_soon(ask, index)
        return replies, refusals[min(refusals)] if refusals else None

    async def on_admission_closed(self, op: OperationSpan, checkpoint_id: str, deadline_ts: float) -> None:
        traceparent = op.traceparent() or _share()[1]
        # A silent worker must not hold prepare past its deadline: it is left unreported.
        remaining = min(max(0.05, deadline_ts - time.time()), self.coordinator.reply_seconds)
        # Each report is kept as it comes: /status (``watch``) reads them while a silent worker
        # holds this ask to its deadline, and would otherwise count every worker unreported.
        await self._ask_each(
            Closed(checkpoint_id, deadline_ts),
            self.coordinator.connected(),
            traceparent,
            remaining,
            self._reports,
        )

    async def wait_changed(self, timeout: float) -> None:
        # Workers cap their wait at 0.5 s; a worker silent for longer is left unreported this round.
        seconds = min(timeout + 1.0, self.coordinator.reply_seconds)
        replies, _ = await self._ask_each(Report(timeout), self.coordinator.connected(), None, seconds)
        self._reports.update(replies)
        if not replies:
            # No worker answered: the next report can only come from one that joins.
            await self.coordinator.wait_connected(len(self.coordinator.connected()) + 1, min(timeout, 0.5))

    def unreported(self) -> dict[int, str]:
        """The workers counted in ``<kind>-workers-unreported`` now, each with how it stands
        ("connected, no answer": hung or overloaded; or "not connected")."""
        connected = set(self.coordinator.connected())
        return {
            index: "connected, no answer" if index in connected else "not connected"
            for index in range(self.coordinator.workers)
            if index not in self._lost and not (index in connected and index in self._reports)
        }

    def _special(self, reports: list[PrepareReport]) -> list[str]:
        """The blockers that are workers, not episodes, given the connected workers' ``reports``."""
        kind = str(self.kind)
        unreported = self.coordinator.workers - len(reports) - len(self._lost)
        special = [f"{kind}-worker-lost"] * bool(self._lost)
        special += [f"{kind}-workers-unreported:{unreported}"] * (unreported > 0)
        special += [f"{kind}-worker-restarts-spent"] * (self.spent is not None)
        return special

    def not_ready_workers(self) -> tuple[str, int] | None:
        """What of ``report()``'s blockers are workers, in words naming each (``worker 1
        unreported (connected, no answer)``), and how many of its ``blocker_count`` that is;
        ``None`` when only episodes block. A frozen or lost worker is otherwise one more
        "episode" in the blocker count the log keeps."""
        connected = set(self.coordinator.connected())
        reports = [r for i, r in sorted(self._reports.items()) if i in connected and i not in self._lost]
        special = self._special(reports)
        if not special:
            return None
        said = [f"worker {i} unreported ({how})" for i, how in sorted(self.unreported().items())]
        said += [f"worker {i} lost" for i in sorted(self._lost)]
        said += ["its workers' restarts spent"] * (self.spent is not None)
        return ", ".join(said), len(special)

    def report(self) -> PrepareReport:
        connected = set(self.coordinator.connected())
        reports = [r for i, r in sorted(self._reports.items()) if i in connected and i not in self._lost]
        blockers = sorted(b for r in reports for b in r.blockers)
        count = sum(r.blocker_count for r in reports)
        special = self._special(reports)
        counts: dict[str, int] = {}
        for r in reports:
            for name, value in r.counts.items():
                counts[name] = counts.get(name, 0) + value
        counts["workers"] = self.coordinator.workers
        return PrepareReport(
            ready=count == 0 and not special and all(r.ready for r in reports),
            blockers=(special + blockers)[:MAX_BLOCKERS],
            blocker_count=count + len(special),
            counts=counts,
            restarts=sorted(k for r in reports for k in r.restarts),
        )

    # -- commit -----------------------------------------------------------------------------

    def check_all_connected(self, what: str) -> list[int]:
        """Every worker index; 503 if any is not connected (or was lost during this checkpoint)."""
        indexes = list(range(self.coordinator.workers))
        missing = sorted(set(indexes) - set(self.coordinator.connected()) | self._lost)
        if missing:
            raise ProtocolRefusal(
                ErrorCode.CHECKPOINT_COORDINATOR_UNAVAILABLE, f"{what}: workers {missing} are not connected"
            )
        return indexes

    async def write_parts(
        self, directory: Beneath, scope: Iterable[EpisodeId] | None, deadline_ts: float
    ) -> list[tuple[RecordsPart, list[str]]]:
        """Every worker writes its episodes in scope as its own records file in ``directory``,
        all at once; each part with the capture keys it holds, in worker order. A worker that
        fails, or does not answer by the commit's ``deadline_ts`` plus ``_PART_GRACE_SECONDS``
        and ``_PART_REPLY_SECONDS``, is 503 (the parts the others wrote are the caller's to
        delete: ``written``); a part not placed by the deadline plus ``_PART_GRACE_SECONDS`` is
        never placed (a worker that runs again later drops it)."""
        indexes = self.check_all_connected("commit")
        checkpoint_id, traceparent = _share()
        place_by = deadline_ts + _PART_GRACE_SECONDS
        body = WritePart(directory.wire(), None if scope is None else list(scope), checkpoint_id, place_by)
        # Bounded by the commit's deadline, not the reply deadline: a hung worker (SIGSTOP) held
        # every commit for the fixed 30 s, whatever its deadline, and a large part that takes
        # longer than 30 s within a longer deadline was cut short.
        wait = max(0.0, place_by - time.time()) + _PART_REPLY_SECONDS
        replies: dict[int, WrittenPart] = {}
        try:
            _, refusal = await self._ask_each(body, indexes, traceparent, wait, replies)
        finally:
            # Noted as each part is announced: a commit cancelled while a worker still writes
            # (the server stopping) left the parts already placed behind.
            self.written = [replies[index].records_file for index in sorted(replies)]
        parts: list[tuple[RecordsPart, list[str]]] = []
        self._extras = {}
        for index in sorted(replies):
            reply = replies[index]
            parts.append(
                (RecordsPart(index, reply.records_file, reply.records_sha256, reply.record_count), reply.keys)
            )
            for key, value in reply.extras.items():
                if isinstance(value, list):
                    self._extras[key] = sorted([*self._extras.get(key, []), *value])
                else:
                    self._extras[key] = value
        if refusal is not None:
            raise refusal
        return parts

    def stop(self, keys: Iterable[str]) -> None:
        for index, chosen in self.placement.by_worker(keys).items():
            try:
                self.coordinator.channel(index).post(Stop(chosen))
            except (WorkerChannelError, ProtocolRefusal):
                pass

    def commit_extras(self, keys: Sequence[str]) -> dict[str, Any]:
        return dict(self._extras)

    # -- restore ----------------------------------------------------------------------------

    async def stage(
        self, directory: Beneath, parts: Sequence[RecordsPart], scope: set[EpisodeId], deadline_ts: float
    ) -> tuple[set[str], int]:
        """Every worker reads and checks its share of ``parts`` (``assign_parts``), all at once;
        nothing is installed. Returns the capture keys the checkpoint holds and its bytes read.
        A refusal (a record that does not check: 422), a lost worker, or one that has not answered
        by the restore's ``deadline_ts`` plus ``_RESTORE_GRACE_SECONDS`` (503) discards everywhere;
        so does an episode in two shares. What is out of ``scope`` is left out at install."""
        indexes = self.check_all_connected("restore")
        checkpoint_id, traceparent = _share()
        plan = assign_parts(parts, len(indexes))
        wire = directory.wire()

        def body(index: int) -> Stage:
            return Stage(wire, [PartShare(p, share) for p, share in plan[index]], checkpoint_id)

        replies, refusal = await self._ask_each(body, indexes, traceparent, _until(deadline_ts))
        held: dict[int, list[str]] = {}
        size = 0
        for index in sorted(replies):
            staged = replies[index]
            held[index] = staged.keys
            size += staged.bytes
        found = {key for keys in held.values() for key in keys}
        if refusal is None and len(found) != sum(map(len, held.values())):
            twice = sorted(k for k, n in Counter(k for keys in held.values() for k in keys).items() if n > 1)
            refusal = ProtocolRefusal(
                ErrorCode.INVALID_CHECKPOINT_STATE,
                f"episodes in two parts of the checkpoint: {', '.join(twice[:5])}",
            )
        if refusal is not None:
            self.discard()
            raise refusal
        wanted = {e.capture_key for e in scope}
        self._staged = {i: [k for k in keys if k not in wanted] for i, keys in held.items()}
        self._staged_scope = scope
        return found, size

    async def install_staged(self, deadline_ts: float) -> list[str]:
        """Each worker installs what it staged (less what is out of scope); a worker lost now, or
        silent past the restore's ``deadline_ts`` plus ``_RESTORE_GRACE_SECONDS``, takes the
        others' out again."""
        indexes = self.check_all_connected("restore")
        checkpoint_id, traceparent = _share()
        replies, refusal = await self._ask_each(
            lambda index: InstallStaged(self._staged.get(index, []), checkpoint_id),
            indexes,
            traceparent,
            _until(deadline_ts),
        )
        if refusal is not None:
            self.discard()
            raise refusal
        # The whole server's fence, once every worker installed (a refused restore marks
        # nothing); admission stays closed until resume, so no late attempt got in meanwhile.
        RetiredAttempts.mark_all(self.fence, self._staged_scope)
        restored: list[str] = []
        for index, keys in replies.items():
            self.placement.place(index, keys)
            restored.extend(keys)
        self._staged = {}
        self._staged_scope = set()
        return sorted(restored)

    def discard(self) -> None:
        """Every connected worker drops what a failed restore staged or installed."""
        self.broadcast(Discard())
        self.placement.unplace(episode_id.next().capture_key for episode_id in self._staged_scope)
        self._staged = {}
        self._staged_scope = set()

    async def retire(self, episode_ids: Iterable[EpisodeId]) -> RetireReply:
        """Raise the server's marks, then every worker retires ``episode_ids`` (and marks them).

        The marks go up ``RETIRE_CHUNK`` at a time, the loop free between chunks, as
        ``Workload.retire`` (one mark and one retention pass an id held the main loop ~50 ms
        for 64,000 ids): a work call admitted in between is freed by its worker's retire."""
        ids = list(episode_ids)
        retired = RetiredKeys()
        for at in range(0, len(ids), RETIRE_CHUNK):
            chunk = ids[at : at + RETIRE_CHUNK]
            # Not posted: the workers' retire marks them.
            RetiredAttempts.mark_all(self.fence, chunk)
            retired.add(chunk)
            await anyio.lowlevel.checkpoint()
        checkpoint_id, traceparent = _share()
        await self._ask_each(Retire(ids, checkpoint_id), self.coordinator.connected(), traceparent)
        # The workers' replies (each its own count and first keys) are not needed: the ids
        # named are the reply, whichever worker held them.
        self.placement.drop_retired(self.fence)
        return retired.reply()

    async def aclose(self) -> None:
        await self.checker.aclose()
