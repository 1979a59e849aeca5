"""Two processes appending to one log, each rotating it by ``max_bytes`` (workers given one path).

Each process renames the chain ``log.jsonl.N`` up one and the log to ``.1`` when its own count
says the file is full; two doing it at once renamed over each other's files, and whole files of
lines were lost while both sinks counted them written.
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
from ckpt_events import ErrorCode, Refused
from ckpt_events.sinks import JsonLinesSink

who, log, start = sys.argv[1], sys.argv[2], float(sys.argv[3])
sink = JsonLinesSink(log, max_bytes=4_000, backups=10_000)
while time.time() < start:  # both begin together, so their rotations meet
    time.sleep(0.001)
for n in range(LINES):
    sink.handle([Refused(kind="judge", instance=f"{who}-{n}", time_ns=n, code=ErrorCode.ADMISSION_CLOSED)])
sink.close()
print(sink.stats().events)
"""
LINES = 3_000


def test_two_processes_rotating_one_log_lose_and_repeat_no_line(tmp_path: Path) -> None:
    """Every line of both writers is in the log or one of its rotations, exactly once."""
    log = tmp_path / "events.jsonl"
    start = time.time() + 1.5
    script = WRITER.replace("LINES", str(LINES))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", script, who, str(log), str(start)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for who in ("a", "b")
    ]
    try:
        outputs = [writer.communicate(timeout=60) for writer in writers]
    finally:
        for writer in writers:
            if writer.poll() is None:
                writer.kill()
                writer.wait(timeout=10)
    for writer, (out, err) in zip(writers, outputs, strict=True):
        assert writer.returncode == 0, err[-2000:]
        assert out.strip() == str(LINES)
    instances = [
        msgspec.json.decode(line)["instance"]
        for path in tmp_path.iterdir()
        for line in path.read_bytes().splitlines()
        if line
    ]
    expected = {f"{who}-{n}" for who in ("a", "b") for n in range(LINES)}
    assert len(instances) == len(set(instances)), "a line was written twice"
    assert expected - set(instances) == set(), f"{len(expected - set(instances))} lines lost"
