"""Rollout collection: a controller that runs rollouts on the participants and checkpoints them.

A rollout is one episode of ``steps`` units on one participant of each kind, driven through the
work API (``/work/start``, ``/work/advance``, with the control token). Where a kind has several
servers, a rollout's session goes to its least loaded one (rollouts in flight there) and stays
there: a checkpoint commits each server's own rollouts, and a restore gives them back to the
server of the same name. Sessions never move between servers (a server reads only its own
records), so a restored rollout whose server is gone restarts. Checkpoints: on demand, on a
timer, on SIGUSR1, and with ``stop=True`` on SIGTERM (then no more dispatch). ``run()`` first
restores the run directory's published checkpoint, if any: its continued episodes go on as
``attempt + 1`` from their boundaries, the others restart from their inputs (a new attempt too).
The run directory is this collection's while it runs (``RunDir.claim``): a second fleet there
is refused, and so is a published checkpoint of another run.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Final

import anyio
import anyio.abc
import anyio.to_thread
import httpx
import msgspec

from ckpt_events import CollectionSpan, ConfigurationError, InvalidValueError, Telemetry
from ckpt_events.checks import library_logger, said_in_log
from ckpt_events.participants.controller.client import what_came
from ckpt_events.participants.controller.coordinator import Coordinator, Member, PrepareResult
from ckpt_events.participants.controller.rollout import CollectionSummary, Rollout
from ckpt_events.participants.controller.run_directory import (
    CollectionManifest,
    RunDir,
    new_checkpoint_id,
    new_restore_id,
)
from ckpt_events.participants.controller.triggers import every, on_signals
from ckpt_events.participants.controller.types import check_url
from ckpt_events.participants.controller.work_calls import WorkClients, call_error
from ckpt_events.participants.errors import (
    HTTP_STATUS,
    CheckpointNotPrepared,
    CheckpointWriteError,
    CoordinationError,
    ParticipantCallError,
    RolloutRetired,
    RunDirectoryError,
    check_int,
)
from ckpt_events.participants.protocol import CommitReply, EpisodeId, WorkAdvanceReply, WorkStartReply
from ckpt_events.vocab import ErrorCode

__all__ = ["Collection", "CollectionSummary", "Rollout", "RolloutRetired"]

logger: Final = library_logger("ckpt_events.participants.controller.collection")

_RETRY_DELAY: Final = 0.02
_MAX_REFUSALS: Final = 2_000
_REPLY_TYPES: Final[dict[str, type[WorkStartReply | WorkAdvanceReply]]] = {
    "start": WorkStartReply,
    "advance": WorkAdvanceReply,
}


class Collection:
    """Runs ``rollouts`` rollouts of ``steps`` units on the coordinator's members.

    ``concurrency`` bounds the rollouts in flight; ``checkpoint_every_s`` adds a timer;
    ``handle_signals`` installs SIGUSR1 (checkpoint) and SIGTERM (checkpoint and stop).
    Work calls go through ``WorkClients`` (``http`` if given), which retries transient failures.
    ``stop_after=n`` checkpoints and stops once ``n`` rollouts are finishing: no other rollout
    starts its last step before that checkpoint, so it always finds the rest in flight, however
    fast the work (a rollout restored mid-episode is held once its boundary is known).
    ``checkpoint_after=[n, ...]`` checkpoints (and goes on) as the n-th rollout finishes (a failure
    is logged); ``work_timeout_s`` bounds each work call (default: ``deadline_s``).
    ``run_id`` (default: the run directory's name) is written in every checkpoint; only this
    run's checkpoints are restored by ``run()`` and pruned. A coordinator without members is
    ``InvalidValueError``.
    """

    def __init__(
        self,
        coordinator: Coordinator,
        run_dir: Path | str,
        *,
        telemetry: Telemetry,
        rollouts: int | Iterable[str],
        steps: int,
        concurrency: int = 8,
        run_id: str | None = None,
        checkpoint_every_s: float | None = None,
        deadline_s: float = 30.0,
        handle_signals: bool = False,
        http: httpx.AsyncClient | None = None,
        stop_after: int | None = None,
        checkpoint_after: Iterable[int] = (),
        work_timeout_s: float | None = None,
    ) -> None:
        if not coordinator.members:
            # Else every rollout "completed" with no call made, and a checkpoint of nothing published.
            raise InvalidValueError("a collection over no participants: the coordinator has no members")
        for count in (steps, concurrency):
            check_int(count, "steps and concurrency must be >= 1", minimum=1)
        if stop_after is not None:
            check_int(stop_after, f"stop_after must be >= 0, not {stop_after}")

        self.coordinator = coordinator
        self.run_dir = RunDir(run_dir, run_id=run_id)
        self.tel = telemetry
        ids = [f"r{i:05d}" for i in range(rollouts)] if isinstance(rollouts, int) else list(rollouts)
        self.rollouts: dict[str, Rollout] = {rid: Rollout(rid) for rid in ids}
        self.steps = steps
        self.run_id = self.run_dir.run_id
        self.checkpoint_every_s = checkpoint_every_s
        self.deadline_s = deadline_s
        self.handle_signals = handle_signals

        self.checkpoints: list[str] = []
        self.restored_from: str | None = None
        #: Every prepare that stopped at a stage not ready (its checkpoint aborted), with the
        #: blockers each member reported.
        self.not_prepared: list[PrepareResult] = []
        self._continues: str | None = None  # the other run whose checkpoint was restored on purpose

        self._limiter = anyio.CapacityLimiter(concurrency)
        self._work = WorkClients(concurrency, work_timeout_s or deadline_s, http)
        self._checkpoint_after = frozenset(checkpoint_after)
        self._finished = 0  # rollouts finished in this run, counted against checkpoint_after
        self._load: dict[str, int] = {}  # member name -> rollouts in flight placed there
        self._loading: set[str] = set()  # the rollouts counted in _load
        self._open = anyio.Event()
        self._open.set()
        self._lock = anyio.Lock()
        self._stopped = False
        self._tg: anyio.abc.TaskGroup | None = None

        self._stop_after = stop_after
        self._finishing = 0  # rollouts whose last step went out while stop_after holds the rest
        self._stop_checkpoint_taken = False
        self._held = anyio.Event()  # set if the stop checkpoint fails: the held rollouts go on
        self._finishing_in_flight = 0
        self._finishing_idle = anyio.Event()

    def progress(self) -> dict[str, int]:
        """How many rollouts are pending, running, done and retired."""
        counts = dict.fromkeys(("pending", "running", "done", "retired"), 0)
        for rollout in self.rollouts.values():
            counts[rollout.status] += 1
        return counts

    # -- running -------------------------------------------------------------------------------

    async def run(self) -> CollectionSummary:
        """Restore the published checkpoint if there is one, then run every rollout to its end.

        A restore that fails (all or nothing) restarts that checkpoint's rollouts from their
        inputs, past the attempts the coordinator retired. The run directory is held throughout:
        another fleet in it is ``RunDirectoryInUse``, a published checkpoint of another run
        ``ForeignCheckpoint`` (both before anything is dispatched).
        """
        with self.run_dir.claim():
            return await self._run()

    async def _run(self) -> CollectionSummary:
        latest = self.run_dir.latest()
        if latest is not None:
            try:
                await self.restore(latest)
            except CoordinationError as exc:
                # Nothing was installed anywhere; its rollouts restart from their inputs.
                logger.warning("restore of %s failed, restarting its rollouts: %s", latest, said_in_log(exc))

        async with anyio.create_task_group() as tg:
            self._tg = tg
            if self.handle_signals:
                tg.start_soon(on_signals, self._checkpoint_quietly)
            if self.checkpoint_every_s is not None:
                tg.start_soon(every, self.checkpoint_every_s, self._checkpoint_quietly)
            async with self._work.open(self.coordinator.members), anyio.create_task_group() as drivers:
                for rollout in self.rollouts.values():
                    if rollout.status in ("pending", "running"):
                        drivers.start_soon(self._drive, rollout)
            tg.cancel_scope.cancel()

        self._tg = None
        return CollectionSummary(
            completed=self.progress()["done"],
            stopped=self._stopped,
            restored_from=self.restored_from,
            checkpoints=list(self.checkpoints),
            attempts={r.rollout_id: r.attempt for r in self.rollouts.values()},
        )

    async def _checkpoint_quietly(self, why: str, *, stop: bool = False) -> None:
        try:
            await self.checkpoint(stop=stop)
        except (CheckpointNotPrepared, CoordinationError, CheckpointWriteError) as exc:
            logger.warning("checkpoint %s failed: %s", why, said_in_log(exc))
            if stop:
                self._stop_now()

    def _stop_now(self) -> None:
        self._stopped = True
        if self._tg is not None:
            self._tg.cancel_scope.cancel()

    async def _drive(self, rollout: Rollout) -> None:
        """Start (if needed) and advance one rollout on every member until each reports done."""
        async with self._limiter:
            try:
                while rollout.status in ("pending", "running"):
                    members = self._place(rollout)
                    if len(rollout.started) < len(members):
                        # Running from the first call on: a checkpoint taken mid-start restarts it.
                        rollout.status = "running"
                        await self._fan(
                            rollout, [m for m in members if m.name not in rollout.started], "start"
                        )
                        continue
                    pending = [m for m in members if m.name not in rollout.done_at]
                    if not pending:
                        rollout.status = "done"
                        self._unload(rollout)
                        self._finished += 1
                        if self._finished in self._checkpoint_after:
                            done = self._finished
                            await self._checkpoint_quietly(f"after {done} rollout{'' if done == 1 else 's'}")
                        break
                    if self._stop_after is not None and self._last_step(rollout, pending):
                        await self._finish_or_hold(rollout, pending)
                    else:
                        await self._fan(rollout, pending, "advance")
            except RolloutRetired:
                rollout.status = "retired"
                self._unload(rollout)

    def _place(self, rollout: Rollout) -> tuple[Member, ...]:
        """The members ``rollout``'s session is on: placed on first use, one of each kind, the
        one with the fewest rollouts in flight (then by name), as a rollout driver balances."""
        if not rollout.placed:
            kinds: dict[str, list[Member]] = {}
            for member in self.coordinator.members:
                kinds.setdefault(member.kind, []).append(member)
            chosen = tuple(
                min(group, key=lambda m: (self._load.get(m.name, 0), m.name)) for group in kinds.values()
            )
            self._set_placed(rollout, chosen)
        return rollout.placed

    def _set_placed(self, rollout: Rollout, members: tuple[Member, ...]) -> None:
        """Place ``rollout`` on ``members`` (none: to be placed when it next runs)."""
        self._unload(rollout)
        rollout.placed = members
        if members:
            self._loading.add(rollout.rollout_id)
            for member in members:
                self._load[member.name] = self._load.get(member.name, 0) + 1

    def _unload(self, rollout: Rollout) -> None:
        """``rollout`` no longer counts in its members' load (it stays placed, to be looked up)."""
        if rollout.rollout_id in self._loading:
            self._loading.discard(rollout.rollout_id)
            for member in rollout.placed:
                self._load[member.name] -= 1

    def _last_step(self, rollout: Rollout, pending: list[Member]) -> bool:
        """Whether the next advance finishes ``rollout`` everywhere (unknown boundaries: no)."""
        return all(m.name in rollout.at and rollout.at[m.name] + 1 >= self.steps for m in pending)

    async def _finish_or_hold(self, rollout: Rollout, pending: list[Member]) -> None:
        """Let ``stop_after`` rollouts take their last step; the next one waits for them to
        finish, then checkpoints and stops (the others wait for that checkpoint)."""
        assert self._stop_after is not None
        if self._finishing < self._stop_after:
            self._finishing += 1
            if not self._finishing_in_flight:
                self._finishing_idle = anyio.Event()
            self._finishing_in_flight += 1
            try:
                await self._fan(rollout, pending, "advance")
            finally:
                self._finishing_in_flight -= 1
                if not self._finishing_in_flight:
                    self._finishing_idle.set()
            return

        if not self._stop_checkpoint_taken:
            self._stop_checkpoint_taken = True
            if self._finishing_in_flight:
                await self._finishing_idle.wait()
            try:
                await self.checkpoint(stop=True)  # cancels the drivers, this one included
            except (CheckpointNotPrepared, CoordinationError, CheckpointWriteError) as exc:
                logger.warning(
                    "checkpoint after %d rollouts failed, going on: %s", self._stop_after, said_in_log(exc)
                )
                self._stop_after = None
                self._held.set()

        await self._held.wait()
        await self._fan(rollout, pending, "advance")

    async def _fan(self, rollout: Rollout, members: list[Member], action: str) -> None:
        attempt = rollout.attempt
        async with anyio.create_task_group() as tg:
            for member in members:
                tg.start_soon(self._work_call, rollout, attempt, member, action)

    async def _work_call(self, rollout: Rollout, attempt: int, member: Member, action: str) -> None:
        body: dict[str, object] = {"rollout_id": rollout.rollout_id, "attempt": attempt}
        if action == "start":
            body["steps"] = self.steps

        routed = rollout.direct.get(member.name)
        direct = routed[1] if routed is not None and routed[0] == attempt and action != "start" else None
        began = time.monotonic()
        said = ""  # what the participant said when it last refused with admission_closed
        for _ in range(_MAX_REFUSALS):
            await self._open.wait()
            if rollout.attempt != attempt:
                return  # a restore moved this rollout on; this call belongs to the old attempt
            url = (direct or member.url).rstrip("/") + "/work/" + action
            headers = self.coordinator.control.auth_headers
            try:
                # Straight to the worker: one try, since the main port is the fallback.
                response = await self._work.post(
                    member, url, body, headers=headers, tries=1 if direct else None
                )
            except ParticipantCallError as exc:
                if direct is None:
                    raise
                logger.info(
                    "worker port of %s unreachable (%s): through its main port", member.name, exc.detail
                )
                rollout.direct.pop(member.name, None)
                direct = None
                continue
            if direct is not None and response.status_code == 404:
                rollout.direct.pop(member.name, None)  # not (or no longer) on that worker
                direct = None
                continue
            if not response.is_success:
                refusal = call_error(url, response)  # any body: not JSON, or not an error body
                if refusal.code is ErrorCode.STALE_ATTEMPT:
                    raise RolloutRetired(f"{rollout.rollout_id} attempt {attempt} at {member.name}")
                if refusal.code is ErrorCode.ADMISSION_CLOSED:
                    # A checkpoint is open; wait for it (the event) and for the participant to reopen.
                    said = refusal.detail
                    await anyio.sleep(_RETRY_DELAY)
                    continue
                # An answer the rollout cannot go past (a session the participant lost, a body
                # it refuses): one error naming the participant and what it said.
                raise refusal
            reply: WorkStartReply | WorkAdvanceReply
            try:
                reply = msgspec.json.decode(response.content, type=_REPLY_TYPES[action])
                if reply.worker_url is not None:
                    check_url(reply.worker_url)  # later calls go there: httpx raised OverflowError
            except (msgspec.DecodeError, InvalidValueError) as exc:
                where = " at $.worker_url" if isinstance(exc, InvalidValueError) else what_came(response)
                unexpected = f"unexpected reply: {exc}{where}"
                raise ParticipantCallError(url, unexpected, status=response.status_code) from exc
            if isinstance(reply, WorkStartReply):
                rollout.started.add(member.name)
            elif reply.done:
                rollout.done_at.add(member.name)
            if reply.worker_url is not None:
                rollout.direct[member.name] = (attempt, reply.worker_url)
            if rollout.attempt == attempt:
                rollout.at[member.name] = reply.boundary
            return
        # Bounded: a participant that stays closed with no checkpoint of ours open (another
        # controller's prepare, a stuck one) fails this rollout by name.
        raise ParticipantCallError(
            url,
            f"{rollout.rollout_id} refused {_MAX_REFUSALS:,} times in a row over "
            f"{time.monotonic() - began:.0f} s, the last: {said}",
            raw_code=ErrorCode.ADMISSION_CLOSED.value,
            status=HTTP_STATUS[ErrorCode.ADMISSION_CLOSED],
        )

    # -- checkpoints ---------------------------------------------------------------------------

    async def checkpoint(self, *, stop: bool = False) -> str:
        """Checkpoint the rollouts in flight and publish it; with ``stop``, stop dispatching after.

        Raises ``CheckpointNotPrepared`` (nothing published, everyone resumed),
        ``CoordinationError`` (nothing published) or ``CheckpointWriteError`` (the run directory
        could not be written: nothing published, everyone resumed); before anything, ``RunDirectoryInUse`` if
        another fleet holds the run directory, ``ForeignCheckpoint`` if its published checkpoint
        is another run's. A resume refused once it is published is logged: it stays published.
        """
        async with self._lock:
            with self.run_dir.claim():
                self.run_dir.check_latest(also=self._continues)
                checkpoint_id = new_checkpoint_id()
                self._open = anyio.Event()  # hold our own calls back while the checkpoint is open
                try:
                    with self.tel.collection("checkpoint", checkpoint_id=checkpoint_id) as span:
                        span.set(stop=stop, published=False)
                        await self._checkpoint(checkpoint_id, stop, span)
                        span.set(published=True)
                except CheckpointNotPrepared as exc:
                    if isinstance(exc.result, PrepareResult):
                        self.not_prepared.append(exc.result)
                    raise
                finally:
                    self._open.set()

                self.checkpoints.append(checkpoint_id)
                if stop:
                    self._stop_now()
                return checkpoint_id

    async def _checkpoint(self, checkpoint_id: str, stop: bool, span: CollectionSpan) -> None:
        continued: list[EpisodeId] = []
        restarted: list[EpisodeId] = []
        placement: dict[str, list[str]] = {}
        published = False  # LATEST names this checkpoint
        # One server of each kind holds every rollout: one scope for all, no placement to keep.
        spread = self._spread()

        def scope(prepared: PrepareResult) -> list[EpisodeId] | dict[str, list[EpisodeId]]:
            # Decided after prepare, when no participant admits work: the scope is stable.
            # Each member commits the continued rollouts placed on it.
            restarts = prepared.restarts()
            running = [r for r in self.rollouts.values() if r.status == "running"]
            span.set(in_flight=len(running))
            shares: dict[str, list[EpisodeId]] = {m.name: [] for m in self.coordinator.members}
            for rollout in running:
                episode_id = rollout.episode_id
                placed = rollout.placed
                if placed and len(rollout.started) == len(placed) and episode_id.capture_key not in restarts:
                    continued.append(episode_id)
                    if spread:
                        placement[rollout.rollout_id] = [m.name for m in placed]
                        for member in placed:
                            shares[member.name].append(episode_id)
                else:
                    restarted.append(episode_id)
            return shares if spread else continued

        async def publish(prepared: PrepareResult, commits: dict[str, CommitReply]) -> None:
            nonlocal published
            # A rollout in the scope whose last step was already in flight at prepare may finish
            # now: the checkpoint holds it in flight, so it is not also listed as completed.
            in_scope = {e.rollout_id for e in continued} | {e.rollout_id for e in restarted}
            manifest = CollectionManifest(
                checkpoint_id=checkpoint_id,
                run_id=self.run_id,
                created_at=time.time(),
                steps=self.steps,
                continued=continued,
                restarted=restarted,
                completed=sorted(
                    r.rollout_id
                    for r in self.rollouts.values()
                    if r.status == "done" and r.rollout_id not in in_scope
                ),
                placement=placement,
                members=[m.name for m in self.coordinator.members],
            )
            with self.tel.collection("publish", checkpoint_id=checkpoint_id, parent=span):
                await anyio.to_thread.run_sync(self.run_dir.publish, manifest)
            published = True

        directory = self.run_dir.checkpoint_dir(checkpoint_id)
        try:
            await self.coordinator.checkpoint(
                checkpoint_id,
                str(directory),
                deadline_ts=time.time() + self.deadline_s,
                episodes=scope,
                publish=publish,
                stop=stop,
                parent=span,
            )
        except (CoordinationError, CheckpointWriteError) as exc:
            if not published:
                # A publish that failed (the run directory's disk full) is aborted as well: what
                # the participants wrote was kept, and the failure ended the whole run.
                # Aborted: its directory holds what some participants wrote, never to be
                # restored; kept, a fleet that aborts often filled its disk with them.
                try:
                    await anyio.to_thread.run_sync(self.run_dir.discard, checkpoint_id)
                except (OSError, RunDirectoryError) as removal:  # the abort's error is the one to raise
                    logger.warning(
                        "aborted checkpoint %s: its directory stays (%s)", checkpoint_id, said_in_log(removal)
                    )
                raise
            # LATEST names it and the next run restores it: a resume refused after that does not
            # unpublish it (who did not resume does when its lease runs out; its span says so).
            logger.warning(
                "checkpoint %s published, but its resume is incomplete: %s", checkpoint_id, said_in_log(exc)
            )

    async def restore(self, checkpoint_id: str, *, from_run: str | None = None) -> None:
        """Restore ``checkpoint_id`` into the (fresh) participants and set each rollout's next attempt.

        The checkpoint must be this run's (``ForeignCheckpoint`` otherwise, nothing restored);
        ``from_run`` names another run whose checkpoint is restored on purpose. One never
        published (its commit failed) or never taken is ``InvalidCheckpointError``, nothing called.
        """
        with self.run_dir.claim():
            await self._restore(checkpoint_id, from_run)

    async def _restore(self, checkpoint_id: str, from_run: str | None) -> None:
        manifest = self.run_dir.read(checkpoint_id, run_id=from_run)
        if manifest.steps != self.steps:
            raise ConfigurationError(
                f"{checkpoint_id} was taken with {manifest.steps} step{'' if manifest.steps == 1 else 's'}, "
                f"not {self.steps}"
            )

        restore_id = new_restore_id()
        deadline = time.time() + self.deadline_s
        directory = str(self.run_dir.checkpoint_dir(checkpoint_id))
        scope, continued, orphans = self._restore_scope(manifest)
        with self.tel.collection("restore", checkpoint_id=checkpoint_id) as span:
            span.set(rows=len(continued), restarts=len(manifest.restarted) + len(orphans))
            restarts = list(manifest.restarted) + orphans
            restored = False
            try:
                await self.coordinator.restore(
                    restore_id,
                    directory,
                    scope,
                    deadline_ts=deadline,
                    source_checkpoint_id=checkpoint_id,
                    parent=span,
                )
                restored = True
                old = list(manifest.continued) + list(manifest.restarted)
                if old:
                    await self.coordinator.retire(
                        old, checkpoint_id=restore_id, deadline_ts=deadline, parent=span
                    )
                await self.coordinator.resume(restore_id, deadline_ts=deadline, parent=span)
            except BaseException as exc:
                failed = isinstance(exc, CoordinationError)
                if restored:
                    # It took everywhere, but fencing the old attempts or resuming did not: undo
                    # it as a failed restore is undone, else everyone stays restored, admission
                    # closed, until the leases run out.
                    await self.coordinator.undo_restore(
                        restore_id, continued, deadline_ts=deadline, cancelled=not failed, parent=span
                    )
                if failed:
                    # All or nothing: the next attempts were retired and everyone resumed; every
                    # rollout of the checkpoint restarts from its input, past those attempts.
                    self._apply(manifest, continued=[], restarted=[e.next() for e in continued] + restarts)
                raise
            self._apply(manifest, continued=continued, restarted=restarts)

        self.restored_from = checkpoint_id
        self._continues = from_run

    def _spread(self) -> bool:
        """Whether some kind has several servers (so each holds only the rollouts placed on it)."""
        return len({m.kind for m in self.coordinator.members}) < len(self.coordinator.members)

    def _restore_scope(
        self, manifest: CollectionManifest
    ) -> tuple[list[EpisodeId] | dict[str, list[EpisodeId]], list[EpisodeId], list[EpisodeId]]:
        """What each member restores, the episodes that continue, and those that cannot: a
        session on a member this fleet lacks (it had fewer servers of that kind) restarts.

        A member that took no part in the checkpoint (this fleet has more servers) restores
        nothing and starts empty. A checkpoint without placements had one server of each kind
        (``members``; a checkpoint older than that field: this fleet's) holding every rollout."""
        present = {m.name for m in self.coordinator.members}
        if not manifest.members or (not manifest.placement and set(manifest.members) == present):
            return list(manifest.continued), list(manifest.continued), []
        shares: dict[str, list[EpisodeId]] = {name: [] for name in manifest.members if name in present}
        continued: list[EpisodeId] = []
        orphans: list[EpisodeId] = []
        for episode_id in manifest.continued:
            names = self._placed_on(manifest, episode_id.rollout_id)
            if all(name in shares for name in names):
                continued.append(episode_id)
                for name in names:
                    shares[name].append(episode_id)
            else:
                orphans.append(episode_id)
        return shares, continued, orphans

    def _placed_on(self, manifest: CollectionManifest, rollout_id: str) -> list[str]:
        """The members that hold ``rollout_id`` in the checkpoint ``manifest``."""
        if manifest.placement:
            return manifest.placement.get(rollout_id, [])
        return list(manifest.members) or [m.name for m in self.coordinator.members]

    def _apply(
        self, manifest: CollectionManifest, *, continued: list[EpisodeId], restarted: list[EpisodeId]
    ) -> None:
        members = {m.name: m for m in self.coordinator.members}
        for rollout_id in manifest.completed:
            if rollout_id in self.rollouts:
                self.rollouts[rollout_id].status = "done"

        for episode_id, resumed in [(e, True) for e in continued] + [(e, False) for e in restarted]:
            rollout = self.rollouts.setdefault(episode_id.rollout_id, Rollout(episode_id.rollout_id))
            rollout.attempt = episode_id.attempt + 1
            rollout.status = "running" if resumed else "pending"
            # A continued episode exists on the members it was placed on already (installed as
            # attempt + 1).
            names = self._placed_on(manifest, episode_id.rollout_id) if resumed else []
            self._set_placed(rollout, tuple(members[name] for name in names))
            rollout.started = set(names)
            rollout.done_at = set()
            rollout.at = {}

    async def forget_finished(self) -> list[str]:
        """Clear the retired-attempt marks of finished rollouts that ran past attempt 0."""
        rollout_ids = sorted(r.rollout_id for r in self.rollouts.values() if r.attempt > 0)
        if rollout_ids:
            await self.coordinator.forget(
                rollout_ids,
                checkpoint_id=f"forget-{secrets.token_hex(6)}",
                deadline_ts=time.time() + self.deadline_s,
            )
        return rollout_ids
