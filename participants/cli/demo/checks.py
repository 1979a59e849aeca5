"""The demo's checks of its own events: the checkpoints it took, and the injected failure named.

The run overview (``run_overview``) diagnoses the demo's events exactly as ``ckpt-events
report`` would diagnose its log; each check compares that diagnosis with what the demo asked
for, and a mismatch raises ``DemoFailed``.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from ckpt_events.participants.cli.report.judge import ABORTED, PUBLISHED, RESTORED
from ckpt_events.participants.cli.report.overview import Run, RunRow
from ckpt_events.participants.cli.words import counted
from ckpt_events.participants.errors import DemoFailed
from ckpt_events.participants.faults import Fault

__all__ = ["diagnosis_checks"]


def diagnosis_checks(
    run: Run,
    *,
    published: int,
    ids: Sequence[str] | None = None,
    fault: Fault | None,
    one_of: int | None = None,
    lease_on: str | None = None,
    blockers: Mapping[str, Sequence[str]] | None = None,
) -> list[str]:
    """The checks that passed; raises ``DemoFailed`` on the first that does not. ``published``
    checkpoints should have published, with these ``ids`` if given (the controller's list).

    ``one_of``: the fleet has that many servers of each kind, and the fault must be named on
    its one server and no other (``lease_on``: the one whose lease the lease fault hits).
    ``blockers``: what each member's reply to the aborted prepare named (the controller's view),
    which the stall fault's server alone must have, naming the episode it holds."""
    checkpoints = [r for r in run.rows if r.what == "checkpoint"]
    passed = [_published_check(checkpoints, published, ids)]
    restores = [r for r in run.rows if r.what == "restore"]
    if len(restores) != 1 or restores[0].outcome != RESTORED:
        raise DemoFailed(f"expected one restore that restored, got {_outcomes(restores)}")
    if fault is None:
        return passed
    if fault.mode in ("stall", "lease"):
        passed.append(_abort_check(checkpoints, fault, one_of, lease_on, blockers))
    elif fault.mode == "slow-restore":
        passed.append(_slow_restore_check(restores[0], fault))
    elif fault.mode == "slow":
        passed.append(_straggler_check(run, fault))
    return passed


def _published_check(checkpoints: list[RunRow], published: int, ids: Sequence[str] | None) -> str:
    """``published`` of the ``checkpoints`` published, with these ``ids`` if given, the others
    counted by outcome."""
    done = [r for r in checkpoints if r.outcome == PUBLISHED]
    if ids is not None and [r.checkpoint_id for r in done] != list(ids):
        raise DemoFailed(f"the controller published {list(ids)}, the log shows {_outcomes(checkpoints)}")
    if len(done) != published:
        raise DemoFailed(
            f"{counted(len(done), 'checkpoint')} published, not {published}: {_outcomes(checkpoints)}"
        )
    others = sorted({r.outcome for r in checkpoints} - {PUBLISHED})
    rest = "".join(f", {sum(r.outcome == o for r in checkpoints)} {o}" for o in others)
    of = counted(len(checkpoints), "checkpoint")
    return f"{published} of {of} published{rest}, each through the controller"


