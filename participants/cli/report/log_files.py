"""Which files the logs named on the command line are, and how many may be open at once.

``expand_logs`` turns files, globs and folders into paths (each once) and says what named
nothing; ``rotated_ends`` says where a log given ends in a rotated file (its writer went on in a
newer one); ``open_files_budget`` how many logs may be open while they merge (``logs``).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from ckpt_events.sinks.jsonl import oldest_first, rotated_name

__all__ = ["expand_logs", "open_files_budget", "rotated_ends"]


def expand_logs(specs: Sequence[str]) -> tuple[list[Path], list[str]]:
    """Paths for files, globs and directories (every regular file in it, sorted), each once,
    and one line per spec that named nothing, saying why."""
    paths: list[Path] = []
    missing: list[str] = []
    for spec in specs:
        if not spec.strip():
            missing.append("an empty log name (a stray comma or quotes?)")
            continue
        if os.path.isdir(spec):
            found = sorted(p for p in Path(spec).iterdir() if p.is_file() and not p.name.startswith("."))
            if not found:
                missing.append(f"{spec}: a folder with no log file in it")
                continue
        elif os.path.isfile(spec):
            found = [Path(spec)]
        elif os.path.exists(spec):
            # A pipe (`<(...)`, /dev/stdin) can be read once; a log may be read twice (out of
            # time order, or a clock proven off), so it is refused rather than misread.
            missing.append(f"{spec}: not a regular file (a pipe?): save the log to a file and name that")
            continue
        else:
            found = [Path(p) for p in sorted(glob.glob(spec)) if os.path.isfile(p)]
        if not found:
            missing.append(f"{spec}: no such file, directory or matching glob")
        paths.extend(found)
    seen: set[Path] = set()
    unique = []
    for path in paths:
        if (resolved := path.resolve()) not in seen:
            seen.add(resolved)
            unique.append(path)
    return unique, missing


def rotated_ends(paths: Sequence[Path]) -> list[str]:
    """One line per log whose newest file in ``paths`` is a rotated one (``x.jsonl.1`` given
    without ``x.jsonl``): its writer went on in a newer file, not read, so what is open at that
    file's end may have ended there."""
    newest: dict[str, Path] = {}
    for path in sorted(paths, key=oldest_first):
        rotated = rotated_name(path)
        newest[str(path) if rotated is None else rotated.log] = path
    lines = []
    for log, path in newest.items():
        if str(path) != log:
            add = f"add {log}" if os.path.exists(log) else f"{log}, which it rotated from, is not here"
            lines.append(
                f"{path}: the newest file given of {log}, and a rotated one: work open at its end may "
                f"have ended in a newer file ({add})"
            )
    return lines


#: Descriptors left for everything else while logs are open (the report's output, sockets).
_SPARE_FILES: Final = 64


def open_files_budget(wanted: int) -> int:
    """How many logs may be open at once to read ``wanted``: the soft limit on open files is
    raised toward the hard one first (a folder of 1,100 logs under ``ulimit -n 1024`` lost 77
    of them, and the report was built from the rest)."""
    try:
        import resource
    except ImportError:  # not on this platform: no limit known
        return wanted
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = wanted + _SPARE_FILES * 2
    if soft != resource.RLIM_INFINITY and soft < need:
        raised = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return wanted
    try:
        in_use = len(os.listdir("/proc/self/fd"))
    except OSError:
        in_use = _SPARE_FILES
    return max(1, min(wanted, soft - in_use - _SPARE_FILES))
