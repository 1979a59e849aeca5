"""``Placement``: which worker of a multi-worker server holds each session, and the work calls
sent there.

A session's state lives in one worker, so placement is sticky: a new session goes to the
connected worker holding the fewest, and every later call for it (advance, get) goes to the
same worker until it is retired or that worker is lost. ``assign_parts`` is the same rule for a
restore: each records file of a checkpoint goes back to the worker that wrote it. The fan-out
to every worker at once (admission, readiness, commit, restore) is ``pool.WorkerPool``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Final, TypeVar

from ckpt_events.participants.errors import ProtocolRefusal, WorkerChannelError
from ckpt_events.participants.protocol import EpisodeId, RecordsPart
from ckpt_events.participants.server.store_read import Share
from ckpt_events.participants.server.work import EpisodeGone, EpisodeView
from ckpt_events.participants.server.workers.coordinator import WorkerCoordinator
from ckpt_events.participants.server.workers.frames import Advance, Advanced, Get, Request, Start, Started
from ckpt_events.participants.workloads.fence import RetiredAttempts
from ckpt_events.vocab import ErrorCode

__all__ = ["Placement", "assign_parts"]

R = TypeVar("R")
#: Sessions lost with their worker remembered (for the 404 that says so), the oldest forgotten first.
LOST_KEPT: Final = 4096


def assign_parts(parts: Sequence[RecordsPart], workers: int) -> dict[int, list[tuple[RecordsPart, Share]]]:
    """Which worker reads what of a checkpoint's records files, each record read by exactly one.

    The parts of a multi-worker checkpoint go back to the worker that wrote them (its
    sessions return to their pre-crash owner), part ``w`` to worker ``w % workers`` when
    there are fewer workers now; a worker index that did not exist then gets nothing. The one
    file of a single-process checkpoint is shared out: worker ``i`` of ``n`` takes every
    ``n``-th record from the ``i``-th (each still reads and verifies the whole file).
    """
    plan: dict[int, list[tuple[RecordsPart, Share]]] = {i: [] for i in range(workers)}
    if len(parts) == 1 and parts[0].worker == 0 and workers > 1:
        for index in range(workers):
            plan[index].append((parts[0], Share(workers, index)))
        return plan
    for part in parts:
        plan[part.worker % workers].append((part, Share()))
    return plan


def _same_session(reply: R, index: int, what: str, key: str) -> R:
    """A worker's ``reply`` about session ``key``; one about another session is the worker's fault
    (503, logged), never passed on to the client."""
    if getattr(reply, "capture_key", key) != key or getattr(reply, "worker", index) != index:
        raise ProtocolRefusal(
            ErrorCode.CHECKPOINT_COORDINATOR_UNAVAILABLE,
            f"worker {index} answered {what} of {key} for another session",
        )
    return reply


class Placement:
    """Which of ``coordinator``'s workers holds each session (``owners``: capture key -> worker
    index), and the work calls (``start``, ``advance``, ``get``) routed to that worker.

    ``admit(episode_id)`` is the server's gate (its fence and admission), called before each
    ``start`` and ``advance``: it raises the refusal of a call that may not run now.
    """

    def __init__(self, coordinator: WorkerCoordinator, admit: Callable[[EpisodeId], None]) -> None:
        self.coordinator = coordinator
        self.owners: dict[str, int] = {}
        #: Sessions lost with their worker (capture key -> that worker), until started again.
        self.lost: dict[str, int] = {}
        #: Whether a work call was admitted (a restore needs a fresh participant).
        self.served = False
        self._admit = admit

    def worker_url(self, key: str) -> str | None:
        """The own port of the worker holding ``key``, for the client's next calls."""
        owner = self.owners.get(key)
        return None if owner is None else self.coordinator.urls.get(owner)

    # -- changes of placement ---------------------------------------------------------------

    def place(self, index: int, keys: Iterable[str]) -> None:
        """Worker ``index`` holds ``keys`` (it installed them)."""
        for key in keys:
            self.owners[key] = index

    def unplace(self, keys: Iterable[str]) -> None:
        """Nobody holds ``keys`` any more (a failed restore took them out)."""
        for key in keys:
            self.owners.pop(key, None)

    def drop_worker(self, index: int) -> list[str]:
        """Worker ``index`` is lost, and its sessions with it: returns them (sorted)."""
        gone = sorted(k for k, w in self.owners.items() if w == index)
        self.owners = {k: w for k, w in self.owners.items() if w != index}
        for key in gone:
            self.lost[key] = index
        for key in list(self.lost)[: max(0, len(self.lost) - LOST_KEPT)]:
            del self.lost[key]
        return gone

    def drop_retired(self, fence: RetiredAttempts) -> None:
        """Forget the sessions whose attempt ``fence`` has retired."""
        self.owners = {
            k: w for k, w in self.owners.items() if not fence.is_retired(EpisodeId.from_capture_key(k))
        }
        self.lost = {
            k: w for k, w in self.lost.items() if not fence.is_retired(EpisodeId.from_capture_key(k))
        }

    def _gone(self, key: str) -> LookupError:
        """Why nobody holds ``key``: lost with its worker (``EpisodeGone``), or never here."""
        index = self.lost.get(key)
        if index is None:
            return LookupError(key)
        return EpisodeGone(key, f"episode {key} was lost with worker {index}: start it again")

    def by_worker(self, keys: Iterable[str]) -> dict[int, list[str]]:
        """``keys`` grouped by the worker holding each; a key nobody holds is left out."""
        grouped: dict[int, list[str]] = {}
        for key in keys:
            if (owner := self.owners.get(key)) is not None:
                grouped.setdefault(owner, []).append(key)
        return grouped

    def _least_loaded(self, candidates: Sequence[int]) -> int:
        load = dict.fromkeys(candidates, 0)
        for owner in self.owners.values():
            if owner in load:
                load[owner] += 1
        return min(candidates, key=lambda i: (load[i], i))

    # -- the work calls ---------------------------------------------------------------------

    async def _request(self, index: int, body: Request[R]) -> R:
        try:
            return await self.coordinator.channel(index).request(body, timeout=self.coordinator.reply_seconds)
        except WorkerChannelError as exc:
            raise ProtocolRefusal(ErrorCode.CHECKPOINT_COORDINATOR_UNAVAILABLE, str(exc)) from None

    async def start(self, episode_id: EpisodeId, steps: int) -> Started:
        """Start ``episode_id`` on the worker holding it, else on the least-loaded connected one."""
        self._admit(episode_id)
        key = episode_id.capture_key
        owner = self.owners.get(key)
        if owner is None:
            connected = self.coordinator.connected()
            if not connected:
                raise ProtocolRefusal(ErrorCode.CHECKPOINT_COORDINATOR_UNAVAILABLE, "no worker is connected")
            owner = self._least_loaded(connected)
        self.served = True
        reply = _same_session(await self._request(owner, Start(episode_id, steps)), owner, "start", key)
        self.owners[key] = owner
        self.lost.pop(key, None)
        return reply

    async def advance(self, episode_id: EpisodeId) -> Advanced:
        """One step of ``episode_id`` on its worker; ``LookupError`` if no worker holds it
        (``EpisodeGone`` if one held it and was lost)."""
        self._admit(episode_id)
        key = episode_id.capture_key
        owner = self.owners.get(key)
        if owner is None:
            raise self._gone(key)
        self.served = True
        reply = await self._request(owner, Advance(episode_id))
        if reply is None:
            raise LookupError(key)
        return reply

    async def get(self, key: str) -> EpisodeView | None:
        """The view of session ``key`` from its worker; ``None`` if no worker holds it
        (``EpisodeGone`` if one held it and was lost)."""
        owner = self.owners.get(key)
        if owner is None:
            if key in self.lost:
                raise self._gone(key)
            return None
        reply = await self._request(owner, Get(key))
        return None if reply is None else _same_session(reply, owner, "get", key)
