"""The demo's ``--jsonl PATH`` holds every process's and worker's events, merged in time order.

During the run each participant process writes ``<workdir>/logs/<instance>.gen<n>.jsonl`` and
each worker of a multi-worker participant ``<that>.w<index>``; the controller (and in-process
participants) write PATH through the bus. At the end ``merge_into`` folds every such file into
PATH, lines sorted by the event's own time (``end_ns``, else ``time_ns``, else ``start_ns``), so
``ckpt-events report PATH`` reads what the demo read. Lines are copied byte for byte.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import msgspec

__all__ = ["merge_into"]

_TIMES = ("end_ns", "time_ns", "start_ns")


def _keyed(path: Path, file_index: int) -> list[tuple[int, int, int, bytes]]:
    """(time, file, line, bytes) for every non-blank line; a line that does not decode keeps the
    time of the line before it, so it stays where it was."""
    out: list[tuple[int, int, int, bytes]] = []
    last = 0
    for number, line in enumerate(path.read_bytes().splitlines()):
        if not line.strip():
            continue
        try:
            fields = msgspec.json.decode(line)
        except msgspec.DecodeError:
            fields = None
        if isinstance(fields, dict):
            last = next((t for name in _TIMES if isinstance(t := fields.get(name), int)), last)
        out.append((last, file_index, number, line))
    return out


def merge_into(path: Path, others: Sequence[Path]) -> int:
    """Rewrite ``path`` with its own lines and every line of ``others`` in time order (atomically,
    through a temporary file beside it); the number of lines it holds afterwards. A ``path``
    that is a symbolic link is followed: the file it names is rewritten, the link stays."""
    # Was: the merged file was renamed over the link, and the file it named kept only the
    # demo's own events.
    path = Path(os.path.realpath(path))
    rows = [row for index, p in enumerate([path, *others]) if p.exists() for row in _keyed(p, index)]
    rows.sort()
    partial = path.with_name(path.name + ".merging")
    with open(partial, "wb") as file:
        for *_, line in rows:
            file.write(line + b"\n")
    os.replace(partial, path)
    return len(rows)
