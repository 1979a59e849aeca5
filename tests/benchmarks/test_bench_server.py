"""bench_server without a collector: the OTLP, every-sink and SDK rows stay, saying why and how."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import NoReturn

import pytest

from ckpt_events.benchmarks import bench_server, rotel
from ckpt_events.benchmarks.load import children_pids
from ckpt_events.benchmarks.spread import Ratio


@pytest.mark.slow
def test_rows_that_need_rotel_say_why_without_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No rotel-agent: every variant that needs it keeps a row with the reason; the rest are measured."""
    absent = tmp_path / "no-rotel-agent"
    monkeypatch.setenv(rotel.ENV_BINARY, str(absent))
    # The rows, not the figures, are under test: two short rounds (a quick run is 3 of 2,000).
    result = bench_server.run(quick=True, requests=400, rounds=2)
    why = rotel.why_missing()
    assert str(absent) in why and "pip install rotel" in why
    assert result["skipped"] == {"otlp": why, "all": why, "all_export_process": why, "sdk": why}
    rows = {what: value for what, value, _, _ in result["rows"]}
    skipped = [what for what in rows if why in what]
    # The OTLP, both every-sink and the SDK rows, and each of ours against the SDK's.
    assert len(skipped) == 7
    assert all(rows[what] is None for what in skipped)
    measured = rows["server CPU/request: ckpt-events, no sink / uninstrumented"]
    assert isinstance(measured, Ratio) and measured.rounds == result["rounds"]


@pytest.mark.skipif(rotel.agent_binary() is None, reason="needs the rotel collector (pip install rotel)")
def test_a_round_reads_the_export_process_beside_its_server() -> None:
    """Servers side by side, load alternating: the export process's CPU is read from the
    server's children (more than nothing), and a server without one has none."""
    cores = (0, 1) if len(os.sched_getaffinity(0)) >= 2 else None
    with rotel.collector() as collector:
        measured = bench_server._round(["uninstrumented", "all_export_process"], collector, 400, 4, cores)
    assert measured["uninstrumented"].children == 0.0
    exported = measured["all_export_process"]
    assert exported.server > 0 and exported.children > 0
    # Each server's CPU is read from its CPU clock where the kernel has one (not its ticks).
    if sys.platform == "linux":
        assert all(one.exact for one in measured.values())


def test_a_server_interrupted_while_it_starts_is_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C while a variant's server started (before it answered) left that server running.

    The Ctrl-C comes in the first wait between tries: a server spawned a moment ago has not
    imported uvicorn yet, so the first try is always refused. (A 0.3 s timer, first used here,
    went off after a warm machine's server had answered: the test then failed, not the code.)"""

    def interrupt(seconds: float) -> NoReturn:
        monkeypatch.undo()  # once: stopping the server may sleep too (``time`` is one module)
        raise KeyboardInterrupt

    before = set(children_pids(os.getpid()))
    monkeypatch.setattr(bench_server.time, "sleep", interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            bench_server._start("uninstrumented", rotel.free_port(), None, None)
    finally:
        monkeypatch.undo()
        left = set(children_pids(os.getpid())) - before
        for pid in left:  # what the old code left running
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    assert not left


def test_the_load_sends_exactly_the_requests_asked_over_its_connections() -> None:
    """100 requests on 32 connections are 100 (each connection's share rounded down sent 96;
    fewer requests than connections sent none, and the round divided by zero)."""

    async def serve_and_load(requests: int) -> tuple[int, int]:
        answered = 0

        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal answered
            try:
                while True:
                    await reader.readuntil(b"\r\n\r\n")
                    await reader.readexactly(2048)
                    answered += 1
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                writer.close()

        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        async with server:
            port = server.sockets[0].getsockname()[1]
            done = await asyncio.wait_for(bench_server._load(port, requests, 32, 10), 20)
        return done, answered

    assert asyncio.run(serve_and_load(100)) == (100, 100)
    assert asyncio.run(serve_and_load(20)) == (20, 20)


def test_fewer_requests_than_slices_are_refused_before_anything_starts() -> None:
    with pytest.raises(ValueError, match="at least 10"):
        bench_server.run(requests=5, rounds=1)
