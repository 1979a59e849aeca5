"""``unwritable(path)``: whether a file can be written there, asked before any work is done.

The one write probe of the command line (``writable_path``, ``report --report``) and of the
benchmarks (``--json PATH`` of every suite), so both refuse a path with the same words. A leaf:
it imports nothing of ours, so the benchmarks' ``report``, which the command line imports
(``bench`` -> ``bench_app``), can use it without importing the command line back.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["unwritable"]


def unwritable(path: Path, *, make_folders: bool = False) -> str | None:
    """Why ``path`` cannot be written as a file, in one line, or ``None``: a folder; a file where
    a folder of the path should be; a folder that does not exist (unless ``make_folders``: the
    writer makes it, so the nearest one that exists must take a file); no right to write there
    (tried, not read from modes: they lie to root and on read-only mounts). A link is judged by
    where it points (a write follows it), and the line names both. Nothing is created, and an
    existing file is opened for writing, never truncated."""
    shown = repr(str(path))
    if path.is_symlink():
        # A dangling link's own folder takes a file, but the write goes where it points.
        target = Path(os.path.realpath(path))
        shown = f"{shown} (a link to {str(target)!r})"
        path = target
    if path.is_dir():
        return f"{shown} is a folder: name a file in it"
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        return f"cannot write {shown}: {str(folder)!r} is a file, not a folder"
    if folder != path.parent and not make_folders:
        return f"the folder of {shown} does not exist"
    try:
        if path.exists():
            with open(path, "r+b"):  # opened for writing, not truncated
                pass
        else:
            with tempfile.TemporaryFile(dir=folder):
                pass
    except OSError as exc:
        return f"cannot write {shown}: {exc.strerror or exc}"
    return None
