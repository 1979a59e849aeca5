"""``ckpt-events diff BASE NEW``: per (kind, operation, step) median and p95 of two runs, and
their ratio, largest change first; ``--fail-above RATIO`` gates a CI job on it.

Only ok spans are timed: a commit that failed after 2 ms made a failing run look faster than
one whose commits took 200 ms. Failed spans are counted per row instead (a ``failed`` column,
base -> new, when either run has one); a row whose count differs is marked ``*`` and named in
one line under the table; a key with no ok span in a run shows ``-`` for its times and is never
gated. Cancelled spans (``cancels.is_cancelled``: a server's stop cut their request) are counted
apart from the failed ones, in a ``cancelled`` column and line of their own shown only when
either run has one: three requests cut by a stop are not a regression of failures. Neither count
gates ``--fail-above``, which weighs the ok spans' medians only.

A ratio above the gate fails the run only if the change of the medians is also real: at least
``FAIL_FLOOR_MS`` (as the trend flags' ``GROWTH_MIN_MS``), and at least the step's jitter (the
robust spread of its durations, the larger of the two runs'; as the straggler flag weighs a gap
against its spread). A sub-millisecond step doubling (renew 0.14 -> 0.27 ms over 3 checkpoints)
is noise; each one ignored is named in one line.
"""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING, Final

from ckpt_events.participants.cli.command import Command, CommandError, console, positive_number
from ckpt_events.participants.cli.text import escape, say
from ckpt_events.participants.cli.words import counted
from ckpt_events.participants.errors import shown

if TYPE_CHECKING:
    from rich.table import Table

    from ckpt_events.participants.cli.report.durations import Durations

__all__ = ["DIFF", "FAIL_FLOOR_MS", "real_change"]

#: A median change under this many ms never fails ``--fail-above`` (the trend flags' floor).
FAIL_FLOOR_MS: Final = 1.0


def real_change(base: list[float], new: list[float]) -> bool:
    """Whether the medians of ``base`` and ``new`` (ms) differ by at least ``FAIL_FLOOR_MS`` and by
    at least the larger of the two runs' jitter (the robust spread of their values)."""
    from ckpt_events.participants.cli.report.durations import median
    from ckpt_events.participants.cli.report.trends import spread

    change = abs(median(new) - median(base))
    return change >= FAIL_FLOOR_MS and change >= max(spread(base), spread(new))


def _diff_arguments(parser: argparse.ArgumentParser) -> None:
    for name, what in (("base", "the baseline run"), ("new", "the run compared with it")):
        parser.add_argument(
            name,
            metavar=name.upper(),
            help=f"{what}: a log file, a glob or a directory (quote a glob; separate several with ',')",
        )
    parser.add_argument(
        "--fail-above",
        type=_ratio,
        metavar="RATIO",
        help="exit 1 when any median ratio (new / base) is above RATIO (1 or more; 1.1 is 10%%) and its "
        f"change is real: at least {FAIL_FLOOR_MS:g} ms and at least the step's jitter (the others are "
        "named, not failed)",
    )
    parser.add_argument(
        "--min-ms",
        type=_milliseconds,
        default=0.05,
        metavar="MS",
        help="ignore keys whose medians are both below MS (noise; default 0.05)",
    )


