"""The export process's report pipe: its sinks' failures seen by the server while the child runs.

A real child (``configure(export_process=True)``), real failures: a JSON-lines folder removed
under it, a real HTTP server on 127.0.0.1 answering 500 to every OTLP export.
"""

from __future__ import annotations

import http.server
import logging
import os
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from ckpt_events import Bus, Telemetry
from ckpt_events.sinks import ExportProcess, ExportProcessStats, configure
from ckpt_events.sinks._export.reports import Flushed, ReportListener
from ckpt_events.sinks.otel import OtlpSpanSinkStats
from tests.http_servers import serving

pytestmark = pytest.mark.anyio

#: The longest a child sink's failure may take to show in ``ExportProcess.stats()``.
SHOWN_WITHIN = 1.0


def _checkpoints(telemetry: Telemetry, count: int) -> None:
    for i in range(count):
        with telemetry.operation("commit", checkpoint_id=f"c{i}") as op:
            with op.step("export"):
                pass


async def _until(process: ExportProcess, shown: Any) -> tuple[ExportProcessStats, float]:
    """Poll ``process.stats()`` until ``shown(stats)``, for at most ``SHOWN_WITHIN`` s (plus one
    look); the stats last seen and the seconds it took."""
    started = time.monotonic()
    for _ in range(200):  # bounded in count as in time
        stats = process.stats()
        if shown(stats) or time.monotonic() - started > SHOWN_WITHIN:
            break
        await anyio.sleep(0.02)
    return stats, time.monotonic() - started


@pytest.fixture
def refusing() -> Iterator[str]:
    """A collector on 127.0.0.1 answering every export with HTTP 500; its base URL."""

    class Refuse(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("content-length", "0")))
            self.send_response(500)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    with serving(Refuse) as server:
        yield f"http://127.0.0.1:{server.server_port}"


async def test_a_failing_json_lines_sink_in_the_child_is_seen_while_it_runs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    """The log's folder removed under the child: ``stats()`` shows the failed events within 1 s
    (before: ``child`` and ``sinks`` were ``None`` until the close), the server logs the cause in
    one line through its own logging (before: a traceback on the child's stderr), and a summary
    at the close."""
    folder = tmp_path / "logs"
    folder.mkdir()
    with caplog.at_level(logging.WARNING, logger="ckpt_events"):
        async with Bus() as bus:
            configured = configure(bus, jsonl_path=folder / "events.jsonl", export_process=True)
            process = configured.export_process
            assert process is not None
            shutil.rmtree(folder)  # the sink reopens its path, in a folder that is gone
            _checkpoints(Telemetry(bus, kind="environment", instance="env-0"), 100)
            await bus.flush()
            stats, took = await _until(
                process, lambda s: s.child is not None and s.child.sink("jsonl").failed == 400
            )
            assert took <= SHOWN_WITHIN, stats
            assert stats.child is not None and stats.sinks is not None and not stats.final
            assert stats.sinks["jsonl"].failed == 400  # type: ignore[attr-defined]
            assert "No such file or directory" in str(stats.child.sink("jsonl").error)
            assert stats.exit_code is None  # it runs on: the failure is isolated there
            said = [r for r in caplog.records if getattr(r, "export_process", None) == process.pid]
            assert len(said) == 1, [r.getMessage() for r in said]
            assert said[0].levelno == logging.ERROR and said[0].name == "ckpt_events"
            assert said[0].exc_info is None
            line = said[0].getMessage()
            assert "sink 'jsonl' failed to handle a batch of 400 events" in line
            assert "FileNotFoundError" in line and "\n" not in line
            _checkpoints(Telemetry(bus, kind="environment", instance="env-0"), 10)  # fails again
            await bus.flush()
            await configured.aclose()
    stats = process.stats()
    assert stats.final and stats.child is not None and stats.child.sink("jsonl").failed == 440
    said = [r for r in caplog.records if getattr(r, "export_process", None) == process.pid]
    assert len(said) == 1  # once, not per batch
    summary = [r.getMessage() for r in caplog.records if "its sinks having lost events" in r.getMessage()]
    assert len(summary) == 1 and "jsonl failed=440 (FileNotFoundError" in summary[0], summary
    assert "Traceback" not in capfd.readouterr().err


