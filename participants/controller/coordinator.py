"""The coordinator (controller side of the checkpoint protocol), reporting as ``controller``.

Order, as the protocol fixes it: prepare runs stage by stage (environment, model, agent,
resources) and stops at the first stage that is not prepared; commit and restore fan out to
everyone at once; resume runs the stages in reverse; retire and forget go callers before
callees (``ckpt_events.participants.kinds``, which also places a kind it does not name:
prepared last, resumed first, retired with the last group). Every call carries the
``traceparent`` of the span it belongs to, so one checkpoint is one trace across every process.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Final, Self, TypeVar

import anyio
import httpx
import msgspec

from ckpt_events import InvalidValueError, Telemetry
from ckpt_events.checks import library_logger, said_in_log
from ckpt_events.participants.controller.client import ControlClient
from ckpt_events.participants.controller.discovery import DISCOVER_TIMEOUT, DISCOVER_TRIES, discover_members
from ckpt_events.participants.controller.fan_out import (
    Failures,
    Scope,
    check_committed,
    check_phase,
    check_restored,
    episodes_in,
    episodes_of,
    fan_out,
    renewing,
)
from ckpt_events.participants.controller.types import (
    FAILURES_ATTRIBUTE,
    Member,
    PrepareResult,
    check_url,
    failures_value,
)
from ckpt_events.participants.errors import CheckpointNotPrepared, CoordinationError, shown
from ckpt_events.participants.faults import NO_FAULTS, FaultPlan
from ckpt_events.participants.kinds import prepare_order, resume_order, retire_groups
from ckpt_events.participants.protocol import (
    CommitReply,
    CommitRequest,
    EpisodeId,
    ForgetReply,
    ForgetRequest,
    PrepareReply,
    PrepareRequest,
    RenewReply,
    RenewRequest,
    RestoreReply,
    RestoreRequest,
    ResumeReply,
    ResumeRequest,
    RetireReply,
    RetireRequest,
)
from ckpt_events.vocab import Kind, Phase, kind_name

__all__ = [
    "CheckpointNotPrepared",
    "CoordinationError",
    "Coordinator",
    "Member",
    "PrepareResult",
    "discover_members",
]

logger: Final = library_logger("ckpt_events.participants.controller.coordinator")

#: A restore that failed retires the next attempts with at least this much time left.
RESTORE_CLEANUP_SECONDS: Final = 30.0

R = TypeVar("R", bound=msgspec.Struct)


def _check_distinct(members: Sequence[Member]) -> None:
    """Refuse ``members`` that discovery would refuse: a URL that is not one (``check_url``), two
    with one name (their replies would be taken for each other's), or one kind and instance
    (their commits would write one directory)."""
    names: dict[str, Member] = {}
    identities: dict[tuple[str, str], Member] = {}
    for member in members:
        check_url(member.url)
        if (twin := names.setdefault(member.name, member)) is not member:
            raise InvalidValueError(
                f"two members are named {shown(member.name)} ({twin.url} and {member.url}): give "
                f"each its own name"
            )
        if (twin := identities.setdefault((member.kind, member.instance), member)) is not member:
            raise InvalidValueError(
                f"members {shown(twin.name)} and {shown(member.name)} are both "
                f"{member.kind}/{member.instance}: "
                "their commits would write one checkpoint directory (give each its own instance)"
            )


def _move_late(
    replies: dict[str, PrepareReply], failures: Failures, answered_at: Mapping[str, float], deadline: float
) -> None:
    """A member whose ``prepared`` arrived past ``deadline`` (``answered_at``'s clock, the
    monotonic one) failed: the next stage, asked after it, would refuse ``deadline_exceeded``
    and be taken for the cause. (A ``preparing`` reply is sent at the deadline by design: it is
    the member's "not ready", not late.)"""
    for name in sorted(replies):
        late = answered_at.get(name, deadline) - deadline
        if replies[name].phase is Phase.PREPARED and late > 0:
            failures[name] = f"answered prepare (prepared) {late:.1f} s after its deadline"
            del replies[name]


class Coordinator:
    """Runs checkpoint operations over ``members`` with telemetry ``tel`` (kind ``controller``).

    ``client`` (an ``httpx.AsyncClient``) stays the caller's; without one the coordinator
    makes its own and closes it in ``aclose()``. ``faults`` is what is injected (a ``lease``
    fault: the first checkpoint waits past the leases between prepare and commit). Members
    are distinct, in name and in kind and instance, as discovery finds them (``InvalidValueError``).
    """

    def __init__(
        self,
        members: Sequence[Member],
        *,
        token: str,
        telemetry: Telemetry,
        client: httpx.AsyncClient | None = None,
        faults: FaultPlan = NO_FAULTS,
    ) -> None:
        if telemetry.kind != Kind.CONTROLLER:
            raise InvalidValueError(
                f"the coordinator reports as kind 'controller', not {shown(telemetry.kind)}"
            )
        _check_distinct(members)

        self.members: tuple[Member, ...] = tuple(sorted(members, key=Member.sort_key))
        self.tel = telemetry
        self.control = ControlClient(token, client=client)
        self.faults = faults
        #: The ``lease`` fault stalls this coordinator's first checkpoint only.
        self._lease_stalled = False
        self._group(self.members)

    @classmethod
    async def discover(
        cls,
        servers: Mapping[str, str] | Iterable[str],
        *,
        token: str,
        telemetry: Telemetry,
        client: httpx.AsyncClient | None = None,
        tries: int = DISCOVER_TRIES,
        timeout: float = DISCOVER_TIMEOUT,
        faults: FaultPlan = NO_FAULTS,
    ) -> Coordinator:
        """A coordinator over the participants found among ``servers`` (see ``discover_members``)."""
        self = cls((), token=token, telemetry=telemetry, client=client, faults=faults)
        try:
            members = await discover_members(servers, self.control, tries=tries, timeout=timeout)
        except BaseException:
            await self.aclose()
            raise

        self._group(members)
        return self

    def _group(self, members: Sequence[Member]) -> None:
        """Keep ``members`` and the harness's order of their kinds (``participants.kinds``: a kind
        it does not name prepares last, resumes first, retires with the last group)."""
        self.members = tuple(members)
        kinds = {m.kind for m in self.members}
        self._prepare_order = prepare_order(kinds)
        self._resume_order = resume_order(kinds)
        self._retire_groups = retire_groups(kinds)
        self._by_kind = {kind: [m for m in self.members if m.kind == kind] for kind in self._prepare_order}

    async def aclose(self) -> None:
        await self.control.aclose()

    async def _stall_for_lease_fault(self) -> None:
        """With a ``lease`` fault: wait its seconds between the first ready prepare and its commit."""
        if not self._lease_stalled and (seconds := self.faults.lease_stall()):
            self._lease_stalled = True
            await anyio.sleep(seconds)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def of_kind(self, kind: Kind | str) -> list[Member]:
        """The members of one stage, in (stage, name) order."""
        return list(self._by_kind.get(kind_name(kind), ()))

    # -- operations ----------------------------------------------------------------------------

    async def prepare(self, checkpoint_id: str, *, deadline_ts: float, parent: Any = None) -> PrepareResult:
        """Prepare stage by stage; on a stage not prepared (or failing), resume everyone.

        Returns a ``PrepareResult`` (``prepared=False`` with the blockers after an abort);
        a participant that refuses, cannot be reached, answers in a phase prepare never gives,
        or answers ``prepared`` past ``deadline_ts`` (the next stage would refuse it as
        ``deadline_exceeded``) raises ``CoordinationError`` naming it. A prepare
        cancelled midway resumes everyone too (shielded, each call bounded to about ten seconds).
        """
        request = PrepareRequest(checkpoint_id=checkpoint_id, deadline_ts=deadline_ts)
        # The deadline as far away as it is now, on the clock the answers are timed by. Was: both
        # on the wall clock, and one stepped an hour ahead while the agent took 0.3 s to answer
        # made it "answered prepare (prepared) 3598.3 s after its deadline", a false cause.
        deadline = time.monotonic() + (deadline_ts - time.time())
        replies: dict[str, PrepareReply] = {}
        stopped_at: str | None = None

        try:
            with self.tel.coordinate("prepare", checkpoint_id=checkpoint_id, parent=parent) as span:
                span.set(participants=len(self.members))
                for kind in self._prepare_order:
                    members = self._by_kind[kind]
                    with span.stage(kind) as stage:
                        stage.set(participants=len(members))
                        answered_at: dict[str, float] = {}
                        silent: set[str] = set()
                        got, failures = await fan_out(
                            self.control,
                            members,
                            "prepare",
                            request,
                            PrepareReply,
                            deadline_ts=deadline_ts,
                            span=stage,
                            answered_at=answered_at,
                            unanswered=silent,
                        )
                        check_phase(got, failures, "prepare", Phase.PREPARED, Phase.PREPARING)
                        _move_late(got, failures, answered_at, deadline)
                        replies.update(got)
                        if failures:
                            span.set(prepared=False, stopped_at=kind)
                            # Ends this stage and coordinate.prepare as errors naming who failed.
                            raise self._failed(span, "prepare", failures, stage, silent=silent)
                    if any(r.phase is not Phase.PREPARED for r in got.values()):
                        stopped_at = kind
                        break
                span.set(prepared=stopped_at is None)
                if stopped_at is not None:
                    span.set(stopped_at=stopped_at)
        except CoordinationError as exc:
            # Abort: everyone already prepared (and the stage that failed) reopens admission.
            context = parent if parent is not None else span
            await self._resume_quietly(checkpoint_id, deadline_ts, context, apart=exc.silent)
            raise
        except BaseException:
            # Cancelled (a caller's timeout, Ctrl-C): abort the same way, shielded and within
            # seconds. Else who prepared keeps admission closed, and refuses every other
            # checkpoint as a conflict, until its lease runs out (lease_grace_seconds, 600).
            with anyio.CancelScope(shield=True):
                await self._resume_quietly(checkpoint_id, time.time(), parent if parent is not None else span)
            raise

        result = PrepareResult(checkpoint_id, stopped_at is None, stopped_at, replies)
        if stopped_at is not None:
            # Abort, the same way: the stage that stopped was not ready.
            await self._resume_quietly(checkpoint_id, deadline_ts, parent if parent is not None else span)
        return result

    def _failed(
        self, span: Any, operation: str, failures: Failures, *more: Any, silent: Iterable[str] = ()
    ) -> CoordinationError:
        """Record on ``span`` (and ``more`` spans) whose calls failed and how
        (``FAILURES_ATTRIBUTE``); returns the error to raise inside them, so they end as errors
        (``silent``: the failed members that gave no answer)."""
        value = failures_value(self.members, failures)
        for each in (span, *more):
            each.set_attribute(FAILURES_ATTRIBUTE, value)
        return CoordinationError(operation, failures, silent=silent)

    async def commit(
        self,
        checkpoint_id: str,
        checkpoint_dir: str,
        *,
        deadline_ts: float,
        episode_ids: Scope | None = None,
        stop: bool = False,
        parent: Any = None,
    ) -> dict[str, CommitReply]:
        """Commit on every participant at once with the episodes the controller continues:
        the same for everyone, or (a mapping) each member's own, none for a member it lacks."""

        def request(episodes: list[EpisodeId] | None) -> CommitRequest:
            return CommitRequest(
                checkpoint_id=checkpoint_id,
                deadline_ts=deadline_ts,
                checkpoint_dir=checkpoint_dir,
                episode_ids=episodes,
                stop=stop,
            )

        requests: CommitRequest | dict[str, CommitRequest] = (
            {m.name: request(episodes_of(episode_ids, m.name)) for m in self.members}
            if isinstance(episode_ids, Mapping)
            else request(None if episode_ids is None else list(episode_ids))
        )

        with self.tel.coordinate("commit", checkpoint_id=checkpoint_id, parent=parent) as span:
            span.set(participants=len(self.members))
            silent: set[str] = set()
            replies, failures = await fan_out(
                self.control,
                self.members,
                "commit",
                requests,
                CommitReply,
                deadline_ts=deadline_ts,
                span=span,
                unanswered=silent,
            )
            check_committed(replies, failures, episode_ids, checkpoint_id)
            exported = len({key for r in replies.values() for key in r.episode_ids})
            span.set(episodes=len(episodes_in(episode_ids)) if episode_ids is not None else exported)
            if failures:
                raise self._failed(span, "commit", failures, silent=silent)
        return replies

    async def renew(
        self, checkpoint_id: str, *, deadline_ts: float, parent: Any = None
    ) -> dict[str, RenewReply]:
        """Extend every participant's lease, under ``gym.checkpoint.coordinate.renew`` (participants
        record no renew span), so the report can name the time it takes within the checkpoint."""
        request = RenewRequest(checkpoint_id=checkpoint_id, deadline_ts=deadline_ts)
        with self.tel.coordinate("renew", checkpoint_id=checkpoint_id, parent=parent) as span:
            span.set(participants=len(self.members))
            replies, failures = await fan_out(
                self.control, self.members, "renew", request, RenewReply, deadline_ts=deadline_ts, span=span
            )
            if failures:
                raise self._failed(span, "renew", failures)
        return replies

    async def resume(
        self, checkpoint_id: str, *, deadline_ts: float, parent: Any = None
    ) -> dict[str, ResumeReply]:
        """Resume stage by stage in reverse prepare order; a failing stage does not stop the rest."""
        return await self._resume(checkpoint_id, deadline_ts, parent, apart=frozenset())

    async def _resume(
        self,
        checkpoint_id: str,
        deadline_ts: float,
        parent: Any,
        *,
        apart: frozenset[str],
        members: Sequence[Member] | None = None,
    ) -> dict[str, ResumeReply]:
        """``resume`` (of ``members``, by default all), the members named in ``apart`` called
        alongside the stages, not in them."""
        among = self.members if members is None else tuple(members)
        names = {m.name for m in among}
        request = ResumeRequest(checkpoint_id=checkpoint_id, deadline_ts=deadline_ts)
        replies: dict[str, ResumeReply] = {}
        failures: Failures = {}

        async def call(members: Sequence[Member], span: Any) -> None:
            got, failed = await fan_out(
                self.control, members, "resume", request, ResumeReply, deadline_ts=deadline_ts, span=span
            )
            check_phase(got, failed, "resume", Phase.IDLE)
            replies.update(got)
            failures.update(failed)

        async def staged(span: Any) -> None:
            for kind in self._resume_order:
                stage = [m for m in self._by_kind[kind] if m.name in names and m.name not in apart]
                if stage:
                    await call(stage, span)

        with self.tel.coordinate("resume", checkpoint_id=checkpoint_id, parent=parent) as span:
            span.set(participants=len(among))
            async with anyio.create_task_group() as tg:
                tg.start_soon(staged, span)
                if apart:
                    # A member that gave no answer in this checkpoint likely gives none now: in
                    # its stage, its call's timeout (10 s) held every later stage closed.
                    tg.start_soon(call, [m for m in among if m.name in apart], span)
            if failures:
                raise self._failed(span, "resume", failures)
        return replies

    async def _resume_quietly(
        self,
        checkpoint_id: str,
        deadline_ts: float,
        parent: Any,
        *,
        apart: frozenset[str] = frozenset(),
        members: Sequence[Member] | None = None,
    ) -> None:
        # On an abort path the first error is the one to report; an unreachable participant
        # resumes on its own when its lease expires.
        try:
            await self._resume(
                checkpoint_id, max(deadline_ts, time.time() + 5.0), parent, apart=apart, members=members
            )
        except CoordinationError as exc:
            # One bounded line: a participant's refusal may quote a megabyte.
            logger.warning("resume after abort of %s incomplete: %s", checkpoint_id, said_in_log(exc))

    async def restore(
        self,
        checkpoint_id: str,
        checkpoint_dir: str,
        episode_ids: Scope,
        *,
        deadline_ts: float,
        source_checkpoint_id: str | None = None,
        parent: Any = None,
    ) -> dict[str, RestoreReply]:
        """Restore into fresh processes, all or nothing; each must install exactly ``episode_ids``
        (from ``source_checkpoint_id``, if given), else it failed. With a mapping, only the
        members it names restore, each its own episodes (one it does not name had no part in
        the checkpoint: it starts empty).

        If any participant fails, the next attempts are retired everywhere (deadline at
        least 30 s away), everyone is resumed, and ``CoordinationError("restore")`` raised; a
        restore cancelled midway is undone the same way (shielded, each call bounded).
        """

        def request(episodes: list[EpisodeId]) -> RestoreRequest:
            return RestoreRequest(
                checkpoint_id=checkpoint_id,
                deadline_ts=deadline_ts,
                checkpoint_dir=checkpoint_dir,
                episode_ids=episodes,
            )

        requests: RestoreRequest | dict[str, RestoreRequest]
        if isinstance(episode_ids, Mapping):
            members = [m for m in self.members if m.name in episode_ids]
            requests = {m.name: request(episodes_of(episode_ids, m.name)) for m in members}
        else:
            members = list(self.members)
            requests = request(list(episode_ids))
        everyone = episodes_in(episode_ids)
        silent: set[str] = set()

        try:
            with self.tel.coordinate("restore", checkpoint_id=checkpoint_id, parent=parent) as span:
                span.set(participants=len(members), episodes=len(everyone))
                replies, failures = await fan_out(
                    self.control,
                    members,
                    "restore",
                    requests,
                    RestoreReply,
                    deadline_ts=deadline_ts,
                    span=span,
                    unanswered=silent,
                )
                check_restored(replies, failures, episode_ids, source_checkpoint_id)
                if failures:
                    raise self._failed(span, "restore", failures, silent=silent)
        except BaseException as exc:
            # All or nothing, also when the caller cancelled the restore (a timeout, Ctrl-C):
            # then shielded, and each call bounded to about ten seconds. Else who installed its
            # share keeps it, restored, until its lease runs out (lease_grace_seconds, 600).
            cancelled = not isinstance(exc, CoordinationError)
            context = parent if parent is not None else span
            await self.undo_restore(
                checkpoint_id,
                everyone,
                deadline_ts=deadline_ts,
                cancelled=cancelled,
                parent=context,
                apart=silent,
            )
            raise
        return replies

    async def undo_restore(
        self,
        checkpoint_id: str,
        episodes: Sequence[EpisodeId],
        *,
        deadline_ts: float,
        cancelled: bool = False,
        parent: Any = None,
        apart: Iterable[str] = (),
    ) -> None:
        """Undo restore ``checkpoint_id`` of ``episodes``: retire their next attempts everywhere,
        then resume everyone; what fails is logged, not raised. Each call has at least 30 s
        (``RESTORE_CLEANUP_SECONDS``); ``cancelled`` (the caller was): shielded, about 5 s. The
        members named in ``apart`` (that gave the restore no answer) are retired and resumed
        alongside the others, who keep the protocol's order among themselves."""
        deadline = time.time() + 5.0 if cancelled else max(deadline_ts, time.time() + RESTORE_CLEANUP_SECONDS)
        silent = frozenset(apart)

        async def undo(members: Sequence[Member]) -> None:
            if not members:
                return
            if episodes:
                try:
                    await self._retire(
                        [e.next() for e in episodes],
                        checkpoint_id=checkpoint_id,
                        deadline_ts=deadline,
                        parent=parent,
                        members=members,
                    )
                except CoordinationError as exc:
                    logger.warning(
                        "retire after failed restore %s incomplete: %s", checkpoint_id, said_in_log(exc)
                    )
            await self._resume_quietly(checkpoint_id, deadline, parent, members=members)

        with anyio.CancelScope(shield=cancelled):
            # A member silent in the restore likely is now: with the others, its retire's timeout
            # (35 s) held every later group's retire, and everyone's resume, that long.
            async with anyio.create_task_group() as tg:
                tg.start_soon(undo, [m for m in self.members if m.name not in silent])
                tg.start_soon(undo, [m for m in self.members if m.name in silent])

    async def _grouped(
        self,
        operation: str,
        request: msgspec.Struct,
        reply_type: type[R],
        *,
        deadline_ts: float,
        span: Any,
        among: Sequence[Member] | None = None,
    ) -> dict[str, R]:
        """Run ``operation`` group by group, callers before callees (on the members ``among``,
        by default all); raise if any member failed."""
        replies: dict[str, R] = {}
        failures: Failures = {}
        names = None if among is None else {m.name for m in among}
        for group in self._retire_groups:
            members = [m for kind in group for m in self._by_kind[kind] if names is None or m.name in names]
            if not members:
                continue
            got, failed = await fan_out(
                self.control, members, operation, request, reply_type, deadline_ts=deadline_ts, span=span
            )
            replies.update(got)
            failures.update(failed)
        if failures:
            raise self._failed(span, operation, failures)
        return replies

    async def retire(
        self, episode_ids: Sequence[EpisodeId], *, checkpoint_id: str, deadline_ts: float, parent: Any = None
    ) -> dict[str, RetireReply]:
        """Retire attempts everywhere (a later request at or below them gets ``stale_attempt``)."""
        return await self._retire(
            episode_ids,
            checkpoint_id=checkpoint_id,
            deadline_ts=deadline_ts,
            parent=parent,
            members=self.members,
        )

    async def _retire(
        self,
        episode_ids: Sequence[EpisodeId],
        *,
        checkpoint_id: str,
        deadline_ts: float,
        parent: Any,
        members: Sequence[Member],
    ) -> dict[str, RetireReply]:
        """``retire`` on ``members`` only."""
        if not episode_ids:
            raise InvalidValueError("retire needs at least one episode")
        request = RetireRequest(
            checkpoint_id=checkpoint_id, deadline_ts=deadline_ts, episode_ids=list(episode_ids)
        )

        with self.tel.coordinate("retire", checkpoint_id=checkpoint_id, parent=parent) as span:
            span.set(participants=len(members), episodes=len(episode_ids))
            return await self._grouped(
                "retire", request, RetireReply, deadline_ts=deadline_ts, span=span, among=members
            )

    async def forget(
        self, rollout_ids: Sequence[str], *, checkpoint_id: str, deadline_ts: float, parent: Any = None
    ) -> dict[str, ForgetReply]:
        """Clear the retired-attempt marks of ``rollout_ids`` everywhere."""
        if not rollout_ids:
            raise InvalidValueError("forget needs at least one rollout id")
        request = ForgetRequest(
            checkpoint_id=checkpoint_id, deadline_ts=deadline_ts, rollout_ids=list(rollout_ids)
        )

        with self.tel.coordinate("forget", checkpoint_id=checkpoint_id, parent=parent) as span:
            span.set(participants=len(self.members), rollouts=len(rollout_ids))
            return await self._grouped("forget", request, ForgetReply, deadline_ts=deadline_ts, span=span)

    # -- the whole flow ------------------------------------------------------------------------

    async def checkpoint(
        self,
        checkpoint_id: str,
        checkpoint_dir: str,
        *,
        deadline_ts: float,
        episodes: Callable[[PrepareResult], Scope | None] | None = None,
        publish: Callable[[PrepareResult, dict[str, CommitReply]], Awaitable[None]] | None = None,
        stop: bool = False,
        renew_every: float = 5.0,
        parent: Any = None,
    ) -> tuple[PrepareResult, dict[str, CommitReply]]:
        """Prepare, commit, publish (renewing leases meanwhile), resume.

        ``episodes(prepared)`` picks the commit scope once prepare is done (``None``: all; a
        mapping: each member's own, see ``commit``).
        Any failure after prepare resumes everyone and re-raises; a prepare that stopped
        raises ``CheckpointNotPrepared`` (everyone was already resumed).
        """
        prepared = await self.prepare(checkpoint_id, deadline_ts=deadline_ts, parent=parent)
        if not prepared.prepared:
            raise CheckpointNotPrepared(prepared)

        try:
            await self._stall_for_lease_fault()
            scope = episodes(prepared) if episodes is not None else None
            commits = await self.commit(
                checkpoint_id,
                checkpoint_dir,
                deadline_ts=deadline_ts,
                episode_ids=scope,
                stop=stop,
                parent=parent,
            )
            if publish is not None:

                async def renew(deadline: float) -> None:
                    await self.renew(checkpoint_id, deadline_ts=deadline, parent=parent)

                await renewing(
                    renew,
                    functools.partial(publish, prepared, commits),
                    deadline_ts=deadline_ts,
                    every=renew_every,
                )
        except BaseException as exc:
            apart = exc.silent if isinstance(exc, CoordinationError) else frozenset()
            with anyio.CancelScope(shield=True):
                await self._resume_quietly(checkpoint_id, deadline_ts, parent, apart=apart)
            raise

        await self.resume(checkpoint_id, deadline_ts=max(deadline_ts, time.time() + 5.0), parent=parent)
        return prepared, commits
