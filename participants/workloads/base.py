"""The workload every participant kind runs, behind one uniform API the controller drives.

An episode (``EpisodeId``, keyed by its capture key) advances one unit of work at a time
and sits at a *boundary* between units. While a checkpoint is open, admission is closed:
new work is refused with 409 ``admission_closed`` (we refuse rather than wait, so a caller
never holds a connection across a checkpoint), and a unit already running finishes, which
parks the episode at its next boundary. Kinds subclass ``Workload[State, Record]`` and fill
in the hooks: ``State`` is the kind's episode state (one Struct per kind), ``Record`` what a
commit saves of it. ``checkpointable.CheckpointableWorkload`` is what the control plane uses.
Episodes are not tracked by the cyclic collector, so a ``State`` must never refer back to
its episode or its workload (such a cycle would leak); the built-in kinds' states and records
are ``gc=False`` Structs of scalars, strings and lists of those.
"""

from __future__ import annotations

import heapq
import math
import operator
from collections.abc import Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar, Final, Generic, TypeVar

import anyio
import anyio.lowlevel
import msgspec

from ckpt_events import InvalidTypeError, OperationSpan, Telemetry
from ckpt_events.participants.errors import InvalidCheckpointError, ProtocolRefusal, WorkError
from ckpt_events.participants.protocol import (
    MAX_BLOCKERS,
    MAX_RETIRED_KEYS_SHOWN,
    EpisodeId,
    PrepareReport,
    RetireReply,
)
from ckpt_events.participants.workloads.episodes import Episode, EpisodeTable
from ckpt_events.participants.workloads.fence import RetiredAttempts
from ckpt_events.vocab import ErrorCode

__all__ = ["Episode", "Record", "RetiredKeys", "WorkError", "Workload", "finite_sleep"]

_RETIRE_WAIT: Final = 5.0
#: Ids a retire marks (and a forget clears) between two yields to the loop: ~0.5 ms of work
#: (a request beside it needs several turns of the loop to be answered).
RETIRE_CHUNK: Final = 1024


class RetiredKeys:
    """The capture keys a retire names, a chunk at a time: how many (each once) and the first
    ``MAX_RETIRED_KEYS_SHOWN`` in sorted order, kept as the chunks come. Sorting every key
    for the reply held the loop ~20-35 ms in one stretch at 64,000 ids; a chunk's share here
    is ~0.1 ms."""

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._first: list[str] = []

    def add(self, chunk: Iterable[EpisodeId]) -> None:
        fresh = {e.capture_key for e in chunk}
        fresh -= self._seen
        self._seen |= fresh
        self._first = heapq.nsmallest(MAX_RETIRED_KEYS_SHOWN, [*self._first, *fresh])

    def reply(self) -> RetireReply:
        return RetireReply(retired=self._first, retired_count=len(self._seen))


class Record(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, gc=False):
    """Base of every kind's record: the episode it captures, its boundary and length.

    ``gc=False`` (inherited by every kind's record): a record holds only scalars, strings,
    lists of those and other ``gc=False`` Structs, so it can close no reference cycle, and
    the collector need not track the 64,000 of them a commit or a restore makes
    (tests/participants/test_gc_free.py checks every kind's types and instances).
    """

    episode_id: EpisodeId
    boundary: int
    steps: int


S = TypeVar("S", bound=msgspec.Struct)
R = TypeVar("R", bound=Record)


