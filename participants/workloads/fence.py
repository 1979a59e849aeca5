"""The retired-attempt fence: the highest retired attempt per rollout."""

from __future__ import annotations

from collections.abc import Iterable

from ckpt_events.participants.errors import ProtocolRefusal
from ckpt_events.participants.protocol import EpisodeId
from ckpt_events.vocab import ErrorCode

__all__ = ["RetiredAttempts"]


class RetiredAttempts:
    """Per rollout, the highest retired attempt; a request at or below it is ``stale_attempt``.

    A mark only rises, and only ``forget`` clears it: a call its caller sent just before its
    own retire can still arrive after this server's retire finished.
    """

    def __init__(self) -> None:
        self._marks: dict[str, int] = {}

    def mark(self, episode: EpisodeId) -> None:
        """Retire ``episode`` and every earlier attempt of its rollout."""
        self.mark_all((episode,))

    def mark_all(self, episodes: Iterable[EpisodeId]) -> None:
        """``mark`` each of ``episodes`` (one call for a restore's tens of thousands)."""
        marks = self._marks
        for episode in episodes:
            if episode.attempt > marks.get(episode.rollout_id, -1):
                marks[episode.rollout_id] = episode.attempt

    def forget(self, rollout_id: str) -> bool:
        """Clear the mark of ``rollout_id``; true if there was one."""
        return self._marks.pop(rollout_id, None) is not None

    def is_retired(self, episode: EpisodeId) -> bool:
        mark = self._marks.get(episode.rollout_id)
        return mark is not None and episode.attempt <= mark

    def check(self, episode: EpisodeId) -> None:
        """Raise ``stale_attempt`` if ``episode`` is at or below its rollout's mark."""
        if self.is_retired(episode):
            raise ProtocolRefusal(
                ErrorCode.STALE_ATTEMPT,
                f"attempt {episode.attempt} of rollout {episode.rollout_id} is retired "
                f"(retired up to attempt {self._marks[episode.rollout_id]})",
            )

    def snapshot(self) -> dict[str, int]:
        return dict(self._marks)
