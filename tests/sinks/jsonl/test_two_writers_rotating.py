"""Processes appending to one log, each rotating it by ``max_bytes`` (workers given one path).

Each process renames the chain ``log.jsonl.N`` up one and the log to ``.1`` when its own count
says the file is full; two doing it at once renamed over each other's files, and whole files of
lines were lost while both sinks counted them written. Each also went by a size read once a
batch, so files ended up to 1,934 bytes past ``max_bytes`` (4 processes, 8 events a batch), and
one opening the log while another wrote took the write in progress for a torn line and wrote a
blank line (1-4 per 8,000 events).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

pytestmark = pytest.mark.slow

WRITER = """
import sys, time
from pathlib import Path
from ckpt_events import Refused
from ckpt_events.vocab import ErrorCode
from ckpt_events.sinks import JsonLinesSink

who, log, start, per = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
# 1,000 backups keep the ~250 files a run makes; 10,000 made each rotation try 10,000 names (27 s -> 6.6 s)
sink = JsonLinesSink(log, max_bytes=MAX_BYTES, backups=1_000)
while time.time() < start:  # all begin together, so their rotations meet
    time.sleep(0.001)
for n in range(0, LINES, per):
    sink.handle([
        Refused(kind="judge", instance=f"{who}-{i}", time_ns=i, code=ErrorCode.ADMISSION_CLOSED)
        for i in range(n, min(n + per, LINES))
    ])
sink.close()
print(sink.stats().events, sink.stats().lock_missed)
"""
LINES = 2_000
MAX_BYTES = 4_000


@pytest.mark.parametrize(("writers", "per"), [(2, 1), (4, 8)])
def test_processes_rotating_one_log_lose_and_repeat_no_line(tmp_path: Path, writers: int, per: int) -> None:
    """Every line of every writer is in the log or one of its rotations, exactly once; no blank
    line; a file past ``max_bytes`` rare, and by less than one batch."""
    log = tmp_path / "events.jsonl"
    start = time.time() + 1.5
    script = WRITER.replace("LINES", str(LINES)).replace("MAX_BYTES", str(MAX_BYTES))
    names = [f"w{i}" for i in range(writers)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", script, who, str(log), str(start), str(per)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for who in names
    ]
    try:
        outputs = [writer.communicate(timeout=60) for writer in writers]
    finally:
        for writer in writers:
            if writer.poll() is None:
                writer.kill()
                writer.wait(timeout=10)
    missed = 0
    for writer, (out, err) in zip(writers, outputs, strict=True):
        assert writer.returncode == 0, err[-2000:]
        events, lock_missed = map(int, out.split())
        assert events == LINES
        missed += lock_missed
    files = {path.name: path.read_bytes() for path in tmp_path.iterdir()}
    over = {name: len(data) - MAX_BYTES for name, data in files.items() if len(data) > MAX_BYTES}
    # The documented rule: a file ends past max_bytes only through a batch written without the
    # lock (another writer held it past LOCK_WAIT on a busy machine), counted in lock_missed; such
    # a batch goes by a size read unlocked, so its overshoot has no fixed bound (1,917 bytes seen
    # with a writer holding the lock 1.2 s). Was: 94 of 129 files over (2 writers, 1 a batch),
    # 220 of 232 (4, 8 a batch), up to 1,934 bytes, with every lock had.
    assert missed or not over, f"{len(over)} of {len(files)} files past max_bytes, every lock had: {over}"
    lines = [line for data in files.values() for line in data.splitlines()]
    assert b"" not in lines, f"{lines.count(b'')} blank lines"
    instances = [msgspec.json.decode(line)["instance"] for line in lines]
    expected = {f"{who}-{n}" for who in names for n in range(LINES)}
    assert len(instances) == len(set(instances)), "a line was written twice"
    assert expected - set(instances) == set(), f"{len(expected - set(instances))} lines lost"
