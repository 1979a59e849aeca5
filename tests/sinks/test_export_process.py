"""``configure(export_process=True)``: the sinks in a real child process, fed through a pipe.

Everything here runs the real child (``python -m ckpt_events.sinks._export.child``), a real
OTLP/HTTP receiver on 127.0.0.1 and real files; the failures are real signals to the child.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from ckpt_events import Bus, ConfigurationError, Telemetry
from ckpt_events.sinks import ExportProcess, configure, read_events
from tests.participants.cli.otlp_receiver import otlp_receiver
from tests.processes import alive

pytestmark = pytest.mark.anyio


def _checkpoints(telemetry: Telemetry, count: int) -> None:
    for i in range(count):
        with telemetry.operation("commit", checkpoint_id=f"c{i}") as op:
            with op.step("export") as step:
                step.set(records=1)
            op.set(records=1, bytes=32)


@contextlib.contextmanager
def _hung_collector() -> Iterator[str]:
    """The endpoint of a collector that takes connections and never answers (they complete in
    the backlog; nothing is ever read)."""
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(16)
        yield f"http://127.0.0.1:{hole.getsockname()[1]}"


async def test_every_sink_runs_in_the_child_and_gets_every_event(tmp_path: Path) -> None:
    """JSON lines, OTLP spans and the Prometheus endpoint, all in the child: the log holds the
    same events this process emitted, the collector gets the spans, the child's counters come back."""
    log = tmp_path / "events.jsonl"
    with otlp_receiver() as received:
        async with Bus() as bus:
            configured = configure(
                bus,
                jsonl_path=log,
                otlp_endpoint=received.url,
                export_process=True,
                environ={
                    "OTEL_METRICS_EXPORTER": "prometheus",
                    "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
                    "OTEL_EXPORTER_PROMETHEUS_PORT": "0",
                },
            )
            process = configured.export_process
            assert process is not None and [sub.name for sub in configured.subscriptions] == [
                "export-process"
            ]
            assert configured.span_sinks == () and configured.jsonl_sink is None
            seen: list[Any] = []

            class Keep:
                def handle(self, batch: list[Any]) -> None:
                    seen.extend(batch)

            bus.subscribe(Keep())
            _checkpoints(Telemetry(bus, kind="environment", instance="env-0"), 50)
            await bus.flush()
            assert process.prometheus_url is not None
            scraped = _scrape(process.prometheus_url, "gym_checkpoint_records_total{")
            assert 'operation="commit"' in scraped
            await configured.aclose()
        stats = process.stats()
    assert len(seen) == 200
    assert stats.forwarded == stats.received == 200 and stats.dropped == 0 and stats.exit_code == 0
    assert stats.child is not None
    assert {row.name: row.delivered for row in stats.child.sinks}["jsonl"] == 200
    assert [event for _, event in read_events(log)] == seen
    assert received.paths.count("/v1/traces") >= 1
    assert not alive(process.pid)


def _scrape(url: str, needle: str) -> str:
    """The endpoint's page once it shows ``needle`` (the child's bus delivers a moment later)."""
    text = ""
    for _ in range(100):
        with urllib.request.urlopen(url, timeout=5) as page:
            text = page.read().decode()
        if needle in text:
            break
        time.sleep(0.05)
    return text


async def test_a_bad_setting_is_the_childs_own_error_in_one_line(tmp_path: Path) -> None:
    """A setting the child's configure() refuses raises ConfigurationError here, with its
    message, and leaves no child running."""
    async with Bus() as bus:
        with pytest.raises(ConfigurationError, match=r"OTEL_TRACES_EXPORTER.*'bogus'") as caught:
            configure(bus, export_process=True, environ={"OTEL_TRACES_EXPORTER": "bogus"})
        assert "\n" not in str(caught.value)
        assert bus.stats().sinks == ()
    children = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text().split()
    assert not [pid for pid in children if alive(int(pid)) and "sinks._export.child" in _cmdline(int(pid))]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


async def test_in_process_parts_and_a_bad_switch_are_refused() -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    async with Bus() as bus:
        with pytest.raises(ConfigurationError, match="export_process cannot take span_exporter"):
            configure(bus, export_process=True, span_exporter=InMemorySpanExporter())
        with pytest.raises(ConfigurationError, match=r"CKPT_EVENTS_EXPORT_PROCESS='yes': use true or false"):
            configure(bus, environ={"CKPT_EVENTS_EXPORT_PROCESS": "yes"})
        with pytest.raises(ConfigurationError, match="export_process must be True or False"):
            configure(bus, export_process=1)  # type: ignore[arg-type]
        assert bus.stats().sinks == ()


