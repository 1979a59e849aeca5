"""Shared output for the benchmarks: one rich table of ratios, the figures as JSON, paired
ratios, and a failed suite said in one line."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Final

from ckpt_events.participants.writable import unwritable

from .load import DriverError
from .rotel import CollectorError
from .spread import Ratio

Row = Sequence[Any]  # (what, value, target, met: bool | None)


def _fmt(value: object) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, Ratio):
        return str(value)  # its spread, or "no measurable difference"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def cell(value: object) -> str:
    """A value as the table prints it (a ``Ratio`` with its spread, ``n/a`` for ``None``)."""
    return _fmt(value)


def print_table(title: str, rows: Iterable[Row]) -> None:
    """Print ``rows`` as a table: measurement, value, target, and whether it is met."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    # Text, not markup: a row's "how to get it" names an extra in brackets ('ckpt-events[dev]'),
    # which rich's markup took for a style tag and printed as 'ckpt-events'.
    table = Table(title=Text(title), title_justify="left")
    table.add_column("measurement", overflow="fold")  # a long hint wraps, never cut to "…"
    table.add_column("value", justify="right")
    table.add_column("target", justify="right")
    table.add_column("met", justify="center")
    for what, value, target, met in rows:
        mark = "" if met is None else ("yes" if met else "NO")
        table.add_row(Text(str(what)), Text(_fmt(value)), Text(str(target)), mark)
    Console(width=_width()).print(table)


def _width() -> int | None:
    """A terminal's own width (``None``: rich asks it); piped output ``$COLUMNS`` if it is a
    number of 40 or more (a CI log's width), else 110 columns."""
    if sys.stdout.isatty():
        return None
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) >= 40 else 110


def markdown_table(rows: Iterable[Row]) -> str:
    """The same rows as a Markdown table, for the README and closing notes."""
    lines = ["| measurement | value | target | met |", "|---|---:|---:|:---:|"]
    for what, value, target, met in rows:
        mark = "" if met is None else ("yes" if met else "NO")
        lines.append(f"| {what} | {_fmt(value)} | {target} | {mark} |")
    return "\n".join(lines)


def matrix_markdown(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A Markdown table with a name column and right-aligned value columns."""
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    lines.extend("| " + " | ".join(row) + " |" for row in rows)
    return "\n".join(lines)


def paired_ratio(values: Sequence[float], baseline: Sequence[float]) -> Ratio:
    """The median over rounds of ``values[r] / baseline[r]``, with its spread (a ``Ratio``, a
    float): measured back to back in each round, so a drift in the machine's speed between
    rounds cancels out of every pair."""
    return Ratio.paired(values, baseline)


def output_path(value: str) -> Path:
    """``--json PATH`` (``--png PATH``) of a suite's ``main``, an argparse type: what could not be
    written is refused when parsed, in one line (an empty path, a folder, a place with no right
    to write), not found with a traceback after the whole run, in the words the command line
    uses (``participants.writable.unwritable``). Missing folders are made."""
    if not value.strip():
        raise argparse.ArgumentTypeError(f"{value!r} is an empty path (stray quotes?): name a file")
    path = Path(value)
    if (refusal := unwritable(path, make_folders=True)) is not None:
        raise argparse.ArgumentTypeError(refusal)
    return path


#: Set (to anything) to have a failed suite's ``main`` raise with its traceback, not one line.
TRACEBACK_ENV: Final = "CKPT_EVENTS_BENCH_TRACEBACK"


@contextlib.contextmanager
def failure_in_one_line(suite: str) -> Iterator[None]:
    """What a suite's ``main`` (``python -m ckpt_events.benchmarks.bench_<suite>``) runs in: an
    exception (a server or collector that did not start, a load generator that failed) is one
    line on stderr, as ``ckpt-events bench`` says it, and exit status 1, never a traceback. The
    benchmarks' own errors (``CollectorError``, ``DriverError``) say their fix; any other is
    named with its type and how to see where it came from (``$CKPT_EVENTS_BENCH_TRACEBACK``).
    Ctrl-C is not caught."""
    try:
        yield
    except Exception as exc:
        if os.environ.get(TRACEBACK_ENV):
            raise
        said = " ".join((str(exc) or type(exc).__name__).split())[:300]
        said = "".join(c if c.isprintable() else repr(c)[1:-1] for c in said)  # inert on a terminal
        fix = (
            ""
            if isinstance(exc, CollectorError | DriverError)
            else f" ({type(exc).__name__}: the output above may say why; {TRACEBACK_ENV}=1 shows "
            "where it was raised)"
        )
        print(f"bench_{suite}: failed: {said}{fix}", file=sys.stderr)
        raise SystemExit(1) from None


def table_json(rows: Iterable[Row]) -> list[dict[str, Any]]:
    """The table's rows as JSON: each measurement as printed (a skipped row's why and how to get
    it is in its name), its value (``None`` for ``n/a``, a ``Ratio``'s figures), the cell the
    table showed, the target and whether it was met."""
    return [
        {
            "measurement": str(what),
            # A Ratio's spread too: as a float it was its median alone, and the JSON lost the
            # "no measurable difference" the table printed.
            "value": value.figures() if isinstance(value, Ratio) else value,
            "shown": _fmt(value),
            "target": str(target),
            "met": met,
        }
        for what, value, target, met in rows
    ]


def write_json(
    path: Path,
    figures: dict[str, Any],
    *,
    rows: Iterable[Row] | None = None,
    failed: dict[str, str] | None = None,
) -> None:
    """Write ``figures`` with the interpreter and time they were measured on, and the table that
    was printed (``rows``) and the suites that failed with why, when given: the figures alone
    held ``null`` for a skipped row, not why or how to get it, and left a failed suite out
    without a word."""
    # The folders of where the write goes: a link's own folder exists, its target's may not (the
    # probe took it, making folders; the write then failed after the whole run, a traceback).
    Path(os.path.realpath(path)).parent.mkdir(parents=True, exist_ok=True)
    payload: dict[str, Any] = {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "figures": figures,
    }
    if rows is not None:
        payload["table"] = table_json(rows)
    if failed:
        payload["failed"] = failed
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")


def publish(title: str, rows: Sequence[Row], json_path: Path, figures: dict[str, Any]) -> None:
    """What every suite ends with: its table, the same table in Markdown (for the docs), and
    ``figures`` written to ``json_path`` with the interpreter and time they were measured on."""
    print_table(title, rows)
    print(markdown_table(rows))
    write_json(json_path, figures, rows=rows)
    print(f"figures written to {json_path}")
