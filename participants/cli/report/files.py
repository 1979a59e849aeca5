"""Write the report to a file chosen by its extension: ``.html``/``.htm``, ``.svg``, ``.png`` or
``.perfetto.json`` (Chrome Trace Event format); any other extension is refused before work starts."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ckpt_events import Event
from ckpt_events.participants.cli.report.html import write_timeline
from ckpt_events.participants.cli.report.named import checkpoint_of, named_line
from ckpt_events.participants.cli.report.png import find_browser, write_png
from ckpt_events.participants.cli.text import escape, short_id
from ckpt_events.participants.cli.words import counted
from ckpt_events.participants.writable import unwritable

if TYPE_CHECKING:
    from ckpt_events.participants.cli.report.overview import Whole

__all__ = ["REPORT_SUFFIXES", "check_report_path", "holds_the_run", "write_report"]


#: What ``--report`` can write, by how the file name ends.
REPORT_SUFFIXES = (".html", ".htm", ".svg", ".png", ".perfetto.json")


def _perfetto(path: Path) -> bool:
    return path.name.lower().endswith(".perfetto.json")


def holds_the_run(path: Path) -> bool:
    """Whether the format of ``path`` holds every trace of the run (Perfetto's JSON), rather than
    the checkpoint shown in detail and its restore (a picture)."""
    return _perfetto(path)


def check_report_path(path: Path) -> str | None:
    """Why ``path`` cannot be written (one line), checked before any work; ``None`` if it can."""
    if path.is_dir():
        return f"cannot write {path}: it is a folder (name a file ending in {', '.join(REPORT_SUFFIXES)})"
    if not _perfetto(path) and path.suffix.lower() not in REPORT_SUFFIXES:
        return (
            f"cannot write {path}: --report writes {', '.join(REPORT_SUFFIXES)} "
            "(the file name's ending picks the format)"
        )
    if (refusal := unwritable(path)) is not None:
        return refusal
    if path.suffix.lower() == ".png" and find_browser() is None:
        return (
            f"cannot write {path}: a PNG is rendered by headless Chromium, and none was found "
            "(install Debian's 'chromium' package, or ask for .html or .svg)"
        )
    return None


def write_report(
    path: Path,
    events: Sequence[Event],
    *,
    title: str,
    tallies: Mapping[str, Counter[str]] | None = None,
    whole: Whole | None = None,
) -> str:
    """Write the report and say what was written; raises ``CommandError`` for a PNG that failed.
    ``tallies``: the counted events of more than ``events`` (whole logs), for the HTML page;
    ``whole``: the tables of logs with no controller's row, ``events`` the trace drawn."""
    suffix = path.suffix.lower()
    if _perfetto(path):
        from ckpt_events.participants.cli.report.perfetto import write_perfetto

        spans = write_perfetto(path, events)
        return (
            f"report written to {path} (Chrome Trace Event JSON, {counted(spans, 'span')} of the "
            "whole run: open in ui.perfetto.dev)"
        )
    if suffix == ".png":
        write_png(path, events, title=title, tallies=tallies, whole=whole)
        return (
            f"report written to {path} (PNG rendered by headless {Path(find_browser() or 'chromium').name})"
        )
    what = "SVG waterfall of the checkpoint" if suffix == ".svg" else "HTML page"
    if suffix == ".svg" and whole is not None and not whole.named:
        # Logs with no controller's checkpoint: the waterfall is the logs' last trace (it read
        # "of the checkpoint", of logs that name none).
        what = "SVG waterfall of the logs' last trace: no controller's checkpoint in them to draw"
    elif suffix == ".svg" and whole is not None:
        # One waterfall of a checkpoint's several requests: the last, said as such (it read
        # "of the checkpoint", one request of c1's ten, titled by the log's name alone).
        line = named_line(whole.named[-1])
        number = whole.earlier + len(whole.named)
        checkpoint = escape(short_id(checkpoint_of(whole.named[-1])))
        title = f"{title}: #{number} {line.title}"
        what = (
            f"SVG waterfall of the last of {checkpoint}'s {counted(number, 'request')}, "
            f"#{number} {escape(line.title)}; an .html page draws the last {len(whole.named)}"
        )
    write_timeline(path, events=events, title=title, tallies=tallies, whole=whole)
    return f"report written to {path} ({what})"
