"""``say``: a line on stderr in one write. A server and its workers share stderr; ``print``
wrote a line and its newline apart, and a worker's "interrupted" and its server's "worker 0
lost" came out as one line in a clean-clone CI run."""

from __future__ import annotations

import ast
import subprocess
import sys
import time
from pathlib import Path

from ckpt_events.participants.cli import text

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


def _prints_to_stderr(path: Path) -> list[str]:
    """The ``print(..., file=sys.stderr)`` calls in one source file, as ``file:line``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
            if any(k.arg == "file" and ast.unparse(k.value) == "sys.stderr" for k in node.keywords):
                found.append(f"{path.name}:{node.lineno}")
    return found


def test_the_command_line_says_its_stderr_lines(tmp_path: Path) -> None:
    """Every stderr line of the command line goes through ``say`` (report, diff, replay, watch
    and bench printed theirs in two writes, as ``serve`` did before its workers' lines ran
    together). The check reads itself right: a file with such a ``print`` is found."""
    package = Path(text.__file__).parent
    found = [hit for path in sorted(package.rglob("*.py")) for hit in _prints_to_stderr(path)]
    assert found == []
    sample = tmp_path / "sample.py"
    sample.write_text('import sys\nprint("x", file=sys.stderr)\nprint("y")\n')
    assert _prints_to_stderr(sample) == ["sample.py:2"]
