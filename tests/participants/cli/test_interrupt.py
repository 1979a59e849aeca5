"""Ctrl-C at any point of a command's start, or while ``watch --once`` reads a large backlog, is
one line and exit 130, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _python(script: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """``script`` (one of the programs below) run with ``argv`` in a fresh interpreter on this tree."""
    return subprocess.run(
        [sys.executable, "-c", script, *argv],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


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
    done = _python(INTERRUPTED_AT, at, "watch", "--follow", str(log), "--once")
    assert done.returncode == 130, done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.endswith(": interrupted\n"), done.stderr


#: ``watch`` with its logs read in 64 KiB chunks, its own SIGINT sent as the third is read (a
#: Ctrl-C in the middle of a large backlog, with no race); at exit, how many chunks it read is
#: written to the file named first.
INTERRUPTED_READING = """
import atexit
import os
import signal
import sys

from ckpt_events.participants.cli.watch import follow

COUNT = sys.argv.pop(1)
follow.MAX_READ = 64 * 1024
read_at = follow._read_at
calls = []

def counted(file, offset, size):
    calls.append(offset)
    if len(calls) == 3:
        os.kill(os.getpid(), signal.SIGINT)
    return read_at(file, offset, size)

follow._read_at = counted
atexit.register(lambda: open(COUNT, "w").write(str(len(calls))))
from ckpt_events.participants.cli.main import main
sys.exit(main())
"""


def test_ctrl_c_while_watch_once_reads_a_large_log_ends_it_within_a_chunk(tmp_path: Path) -> None:
    """Ctrl-C while ``watch --once`` reads a log's backlog ends the read within a chunk, exit 130
    and one line: the read was one call, and Ctrl-C waited for the log's end (minutes on a
    multi-GB log)."""
    from ckpt_events import OperationFinished, OperationStarted
    from ckpt_events.sinks import JsonLinesSink
    from ckpt_events.vocab import Operation

    log = tmp_path / "run.jsonl"
    sink = JsonLinesSink(log)
    for n in range(1, 6001):  # ~4.5 MB: about 70 chunks of 64 KiB
        start = OperationStarted(
            "model", "model-0", n, n, n * 10_000_000, Operation.COMMIT, checkpoint_id="c"
        )
        sink.handle(
            [
                start,
                OperationFinished(
                    "model", "model-0", n, n, start.start_ns, start.start_ns + 1, Operation.COMMIT
                ),
            ]
        )
    sink.close()
    assert log.stat().st_size > 60 * 64 * 1024
    count = tmp_path / "chunks.txt"
    done = _python(INTERRUPTED_READING, str(count), "watch", "--follow", str(log), "--once")
    assert done.returncode == 130, done.stderr
    assert done.stderr == "ckpt-events watch: interrupted\n", done.stderr
    assert int(count.read_text()) <= 4  # the chunk the signal came in, and at most one more


#: The command line, interrupted by its own SIGINT as ``report`` starts, and again (a second
#: Ctrl-C) while it writes its first line on stderr: the line saying it was interrupted.
INTERRUPTED_TWICE = """
import os
import signal
import sys


class Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == "ckpt_events.participants.cli.report.command":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None


class AgainAsItSays:
    def __init__(self, stream):
        self.stream = stream
        self.sent = False

    def write(self, text):
        if not self.sent:
            self.sent = True
            os.kill(os.getpid(), signal.SIGINT)
        return self.stream.write(text)

    def __getattr__(self, name):
        return getattr(self.stream, name)


sys.meta_path.insert(0, Interrupt())
sys.stderr = AgainAsItSays(sys.stderr)
from ckpt_events.participants.cli.main import main
sys.exit(main())
"""


def test_a_second_ctrl_c_while_interrupted_is_said_is_still_one_line(tmp_path: Path) -> None:
    """Ctrl-C twice quickly: the second landed while the first was being said, a KeyboardInterrupt
    traceback (here) or "ckpt-events report: interrupted" twice (3 of 3 runs of ``report`` on a
    28 MB log, two SIGINTs 5 ms apart). Once the interrupt is being said, another is the same."""
    log = tmp_path / "run.jsonl"
    log.write_text("")
    done = _python(INTERRUPTED_TWICE, "report", str(log))
    assert done.returncode == 130, done.stderr
    # Interrupted while the commands are imported, before one is parsed: no command to name.
    assert done.stderr.splitlines() == ["ckpt-events: interrupted"], done.stderr
