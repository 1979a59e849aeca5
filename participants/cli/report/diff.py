"""``ckpt-events diff BASE NEW``: per (kind, operation, step) median and p95 of two runs, and
their ratio, largest change first; ``--fail-above RATIO`` gates a CI job on it."""

from __future__ import annotations

import argparse
import math
import sys

from ckpt_events.participants.cli.command import Command, CommandError, console, positive_number
from ckpt_events.participants.cli.words import counted

__all__ = ["DIFF"]


def _diff_arguments(parser: argparse.ArgumentParser) -> None:
    for name, what in (("base", "the baseline run"), ("new", "the run compared with it")):
        parser.add_argument(
            name,
            metavar=name.upper(),
            help=f"{what}: a log file, a glob or a directory (quote a glob; separate several with ',')",
        )
    parser.add_argument(
        "--fail-above",
        type=positive_number,
        metavar="RATIO",
        help="exit 1 when any median ratio (new / base) is above RATIO",
    )
    parser.add_argument(
        "--min-ms",
        type=float,
        default=0.05,
        metavar="MS",
        help="ignore keys whose medians are both below MS (noise; default 0.05)",
    )


def _read(spec: str) -> dict[tuple[str, str, str], list[float]]:
    from ckpt_events.participants.cli.report.durations import durations
    from ckpt_events.participants.cli.report.logs import LogProblems, expand_logs, merged_events

    paths, missing = expand_logs(spec.split(","))
    if missing:
        raise CommandError("; ".join(missing))
    problems = LogProblems()
    found = durations(merged_events(paths, problems))
    for line in problems.summary():
        print(line, file=sys.stderr)
    if not found:
        raise CommandError(f"{spec} holds no checkpoint spans ({counted(len(paths), 'file')} read)")
    return found


def _diff(args: argparse.Namespace) -> int:
    from rich import box
    from rich.table import Table

    from ckpt_events.participants.cli.report.durations import median, percentile
    from ckpt_events.participants.cli.report.overview_terminal import clean

    base, new = _read(args.base), _read(args.new)
    rows = []
    for key in sorted(base.keys() & new.keys()):
        b50, n50 = median(base[key]), median(new[key])
        if max(b50, n50) < args.min_ms:
            continue
        ratio = n50 / b50 if b50 > 0 else math.inf
        rows.append(
            (
                key,
                len(base[key]),
                len(new[key]),
                b50,
                percentile(base[key], 0.95),
                n50,
                percentile(new[key], 0.95),
                ratio,
            )
        )
    rows.sort(key=lambda r: -abs(math.log(r[7])) if 0 < r[7] < math.inf else -math.inf)
    table = Table(box=box.SIMPLE_HEAD, title=f"{clean(args.new)} against {clean(args.base)} (ms)")
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
    ):
        table.add_column(column, justify="left" if column in ("kind", "operation", "step") else "right")
    for (kind, operation, step), nb, nn, b50, b95, n50, n95, ratio in rows:
        flag = "" if args.fail_above is None or ratio <= args.fail_above else " !"
        table.add_row(
            kind,
            operation,
            step,
            str(nb),
            str(nn),
            f"{b50:.2f}",
            f"{b95:.2f}",
            f"{n50:.2f}",
            f"{n95:.2f}",
            f"{ratio:.2f}x{flag}",
        )
    console().print(table)
    only = sorted(base.keys() ^ new.keys())
    if only:
        print(f"in one run only (not compared): {', '.join('/'.join(k).rstrip('/') for k in only[:8])}")
    if args.fail_above is not None:
        above = [r for r in rows if r[7] > args.fail_above]
        if above:
            (kind, operation, step), *_, ratio = above[0]
            worst = "/".join(p for p in (kind, operation, step) if p)
            print(
                f"{len(above)} median ratios above {args.fail_above}: worst {worst} {ratio:.2f}x",
                file=sys.stderr,
            )
            return 1
    return 0


DIFF = Command(
    "diff",
    "compare two runs' logs: median and p95 per kind, operation and step",
    _diff_arguments,
    _diff,
    needs=("rich",),
)
