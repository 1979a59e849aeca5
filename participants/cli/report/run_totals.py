"""The run-wide lines under the overview, said the same in the terminal and on the HTML page.

The fleet's pause over the logs' time (never an unknown pause summed as 0; each fleet's over its
own logs when the logs hold several runs apart), the episodes after
the restores, the counted events that named no checkpoint (a refusal before the body was read:
one line per event) and what the fold let go to bound its memory. Each line says whether it is
a warning (the terminal draws those yellow, the page marks them).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Final, NamedTuple

from ckpt_events.participants.cli.report.overview import PauseUnknown, Run, RunRow, episodes_text
from ckpt_events.participants.cli.words import counted

__all__ = ["RunLine", "run_lines"]


class RunLine(NamedTuple):
    text: str
    warning: bool = False


def _span_text(ms: float) -> str:
    return f"{ms:.1f} ms" if ms < 10_000 else f"{ms / 1e3:.1f} s"


def _paused_ms(checkpoints: list[RunRow]) -> float:
    """How long the known pauses of ``checkpoints`` held the fleet, overlaps counted once (one
    fleet's never overlap; summed, two fleets' at once read more than the logs' whole time)."""
    spans = sorted(r.paused_span for r in checkpoints if r.paused_span is not None)
    total = 0
    end = None
    for begin, stop in spans:
        if end is None or begin > end:
            total += stop - begin
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total / 1e6


#: Why a checkpoint's pause is unknown (``RunRow.pause_why``), in words.
_UNKNOWN_BECAUSE: Final[dict[PauseUnknown, str]] = {
    "unaligned": (
        "with a participant that answered outside the controller's call (a clock no one shift aligns)"
    ),
    "resume_clock": "with a resume during which its participant's clock went back (its end unknown)",
    "shared_trace": (
        "sharing its trace with another checkpoint or restore (one traceparent given to several collections)"
    ),
    "stepped": "whose coordinate operations' stamps are out of the order they ran in (a clock that stepped)",
    "wall_step": (
        "during which the controller's wall clock stepped (its prepares and resumes stamped across it)"
    ),
}
#: Checkpoints of unknown duration named one by one in the line that says why; the rest counted.
_NAMED: Final = 3


def _pause_line(rows: list[RunRow], first_ns: int, last_ns: int, whose: str = "") -> RunLine | None:
    checkpoints = [r for r in rows if r.what == "checkpoint"]
    known = [r for r in checkpoints if r.paused_ms is not None]
    because = Counter(r.pause_why for r in checkpoints if r.pause_why is not None)
    # A checkpoint without both its first prepare and its last resume in the logs (a cut log,
    # an abort) paused the fleet for an unknown time: never summed as 0.
    torn = len(checkpoints) - len(known) - because.total()
    wall_ms = (last_ns - first_ns) / 1e6
    if wall_ms <= 0 or not checkpoints:
        return None
    why = [
        *([f"{counted(torn, 'checkpoint')} without both a prepare and a resume in the logs"] if torn else []),
        *(f"{counted(n, 'checkpoint')} {_UNKNOWN_BECAUSE[reason]}" for reason, n in because.items()),
    ]
    unknown = f"pause unknown for {counted(torn + because.total(), 'checkpoint')}: {'; '.join(why)}"
    fleet = "its fleet" if whose else "the fleet"
    lead = f"{whose}checkpointing paused {fleet} (admission closed, first prepare to last resume) "
    if not known:
        return RunLine(f"{lead}for an unknown time ({unknown})")
    paused = _paused_ms(known)
    logs = "its logs'" if whose else "the logs'"
    if any(r.ms_why is not None or r.stepped_ns is not None for r in rows):
        # The logs' time spans stamps a clock stepped between (was "0.0% of the logs' 3600.0 s").
        share = f"its share of {logs} time unknown (a clock stepped during the run: see the durations)"
    elif paused <= wall_ms:
        share = f"{paused / wall_ms:.1%} of {logs} {_span_text(wall_ms)}"
    else:
        share = f"longer than {logs} {_span_text(wall_ms)} (stamps of clocks not aligned): its share unknown"
    return RunLine(
        f"{lead}{'at least ' if why else ''}{paused:.1f} ms in all, {share}" + (f"; {unknown}" if why else "")
    )


def _pause_lines(run: Run) -> list[RunLine]:
    """The pause line of the run, or one per run when the logs hold several apart (no trace in
    common), each over its own logs' time."""
    if not run.fleets:
        line = _pause_line(run.rows, run.first_ns, run.last_ns)
        return [] if line is None else [line]
    lines = []
    for number, fleet in enumerate(run.fleets, 1):
        files = ", ".join(fleet.files[:3]) + (
            f" and {len(fleet.files) - 3} more" if len(fleet.files) > 3 else ""
        )
        whose = f"run {number} of {len(run.fleets)} ({files}, no trace in common with the others): "
        line = _pause_line(fleet.rows, fleet.first_ns, fleet.last_ns, whose)
        if line is not None:
            lines.append(line)
    return lines


def _rows_named(rows: list[tuple[int, RunRow]], said: Callable[[RunRow], str]) -> str:
    """The first ``_NAMED`` of ``rows`` (row number, row), each as ``#N what id: said``, and
    how many more: the list inside a run line's parentheses."""
    named = "; ".join(
        f"#{number} {r.what} {r.checkpoint_id or ''}: {said(r)}".replace(" :", ":")
        for number, r in rows[:_NAMED]
    )
    return named + (f"; and {counted(len(rows) - _NAMED, 'more')}" if len(rows) > _NAMED else "")


def _unknown_durations(run: Run) -> RunLine | None:
    """Which rows' durations are unknown though they ended (``RunRow.ms_why``), and why."""
    unknown = [(number, r) for number, r in enumerate(run.rows, 1) if r.ms_why is not None]
    if not unknown:
        return None
    named = _rows_named(unknown, lambda r: r.ms_why or "")
    return RunLine(f"duration unknown for {counted(len(unknown), 'row')} ({named})", warning=True)


def _stepped_durations(run: Run) -> RunLine | None:
    """Which rows' durations were read on the controller's monotonic clock (``RunRow.stepped_ns``:
    its wall clock stepped between their root spans), and by how much it stepped."""
    stepped = [(number, r) for number, r in enumerate(run.rows, 1) if r.stepped_ns is not None]
    if not stepped:
        return None
    named = _rows_named(stepped, lambda r: f"{(r.stepped_ns or 0) / 1e9:+,.1f} s")
    return RunLine(
        f"the controller's wall clock stepped during {counted(len(stepped), 'row')}, their durations read "
        f"on its monotonic clock, the step left out ({named})",
        warning=True,
    )


def run_lines(run: Run) -> list[RunLine]:
    """Every run-wide line of ``run``, in the order the terminal prints them."""
    lines = _pause_lines(run)
    if (durations := _unknown_durations(run)) is not None:
        lines.append(durations)
    if (stepped := _stepped_durations(run)) is not None:
        lines.append(stepped)
    restores = [
        r for r in run.rows if r.what == "restore" and (r.continued is not None or r.restarted is not None)
    ]
    if restores:
        known = [r.restarted for r in restores if r.restarted is not None]
        after = episodes_text(sum(r.continued or 0 for r in restores), sum(known) if known else None)
        lines.append(RunLine(f"after {counted(len(restores), 'restore')}: {after}"))
    # Counted run-wide: a refusal before the body was read names no checkpoint.
    lines.extend(RunLine(line, warning=True) for line in run.unscoped_lines())
    let_go = run.let_go_line()
    if let_go is not None:
        lines.append(RunLine(let_go, warning=True))
    return lines
