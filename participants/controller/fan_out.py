"""One control call to many participants at once, and the lease renewal around a slow publish.

``fan_out`` gathers every reply and every failure: one member failing does not cancel the
others, so a coordinator always knows who answered what; the request is one for everyone, or
one per member (a commit or restore whose episodes differ by member, ``Scope``). ``renewing``
runs a publish while leases are renewed in the background, so they outlive it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import anyio
import msgspec

from ckpt_events.participants.controller.client import ControlClient, SpanLike
from ckpt_events.participants.controller.types import Member
from ckpt_events.participants.errors import ParticipantCallError, ParticipantUnreachable
from ckpt_events.participants.protocol import CommitReply, EpisodeId, RestoreReply
from ckpt_events.vocab import Phase

__all__ = [
    "Failures",
    "Scope",
    "check_committed",
    "check_phase",
    "check_restored",
    "described",
    "episodes_in",
    "episodes_of",
    "fan_out",
    "renewing",
]

R = TypeVar("R", bound=msgspec.Struct)
T = TypeVar("T")


class _Phased(Protocol):
    """A reply that says the phase its participant is in."""

    @property
    def phase(self) -> Phase: ...


P = TypeVar("P", bound=_Phased)
#: Member name -> what went wrong with its call, in words (``described``).
Failures = dict[str, str]
#: The episodes of a commit or restore: one list for every member, or each member's own (by
#: member name; a fleet with several servers of a kind holds each rollout on one of them).
Scope = Sequence[EpisodeId] | Mapping[str, Sequence[EpisodeId]]


def described(exc: ParticipantCallError) -> str:
    """A failed call in words, code first: ``refused: unauthorized (401): missing or wrong
    bearer token``, ``unreachable at URL: ConnectError: ...`` (no connection), ``no whole reply
    from URL: ReadTimeout: ...`` (connected, no whole answer), ``answered HTTP 502: ...``,
    ``failed at URL: unreadable reply: DecodingError: ...``."""
    detail = " ".join(exc.detail.split())  # one line, whatever the reply's body held
    if isinstance(exc, ParticipantUnreachable):
        return f"{'no whole reply from' if exc.reached else 'unreachable at'} {exc.url}: {detail}"
    if exc.status is None:  # an answer that could not be read
        return f"failed at {exc.url}: {detail}"
    if exc.raw_code is not None:
        return f"refused: {exc.raw_code} ({exc.status}): {detail}"
    return f"answered HTTP {exc.status}: {detail}"


def episodes_of(scope: Scope, name: str) -> list[EpisodeId]:
    """The episodes of ``scope`` on the member called ``name`` (none if a mapping lacks it)."""
    return list(scope.get(name, ()) if isinstance(scope, Mapping) else scope)


def episodes_in(scope: Scope) -> list[EpisodeId]:
    """Every episode of ``scope`` once, in first-seen order."""
    if not isinstance(scope, Mapping):
        return list(scope)
    return list(dict.fromkeys(e for episodes in scope.values() for e in episodes))


async def fan_out(
    control: ControlClient,
    members: Sequence[Member],
    operation: str,
    request: msgspec.Struct | Mapping[str, msgspec.Struct],
    reply_type: type[R],
    *,
    deadline_ts: float,
    span: SpanLike | None,
    answered_at: dict[str, float] | None = None,
    unanswered: set[str] | None = None,
) -> tuple[dict[str, R], Failures]:
    """Call ``operation`` on ``members`` at once (``request``, or ``request[member.name]``); one
    member failing does not cancel the others. ``answered_at``, if given, gets the time
    (``time.monotonic()``: a wall-clock step is no lateness) each reply arrived, by member
    name; ``unanswered``, if given, the names of the members whose call got no whole answer
    (``ParticipantUnreachable``)."""
    replies: dict[str, R] = {}
    failures: Failures = {}

    async def one(member: Member) -> None:
        body = request[member.name] if isinstance(request, Mapping) else request
        try:
            replies[member.name] = await control.call(
                member.url, operation, body, reply_type, deadline_ts=deadline_ts, span=span
            )
        except ParticipantCallError as exc:
            failures[member.name] = described(exc)
            if unanswered is not None and isinstance(exc, ParticipantUnreachable):
                unanswered.add(member.name)
            return
        if answered_at is not None:
            answered_at[member.name] = time.monotonic()

    async with anyio.create_task_group() as tg:
        for member in members:
            tg.start_soon(one, member)
    return replies, failures


def _move_mismatches(
    replies: dict[str, T], failures: Failures, wrong: Callable[[str, T], str | None]
) -> None:
    for name in sorted(replies):
        problem = wrong(name, replies[name])
        if problem is not None:
            failures[name] = problem
            del replies[name]


def _compare(what: str, got: Sequence[str], want: Sequence[str]) -> str | None:
    if list(got) == list(want):
        return None
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    # In words as ``cli.words.counted`` says them (the controller does not import the command line).
    episodes = f"{len(got):,} episode{'' if len(got) == 1 else 's'}"
    counts = f"{what} {episodes}, not the {len(want):,} asked for"
    return f"{counts} (missing {missing[:5]}, extra {extra[:5]})"


def _wanted(scope: Scope, key: Callable[[EpisodeId], str]) -> Callable[[str], list[str]]:
    """Member name -> the sorted keys of its share of ``scope`` (one list for every member is
    sorted once: a commit's scope can hold 64,000 episodes)."""
    if isinstance(scope, Mapping):
        return lambda name: sorted({key(e) for e in scope.get(name, ())})
    shared = sorted({key(e) for e in scope})
    return lambda name: shared


def _answered(operation: str, got: Phase, *want: Phase) -> str | None:
    if got in want:
        return None
    return f"answered {operation} with phase {got}, not {' or '.join(str(p) for p in want)}"


def check_phase(replies: dict[str, P], failures: Failures, operation: str, *phases: Phase) -> None:
    """A participant that answered ``operation`` in another phase than ``phases`` (a resume
    not ``idle``) failed: its reply says it did not do what was asked."""
    _move_mismatches(replies, failures, lambda n, r: _answered(operation, r.phase, *phases))


def check_committed(
    replies: dict[str, CommitReply], failures: Failures, scope: Scope | None, checkpoint_id: str
) -> None:
    """A participant whose commit is not ``committed``, wrote another checkpoint's manifest than
    ``checkpoint_id``, or exported other episodes than its share of ``scope``, failed."""
    want = None if scope is None else _wanted(scope, lambda e: e.capture_key)

    def wrong(name: str, reply: CommitReply) -> str | None:
        if (problem := _answered("commit", reply.phase, Phase.COMMITTED)) is not None:
            return problem
        if reply.manifest.checkpoint_id != checkpoint_id:
            return f"committed checkpoint {reply.manifest.checkpoint_id}, not {checkpoint_id}"
        return None if want is None else _compare("committed", reply.episode_ids, want(name))

    _move_mismatches(replies, failures, wrong)


def check_restored(
    replies: dict[str, RestoreReply], failures: Failures, scope: Scope, source: str | None
) -> None:
    """A participant whose restore is not ``restored``, installed other episodes than its share
    of ``scope`` (each as attempt + 1), or restored another checkpoint than ``source``, failed."""
    want = _wanted(scope, lambda e: e.next().capture_key)

    def wrong(name: str, reply: RestoreReply) -> str | None:
        if (problem := _answered("restore", reply.phase, Phase.RESTORED)) is not None:
            return problem
        if source is not None and reply.source_checkpoint_id != source:
            return f"restored checkpoint {reply.source_checkpoint_id}, not {source}"
        return _compare("restored", reply.restored, want(name))

    _move_mismatches(replies, failures, wrong)


async def renewing(
    renew: Callable[[float], Awaitable[Any]],
    publish: Callable[[], Awaitable[None]],
    *,
    deadline_ts: float,
    every: float,
) -> None:
    """Run ``publish()`` while ``renew(deadline_ts)`` keeps the leases alive (now, then every ``every`` s).

    A renew that fails stops the publish, and its error is raised as itself (as is the
    publish's own), never wrapped in an ``ExceptionGroup``."""
    # Leases must outlive a slow publish: renew now, then in the background until it is done.
    await renew(max(deadline_ts, time.time() + every * 2))
    try:
        async with anyio.create_task_group() as tg:

            async def renew_loop() -> None:
                while True:
                    await anyio.sleep(every)
                    await renew(max(deadline_ts, time.time() + every * 2))

            tg.start_soon(renew_loop)
            await publish()
            tg.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # The callers document CoordinationError: a background renew's came wrapped, and
        # passed every ``except CoordinationError`` (a timer's checkpoint ended the whole run).
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
