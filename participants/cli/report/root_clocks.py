"""A bare coordinator's checkpoint across its root spans: how long it took when the controller's
wall clock stepped between them, or why that is unknown.

Such a checkpoint spans several root spans (prepare, commit, resume), each stamped on the wall
clock as it began; within one root every stamp is on that root's offset (its children anchored
to it), so a step shows only between roots. Each root also carries the monotonic clock read
beside its start (``CoordinateFinished.monotonic_start_ns``): the time between roots is read on
it. A log written before that field falls back on the stamps' order, which sees a step back (the
roots out of the order they ran in) and never a step forward.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Final

from ckpt_events.participants.cli.report.roots import RootEnd
from ckpt_events.vocab import Operation

__all__ = ["FIRST", "ROOTS_SLACK_NS", "wall_step"]

#: A row's coordinate operations that the controller runs first: a second one opens a new row.
FIRST: Final = frozenset((Operation.PREPARE, Operation.RESTORE))
#: Stamps of one process this far out of that order (ns) are a clock stepped between them, as
#: ``logs`` takes a file back by more than a millisecond for one; offsets of its roots this far
#: apart are a wall clock stepped between them.
ROOTS_SLACK_NS: Final = 1_000_000


def wall_step(ends: Sequence[RootEnd]) -> tuple[int | None, int | None, str | None]:
    """How far the controller's wall clock stepped between the root spans ``ends`` (one row's,
    ended) and the row's duration on its monotonic clock (both ``None`` without a step), and why
    the duration is unknown, if it is (``_disagree``). Where every root carries its monotonic
    start, all from one process, the time from the first one's start to the last one's end is
    read on that clock, a wall clock stepped forward or back between them left out. Was: a clock
    stepped forward an hour between a prepare and its commit, every root in order and every
    answer inside its call, made the checkpoint "3600073.0 ms" (73.0 ms on true clocks)."""
    if len(ends) < 2 or len({(f.kind, f.instance, f.worker) for f in ends}) > 1:
        return None, None, _disagree(ends)
    # (monotonic start, monotonic end, wall-clock offset) of each root, in the order they ran.
    timed = sorted(
        (m, m + (f.end_ns - f.start_ns), f.start_ns - m)
        for f in ends
        if (m := f.monotonic_start_ns) is not None
    )
    if len(timed) < len(ends):
        return None, None, _disagree(ends)
    stepped = timed[-1][2] - timed[0][2]
    if abs(stepped) <= ROOTS_SLACK_NS:
        return None, None, _disagree(ends)
    return stepped, max(end for _, end, _ in timed) - timed[0][0], None


def _disagree(ends: Sequence[RootEnd]) -> str | None:
    """Why a row's duration is unknown, if it is: it spans several root spans (a bare
    coordinator's prepare, commit and resume), each stamped on the wall clock when it began, and
    their stamps disagree. A single root's duration is its own (its end is its start plus a
    monotonic time), whatever a clock did; a participant that answered outside a call (its own
    clock, or the controller's, stepped) leaves it known unless the roots disagree too (the
    controller's on another host, it is true). Was: a clock stepped back an hour between a prepare
    and its commit made the checkpoint "3600000.0 ms" and the run "0.0% of the logs' 3600.0 s"."""
    for before, after in itertools.pairwise(sorted(ends, key=lambda f: f.start_ns)):
        if after.operation in FIRST and before.operation not in FIRST:
            said = f"its {before.operation} stamped before its {after.operation}"
        elif after.start_ns < before.end_ns - ROOTS_SLACK_NS:
            said = f"its {after.operation} stamped before its {before.operation} ended"
        else:
            continue
        return (
            f"its coordinate operations' stamps are out of the order they ran in ({said}): the "
            "controller's clock stepped during it?"
        )
    return None