async def test_the_environment_switch_starts_the_child(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    async with Bus() as bus:
        configured = configure(
            bus, environ={"CKPT_EVENTS_EXPORT_PROCESS": "true", "CKPT_EVENTS_JSONL": str(log)}
        )
        assert configured.export_process is not None
        _checkpoints(Telemetry(bus, kind="agent", instance="agent-0"), 3)
        await configured.aclose()
    assert len(list(read_events(log))) == 12


async def test_the_sampler_and_settings_are_the_environments_as_in_process(tmp_path: Path) -> None:
    """``Configured.sample_ratio`` (what to pass to ``Telemetry``) and ``settings`` are the
    environment's with the child as without it (before: 1.0 and the defaults, so a server
    asking for 10% of traces sampled them all)."""
    environ = {
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.1",
        "OTEL_METRIC_EXPORT_INTERVAL": "2500",
        "CKPT_EVENTS_JSONL": str(tmp_path / "events.jsonl"),
    }
    async with Bus() as bus:
        async with configure(bus, environ=environ) as in_process:
            pass
        async with configure(bus, environ=environ, export_process=True) as configured:
            assert configured.export_process is not None
        async with configure(bus, environ={**environ, "CKPT_EVENTS_JSONL": ""}, export_process=True) as off:
            assert configured.export_process is not None and not off.enabled
    assert in_process.sample_ratio == configured.sample_ratio == off.sample_ratio == 0.1
    assert configured.settings == in_process.settings
    assert configured.settings.metric_interval_ms == 2500


async def test_what_a_sink_prints_goes_to_stderr_not_into_the_replies(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The console span exporter prints to stdout; in the child that is the server's stderr,
    and the child's closing reply still comes back whole. The span sink wants finished events
    only, so only those are built and forwarded."""
    async with Bus() as bus:
        configured = configure(bus, export_process=True, environ={"OTEL_TRACES_EXPORTER": "console"})
        _checkpoints(Telemetry(bus, kind="model", instance="model-0"), 2)
        await configured.aclose()
    stats = configured.export_process.stats()  # type: ignore[union-attr]
    assert stats.exit_code == 0 and stats.forwarded == stats.received == 4 and stats.child is not None
    out, err = capfd.readouterr()
    assert "gym.checkpoint.commit" in err and "gym.checkpoint.commit" not in out


async def test_a_killed_child_costs_counted_drops_and_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SIGKILL the child: the next batches are dropped and counted, one warning is logged, the
    emitter never waits and closing ends at once."""
    async with Bus() as bus:
        configured = configure(bus, jsonl_path=tmp_path / "events.jsonl", export_process=True)
        process = configured.export_process
        assert process is not None
        telemetry = Telemetry(bus, kind="environment", instance="env-0")
        _checkpoints(telemetry, 5)
        await bus.flush()
        os.kill(process.pid, signal.SIGKILL)
        for _ in range(200):
            if not alive(process.pid):
                break
            time.sleep(0.01)
        with caplog.at_level(logging.WARNING, logger="ckpt_events.sinks"):
            for _ in range(3):
                _checkpoints(telemetry, 5)
                await bus.flush()
        started = time.monotonic()
        await configured.aclose()
        assert time.monotonic() - started < 2.0
    stats = process.stats()
    assert stats.forwarded == 20 and stats.dropped == 60 and stats.exit_code == -signal.SIGKILL
    assert not stats.final and stats.received is None  # it never said what it did
    warnings = [r.getMessage() for r in caplog.records if "export process" in r.getMessage()]
    assert len(warnings) == 1 and "is gone" in warnings[0]
    # What it held died with it: the one warning says how much (the docs' promise), not only
    # that later batches are dropped (forwarded=20 and an empty log, unexplained).
    assert "20 events were forwarded to it before, how many it exported is unknown" in warnings[0]


async def test_a_child_killed_with_no_batch_after_it_is_said_at_close(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SIGKILL the child after it was handed its last batch: nothing wrote to the pipe again, so
    nothing said it had gone, and the close ended with the events it held lost unsaid. The
    close now says it, once, with what is known (forwarded; how many exported, unknown)."""
    async with Bus() as bus:
        configured = configure(bus, jsonl_path=tmp_path / "events.jsonl", export_process=True)
        process = configured.export_process
        assert process is not None
        os.kill(process.pid, signal.SIGSTOP)  # it reads nothing more: those events die with it
        _checkpoints(Telemetry(bus, kind="environment", instance="env-0"), 5)
        await bus.flush()
        os.kill(process.pid, signal.SIGKILL)
        with caplog.at_level(logging.WARNING, logger="ckpt_events.sinks"):
            await configured.aclose()
    stats = process.stats()
    assert (stats.forwarded, stats.dropped, stats.exit_code, stats.final) == (20, 0, -signal.SIGKILL, False)
    assert stats.received is None  # it never said what it read (its counters: as last reported)
    warnings = [r.getMessage() for r in caplog.records if "export process" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert f"(pid {process.pid}) ended (killed by SIGKILL) without saying what it exported" in warnings[0]
    assert "20 events were forwarded to it" in warnings[0]


async def test_a_stopped_child_fills_the_pipe_and_the_bus_drops_never_the_emitter(tmp_path: Path) -> None:
    """SIGSTOP the child: the pipe fills, this sink waits for it, the bus's bounded buffer drops
    and counts; emitting stays quick and closing ends by its deadline, killing the child."""
    async with Bus(buffer_size=4096) as bus:
        configured = configure(bus, jsonl_path=tmp_path / "events.jsonl", export_process=True)
        process = configured.export_process
        assert process is not None
        process.close_timeout = configured.close_timeout = 1.0
        os.kill(process.pid, signal.SIGSTOP)
        try:
            telemetry = Telemetry(bus, kind="environment", instance="env-0")
            started = time.monotonic()
            for _ in range(50):
                _checkpoints(telemetry, 200)
                await bus.flush(timeout=0.01)
            emitting = time.monotonic() - started
            dropped = {row.name: row.dropped for row in bus.stats().sinks}["export-process"]
            assert dropped > 0
            assert emitting < 10.0
            started = time.monotonic()
            await configured.aclose()
            assert time.monotonic() - started < 4.0
        finally:
            if alive(process.pid):  # the close killed it: it stopped reading with the pipe full
                os.kill(process.pid, signal.SIGCONT)
    assert not alive(process.pid)


async def test_a_hung_child_is_killed_when_the_bus_gives_up_on_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SIGSTOP the child, fill the pipe and close without waking it: the bus abandons the sink
    stuck on the full pipe at its deadline, and the child is killed, not left stopped for ever."""
    with caplog.at_level(logging.WARNING, logger="ckpt_events.sinks"):
        async with Bus(buffer_size=4096, close_timeout=0.3) as bus:
            configured = configure(bus, jsonl_path=tmp_path / "events.jsonl", export_process=True)
            process = configured.export_process
            assert process is not None
            process.close_timeout = configured.close_timeout = 0.3
            os.kill(process.pid, signal.SIGSTOP)
            telemetry = Telemetry(bus, kind="environment", instance="env-0")
            for _ in range(10):
                _checkpoints(telemetry, 500)
                await bus.flush(timeout=0.01)
            await configured.aclose()
        try:
            assert not alive(process.pid)
            assert process.stats().exit_code == -signal.SIGKILL
        finally:
            if alive(process.pid):
                os.kill(process.pid, signal.SIGKILL)
    assert any("stopped reading its input" in r.getMessage() for r in caplog.records)


async def test_a_hung_collector_lets_the_child_close_in_order_within_the_deadline(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A collector that takes the connection and never answers: the child closed within 8 s
    of a 10 s deadline plus its bus's own 5 s, so it was always killed, its drops unsaid. It
    now closes within what is left of the caller's deadline (set after configure(), as serve
    does) and says what it dropped, as the sinks in process do."""
    with _hung_collector() as hole:
        async with Bus() as bus:
            configured = configure(
                bus,
                otlp_endpoint=hole,
                export_process=True,
                environ={},
            )
            # 2.5 s: the child's half of it (its sinks' close) leaves 1.25 s to spare for a
            # machine under load; at 1.0 s a busy machine's child was killed at the deadline.
            configured.close_timeout = 2.5
            _checkpoints(Telemetry(bus, kind="environment", instance="env-0"), 5)
            await bus.flush()
            started = time.monotonic()
            await configured.aclose()
        took = time.monotonic() - started
    stats = configured.export_process.stats()  # type: ignore[union-attr]
    assert took < 3.3
    assert stats.exit_code == 0 and stats.child is not None and stats.received == stats.forwarded
    assert not [r for r in caplog.records if "did not end within its close deadline" in r.getMessage()]


async def test_the_child_sinks_own_counters_come_back_a_refused_collectors_drops_too(
    tmp_path: Path,
) -> None:
    """A collector that refuses: the child's span sink drops every span and says they are
    "counted in OtlpSpanSink.stats()", which lives in the child; the bus counters that came back
    said each was delivered, none dropped. The sinks' own counters come back now, typed as in
    process, so the drops (and why) are where the log line says."""
    from ckpt_events.sinks import JsonLinesStats
    from ckpt_events.sinks.otel import OtlpMetricSinkStats, OtlpSpanSinkStats

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound, never listening: every connection is refused
        async with Bus() as bus:
            configured = configure(
                bus,
                jsonl_path=tmp_path / "events.jsonl",
                otlp_endpoint=f"http://127.0.0.1:{closed.getsockname()[1]}",
                export_process=True,
                environ={},
            )
            configured.close_timeout = 5.0
            _checkpoints(Telemetry(bus, kind="environment", instance="env-0"), 5)
            await configured.aclose()
    stats = configured.export_process.stats()  # type: ignore[union-attr]
    assert stats.exit_code == 0 and stats.sinks is not None
    spans, metrics, jsonl = stats.sinks["otel-spans"], stats.sinks["otel-metrics"], stats.sinks["jsonl"]
    assert isinstance(spans, OtlpSpanSinkStats) and (spans.exported, spans.dropped) == (0, 10)
    assert spans.last_failure is not None
    assert isinstance(metrics, OtlpMetricSinkStats) and metrics.export_failures >= 1
    assert isinstance(jsonl, JsonLinesStats) and jsonl.events == 20


def test_a_server_gone_before_the_child_said_ready_leaves_no_traceback(tmp_path: Path) -> None:
    """The server dies (SIGKILL, SIGTERM) while its export child starts: the child's "ready"
    reply met a closed pipe and it printed a 40-line ``BrokenPipeError`` traceback on the
    server's stderr after the server had gone. It ends quietly now, its sinks closed."""
    replies_read, replies_write = os.pipe()
    reports_read, reports_write = os.pipe()
    os.close(replies_read)  # the server is gone: nobody reads the replies, nor the reports
    os.close(reports_read)
    head = {"arguments": {"jsonl_path": str(tmp_path / "events.jsonl"), "environ": {}}}
    try:
        child = subprocess.run(
            [sys.executable, "-m", "ckpt_events.sinks._export.child"],
            input=msgspec.json.encode({**head, "reports": reports_write}) + b"\n",
            stdout=replies_write,
            stderr=subprocess.PIPE,
            pass_fds=(reports_write,),
            timeout=60,
            check=False,
        )
    finally:
        os.close(replies_write)
        os.close(reports_write)
    assert child.stderr.decode() == ""
    assert child.returncode == 1  # as a child that built no sink: nobody to export for


def test_a_sigkilled_server_still_gets_its_last_events_exported(tmp_path: Path) -> None:
    """The server process SIGKILLs itself right after a flush: the child reads what reached the
    pipe to its end, writes it and exits on its own."""
    log = tmp_path / "events.jsonl"
    script = textwrap.dedent(
        f"""
        import os, signal, sys, anyio
        from ckpt_events import Bus, Telemetry
        from ckpt_events.sinks import configure

        async def main():
            async with Bus() as bus:
                configured = configure(bus, jsonl_path={str(log)!r}, export_process=True)
                print(configured.export_process.pid, flush=True)
                telemetry = Telemetry(bus, kind="environment", instance="env-0")
                for i in range(100):
                    with telemetry.operation("commit", checkpoint_id=f"c{{i}}"):
                        pass
                await bus.flush()
                os.kill(os.getpid(), signal.SIGKILL)

        anyio.run(main)
        """
    )
    server = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, timeout=60)
    assert server.returncode == -signal.SIGKILL
    child = int(server.stdout.split()[0])
    _ends_on_its_own(child)
    assert len(list(read_events(log))) == 200


def _bindable(port: int) -> bool:
    """Whether a new scrape server could listen on 127.0.0.1:``port`` now."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_a_sigkilled_servers_child_lets_its_scrape_port_go_before_it_exports(tmp_path: Path) -> None:
    """A worker SIGKILLed (the OOM killer) with a collector that never answers: its child held
    the Prometheus port while it exported what was left (3-4 s), so the worker restarted in its
    place found every port of ``CKPT_EVENTS_PROMETHEUS_PORTS`` taken and gunicorn stopped the
    whole server. A dead server's page is nobody's to scrape: the port is let go first."""
    with socket.socket() as pick:
        pick.bind(("127.0.0.1", 0))
        port = pick.getsockname()[1]
    with _hung_collector() as hole:
        environ = {
            "OTEL_METRICS_EXPORTER": "prometheus",
            "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
            "OTEL_EXPORTER_PROMETHEUS_PORT": str(port),
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{hole}/v1/traces",
        }
        script = textwrap.dedent(
            f"""
            import os, signal, anyio
            from ckpt_events import Bus, Telemetry
            from ckpt_events.sinks import configure

            async def main():
                async with Bus() as bus:
                    configured = configure(bus, export_process=True, environ={environ!r})
                    print(configured.export_process.pid, flush=True)
                    telemetry = Telemetry(bus, kind="environment", instance="env-0")
                    for i in range(100):
                        with telemetry.operation("commit", checkpoint_id=f"c{{i}}"):
                            pass
                    await bus.flush()
                    os.kill(os.getpid(), signal.SIGKILL)

            anyio.run(main)
            """
        )
        # Its stderr to a file: a pipe stays open in the child, and reading it to its end waited
        # for the child's exit.
        with (
            (tmp_path / "stderr").open("wb") as stderr,
            subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=stderr) as server,
        ):
            assert server.stdout is not None
            child = int(server.stdout.readline())
            try:
                assert server.wait(timeout=30) == -signal.SIGKILL
                for _ in range(100):
                    if _bindable(port):
                        break
                    time.sleep(0.01)
                # Still exporting to the collector that never answers, but the port is free.
                assert alive(child) and _bindable(port)
            finally:
                os.kill(child, signal.SIGKILL)


def test_a_sigterm_to_the_process_group_still_exports_what_the_server_sends_as_it_stops(
    tmp_path: Path,
) -> None:
    """``kill -TERM -PGID`` (a service manager stopping the server's group) reaches the server
    and its export child at once. The server stops in order and sends its last spans as it
    does; the child went at the signal and those spans were lost. It now reads its input to its
    end (within its close budget) before it closes its sinks."""
    log = tmp_path / "events.jsonl"
    script = textwrap.dedent(
        f"""
        import signal, anyio
        from ckpt_events import Bus, Telemetry
        from ckpt_events.sinks import configure

        async def main():
            with anyio.open_signal_receiver(signal.SIGTERM) as signals:
                async with Bus() as bus:
                    configured = configure(bus, jsonl_path={str(log)!r}, export_process=True)
                    telemetry = Telemetry(bus, kind="environment", instance="env-0")
                    print(configured.export_process.pid, flush=True)
                    async for _ in signals:
                        break
                    await anyio.sleep(0.3)  # the server's own shutdown work takes a moment
                    for i in range(100):  # and it still has spans to send
                        with telemetry.operation("commit", checkpoint_id=f"c{{i}}"):
                            pass
                    await configured.aclose()

        anyio.run(main)
        """
    )
    with subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    ) as server:
        try:
            assert server.stdout is not None and server.stderr is not None
            child = int(server.stdout.readline())
            os.killpg(server.pid, signal.SIGTERM)  # as soon as the child said it was ready
            assert server.wait(timeout=30) == 0, server.stderr.read()
        finally:
            if server.poll() is None:
                server.kill()
    _ends_on_its_own(child)
    assert len(list(read_events(log))) == 200


@pytest.mark.slow
async def test_events_written_after_the_child_stopped_reading_are_said_lost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A SIGTERM to the child alone: past its grace it stops reading and closes its sinks (here
    slowly, its collector hanging), its pipe still open, so batches written then are taken by
    the pipe and never read. They were counted as forwarded and lost unsaid (only ``received``
    short of ``forwarded`` showed it); the close says it now."""
    with _hung_collector() as hole:
        arguments = {"jsonl_path": str(tmp_path / "events.jsonl"), "environ": {}}
        arguments["otlp_endpoint"] = hole
        process = ExportProcess.start(arguments, close_timeout=3.0)  # a grace of 2.4 s
        await process.handle([_started("c0")])
        os.kill(process.pid, signal.SIGTERM)
        await anyio.sleep(2.9)  # past its grace: it closes its sinks (1.2 s), reading no more
        assert alive(process.pid)
        await process.handle([_started("c1"), _started("c2")])
        with caplog.at_level(logging.WARNING, logger="ckpt_events.sinks"):
            await process.aclose()
    stats = process.stats()
    assert (stats.forwarded, stats.received, stats.exit_code) == (3, 1, 0)
    warnings = [r.getMessage() for r in caplog.records if "export process" in r.getMessage()]
    warnings = [w for w in warnings if not w.startswith("export process (pid")]  # the child's own
    assert len(warnings) == 1, warnings
    assert "read 1 of the 3 events written to its pipe; the other 2 are lost" in warnings[0]


async def test_a_batch_handed_over_after_close_is_dropped_not_written_to_a_reused_descriptor(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """After ``aclose()`` the pipe's descriptor number is free, and the next file opened takes
    it: a late batch is dropped, counted and logged once, never written into that file."""
    process = ExportProcess.start({"jsonl_path": str(tmp_path / "events.jsonl")})
    await process.aclose()
    batch = [_started("c0"), _started("c1")]
    files = [(tmp_path / f"other-{i}").open("w") for i in range(8)]  # the lowest free numbers
    try:
        with caplog.at_level(logging.WARNING, logger="ckpt_events.sinks"):
            await process.handle(batch)
            await process.handle(batch)
    finally:
        for file in files:
            file.close()
    assert [(tmp_path / f"other-{i}").read_text() for i in range(8)] == [""] * 8
    stats = process.stats()
    assert (stats.forwarded, stats.dropped) == (0, 4)
    assert sum("after it was closed" in r.getMessage() for r in caplog.records) == 1


async def test_a_second_close_meanwhile_waits_for_the_first_and_writes_nowhere(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``aclose()`` from a second task (or thread) while the first waits for the child: it wrote
    the close budget to the pipe's descriptor, closed by the first and taken by the next file
    opened, and raced the first for the child's reply. It waits for the first now."""
    process = ExportProcess.start({"jsonl_path": str(tmp_path / "events.jsonl")}, close_timeout=10.0)
    os.kill(process.pid, signal.SIGSTOP)  # the first close waits for its reply
    files: list[Any] = []
    try:
        with caplog.at_level(logging.WARNING, logger="ckpt_events.sinks"):
            async with anyio.create_task_group() as tg:
                tg.start_soon(process.aclose)
                await anyio.sleep(0.2)
                files.extend((tmp_path / f"other-{i}").open("w") for i in range(8))  # the lowest numbers
                tg.start_soon(process.aclose)
                await anyio.sleep(0.2)
                os.kill(process.pid, signal.SIGCONT)
    finally:
        for file in files:
            file.close()
    assert [(tmp_path / f"other-{i}").read_text() for i in range(8)] == [""] * 8
    stats = process.stats()
    assert stats.exit_code == 0 and stats.child is not None
    assert not [r for r in caplog.records if "export process" in r.getMessage()]


def _ends_on_its_own(pid: int) -> None:
    """The export child ``pid`` exits by itself within 10 s (its input ended)."""
    for _ in range(500):
        if not alive(pid):
            return
        time.sleep(0.02)
    raise AssertionError(f"the export child {pid} is still running 10 s after its input ended")


def _started(checkpoint_id: str) -> Any:
    from ckpt_events import OperationStarted
    from ckpt_events.vocab import Operation

    return OperationStarted(
        kind="agent",
        instance="agent-0",
        trace_id=1,
        span_id=2,
        start_ns=3,
        operation=Operation.COMMIT,
        checkpoint_id=checkpoint_id,
    )


def test_a_batch_cut_by_the_servers_death_keeps_its_whole_events(tmp_path: Path) -> None:
    """A batch longer than the pipe is written in steps: the server SIGKILLed between two of
    them left the child a line with no end, dropped whole and unsaid. Its whole events are
    exported now, in order, and the cut is logged."""
    log = tmp_path / "events.jsonl"
    script = textwrap.dedent(
        f"""
        import os, signal, anyio
        from ckpt_events import OperationStarted
        from ckpt_events.sinks import ExportProcess
        from ckpt_events.vocab import Operation

        async def main():
            process = ExportProcess.start({{"jsonl_path": {str(log)!r}}})
            print(process.pid, flush=True)
            os.kill(process.pid, signal.SIGSTOP)  # it reads nothing until the server is dead
            batch = [
                OperationStarted(kind="agent", instance="agent-0", trace_id=1, span_id=i + 1,
                                 start_ns=i, operation=Operation.COMMIT, checkpoint_id=f"c{{i}}")
                for i in range(10_000)
            ]
            async with anyio.create_task_group() as tg:
                tg.start_soon(process.handle, batch)  # fills the pipe, then waits
                await anyio.sleep(0.2)
                os.kill(os.getpid(), signal.SIGKILL)

        anyio.run(main)
        """
    )
    server = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        child = int(server.stdout.readline())
        assert server.wait(timeout=60) == -signal.SIGKILL
        os.kill(child, signal.SIGCONT)
        _, err = server.communicate(timeout=60)  # the child holds its stderr until it exits
    finally:
        server.kill()
    for _ in range(500):  # its stderr closes a moment before it is gone
        if not alive(child):
            break
        time.sleep(0.01)
    assert not alive(child)
    events = [event for _, event in read_events(log)]
    assert 0 < len(events) < 10_000
    assert [event.checkpoint_id for event in events] == [f"c{i}" for i in range(len(events))]
    assert f"ended inside a batch (the server stopped while writing it): {len(events)} whole" in err


async def test_a_non_finite_attribute_is_exported_not_its_whole_batch_lost(tmp_path: Path) -> None:
    """JSON has no NaN or infinity: msgspec writes one as ``null``, which the child could not
    decode, so the whole batch holding it was skipped as a corrupt line, unsaid. It is read as
    NaN now, as the JSON-lines reader does (the one value changed, every event kept), for a
    handle's record and for an event sent as it is."""
    from ckpt_events import OperationFinished
    from ckpt_events.vocab import Operation

    log = tmp_path / "events.jsonl"
    async with Bus() as bus:
        configured = configure(bus, jsonl_path=log, export_process=True, environ={})
        telemetry = Telemetry(bus, kind="agent", instance="agent-0")
        for value in (float("nan"), float("inf"), 1.5):
            with telemetry.operation("commit", checkpoint_id=str(value)) as op:
                op.set_attribute("x", value)
        built = OperationFinished(
            kind="agent",
            instance="agent-0",
            trace_id=1,
            span_id=2,
            start_ns=3,
            end_ns=4,
            operation=Operation.COMMIT,
            checkpoint_id="built",
            attributes={"x": float("-inf"), "y": "kept"},
        )
        bus.emit(built)
        await configured.aclose()
    stats = configured.export_process.stats()  # type: ignore[union-attr]
    assert (stats.forwarded, stats.received, stats.corrupt_lines) == (7, 7, 0)
    events = [event for _, event in read_events(log)]
    finished = {e.checkpoint_id: e.attributes for e in events if isinstance(e, OperationFinished)}
    assert list(finished) == ["nan", "inf", "1.5", "built"]
    assert [str(attributes["x"]) for attributes in finished.values()] == ["nan", "nan", "1.5", "nan"]
    assert finished["built"]["y"] == "kept"  # type: ignore[index]


async def test_a_hand_built_event_the_child_cannot_read_loses_itself_not_its_batch(tmp_path: Path) -> None:
    """``emit`` takes a hand-built event as it is; one holding a value outside its field's
    vocabulary (``Refused(code="over_quota")``) made the child's decoder refuse the whole line:
    the spans and events of its batch were lost with it, counted only as a corrupt line. The child
    leaves that one event out now, counted in ``invalid_events`` and said once."""
    from ckpt_events import OperationFinished, Refused

    log = tmp_path / "events.jsonl"
    async with Bus() as bus:
        configured = configure(bus, jsonl_path=log, export_process=True, environ={})
        telemetry = Telemetry(bus, kind="agent", instance="agent-0")
        for index in range(5):  # one batch: nothing awaits between them
            with telemetry.operation("commit", checkpoint_id=f"c{index}"):
                pass
            if index in (1, 3):
                bus.emit(Refused(kind="agent", instance="agent-0", time_ns=1, code="over_quota"))  # type: ignore[arg-type]
            telemetry.refused("stale_attempt")
        await configured.aclose()
    stats = configured.export_process.stats()  # type: ignore[union-attr]
    assert (stats.forwarded, stats.received, stats.corrupt_lines, stats.invalid_events) == (17, 15, 0, 2)
    events = [event for _, event in read_events(log)]
    assert [e.checkpoint_id for e in events if isinstance(e, OperationFinished)] == [
        f"c{i}" for i in range(5)
    ]
    assert [e.code for e in events if isinstance(e, Refused)] == ["stale_attempt"] * 5


async def test_a_lone_surrogate_reaches_the_childs_sinks_not_its_whole_batch_lost(tmp_path: Path) -> None:
    """A string holding a lone surrogate (``os.fsdecode`` of a bad file name) cannot be written
    as UTF-8: the batch's line failed to encode, and the bus counted every event of the batch as
    failed. The line goes out with the surrogate escaped now, and the child's sinks treat it as
    in process (the JSON-lines sink writes U+FFFD)."""
    from ckpt_events import OperationFinished

    log = tmp_path / "events.jsonl"
    async with Bus() as bus:
        configured = configure(bus, jsonl_path=log, export_process=True, environ={})
        telemetry = Telemetry(bus, kind="agent", instance="agent-0")
        for value in ("a\udcffb", "fine", float("inf")):
            with telemetry.operation("commit", checkpoint_id=f"c-{value}") as op:
                op.set_attribute("x", value)
        await configured.aclose()
        failed = {row.name: row.failed for row in bus.stats().sinks}["export-process"]
    stats = configured.export_process.stats()  # type: ignore[union-attr]
    assert failed == 0
    assert (stats.forwarded, stats.received, stats.corrupt_lines) == (6, 6, 0)
    events = [event for _, event in read_events(log)]
    finished = [e.attributes for e in events if isinstance(e, OperationFinished)]
    assert [str(attributes["x"]) for attributes in finished] == ["a\ufffdb", "fine", "nan"]  # type: ignore[index]


def test_a_line_the_child_cannot_read_is_said_once_not_only_counted(tmp_path: Path) -> None:
    """A line the child could not decode, or longer than it reads, was skipped with its whole
    batch and only counted in ``corrupt_lines``, known after the close: the events were lost
    unsaid. Each kind is logged once now, when it happens; the batches around it are exported."""
    from ckpt_events.sinks._export.wire import MAX_LINE

    log = tmp_path / "events.jsonl"
    good = b'[["event",' + msgspec.json.encode(_started("c0")) + b"]]\n"
    head = msgspec.json.encode({"arguments": {"jsonl_path": str(log), "environ": {}}}) + b"\n"
    lines = [head, good, b"[not json\n", good, b"[" * (MAX_LINE + 1) + b"\n", b"[0]\n", good]
    child = subprocess.run(
        [sys.executable, "-m", "ckpt_events.sinks._export.child"],
        input=b"".join(lines),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert child.returncode == 0, child.stderr
    closed = msgspec.json.decode(child.stdout.splitlines()[-1])
    assert (closed["received"], closed["corrupt_lines"]) == (3, 3)
    assert len(list(read_events(log))) == 3
    err = child.stderr.decode()
    assert err.count("could not read a line of its input") == 1, err
    assert err.count(f"a line of its input longer than {MAX_LINE} bytes") == 1, err
    assert "its batch's events are lost" in err


async def test_a_batch_longer_than_the_child_reads_goes_in_lines_it_reads(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A batch whose line passed ``MAX_LINE`` (large attributes) was written whole and skipped
    by the child, every event of it lost for one large value. It goes in lines the child reads
    now, in order; only a span longer than a line by itself is dropped, counted and logged."""
    from ckpt_events import OperationFinished
    from ckpt_events.sinks._export.wire import MAX_LINE
    from ckpt_events.vocab import Operation

    log = tmp_path / "events.jsonl"
    sizes = (10, MAX_LINE // 2, MAX_LINE // 2, MAX_LINE + 1, 10)
    built = OperationFinished(
        kind="agent",
        instance="agent-0",
        trace_id=1,
        span_id=2,
        start_ns=3,
        end_ns=4,
        operation=Operation.COMMIT,
    )
    with caplog.at_level(logging.WARNING, logger="ckpt_events.sinks"):
        async with Bus() as bus:
            configured = configure(bus, jsonl_path=log, export_process=True, environ={})
            configured.close_timeout = 60.0
            telemetry = Telemetry(bus, kind="agent", instance="agent-0")
            with telemetry.operation("restore", checkpoint_id="open") as outer:  # ends in a later line
                for i, size in enumerate(sizes):  # all in one batch: nothing awaits between them
                    with outer.step(f"s{i}") as step:
                        step.set_attribute("x", "x" * size)
                bus.emit(built)
            await configured.aclose()
    stats = configured.export_process.stats()  # type: ignore[union-attr]
    assert (stats.forwarded, stats.dropped, stats.received, stats.corrupt_lines) == (11, 2, 11, 0)
    events = [event for _, event in read_events(log, max_line=MAX_LINE)]
    names = [getattr(e, "step", None) or getattr(e, "checkpoint_id", None) for e in events]
    assert names == ["open", "s0", "s0", "s1", "s1", "s2", "s2", "s4", "s4", None, "open"]
    warnings = [r.getMessage() for r in caplog.records if "export process" in r.getMessage()]
    warnings = [w for w in warnings if not w.startswith("export process (pid")]  # the child's own
    assert len(warnings) == 1 and f"longer than the {MAX_LINE} bytes" in warnings[0], warnings


def test_an_event_boundary_inside_a_string_is_not_taken_for_one() -> None:
    """A cut batch is closed after its last whole item; a ``],[`` or ``},{`` inside a message is
    no boundary (the string it cuts stays open), so the events before it come back intact."""
    from ckpt_events import OperationFinished
    from ckpt_events.sinks._export.wire import WireReader, encoder, wire_items
    from ckpt_events.vocab import Operation

    events = [
        OperationFinished(
            kind="agent",
            instance="agent-0",
            trace_id=1,
            span_id=i + 1,
            start_ns=i,
            end_ns=i + 1,
            operation=Operation.COMMIT,
            error_message='a},{"type":"operation_finished"}],["event",{',
        )
        for i in range(3)
    ]
    line = encoder().encode(wire_items(events))
    size = len(encoder().encode(wire_items(events[:1]))) - 2  # each item's: "[" + i0 + "," + i1 ...
    third = 1 + 2 * (size + 1)
    assert line[third - 3 : third + 8] == b'}],["event"'
    assert WireReader().whole_events(line[:third]) == events[:2]  # cut right after the comma
    assert WireReader().whole_events(line[: third - 1]) == events[:2]  # right after the second item
    assert WireReader().whole_events(line[: len(line) - 20]) == events[:2]  # inside the third's message
    message = line.index(b"],[", line.index(b'"error_message"', size + 2)) + 2
    assert WireReader().whole_events(line[:message]) == events[:1]  # past a "],[" in the second's message
    assert WireReader().whole_events(line[:10]) == []


async def test_the_arguments_must_be_plain_values() -> None:
    with pytest.raises(ConfigurationError, match="the arguments must be plain values"):
        ExportProcess.start({"jsonl_path": object()})


def test_closed_reply_decodes_as_bus_stats() -> None:
    """The child's counters come back as the core's own ``BusStats``."""
    from ckpt_events import BusStats

    stats = BusStats(sinks=(), dropped_after_close=0)
    assert msgspec.convert(msgspec.to_builtins(stats), BusStats) == stats


def test_every_sink_stats_class_the_child_reports_is_known_here() -> None:
    """Each stats class of a sink configure() builds is converted back by name from its public
    home (one left out would vanish from ``stats().sinks``)."""
    from ckpt_events.sinks import JsonLinesStats
    from ckpt_events.sinks._export.reports import _SINK_STATS
    from ckpt_events.sinks.otel import MetricSinkStats, OtlpMetricSinkStats, OtlpSpanSinkStats, SpanSinkStats

    classes = (JsonLinesStats, MetricSinkStats, OtlpMetricSinkStats, OtlpSpanSinkStats, SpanSinkStats)
    assert sorted(_SINK_STATS) == sorted(cls.__name__ for cls in classes)


async def test_a_start_up_hook_printing_to_stdout_does_not_stop_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """A ``sitecustomize`` printing a line runs before the child points its stdout at stderr:
    the line was read as the ready reply, and configure() said the child "did not start within
    20 s" after one second. The line goes to stderr, where the child's prints go, and it starts."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text('print("hello from a start-up hook")\n')
    monkeypatch.syspath_prepend(str(hooks))  # the child's PYTHONPATH is this process's sys.path
    async with Bus() as bus:
        configured = configure(bus, jsonl_path=tmp_path / "events.jsonl", export_process=True)
        _checkpoints(Telemetry(bus, kind="agent", instance="agent-0"), 1)
        await configured.aclose()
    stats = configured.export_process.stats()  # type: ignore[union-attr]
    assert stats.exit_code == 0 and stats.received == 4
    assert "hello from a start-up hook" in capfd.readouterr().err


def test_a_child_that_exits_before_it_is_ready_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """An interpreter that cannot run the child (here: one that exits at once) is a
    ConfigurationError saying so, not a wait."""
    monkeypatch.setattr(sys, "executable", "/bin/false")
    started = time.monotonic()
    with pytest.raises(ConfigurationError, match=r"exited \(code 1\) before its sinks were up"):
        ExportProcess.start({})
    assert time.monotonic() - started < 5.0


@pytest.mark.parametrize("executable", ["", "/nonexistent/python"])
def test_an_interpreter_that_cannot_be_run_is_one_line(
    monkeypatch: pytest.MonkeyPatch, executable: str
) -> None:
    """An embedded interpreter (uWSGI, mod_wsgi) whose sys.executable is empty or no Python:
    Popen's bare PermissionError or FileNotFoundError came out of configure(), naming only a
    path. It is a ConfigurationError saying what could not be run, and the way out."""
    monkeypatch.setattr(sys, "executable", executable)
    with pytest.raises(ConfigurationError, match=r"could not be started: .*run without export_process"):
        ExportProcess.start({})


def test_a_child_that_closes_its_output_and_runs_on_is_not_called_slow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its output ended at once and it did not exit: that is no slow start ("did not start
    within 20 s" was said of it); the error says when it stopped answering, and it is killed."""
    mute = tmp_path / "mute"
    mute.write_text(f"#!/bin/sh\necho $$ > {tmp_path / 'pid'}\nexec 1>&-\nexec sleep 30\n")
    mute.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(mute))
    started = time.monotonic()
    with pytest.raises(ConfigurationError, match=r"stopped answering after \d+\.\d s without saying"):
        ExportProcess.start({}, start_timeout=20.0)
    assert time.monotonic() - started < 5.0
    assert not alive(int((tmp_path / "pid").read_text()))


def test_a_child_that_never_answers_is_killed_at_the_start_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hang = tmp_path / "hang"
    hang.write_text(f"#!/bin/sh\necho $$ > {tmp_path / 'pid'}\nexec sleep 30\n")
    hang.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(hang))
    with pytest.raises(ConfigurationError, match=r"did not start within 0.5 s"):
        ExportProcess.start({}, start_timeout=0.5)
    assert not alive(int((tmp_path / "pid").read_text()))


def _python(script: str) -> subprocess.CompletedProcess[str]:
    """``script`` run by this interpreter in a process of its own (a fork's test: its parent is
    the program, not pytest), its output as text."""
    return subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=60
    )


def test_a_forked_copy_drops_and_counts_and_leaves_the_child_alone(tmp_path: Path) -> None:
    """A process forked after the child started (a pre-forking server) must not write into the
    owner's pipe nor take the child's replies: it drops and counts, warns once; the owner's
    events all arrive."""
    log = tmp_path / "events.jsonl"
    script = textwrap.dedent(
        f"""
        import logging, os, sys, anyio
        from ckpt_events import Bus, Telemetry
        from ckpt_events.sinks import ExportProcess

        logging.basicConfig(stream=sys.stderr)
        events = []

        class Keep:
            def handle(self, batch):
                events.extend(batch)

        async def make():
            async with Bus() as bus:
                bus.subscribe(Keep())
                with Telemetry(bus, kind="environment", instance="env-0").operation("commit"):
                    pass

        anyio.run(make)
        process = ExportProcess.start({{"jsonl_path": {str(log)!r}}})
        child = os.fork()
        if child == 0:
            anyio.run(process.handle, events)
            anyio.run(process.handle, events)
            anyio.run(process.aclose)
            stats = process.stats()
            os._exit(0 if (stats.forwarded, stats.dropped) == (0, 4) else 3)
        _, status = os.waitpid(child, 0)
        anyio.run(process.handle, events)
        anyio.run(process.aclose)
        stats = process.stats()
        print(os.waitstatus_to_exitcode(status), stats.forwarded, stats.received, stats.exit_code)
        """
    )
    run = _python(script)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["0", "2", "2", "0"]
    assert run.stderr.count("was forked from the one that started the export process") == 1
    assert len(list(read_events(log))) == 2


def test_a_forked_worker_that_lives_on_does_not_hold_the_close_up(tmp_path: Path) -> None:
    """A process forked after the child started and still running when the owner closes (a
    multiprocessing pool's worker) held a copy of the pipe: the child never saw its input end,
    the close waited out its deadline and killed it. Now it ends in order, at once."""
    log = tmp_path / "events.jsonl"
    script = textwrap.dedent(
        f"""
        import os, signal, time, anyio
        from ckpt_events import Bus, Telemetry
        from ckpt_events.sinks import configure

        async def main():
            async with Bus() as bus:
                configured = configure(bus, jsonl_path={str(log)!r}, export_process=True)
                configured.close_timeout = configured.export_process.close_timeout = 3.0
                with Telemetry(bus, kind="environment", instance="env-0").operation("commit"):
                    pass
                await bus.flush()
                worker = os.fork()
                if worker == 0:
                    time.sleep(30)
                    os._exit(0)
                try:
                    started = time.monotonic()
                    await configured.aclose()
                    took = time.monotonic() - started
                finally:
                    os.kill(worker, signal.SIGKILL)
                    os.waitpid(worker, 0)
            stats = configured.export_process.stats()
            print(took < 1.5, stats.exit_code, stats.received)

        anyio.run(main)
        """
    )
    run = _python(script)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["True", "0", "2"]
    assert len(list(read_events(log))) == 2


def test_a_forked_copy_keeps_none_of_the_report_listeners_descriptors(tmp_path: Path) -> None:
    """A process forked from the owner closes its copies of the report pipe and of the pipe that
    wakes the listener's thread at its stop (the wake pipe's two were left open in it)."""
    log = tmp_path / "events.jsonl"
    script = textwrap.dedent(
        f"""
        import os, anyio
        from ckpt_events import Bus
        from ckpt_events.sinks import configure

        async def main():
            async with Bus() as bus:
                configured = configure(bus, jsonl_path={str(log)!r}, export_process=True)
                reports = configured.export_process._reports
                fds = (reports.fd, reports._wake_r, reports._wake_w)
                worker = os.fork()
                if worker == 0:
                    still = []
                    for fd in fds:
                        try:
                            os.fstat(fd)
                            still.append(fd)
                        except OSError:
                            pass
                    os._exit(len(still))
                _, status = os.waitpid(worker, 0)
                print(os.waitstatus_to_exitcode(status), all(os.fstat(fd) for fd in fds))
                await configured.aclose()

        anyio.run(main)
        """
    )
    run = _python(script)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["0", "True"]


def test_a_fork_after_the_child_exited_closes_none_of_the_servers_own_descriptors(tmp_path: Path) -> None:
    """A fork after the export process was closed (its ``ExportProcess`` still referenced): the
    forked copy closed the report listener's three descriptor numbers again, by then the
    server's own (here a pipe opened after the close, so the child's write end was gone)."""
    log = tmp_path / "events.jsonl"
    script = textwrap.dedent(
        f"""
        import os, anyio
        from ckpt_events import Bus
        from ckpt_events.sinks import configure

        async def main():
            async with Bus() as bus:
                configured = configure(bus, jsonl_path={str(log)!r}, export_process=True)
                await configured.aclose()
            while configured.export_process._reports.running:
                await anyio.sleep(0.01)
            mine = os.pipe()
            worker = os.fork()
            if worker == 0:
                closed = 0
                for fd in mine:
                    try:
                        os.fstat(fd)
                    except OSError:
                        closed += 1
                os._exit(closed)
            _, status = os.waitpid(worker, 0)
            print(os.waitstatus_to_exitcode(status))

        anyio.run(main)
        """
    )
    run = _python(script)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["0"]


async def test_a_cancelled_close_still_kills_a_child_that_hangs(tmp_path: Path) -> None:
    """A caller's own deadline cutting ``aclose()`` short (Configured.aclose has one) leaves no
    child behind."""
    process = ExportProcess.start({"jsonl_path": str(tmp_path / "events.jsonl")}, close_timeout=30.0)
    os.kill(process.pid, signal.SIGSTOP)
    started = time.monotonic()
    with anyio.move_on_after(0.5):
        await process.aclose()
    assert time.monotonic() - started < 5.0
    assert not alive(process.pid) and process.stats().exit_code == -signal.SIGKILL


async def test_a_cancelled_close_leaves_nothing_reading_the_descriptor_it_freed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancelled ``aclose()`` left a thread reading the child's output by its descriptor number
    until the close deadline: the next export process's pipe took that number and the thread
    took its ready reply ("did not start within 20 s", once in 20 runs of this file). A
    grandchild keeps the old output open here, so the thread saw no end of it and read on."""
    child = tmp_path / "child"
    child.write_text(
        "#!/bin/sh\n"
        f"sleep 30 & echo $! > {tmp_path / 'grandchild'}\n"
        'echo \'{"ready": true, "sinks": ["jsonl"]}\'\n'
        "exec sleep 30\n"
    )
    child.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(child))
    process = ExportProcess.start({}, close_timeout=30.0)
    ready = '{"ready": true}\n'
    files: list[Any] = []
    try:
        with anyio.move_on_after(0.2):
            await process.aclose()
        assert process.stats().exit_code == -signal.SIGKILL
        for i in range(8):  # the lowest free numbers, the child's output's among them
            (tmp_path / f"other-{i}").write_text(ready)
            files.append((tmp_path / f"other-{i}").open())
        await anyio.sleep(1.2)  # the thread looked at its descriptor every 0.5 s
        assert [file.read() for file in files] == [ready] * 8
    finally:
        for file in files:
            file.close()
        os.kill(int((tmp_path / "grandchild").read_text()), signal.SIGKILL)


async def test_with_nothing_set_no_child_is_kept_and_every_site_stays_off() -> None:
    """As in process: nothing set subscribes nothing, so the emit sites stay on the no-op path."""
    async with Bus() as bus:
        configured = configure(bus, export_process=True, environ={})
        assert not configured.enabled and configured.export_process is None
        assert not Telemetry(bus, kind="agent", instance="agent-0").enabled
        await configured.aclose()
    children = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text().split()
    assert not [pid for pid in children if alive(int(pid)) and "sinks._export.child" in _cmdline(int(pid))]


async def test_a_ctrl_c_while_the_child_starts_does_not_kill_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child ignored SIGINT only once its imports were done: a Ctrl-C in the server's
    terminal as it started (a server such as uvicorn that handles SIGINT and closes in order)
    killed it with a KeyboardInterrupt traceback, and configure() raised "exited (code 1)
    before its sinks were up". SIGINT is held off from its start now, and it starts."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    pid_file = tmp_path / "pid"
    # A slow start-up (a large sitecustomize, a cold disk): the child says its pid, then waits.
    (hooks / "sitecustomize.py").write_text(
        "import os, pathlib, time\n"
        f"pathlib.Path({str(pid_file)!r}).write_text(str(os.getpid()))\n"
        "time.sleep(1.0)\n"
    )
    monkeypatch.syspath_prepend(str(hooks))  # the child's PYTHONPATH is this process's sys.path

    def interrupt() -> None:
        deadline = time.monotonic() + 10.0
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)  # the pid is written just before it is read back
        os.kill(int(pid_file.read_text()), signal.SIGINT)

    sender = threading.Thread(target=interrupt)
    sender.start()
    try:
        async with Bus() as bus:
            configured = configure(bus, jsonl_path=tmp_path / "events.jsonl", export_process=True)
            _checkpoints(Telemetry(bus, kind="agent", instance="agent-0"), 1)
            await configured.aclose()
    finally:
        sender.join(15.0)
    stats = configured.export_process.stats()  # type: ignore[union-attr]
    assert stats.exit_code == 0 and stats.received == 4


async def test_a_close_whose_deadline_a_full_pipe_took_still_kills_the_child(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SIGSTOP the child and fill the pipe: Configured.aclose() spent its deadline on the flush
    and returned with the child still running, stopped, until the bus closed (5 s later by
    default, or never on a bus that lives on). It is killed by the close now, said once."""
    with caplog.at_level(logging.WARNING, logger="ckpt_events.sinks"):
        async with Bus(buffer_size=4096, close_timeout=30.0) as bus:
            configured = configure(bus, jsonl_path=tmp_path / "events.jsonl", export_process=True)
            process = configured.export_process
            assert process is not None
            configured.close_timeout = 0.5
            os.kill(process.pid, signal.SIGSTOP)
            try:
                telemetry = Telemetry(bus, kind="environment", instance="env-0")
                for _ in range(10):
                    _checkpoints(telemetry, 500)
                    await bus.flush(timeout=0.01)
                started = time.monotonic()
                await configured.aclose()
                assert time.monotonic() - started < 2.0
                assert not alive(process.pid)
                assert process.stats().exit_code == -signal.SIGKILL
            finally:
                if alive(process.pid):
                    os.kill(process.pid, signal.SIGKILL)
    stats = process.stats()
    row = {row.name: row for row in bus.stats().sinks}["export-process"]
    assert row.emitted == 20_000 == stats.forwarded + stats.dropped + row.dropped + row.abandoned
    warnings = [r.getMessage() for r in caplog.records if "export process" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert f"killed, with what it held ({stats.forwarded} events were forwarded to it)" in warnings[0]


def _spans_received(received: Any) -> int:
    """The spans in every OTLP/HTTP trace export the receiver got."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    count = 0
    for _, body in list(received.bodies):
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        count += sum(len(scope.spans) for spans in request.resource_spans for scope in spans.scope_spans)
    return count


async def test_replay_onto_an_export_process_bus_keeps_every_span(tmp_path: Path) -> None:
    """A log replayed onto a bus whose sinks run in the export process: the child's span queue
    (256 here, 8,192 by default) dropped what replay handed faster than the collector took it,
    and replay could not ask the child to flush (512 of 4,000 spans received; 60,000 spans:
    56,832). Replay now hands at most the child's queue at a time and waits for its flush: every
    span reaches the collector before the close."""
    from ckpt_events.sinks import replay

    log = tmp_path / "events.jsonl"
    async with Bus() as bus:
        writer = configure(bus, jsonl_path=log, environ={})
        _checkpoints(Telemetry(bus, kind="environment", instance="env-0"), 2000)
        await bus.flush()
        await writer.aclose()
    with otlp_receiver() as received:
        async with Bus() as bus:
            configured = configure(
                bus,
                otlp_endpoint=received.url,
                export_process=True,
                environ={"OTEL_METRICS_EXPORTER": "none", "OTEL_BSP_MAX_QUEUE_SIZE": "256"},
            )
            process = configured.export_process
            assert process is not None
            result = await replay(log, bus)
            replayed = _spans_received(received)  # before the close: replay waited for them
            await configured.aclose()
    assert result.events == 8000 and result.failed == ()
    assert replayed == 4000
    assert process.max_queue == 256  # what replay hands it between two flushes
    assert process.stats().sinks["otel-spans"].dropped == 0  # type: ignore[index,attr-defined]


async def test_a_flush_the_child_does_not_answer_ends_at_its_deadline_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A stopped child cannot answer a flush: ``force_flush`` returns ``False`` at its deadline
    (never hangs the caller), said once however often it is asked; awake, it answers again."""
    async with Bus() as bus:
        configured = configure(bus, jsonl_path=tmp_path / "events.jsonl", export_process=True, environ={})
        process = configured.export_process
        assert process is not None
        _checkpoints(Telemetry(bus, kind="environment", instance="env-0"), 5)
        await bus.flush()
        assert await process.force_flush() is True
        os.kill(process.pid, signal.SIGSTOP)
        try:
            with caplog.at_level(logging.WARNING, logger="ckpt_events.sinks"):
                started = time.monotonic()
                assert await process.force_flush(timeout=0.3) is False
                assert await process.force_flush(timeout=0.3) is False
                took = time.monotonic() - started
        finally:
            os.kill(process.pid, signal.SIGCONT)
        assert await process.force_flush() is True
        await configured.aclose()
    said = [r.getMessage() for r in caplog.records if "could not be flushed" in r.getMessage()]
    assert took < 1.5
    assert len(said) == 1 and "no answer within 0.3 s" in said[0]
    assert process.stats().received == 20


async def test_a_flush_a_close_overtakes_ends_with_it_not_said_as_a_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A flush waiting on a hung collector when the server closes: the child closes in order
    within its budget and never answers the flush, which ends with the close (``False``, well
    before its own deadline); the close's summary says the drops, the flush says nothing (it
    said "could not be flushed: it ended before it answered", of an orderly close)."""
    with _hung_collector() as hole:
        async with Bus() as bus:
            configured = configure(
                bus,
                otlp_endpoint=hole,
                export_process=True,
                environ={"OTEL_METRICS_EXPORTER": "none"},
            )
            configured.close_timeout = 2.5
            process = configured.export_process
            assert process is not None
            _checkpoints(Telemetry(bus, kind="environment", instance="env-0"), 5)
            await bus.flush()
            results: list[bool] = []

            async def flush() -> None:
                results.append(await process.force_flush(timeout=20))

            with caplog.at_level(logging.WARNING, logger="ckpt_events.sinks"):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(flush)
                    await anyio.sleep(0.5)  # the child's flush waits on the collector
                    started = time.monotonic()
                    await configured.aclose()
                took = time.monotonic() - started
    assert results == [False] and took < 3.3
    said = [r.getMessage() for r in caplog.records]
    assert not [m for m in said if "could not be flushed" in m]
    assert [m for m in said if "its sinks having lost events" in m]
    assert process.stats().exit_code == 0


async def test_a_scrape_after_flush_and_force_flush_counts_every_event() -> None:
    """``bus.flush()`` covers the pipe, not the child (docs/configuration.md): after it the
    child may not have counted the round yet; after ``force_flush()`` one scrape counts it all."""
    async with Bus() as bus:
        configured = configure(
            bus,
            export_process=True,
            environ={
                "OTEL_METRICS_EXPORTER": "prometheus",
                "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
                "OTEL_EXPORTER_PROMETHEUS_PORT": "0",
                "OTEL_TRACES_EXPORTER": "none",
            },
        )
        process = configured.export_process
        assert process is not None and process.prometheus_url is not None
        telemetry = Telemetry(bus, kind="environment", instance="env-0")
        for round_ in range(1, 4):
            _checkpoints(telemetry, 100)
            assert await bus.flush(10.0) is True
            assert await process.force_flush(10.0) is True
            assert _commits_counted(process.prometheus_url) == 100 * round_
        await configured.aclose()


def _commits_counted(url: str) -> float:
    """The commit operations the endpoint counts, read in one scrape."""
    with urllib.request.urlopen(url, timeout=5) as page:
        text = page.read().decode()
    prefix = "gym_checkpoint_operation_duration_ms_milliseconds_count{"
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(prefix) and 'operation="commit"' in line
    )


async def test_closing_before_the_bus_ever_started_ends_the_child_with_every_event_written(
    tmp_path: Path,
) -> None:
    """A server whose startup failed before its bus started: ``configured.aclose()`` returned in
    0.00 s, the child still running and the log at 0 lines until a later ``bus.aclose()`` (none,
    on a server that gave up). The events now reach the child's sinks, and the child has exited,
    within the close itself; the bus's later close has nothing left to do."""
    log = tmp_path / "events.jsonl"
    with otlp_receiver() as received:
        bus = Bus()
        configured = configure(bus, jsonl_path=log, otlp_endpoint=received.url, export_process=True)
        process = configured.export_process
        assert process is not None
        _checkpoints(Telemetry(bus, kind="environment", instance="env-0"), 5)
        await configured.aclose()
        assert not alive(process.pid)
        assert len(list(read_events(log))) == 20 and received.paths.count("/v1/traces") >= 1
        stats = process.stats()
        assert stats.forwarded == 20 and stats.dropped == 0 and stats.exit_code == 0
        await bus.aclose()
    assert bus.stats().sink("export-process").delivered == 20