def _milliseconds(value: str) -> float:
    """A finite number of ms, 0 or more (``float`` took -1, nan and inf)."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{shown(value)} is not a number") from None
    if not 0 <= number < math.inf:
        raise argparse.ArgumentTypeError(f"{shown(value)} must be a finite number >= 0")
    return number


def _ratio(value: str) -> float:
    """A growth ratio, 1 or more: ``--fail-above 0.1`` (meant as 10%) failed the run on every real
    change, a 5x speed-up named as the worst (0.18x)."""
    number = positive_number(value)
    if number < 1:
        raise argparse.ArgumentTypeError(
            f"{shown(value)} is below 1: RATIO is new / base, so 1.1 fails a median that grew 10%"
        )
    return number


def _read(spec: str) -> Durations:
    from ckpt_events.participants.cli.report.durations import durations
    from ckpt_events.participants.cli.report.log_files import expand_logs
    from ckpt_events.participants.cli.report.logs import read_logs

    paths, missing = expand_logs(spec.split(","))
    if missing:
        raise CommandError("; ".join(missing))
    # A log that went back in time is read again exactly: its copies in the others count once.
    found, problems = read_logs(paths, durations)
    for line in problems.summary():
        say(escape(line))  # names processes, files and values from the logs
    if not found:
        raise CommandError(f"{spec} holds no checkpoint spans ({counted(len(paths), 'file')} read)")
    return found


#: One compared key: (key, n base, n new, base p50, base p95, new p50, new p95, ratio p50,
#: failed base, failed new, cancelled base, cancelled new); n counts ok spans, the times are
#: theirs (nan without one); the failed counts leave out the cancelled spans.
_Row = tuple[tuple[str, str, str], int, int, float, float, float, float, float, int, int, int, int]


#: The line naming the keys whose cancelled spans differ: the report knows they were cut, not why.
_CANCELLED_DIFFER: Final = "cancelled spans differ (base -> new; not timed, not failures, never gated)"


def _diff(args: argparse.Namespace) -> int:
    from ckpt_events.participants.cli.report.durations import median

    base, new = _read(args.base), _read(args.new)
    rows = _compared(base, new, args.min_ms)
    above = [] if args.fail_above is None else [r for r in rows if r[7] > args.fail_above]
    failing = [r for r in above if real_change(base.ok[r[0]], new.ok[r[0]])]
    noise = [r for r in above if r not in failing]
    console().print(_table(rows, failing, title=f"{escape(args.new)} against {escape(args.base)} (ms)"))
    for at, said in ((8, "failed spans differ (base -> new; not timed)"), (10, _CANCELLED_DIFFER)):
        changed = [r for r in rows if r[at] != r[at + 1]]
        if changed:
            named = ", ".join(f"{_name(r[0])} {r[at]} -> {r[at + 1]}" for r in changed[:8])
            more = f" and {len(changed) - 8} more" if len(changed) > 8 else ""
            print(f"{said}: {named}{more}")
    only = sorted(base.keys() ^ new.keys())
    if only:
        more = f" and {len(only) - 8} more" if len(only) > 8 else ""
        print(f"in one run only (not compared): {', '.join(_name(k) for k in only[:8])}{more}")
    shared = base.ok.keys() & new.ok.keys()
    below = sorted(k for k in shared if max(median(base.ok[k]), median(new.ok[k])) < args.min_ms)
    if rows and below:
        # A step left out said nothing: the quickstart's 8 us upload was just missing from the table.
        named = ", ".join(_name(k) for k in below[:8])
        more = f" and {len(below) - 8} more" if len(below) > 8 else ""
        print(
            f"left out, both medians under --min-ms {args.min_ms:g} ms (lower it to see them): {named}{more}"
        )
    if not rows and shared and args.fail_above is None:
        # An empty table said nothing of why: every median in both runs under --min-ms.
        say(
            f"nothing compared: each operation and step in both runs ({len(shared):,}) has its "
            f"medians under --min-ms {args.min_ms:g} ms: lower it",
        )
    if args.fail_above is not None and not rows:
        # A gate that compared nothing has not passed (a controller's log against a participant's).
        raise CommandError(
            f"--fail-above {args.fail_above:g}: nothing was compared (no operation or step is in both "
            f"runs above {args.min_ms:g} ms): give logs of the same processes"
        )
    if noise:
        ignored = ", ".join(
            f"{_name(r[0])} {r[3]:.2f} -> {r[5]:.2f} ms (n = {r[1]}, {r[2]})" for r in noise[:4]
        )
        more = f" and {len(noise) - 4} more" if len(noise) > 4 else ""
        say(
            f"ignored {counted(len(noise), 'median ratio')} above {args.fail_above:g} as noise (a change "
            f"under {FAIL_FLOOR_MS:g} ms or under the step's jitter): {ignored}{more}",
        )
    if failing:
        (kind, operation, step), *_, ratio, _, _, _, _ = failing[0]
        say(
            f"{counted(len(failing), 'median ratio')} above {args.fail_above:g}: "
            f"worst {_name((kind, operation, step))} {ratio:.2f}x",
        )
        return 1
    return 0


def _compared(base: Durations, new: Durations, min_ms: float) -> list[_Row]:
    """A row per key of both runs (ok or failed spans) whose medians are not both under
    ``min_ms``, largest change (either way) first; a key without an ok span in a run (all of its
    spans failed) has nan times and ratio, and comes first."""
    from ckpt_events.participants.cli.report.durations import median, percentile

    rows = []
    for key in sorted(base.keys() & new.keys()):
        b, n = base.ok.get(key, []), new.ok.get(key, [])
        # A cancelled span is counted in ``cancelled`` only: a stop cut it, it did not fail.
        cancelled = (base.cancelled.get(key, 0), new.cancelled.get(key, 0))
        failed = (base.failed.get(key, 0) - cancelled[0], new.failed.get(key, 0) - cancelled[1], *cancelled)
        if not (b and n):
            b50, b95 = (median(b), percentile(b, 0.95)) if b else (math.nan, math.nan)
            n50, n95 = (median(n), percentile(n, 0.95)) if n else (math.nan, math.nan)
            rows.append((key, len(b), len(n), b50, b95, n50, n95, math.nan, *failed))
            continue
        b50, n50 = median(b), median(n)
        if max(b50, n50) < min_ms:
            continue
        # Two zero medians (a coarse or injected clock) are no change: 0/0 was shown as infx, first.
        ratio = n50 / b50 if b50 > 0 else 1.0 if n50 == 0 else math.inf
        rows.append((key, len(b), len(n), b50, percentile(b, 0.95), n50, percentile(n, 0.95), ratio, *failed))
    rows.sort(key=lambda r: -abs(math.log(r[7])) if 0 < r[7] < math.inf else -math.inf)
    return rows


def _table(rows: list[_Row], failing: list[_Row], *, title: str) -> Table:
    """The compared rows, a failing ratio marked ``!``; with a failed span in either run, a
    ``failed`` column (base -> new), a changed count marked ``*`` (left out otherwise: at 80
    columns every column costs the numbers room); with a cancelled one, a ``cancelled`` column
    alike."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(box=box.SIMPLE_HEAD, title=Text(title, style="table.title"))
    counts_shown = [
        c for c, at in (("failed", 8), ("cancelled", 10)) if any(r[at] or r[at + 1] for r in rows)
    ]
    for column in (
        "kind",
        "operation",
        "step",
        "n base",
        "n new",
        "base p50",
        "base p95",
        "new p50",
        "new p95",
        "ratio p50",
        *counts_shown,
    ):
        # Folded onto more lines, never cut with an ellipsis: at 80 columns the ratio read "0.1…",
        # a p50 "9.…" and every name "reso…" (the report's tables fold too).
        name = column in ("kind", "operation", "step")
        table.add_column(column, justify="left" if name else "right", overflow="fold")
    for (kind, operation, step), nb, nn, b50, b95, n50, n95, ratio, fb, fn, cb, cn in rows:
        counts = {"failed": (fb, fn), "cancelled": (cb, cn)}
        flag = " !" if any(r[0] == (kind, operation, step) for r in failing) else ""
        table.add_row(
            Text(escape(kind)),
            Text(escape(operation)),
            Text(escape(step)),
            str(nb),
            str(nn),
            _ms(b50),
            _ms(b95),
            _ms(n50),
            _ms(n95),
            f"{_times(ratio)}{flag}",
            *(f"{b} -> {n}{' *' if b != n else ''}" for b, n in (counts[c] for c in counts_shown)),
        )
    return table


def _ms(value: float) -> str:
    """``12.50``; ``-`` for no ok span in that run (every one failed)."""
    return "-" if math.isnan(value) else f"{value:.2f}"


def _times(ratio: float) -> str:
    """``1.25x``; a ratio under 0.005 is ``<0.01x``, not ``0.00x`` (80833 -> 0.08 ms read as a
    step that took no time at all); ``-`` when a run has no ok span to time."""
    if math.isnan(ratio):
        return "-"
    return "<0.01x" if 0 < ratio < 0.005 else f"{ratio:.2f}x"


def _name(key: tuple[str, str, str]) -> str:
    """``kind/operation/step`` of a key, escaped for the terminal."""
    return escape("/".join(p for p in key if p))


DIFF = Command(
    "diff",
    "compare two runs' logs: median and p95 of ok spans per kind, operation and step, failed ones counted",
    _diff_arguments,
    _diff,
    needs=("rich",),
)
