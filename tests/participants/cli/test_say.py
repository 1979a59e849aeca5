"""``say``: a line on stderr in one write. A server and its workers share stderr; ``print``
wrote a line and its newline apart, and a worker's "interrupted" and its server's "worker 0
lost" came out as one line in a clean-clone CI run."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

#: A process that waits for the file ``go`` (10 s at most), then says ``{lines}`` numbered lines
#: on its stderr, with ``say`` or with ``print``: the writers start together, so they overlap.
_WRITER = """
import os, sys, time
from ckpt_events.participants.cli.text import say
tag, how, go = sys.argv[1:4]
deadline = time.monotonic() + 10
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.001)
for n in range({lines}):
    line = f"{{tag}} {{n}} " + "x" * 40
    if how == "say":
        say(line)
    else:
        print(line, file=sys.stderr)
"""
LINES = 20_000
TAGS = ("a", "b", "c")


def _not_whole(tmp_path: Path, how: str, attempt: int = 0) -> list[str]:
    """The lines three writers left in one stderr file that are not whole lines of theirs."""
    path, go = tmp_path / f"{how}-{attempt}.err", tmp_path / f"go-{how}-{attempt}"
    with path.open("ab") as shared:  # O_APPEND: each write lands whole, after the last
        writers = [
            subprocess.Popen(
                [sys.executable, "-c", _WRITER.format(lines=LINES), tag, how, str(go)], stderr=shared
            )
            for tag in TAGS
        ]
        time.sleep(0.3)  # each has imported and waits
        go.touch()
        for writer in writers:
            assert writer.wait(timeout=60) == 0
    lines = path.read_text().splitlines()
    whole = {f"{tag} {n} " + "x" * 40 for tag in TAGS for n in range(LINES)}
    missing = ["(lines missing)"] if len(lines) != len(whole) else []
    return [line for line in lines if line not in whole] + missing


def test_lines_said_by_processes_sharing_stderr_stay_whole(tmp_path: Path) -> None:
    """Three processes say 20,000 lines each at once on one stderr: every line comes out whole."""
    assert _not_whole(tmp_path, "say") == []


def test_print_is_what_split_them(tmp_path: Path) -> None:
    """The same writers with ``print`` (a line, then its newline: stderr is unbuffered) leave
    lines run together, so the test above would see it; up to three tries, since whether two
    writers switch between the two writes is up to the scheduler."""
    assert any(_not_whole(tmp_path, "print", attempt) for attempt in range(3))
