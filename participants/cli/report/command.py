"""``ckpt-events report``: the run overview, then each checkpoint in detail, from any number of logs."""

from __future__ import annotations

import argparse

from ckpt_events.participants.cli.command import Command, CommandError, console, given_path
from ckpt_events.participants.cli.text import escape, say, short_id
from ckpt_events.participants.cli.words import counted
from ckpt_events.participants.errors import shown

__all__ = ["REPORT"]


def _report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "logs",
        nargs="+",
        metavar="LOG",
        help="JSON-lines logs written by the jsonl sink, or a collector's OTLP JSON file: files, "
        "globs or directories (every process's and worker's files), merged in time order",
    )
    parser.add_argument(
        "--checkpoint",
        metavar="ID",
        help="only this checkpoint (or restore) in detail, ID#N for row N of the overview when "
        "several used ID; by default the slowest published one and the first 20 that did not publish",
    )
    parser.add_argument(
        "--report",
        type=given_path,
        metavar="PATH",
        help="also write the report: .html, .svg, .png (headless chromium), .perfetto.json (ui.perfetto.dev)",
    )


def _report(args: argparse.Namespace) -> int:
    from ckpt_events.participants.cli.report.clocks import ClockEvidence
    from ckpt_events.participants.cli.report.files import check_report_path, holds_the_run, write_report
    from ckpt_events.participants.cli.report.fold import ENDED_WAITING
    from ckpt_events.participants.cli.report.judge import OPEN
    from ckpt_events.participants.cli.report.log_files import expand_logs, rotated_ends
    from ckpt_events.participants.cli.report.logs import ENDED_KEPT, LogProblems, merged_events, nothing_read
    from ckpt_events.participants.cli.report.overview import overview
    from ckpt_events.participants.cli.report.overview_terminal import (
        chosen_rows,
        not_detailed_line,
        render_overview,
        reused_id_line,
    )
    from ckpt_events.participants.cli.report.runs import RunLinks
    from ckpt_events.participants.cli.report.terminal import render

    if args.report is not None and (refusal := check_report_path(args.report)) is not None:
        raise CommandError(refusal)
    paths, missing = expand_logs(args.logs)
    if missing:
        raise CommandError("; ".join(missing))
    problems = LogProblems(clocks=(clocks := ClockEvidence()), runs=(runs := RunLinks(paths)))
    cut = rotated_ends(paths)
    # The overview folds one streaming pass; the detail of the chosen rows is one more pass.
    run = overview(
        merged_events(paths, problems),
        again=lambda: merged_events(paths, LogProblems()),
        clocks=clocks,
        runs=runs,
        cut=bool(cut),
        ended=problems.ended,
    )
    offsets = clocks.offsets()
    # Shifting one process of a file may put that file out of time order too.
    exact = (problems.disordered or bool(offsets)) and len(paths) > 1
    sort = dict(problems.back_ns)
    if offsets or problems.disordered:
        # The calls prove a process's clock off (fold again on the callers' clock), or a log
        # went back in time (read sorted; its copies are found only by looking further back).
        problems = LogProblems(clocks=(clocks := ClockEvidence()), runs=(runs := RunLinks(paths)))
        run = overview(
            merged_events(paths, problems, offsets, exact=exact, sort=sort),
            again=lambda: merged_events(paths, LogProblems(), offsets, exact=exact, sort=sort),
            clocks=clocks,
            runs=runs,
            cut=bool(cut),
            ended=problems.ended,
        )
    for line in problems.summary():
        say(escape(line))  # names processes, files and values from the logs
    if problems.ended_dropped:  # the report alone folds them: said here, not by diff or replay
        say(
            f"{counted(problems.ended_dropped, 'more span')} than the {ENDED_KEPT:,} held at once ended "
            "in lines this version cannot read, with no event it reads between them: such a span "
            "shown open may have ended (read the logs with the version of ckpt-events that wrote them)",
        )
    if run.ended_let_go:
        say(
            f"{counted(run.ended_let_go, 'more span')} than the {ENDED_WAITING:,} kept waiting ended in "
            "lines this version cannot read before their start was read: such a span shown open may have "
            "ended (read the logs with the version of ckpt-events that wrote them)",
        )
    if any(row.outcome == OPEN for row in run.rows):
        for line in cut:  # why "no answer in the logs given", not "never answered"
            say(escape(line))
    if not run.count:
        raise CommandError(nothing_read(args.logs, paths, problems))
    out = console()
    rows = chosen_rows(run, args.checkpoint)
    whole = None
    if args.checkpoint is not None and not rows and run.rows:
        # A user's own server's log beside a controller's: the id may be its requests' alone
        # (10 requests of c1 read "no checkpoint 'c1' in the logs"), drawn as on its log alone.
        whole = run.whole(args.checkpoint)
        if not whole.named:
            ids = sorted({r.checkpoint_id or "" for r in run.rows})[:5]
            known = ", ".join(escape(short_id(i)) for i in ids)
            raise CommandError(f"no checkpoint {shown(args.checkpoint)} in the logs (there are: {known})")
        say(
            f"--checkpoint {shown(args.checkpoint)}: no controller's checkpoint or restore in these logs has "
            "that id: shown are every participant's totals, each operation's and step's figures and every "
            "trace of participants' operations given that checkpoint_id",
        )
    elif not run.rows:
        # Only participants' spans (their parents live in a controller log not given): no
        # checkpoint to name, so every participant's totals are shown as one and the last trace
        # is drawn, the logs streamed again, never listed (1.2M lines listed took 590 MiB).
        whole = run.whole(args.checkpoint)
        if args.checkpoint is not None and not whole.events:
            raise CommandError(
                f"--checkpoint {shown(args.checkpoint)}: no operation or step of these logs names "
                "that checkpoint id (the ids an operation(..., checkpoint_id=...) was given)"
            )
        # Said, not left to be guessed from a page headed by the last trace alone.
        drawn = "the last trace" if args.checkpoint is None else "every trace of that checkpoint id"
        say(
            "no controller's coordination in these logs, from which checkpoints are named: shown are "
            f"every participant's totals, each operation's and step's figures and {drawn}; if a "
            "controller coordinated them, pass its log too for each checkpoint and restore",
        )
    if whole is not None:
        render(
            out,
            whole.events,
            title=", ".join(args.logs),
            totals=(whole.breakdown, whole.counts),
            operations=whole.operations,
            named=whole.named,
            earlier=whole.earlier,
        )
    elif args.checkpoint is None:
        render_overview(out, run, title=f"{counted(len(paths), 'log file')}")
        if (note := not_detailed_line(run)) is not None:
            say(note)
    reused = reused_id_line(run, rows) if args.checkpoint is not None else None
    if reused is not None:
        say(reused)
    numbers = {id(r): n for n, r in enumerate(run.rows, 1)}
    details = run.details(rows)
    for row in rows:
        title = f"{row.what} {short_id(row.checkpoint_id)} ({row.outcome})"
        if reused is not None:  # two sections of one title: which row each details
            title = f"#{numbers[id(row)]} {title}"
        render(out, details[id(row)], title=title, note=run.shared_line(row))
    if args.report is None:
        return 0
    name = paths[0].name if len(paths) == 1 else f"{len(paths)} logs"
    try:
        if run.rows and args.checkpoint is None and args.report.suffix.lower() in (".html", ".htm"):
            from ckpt_events.participants.cli.report.run_page import write_run_page

            print(write_run_page(args.report, run, rows, title=f"report of {name}"))
            return 0
        if holds_the_run(args.report):
            events = run.all_events()
        elif rows:
            events = details[id(rows[0])]
        else:  # a picture of logs with no row: the last trace, as the terminal draws it
            events = whole.events if whole is not None else run.all_events()
        # The whole logs' tables (the events given are the drawn trace's alone).
        print(write_report(args.report, events, title=f"report of {name}", whole=whole))
    except OSError as exc:
        # Probed writable up front, the write can still fail (a disk that fills): one line.
        raise CommandError(f"cannot write {args.report}: {exc.strerror or exc}") from None
    return 0


REPORT = Command(
    "report",
    "run overview, then checkpoints in detail, from recorded JSON-lines logs",
    _report_arguments,
    _report,
    needs=("rich",),
)
