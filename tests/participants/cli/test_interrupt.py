"""Ctrl-C at any point of a command's start is one line and exit 130, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

#: The command line as the ``ckpt-events`` script runs it (it imports ``main``, then calls it),
#: interrupted by its own SIGINT when the named module is first imported: as a Ctrl-C that lands
#: there, with no race (the signal's handler runs at the next bytecode, inside that import).
INTERRUPTED_AT = """
import os
import signal
import sys

AT = sys.argv.pop(1)

class Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == AT:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, Interrupt())
from ckpt_events.participants.cli.main import main
sys.exit(main())
"""


@pytest.mark.parametrize(
    "at",
    [
        "ckpt_events.participants.cli.watch.command",  # the commands' modules, imported at the start
        "ckpt_events.participants.cli.watch.view",  # watch's view, imported as it starts
    ],
)
def test_ctrl_c_while_watch_starts_is_one_line(tmp_path: Path, at: str) -> None:
    """Ctrl-C while ``watch`` imports or starts: exit 130, one line on stderr, no traceback (the
    commands' modules were imported with the script, before ``main`` could catch anything)."""
    log = tmp_path / "run.jsonl"
    log.write_text("")
    done = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_AT, at, "watch", "--follow", str(log), "--once"],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 130, done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.endswith(": interrupted\n"), done.stderr