async def test_a_collector_refusing_the_childs_spans_is_seen_while_it_runs(
    refusing: str, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    """A collector answering 500: the child's OTLP span sink drops and counts; ``stats().sinks``
    shows the drops within 1 s (before: only after the close), its warning reaches the server's
    logging once, and the close sums up what was lost."""
    with caplog.at_level(logging.WARNING, logger="ckpt_events"):
        async with Bus() as bus:
            configured = configure(
                bus, otlp_endpoint=refusing, export_process=True, environ={"OTEL_METRICS_EXPORTER": "none"}
            )
            process = configured.export_process
            assert process is not None
            _checkpoints(Telemetry(bus, kind="environment", instance="env-0"), 50)
            await bus.flush()
            # The sink's own export thread sends within its batch delay (OTLP's 5 s default is
            # the SDK's; ours sends a batch at once): the drop is counted as the answer comes.
            stats, took = await _until(
                process, lambda s: s.sinks is not None and s.sinks["otel-spans"].dropped == 100
            )
            assert took <= SHOWN_WITHIN, stats
            spans = stats.sinks["otel-spans"] if stats.sinks else None
            assert isinstance(spans, OtlpSpanSinkStats) and spans.last_failure == "answered 500"
            said = [r for r in caplog.records if getattr(r, "export_process", None) == process.pid]
            assert len(said) == 1 and "answered 500" in said[0].getMessage(), said
            assert said[0].name == "ckpt_events.sinks.otel"
            await configured.aclose()
    summary = [r.getMessage() for r in caplog.records if "its sinks having lost events" in r.getMessage()]
    assert len(summary) == 1 and "otel-spans dropped=100 (answered 500)" in summary[0], summary
    assert "answered 500" not in capfd.readouterr().err  # said through the server's logging only


async def test_a_child_that_loses_nothing_is_not_summed_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing lost: no summary at the close, and the counters while it ran said every event
    delivered."""
    with caplog.at_level(logging.WARNING, logger="ckpt_events"):
        async with Bus() as bus:
            configured = configure(bus, jsonl_path=tmp_path / "events.jsonl", export_process=True)
            process = configured.export_process
            assert process is not None
            _checkpoints(Telemetry(bus, kind="environment", instance="env-0"), 10)
            await bus.flush()
            stats, _ = await _until(
                process, lambda s: s.child is not None and s.child.sink("jsonl").delivered == 40
            )
            assert stats.child is not None and stats.child.sink("jsonl").delivered == 40
            await configured.aclose()
    assert [r.getMessage() for r in caplog.records] == []


async def test_a_stopped_child_never_holds_up_the_servers_stats(tmp_path: Path) -> None:
    """SIGSTOP the child: ``stats()`` answers at once from the last report (the report pipe is
    read by a thread of its own, never on the event loop), and the close still ends in time."""
    async with Bus() as bus:
        configured = configure(bus, jsonl_path=tmp_path / "events.jsonl", export_process=True)
        process = configured.export_process
        assert process is not None
        configured.close_timeout = 1.0
        os.kill(process.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            for _ in range(100):
                process.stats()
            assert time.monotonic() - started < 0.5
            started = time.monotonic()
            await configured.aclose()
            assert time.monotonic() - started < 3.0
        finally:
            if process.stats().exit_code is None:
                os.kill(process.pid, signal.SIGKILL)


async def test_a_credential_in_a_childs_log_message_reaches_the_servers_log_redacted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The child's log lines are forwarded to the server's logging; only a record's exception was
    redacted, not its message: a hand-built event holding a URL's ``user:password`` and a
    ``Bearer`` token, which the child cannot read, was said with both verbatim in the server's
    log (the decoder's error quotes the value). The message is redacted too now."""
    from ckpt_events import Refused

    secret = "https://alice:hunter2@collector.example/v1 Authorization: Bearer sk-live-SECRET"
    with caplog.at_level(logging.WARNING, logger="ckpt_events"):
        async with Bus() as bus:
            configured = configure(bus, jsonl_path=tmp_path / "events.jsonl", export_process=True, environ={})
            process = configured.export_process
            assert process is not None
            bus.emit(Refused(kind="agent", instance="agent-0", time_ns=1, code=secret))  # type: ignore[arg-type]
            await configured.aclose()
    said = [r.getMessage() for r in caplog.records if getattr(r, "export_process", None) == process.pid]
    assert len(said) == 1 and "left out an event it could not read" in said[0], said
    assert "https://[REDACTED]@collector.example/v1" in said[0] and "Bearer [REDACTED]" in said[0]
    assert not any(word in said[0] for word in ("alice", "hunter2", "sk-live-SECRET")), said


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts wake-ups in Linux's /proc")
def test_an_idle_report_listener_sleeps_until_a_report_or_its_stop() -> None:
    """With no report coming for 1 s, the server's report thread woke twice a second (a 0.5 s
    poll for its stop flag), and its stop took up to that; now it sleeps until a report or
    ``stop()`` wakes it, and reads the report sent after the idle second."""
    read_end, write_end = os.pipe()
    listener = ReportListener(read_end, os.getpid())
    try:
        thread = listener._thread
        time.sleep(0.1)  # past its start
        with open(f"/proc/self/task/{thread.native_id}/schedstat") as stat:
            before = int(stat.read().split()[2])
        time.sleep(1.0)
        with open(f"/proc/self/task/{thread.native_id}/schedstat") as stat:
            idle_wakeups = int(stat.read().split()[2]) - before
        os.write(write_end, msgspec.json.encode(Flushed(7, True)) + b"\n")
        for _ in range(100):  # bounded: 1 s
            if listener.flushed is not None:
                break
            time.sleep(0.01)
        stopping = time.monotonic()
        listener.stop()
        thread.join(2.0)
        stopped_in = time.monotonic() - stopping
    finally:
        os.close(write_end)
    assert listener.flushed == Flushed(7, True)
    assert idle_wakeups <= 1, idle_wakeups
    assert not thread.is_alive() and stopped_in < 0.2, stopped_in
