"""The demo's checks of its own events: the checkpoints it took, and the injected failure named.

The run overview (``run_overview``) diagnoses the demo's events exactly as ``ckpt-events
report`` would diagnose its log; each check compares that diagnosis with what the demo asked
for, and a mismatch raises ``DemoFailed``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ckpt_events.participants.cli.run_overview import ABORTED, PUBLISHED, RESTORED, Run
from ckpt_events.participants.cli.words import counted
from ckpt_events.participants.errors import DemoFailed
from ckpt_events.participants.faults import Fault

__all__ = ["diagnosis_checks"]


def diagnosis_checks(
    run: Run, *, published: int, ids: Sequence[str] | None = None, fault: Fault | None
) -> list[str]:
    """The checks that passed; raises ``DemoFailed`` on the first that does not. ``published``
    checkpoints should have published, with these ``ids`` if given (the controller's list)."""
    checkpoints = [r for r in run.rows if r.what == "checkpoint"]
    done = [r for r in checkpoints if r.outcome == PUBLISHED]
    if ids is not None and [r.checkpoint_id for r in done] != list(ids):
        raise DemoFailed(f"the controller published {list(ids)}, the log shows {_outcomes(checkpoints)}")
    if len(done) != published:
        raise DemoFailed(
            f"{counted(len(done), 'checkpoint')} published, not {published}: {_outcomes(checkpoints)}"
        )
    others = sorted({r.outcome for r in checkpoints} - {PUBLISHED})
    rest = "".join(f", {sum(r.outcome == o for r in checkpoints)} {o}" for o in others)
    passed = [f"{published} of {len(checkpoints)} checkpoints published{rest}, each through the controller"]
    restores = [r for r in run.rows if r.what == "restore"]
    if len(restores) != 1 or restores[0].outcome != RESTORED:
        raise DemoFailed(f"expected one restore that restored, got {_outcomes(restores)}")
    if fault is None:
        return passed
    if fault.mode in ("stall", "lease"):
        aborted = [r for r in checkpoints if r.outcome == ABORTED]
        if len(aborted) != 1 or aborted[0] is not checkpoints[0]:
            raise DemoFailed(f"the first checkpoint should abort and only it: {_outcomes(checkpoints)}")
        row = aborted[0]
        wanted = (
            ("not ready at its deadline: ", f"/{fault.instance} blocked by ")
            if fault.mode == "stall"
            else ("lease expired on ", " in phase prepared")
        )
        cause = next((c for c in row.causes if c.startswith(wanted[0]) and wanted[1] in c), None)
        if cause is None:
            raise DemoFailed(
                f"checkpoint {row.checkpoint_id} aborted, but not for the injected {fault}: "
                + ("; ".join(row.causes) or "no cause named")
            )
        passed.append(f"checkpoint {row.checkpoint_id} aborted: {cause} (injected: {fault})")
    elif fault.mode == "slow-restore":
        row = restores[0]
        share = (row.dominant_ms or 0.0) / row.ms if row.ms else 0.0
        named = row.dominated.startswith(f"read on {_kind_of(fault.instance)}/{fault.instance} ")
        if not named or share < 0.5:
            raise DemoFailed(
                f"restore of {row.checkpoint_id} was not dominated by {fault.instance}'s read "
                f"({share:.0%} of it): {row.dominated or row.slowest or 'no read or install step'}"
            )
        passed.append(
            f"restore of {row.checkpoint_id}: {row.dominated.split(',')[0]}, {share:.0%} of its "
            f"{row.ms:.1f} ms (injected: {fault})"
        )
    return passed


def _kind_of(instance: str | None) -> str:
    return (instance or "").rsplit("-", 1)[0]


def _outcomes(rows: Iterable[Any]) -> str:
    return ", ".join(f"{r.checkpoint_id} {r.outcome}" for r in rows) or "none"
