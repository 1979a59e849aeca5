"""``ckpt-events report``: breakdown, waterfall and counts from a recorded JSON-lines log."""

from __future__ import annotations

import argparse

from participants.cli.command import (
    Command,
    CommandError,
    console,
    existing_file,
    load_events,
    writable_path,
)

__all__ = ["REPORT"]


def _report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("log", type=existing_file, help="a JSON-lines log written by the jsonl sink")
    parser.add_argument(
        "--report",
        type=writable_path,
        metavar="PATH",
        help="also write the report: .html, .svg, .png (headless chromium), .perfetto.json (ui.perfetto.dev)",
    )


def _report(args: argparse.Namespace) -> int:
    from participants.cli.report_files import check_report_path, write_report
    from participants.cli.report_terminal import render

    if args.report is not None and (refusal := check_report_path(args.report)) is not None:
        raise CommandError(refusal)
    events = load_events(args.log)
    if not events:
        raise CommandError(f"{str(args.log)!r} holds no checkpoint events")
    render(console(), events, title=str(args.log))
    if args.report is not None:
        print(write_report(args.report, events, title=f"report of {args.log.name}"))
    return 0


REPORT = Command(
    "report", "breakdown, timeline and counts from a recorded JSON-lines log", _report_arguments, _report
)
