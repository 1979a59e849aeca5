"""Sinks of one process writing one log exclude each other as sinks of several processes do: a
POSIX lock belongs to the process, so before each file also had a ``threading.Lock`` two sinks
on one path both held it, renamed the ``.N`` chain over each other's files and lost hundreds of
lines, counted written."""

from __future__ import annotations

import threading
from pathlib import Path

import msgspec

from ckpt_events import Refused
from ckpt_events.sinks import JsonLinesSink
from ckpt_events.vocab import ErrorCode

LINES = 1_000
MAX_BYTES = 4_000


def _write(sink: JsonLinesSink, who: str, start: threading.Barrier) -> None:
    start.wait(timeout=10)
    for n in range(LINES):
        sink.handle(
            [Refused(kind="judge", instance=f"{who}-{n}", time_ns=n, code=ErrorCode.ADMISSION_CLOSED)]
        )


def test_two_sinks_of_one_process_rotating_one_log_lose_no_line(tmp_path: Path) -> None:
    """Two sinks on one path, each written from its own thread: every line of each is in the log or
    one of its rotations exactly once, none blank, no file past ``max_bytes``."""
    log = tmp_path / "events.jsonl"
    sinks = [JsonLinesSink(log, max_bytes=MAX_BYTES, backups=1_000) for _ in range(2)]
    start = threading.Barrier(2)
    threads = [threading.Thread(target=_write, args=(sink, f"w{i}", start)) for i, sink in enumerate(sinks)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads)
    for sink in sinks:
        sink.close()
    assert [sink.stats().events for sink in sinks] == [LINES, LINES]
    files = {path.name: path.read_bytes() for path in tmp_path.iterdir()}
    # Was: 451-725 of 4,000 lines lost (2,000 a sink), counted written; rotations refused as
    # the other sink renamed the same files away (ENOENT).
    assert {name: len(data) for name, data in files.items() if len(data) > MAX_BYTES} == {}
    lines = [line for data in files.values() for line in data.split(b"\n")[:-1]]
    assert b"" not in lines
    instances = [msgspec.json.decode(line)["instance"] for line in lines]
    assert len(instances) == len(set(instances)), "a line was written twice"
    expected = {f"w{i}-{n}" for i in range(2) for n in range(LINES)}
    assert expected - set(instances) == set()
    assert [sink.stats().rotation_errors for sink in sinks] == [0, 0]
