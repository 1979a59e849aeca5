"""``ckpt-events bench``: run the benchmark suites and print one table of ratios."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ckpt_events.participants.cli import bench_app
from ckpt_events.participants.cli.command import Command, given_path
from ckpt_events.participants.cli.command import sigterm_as_interrupt as _sigterm_as_interrupt
from ckpt_events.participants.cli.text import escape, say
from ckpt_events.participants.cli.words import clipped, counted
from ckpt_events.participants.errors import CommandError
from ckpt_events.participants.writable import unwritable

__all__ = ["BENCH"]


def _suites() -> tuple[str, ...]:
    """The suites of the shipped benchmarks package (its ``SUITES``), read without importing
    any suite."""
    import importlib

    return tuple(importlib.import_module("ckpt_events.benchmarks").SUITES)


class _Once(argparse.Action):
    """``--only`` repeatable, each suite once: ``--only core --only core`` ran it twice, its rows
    twice in the table and only the second run's figures in the JSON."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        value: Any,
        option: str | None = None,
    ) -> None:
        chosen: list[str] = getattr(namespace, self.dest) or []
        setattr(namespace, self.dest, chosen if value in chosen else [*chosen, value])


def _json_path(value: str) -> Path:
    """``--json PATH``, refused when parsed if it cannot be written. Missing folders are made, as
    every suite's own ``--json`` makes them: ``bench --json results/today.json`` was refused
    ("the folder ... does not exist") where ``python -m ckpt_events.benchmarks.bench_core`` took it."""
    path = given_path(value)
    if (refusal := unwritable(path, make_folders=True)) is not None:
        raise argparse.ArgumentTypeError(refusal)
    return path


def _bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="fewer iterations and a smaller scale run")
    parser.add_argument(
        "--json",
        type=_json_path,
        default=Path("benchmark-results.json"),
        help="where to write the figures",
    )
    parser.add_argument(
        "--only",
        choices=_suites(),
        action=_Once,
        help="run only these",
    )
    bench_app.add_arguments(parser)


def _bench(args: argparse.Namespace) -> int:
    # Here, not at the top: the parser imports this module on every start (``serve`` too).
    from ckpt_events.benchmarks.load import stop_spawned
    from ckpt_events.benchmarks.rotel import CollectorError

    with _sigterm_as_interrupt():
        try:
            return _run(args)
        except CollectorError as exc:  # a $CKPT_EVENTS_BENCH_ROTEL that does not run
            raise CommandError(str(exc)) from None
        finally:
            # A suite interrupted between starting a server and the block that stops it left
            # that server running (SIGTERM right after a start, in a test): stopped here.
            stop_spawned()


def _run(args: argparse.Namespace) -> int:
    # The suites ship as `ckpt_events.benchmarks` (the checkout's benchmarks/ folder), so this works
    # from an installed package and from a checkout alike.
    import importlib

    if args.app:
        return bench_app.run(args)
    for given, name in ((args.request, "--request"), (args.export_process, "--export-process")):
        if given:
            raise CommandError(f"{name} is for --app MODULE:ATTR (your own app): add --app, or drop {name}")
    report = importlib.import_module("ckpt_events.benchmarks.report")
    chosen = args.only or ["core", "sinks", "otlp", "scale"]
    rows: list[Any] = []
    figures: dict[str, Any] = {}
    failed: dict[str, str] = {}
    for name in chosen:
        module = importlib.import_module(f"ckpt_events.benchmarks.bench_{name}")
        say(f"running {name} benchmarks...")
        try:
            result = module.run(quick=args.quick)
        except Exception as exc:
            # The suites' one boundary: a server or collector that did not start was a traceback,
            # and the figures of the suites already run were lost. One line; the others go on.
            why = escape(clipped(str(exc) or type(exc).__name__, 300))
            failed[name] = why
            say(f"ckpt-events bench: suite {name} failed: {why}")
            continue
        rows.extend(result.pop("rows"))
        figures[name] = result
    if figures:
        report.print_table(_title(quick=args.quick), rows)
        report.write_json(args.json, figures, rows=rows, failed=failed)
        print(f"figures written to {args.json}")
    if failed:
        kept = f"the others' figures are in {args.json}" if figures else "no figures written"
        raise CommandError(f"{counted(len(failed), 'suite')} failed ({', '.join(failed)}): {kept}")
    return 0


def _title(*, quick: bool) -> str:
    """The table's title: a ``--quick`` run's says its figures are a short run's, never to be
    taken for (or pasted as) the full run's."""
    said = "ckpt-events benchmarks (ratios measured side by side in one run)"
    return f"{said}, --quick: a short run's figures, not the full run's" if quick else said


BENCH = Command(
    "bench",
    "run the benchmark suite and print one table of ratios",
    _bench_arguments,
    _bench,
    needs=("rich",),
)
