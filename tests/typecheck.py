"""Type-check a user's program against this tree, as a user's ``mypy --strict`` would."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def mypy_strict(code: str, folder: Path, cache: Path) -> list[str]:
    """``mypy --strict``'s error lines for ``code`` (written to ``folder/user.py``), with this
    tree's ``ckpt_events`` first on the path (not the installed copy); no lines when it is clean.

    ``cache`` is mypy's cache (the ``mypy_cache`` fixture: one a test process): mypy rechecks what
    changed and reads the rest from it, which it keeps exact. A cache a call (its folder's) made
    each call type-check ckpt_events and fastapi again: 2 to 6 s a call, 0.2 to 1 s now."""
    program = folder / "user.py"
    program.write_text(textwrap.dedent(code))
    env = {**os.environ, "MYPYPATH": str(ROOT)}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-error-summary",
            "--cache-dir",
            str(cache),
            str(program),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=folder,
        env=env,
    )
    # 0: clean; 1: the program's errors; anything else is mypy failing, not the program.
    assert result.returncode in (0, 1), result.stderr or result.stdout
    return [line for line in result.stdout.splitlines() if ": error: " in line]