class Workload(Generic[S, R]):
    """Episodes, admission, the retired-attempt fence and the checkpoint hooks of one kind."""

    #: The participant kind it serves: a ``Kind`` constant, or a name of the user's own
    #: (``ckpt_events.vocab.NAME_RULE``).
    kind: ClassVar[str]
    #: The kind's record class (set on the subclass; ``R`` is not allowed in a ``ClassVar``).
    record_type: type[R]

    def __init__(self, tel: Telemetry, **options: Any) -> None:
        if options:
            raise InvalidTypeError(f"unknown {self.kind} workload options: {', '.join(sorted(options))}")
        self.tel = tel
        self.fence = RetiredAttempts()
        self.episodes: EpisodeTable[S] = EpisodeTable()
        # The cancel scope of each unit of work in progress, by capture key.
        self._scopes: dict[str, anyio.CancelScope] = {}
        self.admission_open = True
        self.served = False
        self._changed = anyio.Event()
        self._reopened = anyio.Event()

    # -- hooks ------------------------------------------------------------------------------

    def initial_state(self, episode_id: EpisodeId, steps: int) -> S:
        """The state of a new episode."""
        raise NotImplementedError

    async def work(self, episode: Episode[S]) -> None:
        """One unit of real work on ``episode`` (the base moves the boundary afterwards)."""
        raise NotImplementedError

    def to_record(self, episode: Episode[S]) -> R:
        raise NotImplementedError

    def from_record(self, record: R) -> S:
        """The state to install from ``record``; raise ``InvalidCheckpointError`` if it does not check."""
        raise NotImplementedError

    def describe(self, episode: Episode[S]) -> dict[str, Any]:
        """Kind-specific state for ``GET /work/{capture_key}``."""
        return {}

    def counts(self) -> dict[str, int]:
        return {"episodes": len(self.episodes)}

    def blocking(self, episode: Episode[S]) -> bool:
        """Whether ``episode`` keeps a prepare from being ready."""
        return episode.status == "running"

    async def on_admission_closed(self, op: OperationSpan, checkpoint_id: str, deadline_ts: float) -> None:
        """Called once per checkpoint right after admission closes (the model cuts here)."""

    def commit_extras(self, keys: Sequence[str]) -> dict[str, Any]:
        """Extra fields of the commit reply for the exported ``keys``."""
        return {}

    async def aclose(self) -> None:
        """Release what the workload holds (HTTP clients)."""

    # -- admission and readiness ------------------------------------------------------------

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def close_admission(self) -> None:
        self.admission_open = False
        self._reopened = anyio.Event()
        self._notify()

    def open_admission(self) -> None:
        self.admission_open = True
        self._reopened.set()
        self._notify()

    async def wait_reopened(self) -> None:
        await self._reopened.wait()

    async def wait_changed(self, timeout: float) -> None:
        """Return on the next change of any episode, or after ``timeout`` seconds."""
        changed = self._changed
        with anyio.move_on_after(max(timeout, 0.0)):
            await changed.wait()

    def episode(self, episode_id: EpisodeId, steps: int, boundary: int, state: S) -> Episode[S]:
        """A new idle episode for ``episodes`` (not yet in it)."""
        return Episode(episode_id, episode_id.capture_key, steps, boundary, state, self.episodes.statuses)

    def report(self) -> PrepareReport:
        """Readiness: the first ``MAX_BLOCKERS`` blocking capture keys in sorted order, and
        how many block.

        With the base ``blocking`` (``running`` blocks), the table's running keys are read,
        not every episode: asking each held the loop ~7-10 ms a check at 100,000 episodes. A
        ``blocking`` overridden (on the class or the instance) may read anything, so then
        every episode is asked, as before."""
        blockers: Collection[str]
        if getattr(self.blocking, "__func__", None) is Workload.blocking:
            blockers = self.episodes.with_status("running")
        else:
            blocking = self.blocking
            blockers = [e.key for e in self.episodes.values() if blocking(e)]
        # Only the shown ones are ordered: a full sort cost ~30 ms at 100,000 running episodes
        # with UUID rollout ids (~7 ms so), and prepare's wait runs this on every change.
        return PrepareReport(
            ready=not blockers,
            blockers=heapq.nsmallest(MAX_BLOCKERS, blockers),
            blocker_count=len(blockers),
            counts=self.counts(),
        )

    # -- the workload API -------------------------------------------------------------------

    def _admit(self, episode_id: EpisodeId) -> None:
        self.fence.check(episode_id)
        if not self.admission_open:
            raise ProtocolRefusal(ErrorCode.ADMISSION_CLOSED, "a checkpoint is open: retry after it resumes")

    def start(self, episode_id: EpisodeId, steps: int) -> Episode[S]:
        self._admit(episode_id)
        self.served = True
        key = episode_id.capture_key
        episode = self.episodes.get(key)
        if episode is None:
            episode = self.episode(episode_id, steps, 0, self.initial_state(episode_id, steps))
            self.episodes[key] = episode
            self._notify()
        return episode

    def get(self, key: str) -> Episode[S] | None:
        return self.episodes.get(key)

    async def advance(self, episode_id: EpisodeId) -> Episode[S]:
        self._admit(episode_id)
        episode = self.episodes.get(episode_id.capture_key)
        if episode is None:
            raise LookupError(episode_id.capture_key)
        self.served = True
        if episode.stopped:
            raise ProtocolRefusal(ErrorCode.ADMISSION_CLOSED, f"{episode.key} was stopped by a checkpoint")
        if episode.done:
            return episode
        if episode.status != "idle":
            raise ProtocolRefusal(ErrorCode.CHECKPOINT_ERROR, f"{episode.key} is already advancing")
        episode.status = "running"
        self._notify()
        try:
            with anyio.CancelScope() as self._scopes[episode.key]:
                await self.work(episode)
                episode.boundary += 1
        finally:
            self._scopes.pop(episode.key, None)
            episode.status = "idle"
            self._notify()
        # A retire cancelled the unit of work: the attempt is gone.
        self.fence.check(episode_id)
        return episode

    # -- checkpoint hooks used by the control plane -----------------------------------------

    async def export(self, scope: Iterable[EpisodeId] | None) -> list[R]:
        """Records of the episodes in scope (all when ``scope`` is None), sorted by capture key."""
        if scope is None:
            chosen = list(self.episodes.values())
        else:
            chosen = [e for e in (self.episodes.get(i.capture_key) for i in scope) if e is not None]
        chosen.sort(key=_by_key)
        return [self.to_record(e) for e in chosen]

    def stop(self, keys: Iterable[str]) -> None:
        """Checkpoint-and-stop: exported episodes take no more work in this process."""
        for key in keys:
            if (episode := self.episodes.get(key)) is not None:
                episode.stopped = True

    def check_record(self, record: Record) -> S:
        """Validate one record before anything is installed; returns the state to install."""
        if not isinstance(record, self.record_type):
            key = record.episode_id.capture_key
            raise InvalidCheckpointError(f"record of {key} is not a {self.kind} record")
        if not 0 <= record.boundary <= record.steps or record.steps < 1:
            key = record.episode_id.capture_key
            raise InvalidCheckpointError(f"record of {key} has boundary {record.boundary} of {record.steps}")
        return self.from_record(record)

    @contextmanager
    def installing(self) -> Iterator[None]:
        """The block a restore calls ``install`` in: all or nothing. If the block raises
        (cancellation too), the episodes and the fence are put back as they were before it
        (what ``install``, or a subclass's override of it, had put in is taken out) and the error
        goes on, so the participant is as fresh as before and the same restore can be retried."""
        episodes = dict(self.episodes)
        with self.fence.undone_on_error():
            try:
                yield
            except BaseException:
                # Was: the episodes installed before the raise stayed, and the participant,
                # no longer fresh, refused the retry ("restore needs a fresh participant").
                self.episodes.clear()
                self.episodes.update(episodes)
                self._notify()
                raise

    async def install(self, records: Sequence[Record], states: Sequence[S]) -> list[str]:
        """Install each record as attempt + 1 and fence the attempt it came from. A restore
        calls it inside ``installing()``, which takes everything out again if it raises: an
        override may refuse a record part way (``InvalidCheckpointError``: 422) and leave
        nothing behind."""
        if len(records) != len(states):
            raise ValueError(f"{len(records)} records but {len(states)} states")
        self.fence.mark_all(r.episode_id for r in records)
        episodes = self.episodes
        restored = []
        for record, state in zip(records, states, strict=True):
            episode = self.episode(record.episode_id.next(), record.steps, record.boundary, state)
            episodes[episode.key] = episode
            restored.append(episode.key)
        self._notify()
        restored.sort()
        return restored

    async def retire(self, episode_ids: Iterable[EpisodeId]) -> RetireReply:
        """Raise the marks first, then cancel and free the retired attempts' state; the reply
        names the first ``MAX_RETIRED_KEYS_SHOWN`` capture keys (sorted) and counts them all.

        The marks go up ``RETIRE_CHUNK`` at a time, the loop free between chunks (64,000 ids
        held it ~120 ms): a work call answered in between sees each rollout either marked or
        not yet, as if it came before or after the retire; those it starts are freed below."""
        ids = list(episode_ids)
        retired = RetiredKeys()
        for at in range(0, len(ids), RETIRE_CHUNK):
            chunk = ids[at : at + RETIRE_CHUNK]
            self.fence.mark_all(chunk)
            retired.add(chunk)
            await anyio.lowlevel.checkpoint()
        doomed = [e for e in self.episodes.values() if self.fence.is_retired(e.episode_id)]
        for episode in doomed:
            if (scope := self._scopes.get(episode.key)) is not None:
                scope.cancel()
        with anyio.move_on_after(_RETIRE_WAIT):
            while any(e.status != "idle" for e in doomed):
                await self.wait_changed(0.05)
        for episode in doomed:
            self.episodes.pop(episode.key, None)
        self._notify()
        return retired.reply()


_by_key: Final = operator.attrgetter("key")


def finite_sleep(seconds: float) -> float:
    """Clamp a configured delay to something sane."""
    return 0.0 if not math.isfinite(seconds) or seconds < 0 else min(seconds, 60.0)