def _abort_check(
    checkpoints: list[RunRow],
    fault: Fault,
    one_of: int | None,
    lease_on: str | None,
    blockers: Mapping[str, Sequence[str]] | None,
) -> str:
    """The stall or lease fault: the first checkpoint, and it alone, aborted, its cause naming the
    faulty server (and no other of its kind, with ``one_of``)."""
    aborted = [r for r in checkpoints if r.outcome == ABORTED]
    if len(aborted) != 1 or aborted[0] is not checkpoints[0]:
        raise DemoFailed(f"the first checkpoint should abort and only it: {_outcomes(checkpoints)}")
    row = aborted[0]
    target = fault.instance if fault.mode == "stall" else lease_on
    wanted = (
        ("not ready at its deadline: ", f"/{fault.instance} blocked by ")
        if fault.mode == "stall"
        else (
            "lease expired on ",
            " in phase prepared" if target is None else f"/{target} in phase prepared",
        )
    )
    hits = [c for c in row.causes if c.startswith(wanted[0])]
    cause = next((c for c in hits if wanted[1] in c), None)
    if cause is None:
        raise DemoFailed(
            f"checkpoint {row.checkpoint_id} aborted, but not for the injected {fault}: "
            + ("; ".join(row.causes) or "no cause named")
        )
    among = ""
    if one_of is not None:
        # The lease fault without lease_on names no server ahead: say only what is known.
        if len(hits) != 1:
            raise DemoFailed(
                f"checkpoint {row.checkpoint_id}: the fault hit {target or 'one server'} alone, but "
                f"{counted(len(hits), 'server is', 'servers are')} named: {'; '.join(hits)}"
            )
        server = f"{_kind_of(target)} server" if target else "server"
        among = f", the one of {counted(one_of, server)}"
    if fault.mode == "stall" and blockers is not None and one_of is not None:
        if set(blockers) != {fault.instance}:
            raise DemoFailed(f"the prepare replies name blockers on {sorted(blockers)}, not {fault.instance}")
        cause += f": {', '.join(blockers.get(fault.instance or '', ())[:3])}"
    return f"checkpoint {row.checkpoint_id} aborted: {cause} (injected: {fault}{among})"


#: How many times the median of the other participants' reads the faulty server's read must take.
SLOW_READ_FACTOR: Final = 5.0


def _slow_restore_check(row: RunRow, fault: Fault) -> str:
    """The slow-restore fault: the faulty server's read stood out of the restore's reads, at
    least ``SLOW_READ_FACTOR`` times the median of the other participants' and twice the longest
    of them (the fault hit one server alone). Judged against the same steps of the same run, not
    a share of the restore's wall time, which load erodes: under load model-4's 819 ms read was
    48% of the restore, short of the half wanted, and a run showing the fault plainly failed."""
    mine = f"{_kind_of(fault.instance)}/{fault.instance}"
    slow = row.reads_ms.get(mine)
    others = sorted(ms for who, ms in row.reads_ms.items() if who != mine)
    said = row.dominated or row.critical_path or "no read or install step"
    if slow is None or not others or "longest read or install unknown" in row.dominated:
        missing = "no read of it" if slow is None else "no other read" if not others else "a step unfinished"
        raise DemoFailed(
            f"restore of {row.checkpoint_id}: {fault.instance}'s read cannot be compared with the "
            f"other participants' ({missing}): {said}"
        )
    typical = statistics.median(others)
    others_text = "the other " + counted(len(others), "participant's", "participants'") + " reads"
    if slow < SLOW_READ_FACTOR * typical or slow < 2 * others[-1]:
        raise DemoFailed(
            f"restore of {row.checkpoint_id}: {fault.instance}'s read, {slow:.1f} ms, did not stand "
            f"out of {others_text} (median {typical:.1f} ms, longest {others[-1]:.1f} ms): {said}"
        )
    times = f"{slow / typical:.0f}x the median" if typical > 0 else "above the median"
    share = f", {slow / row.ms:.0%} of its {row.ms:.1f} ms" if row.ms else ""
    return (
        f"restore of {row.checkpoint_id}: read on {mine} {slow:.1f} ms, {times} of {others_text} "
        f"({typical:.1f} ms){share} (injected: {fault})"
    )


def _straggler_check(run: Run, fault: Fault) -> str:
    """The slowed server, and it alone, is flagged as its kind's straggler over the run."""
    kind = _kind_of(fault.instance)
    flags = [f for f in run.trends.flags() if f.startswith(("straggler: ", "stragglers: "))]
    mine = [f for f in flags if f.startswith(f"straggler: {kind}/{fault.instance} ")]
    if not mine or len(flags) != 1:
        raise DemoFailed(
            f"{fault.instance} writes {fault.factor:g}x slower, but the stragglers flagged are: "
            + ("; ".join(flags) or "none")
        )
    return f"{mine[0].removeprefix('straggler: ')}, and no other server (injected: {fault})"


def _kind_of(instance: str | None) -> str:
    return (instance or "").rsplit("-", 1)[0]


def _outcomes(rows: Iterable[Any]) -> str:
    return ", ".join(f"{r.checkpoint_id} {r.outcome}" for r in rows) or "none"
