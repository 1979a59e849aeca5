"""The retired-attempt fence: the highest retired attempt per rollout, kept for a bounded time."""

from __future__ import annotations

import itertools
import math
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Final

from ckpt_events.participants.errors import ProtocolRefusal, check_int, check_number, shown
from ckpt_events.participants.protocol import EpisodeId
from ckpt_events.vocab import ErrorCode

__all__ = ["DEFAULT_MAX_RETIRED", "DEFAULT_RETIRED_SECONDS", "RetiredAttempts"]

#: Marks kept at most: above the largest restore we measure (64,000 rollouts, every one
#: marked), and about 25 MB at ~250 bytes a mark with its UUID rollout id.
DEFAULT_MAX_RETIRED: Final = 100_000
#: How long a mark is kept after its rollout was last retired: six times the default lease
#: grace (600 s), far past any call its caller sent before the retire.
DEFAULT_RETIRED_SECONDS: Final = 3600.0


class RetiredAttempts:
    """Per rollout, the highest retired attempt; a request at or below it is ``stale_attempt``.

    A mark only rises: a call its caller sent just before its own retire can still arrive
    after this server's retire finished. ``forget`` clears it, and so does the retention, so
    that a long-running server's marks stay bounded: a mark is forgotten once its rollout was
    last marked more than ``max_age_seconds`` ago (``math.inf``: never), and the oldest marks
    go first when more than ``max_marks`` are held. The count is kept at every ``mark``; the
    age at every ``mark`` and ``expire`` (a participant app calls it about once a second).
    ``expired`` counts the marks the retention forgot (``forget`` calls are not counted).
    """

    def __init__(
        self,
        *,
        max_marks: int = DEFAULT_MAX_RETIRED,
        max_age_seconds: float = DEFAULT_RETIRED_SECONDS,
    ) -> None:
        # Rollout id -> (highest retired attempt, monotonic time it was last marked), oldest
        # first: the retention pops from the front, in O(1) each.
        self._marks: OrderedDict[str, tuple[int, float]] = OrderedDict()
        self.max_marks = _checked_count(max_marks)
        self.max_age_seconds = _checked_age(max_age_seconds)
        #: Marks the retention forgot (too old, or past ``max_marks``) since this fence was made.
        self.expired = 0

    def retain(self, *, max_marks: int, max_age_seconds: float) -> None:
        """Set the retention (see the class) and apply it now."""
        self.max_marks = _checked_count(max_marks)
        self.max_age_seconds = _checked_age(max_age_seconds)
        self.expire()

    def __len__(self) -> int:
        return len(self._marks)

    def mark(self, episode: EpisodeId) -> None:
        """Retire ``episode`` and every earlier attempt of its rollout."""
        self.mark_all((episode,))

    def mark_all(self, episodes: Iterable[EpisodeId]) -> None:
        """``mark`` each of ``episodes`` (one call for a restore's tens of thousands)."""
        marks = self._marks
        to_end = marks.move_to_end
        now = time.monotonic()
        for episode in episodes:
            rollout_id = episode.rollout_id
            held = marks.get(rollout_id)
            if held is None:
                marks[rollout_id] = (episode.attempt, now)
            else:
                # Marked again: the rollout is still in use, its mark starts a new age.
                marks[rollout_id] = (max(episode.attempt, held[0]), now)
                to_end(rollout_id)
        self.expire(now)

    def expire(self, now: float | None = None) -> int:
        """Forget the marks past the retention (``now``: ``time.monotonic()``); how many went."""
        marks = self._marks
        before = len(marks)
        over = before - self.max_marks
        if over > 0:
            for _ in range(over):
                marks.popitem(last=False)
        if marks and not math.isinf(self.max_age_seconds):
            cutoff = (time.monotonic() if now is None else now) - self.max_age_seconds
            # Oldest first: stop at the first mark young enough.
            while marks and next(iter(marks.values()))[1] <= cutoff:
                marks.popitem(last=False)
        gone = before - len(marks)
        self.expired += gone
        return gone

    @contextmanager
    def undone_on_error(self) -> Iterator[None]:
        """Run a block that may mark, forget or expire; if it raises (cancellation too), every
        mark is put back as it was before the block (attempt, age and place in the retention
        order), as is ``expired``, and the error goes on: a failed restore fences nothing."""
        # A copy of every mark: ~11 ms at the 100,000 the retention keeps at most, against
        # ~1.2 s for the restore of 64,000 rollouts it guards; nothing for a fresh participant.
        marks = list(self._marks.items())
        expired = self.expired
        try:
            yield
        except BaseException:
            self._marks.clear()
            self._marks.update(marks)
            self.expired = expired
            raise

    def forget(self, rollout_id: str) -> bool:
        """Clear the mark of ``rollout_id``; true if there was one."""
        return self._marks.pop(rollout_id, None) is not None

    def forget_all(self, rollout_ids: Sequence[str]) -> int:
        """``forget`` each of ``rollout_ids`` (a multi-worker server tells its workers at once);
        how many had a mark."""
        return sum(self.forget(rollout_id) for rollout_id in rollout_ids)

    def is_retired(self, episode: EpisodeId) -> bool:
        held = self._marks.get(episode.rollout_id)
        return held is not None and episode.attempt <= held[0]

    def check(self, episode: EpisodeId) -> None:
        """Raise ``stale_attempt`` if ``episode`` is at or below its rollout's mark."""
        if self.is_retired(episode):
            raise ProtocolRefusal(
                ErrorCode.STALE_ATTEMPT,
                f"attempt {episode.attempt} of rollout {episode.rollout_id} is retired "
                f"(retired up to attempt {self._marks[episode.rollout_id][0]})",
            )

    def snapshot(self) -> dict[str, int]:
        """Every mark (rollout id -> attempt), oldest first (what a worker that joins gets)."""
        return {rollout_id: attempt for rollout_id, (attempt, _) in self._marks.items()}

    def newest(self, count: int) -> dict[str, int]:
        """The ``count`` most recently marked (rollout id -> attempt), oldest of them first."""
        recent = list(itertools.islice(reversed(self._marks.items()), count))
        return {rollout_id: attempt for rollout_id, (attempt, _) in reversed(recent)}


def _checked_count(max_marks: int) -> int:
    return check_int(max_marks, f"max_marks must be a positive int, not {shown(max_marks)}", minimum=1)


def _checked_age(max_age_seconds: float) -> float:
    what = f"max_age_seconds must be > 0 (math.inf: no limit), not {shown(max_age_seconds)}"
    return check_number(max_age_seconds, what, low_open=True)
