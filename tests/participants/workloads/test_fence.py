"""RetiredAttempts: the fence's marks only rise, and its retention keeps them bounded."""

from __future__ import annotations

import math
import time

import pytest

from ckpt_events import InvalidTypeError, InvalidValueError
from ckpt_events.participants.errors import ProtocolRefusal
from ckpt_events.participants.protocol import EpisodeId
from ckpt_events.participants.workloads.fence import RetiredAttempts


def test_a_mark_fences_its_attempt_and_every_earlier_one_and_only_rises():
    """Marking attempt 2 fences 0-2, not 3; a later mark of attempt 1 does not lower it."""
    fence = RetiredAttempts()
    fence.mark(EpisodeId("r1", 2))
    fence.mark(EpisodeId("r1", 1))
    assert [fence.is_retired(EpisodeId("r1", a)) for a in range(4)] == [True, True, True, False]
    with pytest.raises(ProtocolRefusal, match="retired up to attempt 2"):
        fence.check(EpisodeId("r1", 0))
    assert fence.forget("r1") and not fence.forget("r1")
    assert not fence.is_retired(EpisodeId("r1", 0)) and len(fence) == 0


def test_the_count_cap_drops_the_least_recently_marked_first():
    """Past max_marks the oldest marks go; marking a rollout again makes it the newest."""
    fence = RetiredAttempts(max_marks=3)
    fence.mark_all(EpisodeId(r) for r in ("a", "b", "c"))
    fence.mark(EpisodeId("a", 1))  # "a" is the newest now: "b" is the oldest
    fence.mark(EpisodeId("d"))
    assert fence.snapshot() == {"c": 0, "a": 1, "d": 0}
    assert fence.expired == 1
    assert fence.newest(2) == {"a": 1, "d": 0}
    assert fence.newest(10) == fence.snapshot()


def test_marks_older_than_the_age_are_forgotten_by_expire():
    """expire forgets every mark last marked max_age_seconds ago or earlier, and counts them."""
    fence = RetiredAttempts(max_age_seconds=60)
    fence.mark_all(EpisodeId(f"r{i}") for i in range(5))
    now = time.monotonic()
    assert fence.expire(now) == 0
    assert fence.expire(now + 61) == 5
    assert (len(fence), fence.expired) == (0, 5)
    unlimited = RetiredAttempts(max_age_seconds=math.inf)
    unlimited.mark(EpisodeId("r1"))
    assert unlimited.expire(now + 1e9) == 0 and len(unlimited) == 1


def test_retain_applies_a_smaller_cap_at_once():
    """retain sets the retention and applies it to the marks already held."""
    fence = RetiredAttempts()
    fence.mark_all(EpisodeId(f"r{i}") for i in range(10))
    fence.retain(max_marks=4, max_age_seconds=3600)
    assert list(fence.snapshot()) == ["r6", "r7", "r8", "r9"] and fence.expired == 6


@pytest.mark.parametrize(
    ("max_marks", "max_age_seconds", "error"),
    [
        (0, 1.0, InvalidValueError),
        (True, 1.0, InvalidTypeError),
        (10, -1, InvalidValueError),
        (10, math.nan, InvalidValueError),
        (10, None, InvalidTypeError),
    ],
)
def test_a_bad_retention_is_refused(max_marks, max_age_seconds, error):
    """The cap is a positive int, the age a positive number of seconds (math.inf: no limit)."""
    with pytest.raises(error):
        RetiredAttempts(max_marks=max_marks, max_age_seconds=max_age_seconds)


def test_a_block_that_raises_leaves_every_mark_as_it_was():
    """undone_on_error: marks, their order (who goes first at the cap), the ones the cap dropped
    inside the block and the ``expired`` count are put back when the block raises; kept when not."""
    fence = RetiredAttempts(max_marks=3)
    fence.mark_all(EpisodeId(r) for r in ("a", "b", "c"))
    before = (fence.snapshot(), fence.expired)
    with pytest.raises(RuntimeError, match="half way"), fence.undone_on_error():
        fence.mark(EpisodeId("a", 5))  # "a" raised and moved to the end
        fence.mark(EpisodeId("d"))  # "b" dropped by the cap
        fence.forget("c")
        raise RuntimeError("half way")
    assert (fence.snapshot(), fence.expired) == before
    fence.mark(EpisodeId("d"))  # the order came back too: "a" is still the oldest, so it goes
    assert fence.snapshot() == {"b": 0, "c": 0, "d": 0}
    with fence.undone_on_error():
        fence.mark(EpisodeId("e"))
    assert "e" in fence.snapshot()
