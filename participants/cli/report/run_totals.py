"""The run-wide lines under the overview, said the same in the terminal and on the HTML page.

The fleet's pause over the logs' time (never an unknown pause summed as 0), the episodes after
the restores, the counted events that named no checkpoint (a refusal before the body was read:
one line per event) and what the fold let go to bound its memory. Each line says whether it is
a warning (the terminal draws those yellow, the page marks them).
"""

from __future__ import annotations

from typing import NamedTuple

from ckpt_events.participants.cli.report.overview import Run, episodes_text
from ckpt_events.participants.cli.words import counted

__all__ = ["RunLine", "run_lines"]


class RunLine(NamedTuple):
    text: str
    warning: bool = False


def _span_text(ms: float) -> str:
    return f"{ms:.1f} ms" if ms < 10_000 else f"{ms / 1e3:.1f} s"


def _pause_line(run: Run) -> RunLine | None:
    checkpoints = [r for r in run.rows if r.what == "checkpoint"]
    known_ms = [r.paused_ms for r in checkpoints if r.paused_ms is not None]
    clock = sum(r.pause_unknown for r in checkpoints)
    # A checkpoint without both its first prepare and its last resume in the logs (a cut log,
    # an abort) paused the fleet for an unknown time: never summed as 0.
    torn = len(checkpoints) - len(known_ms) - clock
    wall_ms = (run.last_ns - run.first_ns) / 1e6
    if wall_ms <= 0 or not checkpoints:
        return None
    why = [
        *([f"{counted(torn, 'checkpoint')} without both a prepare and a resume in the logs"] if torn else []),
        *(
            [
                f"{counted(clock, 'checkpoint')} with a participant that answered outside the "
                "controller's call (a clock no one shift aligns)"
            ]
            if clock
            else []
        ),
    ]
    unknown = f"pause unknown for {counted(torn + clock, 'checkpoint')}: {'; '.join(why)}"
    lead = "checkpointing paused the fleet (admission closed, first prepare to last resume) "
    if not known_ms:
        return RunLine(f"{lead}for an unknown time ({unknown})")
    paused = sum(known_ms)
    return RunLine(
        f"{lead}{'at least ' if why else ''}{paused:.1f} ms in all, {paused / wall_ms:.1%} "
        f"of the logs' {_span_text(wall_ms)}" + (f"; {unknown}" if why else "")
    )


def run_lines(run: Run) -> list[RunLine]:
    """Every run-wide line of ``run``, in the order the terminal prints them."""
    lines = []
    pause = _pause_line(run)
    if pause is not None:
        lines.append(pause)
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
