"""Episodes, and the table of one workload's episodes that counts them by status as they change.

Readiness asks which episodes are ``running``; asking each of 100,000 episodes held the loop
~7-10 ms a check (with the kinds' counts). ``EpisodeTable`` keeps, for each status but
``idle``, the capture keys of the episodes in it that have that status: an episode's
``status`` setter and the table's own writes keep it, so it is exact whatever writes them (a
workload, a test, an override) and answering costs nothing per idle episode.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Final, Generic, TypeVar, overload

import msgspec

from ckpt_events.participants.protocol import EpisodeId

__all__ = ["IDLE", "Episode", "EpisodeTable"]

IDLE: Final = "idle"

S = TypeVar("S", bound=msgspec.Struct)
T = TypeVar("T")

#: Status -> the capture keys of a table's episodes with that status (never ``idle``). Strings
#: only, so an episode that refers to it closes no reference cycle.
Statuses = dict[str, dict[str, None]]


class Episode(msgspec.Struct, Generic[S], gc=False, eq=False):
    """One episode's live state. ``status``: ``idle`` (at a boundary), ``running`` or ``held``.

    ``key`` is ``episode_id.capture_key``, computed once by whoever makes the episode. Like a
    record, an episode holds no object that could lead back to it (its cancel scope, while a
    unit of work runs, is kept by the workload), so it is ``gc=False``. Make one with
    ``Workload.episode``: ``statuses`` is its workload's table's, which ``status`` keeps while
    the episode is in that table.
    """

    episode_id: EpisodeId
    key: str
    steps: int
    boundary: int
    state: S
    statuses: Statuses
    _status: str = IDLE
    stopped: bool = False
    # Whether it is in its table now (the table sets it): only then does ``status`` count.
    _listed: bool = False

    @property
    def status(self) -> str:
        return self._status

    @status.setter
    def status(self, value: str) -> None:
        was = self._status
        self._status = value
        if self._listed and was != value:
            _unlist(self.statuses, was, self.key)
            _list(self.statuses, value, self.key)

    @property
    def done(self) -> bool:
        return self.boundary >= self.steps


def _list(statuses: Statuses, status: str, key: str) -> None:
    if status != IDLE:
        statuses.setdefault(status, {})[key] = None


def _unlist(statuses: Statuses, status: str, key: str) -> None:
    if status != IDLE:
        del statuses[status][key]


def _leave(episode: Episode[S]) -> None:
    episode._listed = False
    _unlist(episode.statuses, episode._status, episode.key)


class EpisodeTable(dict[str, Episode[S]]):
    """A workload's episodes by capture key: a ``dict`` whose writes keep ``statuses`` (reads
    cost what a dict's cost). An episode goes in under its own ``key``, made for this table
    (``Workload.episode``), and in one table at a time; else ``ValueError``."""

    def __init__(self) -> None:
        super().__init__()
        self.statuses: Statuses = {}

    def with_status(self, status: str) -> Collection[str]:
        """The capture keys of the episodes with ``status`` (not ``idle``), in no order; live."""
        if status == IDLE:
            raise ValueError("idle episodes are not listed: count them with count('idle')")
        return self.statuses.get(status, {}).keys()

    def count(self, status: str) -> int:
        """How many episodes have ``status``, without visiting them."""
        if status == IDLE:
            return len(self) - sum(map(len, self.statuses.values()))
        return len(self.statuses.get(status, ()))

    def __setitem__(self, key: str, episode: Episode[S]) -> None:
        old = self.get(key)
        if old is episode:
            return
        if key != episode.key:
            raise ValueError(f"episode {episode.key} put under another key, {key}")
        if episode.statuses is not self.statuses or episode._listed:
            raise ValueError(f"episode {key} belongs to another workload's table")
        if old is not None:
            _leave(old)
        dict.__setitem__(self, key, episode)
        # Inlined (no helper call): a restore puts 64,000 episodes in through here.
        episode._listed = True
        if episode._status != IDLE:
            _list(self.statuses, episode._status, key)

    def __delitem__(self, key: str) -> None:
        episode = self[key]
        super().__delitem__(key)
        _leave(episode)

    @overload
    def pop(self, key: str, /) -> Episode[S]: ...
    @overload
    def pop(self, key: str, default: Episode[S], /) -> Episode[S]: ...
    @overload
    def pop(self, key: str, default: T, /) -> Episode[S] | T: ...
    def pop(self, key: str, *default: object) -> object:
        if key not in self:
            if default:
                return default[0]
            raise KeyError(key)
        episode = super().pop(key)
        _leave(episode)
        return episode

    def popitem(self) -> tuple[str, Episode[S]]:
        key, episode = super().popitem()
        _leave(episode)
        return key, episode

    def clear(self) -> None:
        for episode in self.values():
            episode._listed = False
        super().clear()
        self.statuses.clear()

    def setdefault(self, key: str, default: Episode[S], /) -> Episode[S]:
        if key not in self:
            self[key] = default
        return self[key]

    def update(  # type: ignore[override]
        self, other: Mapping[str, Episode[S]] | Iterable[tuple[str, Episode[S]]] = (), /
    ) -> None:
        for key, episode in other.items() if isinstance(other, Mapping) else other:
            self[key] = episode

    def __ior__(self, other: Mapping[str, Episode[S]]) -> EpisodeTable[S]:  # type: ignore[override,misc]
        self.update(other)
        return self
