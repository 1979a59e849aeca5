"""The user's runtime environment at its edges, with real processes: stdout closed (``>&-``), a
low ``ulimit -n`` (for ``serve`` and for the export process), uvloop logging a loop error that
carries no exception, and spans with multi-megabyte attributes sent to a collector that bounds
its requests as the OpenTelemetry Collector does (20 MiB). Each was a traceback, a false cause,
a lost log line or a whole batch of spans lost."""

from __future__ import annotations

import http.client
import http.server
import json
import os
import re
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from ckpt_events import Bus, Telemetry, sinks
from ckpt_events.participants.cli.fleet import free_port
from ckpt_events.sinks import JsonLinesSink
from tests.http_servers import serving

_ROOT = Path(__file__).resolve().parents[2]


def _cli(shell_prefix: str, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``ckpt-events ARGV`` in a shell that first runs ``shell_prefix`` (a ``ulimit``), or
    applies it as the command's redirection (``>&-``)."""
    script = f'{shell_prefix} exec "$@"' if shell_prefix.startswith("ulimit") else f'exec "$@" {shell_prefix}'
    env = {**os.environ, "PYTHONPATH": str(_ROOT), "CKPT_EVENTS_TOKEN": "t" * 32}
    env.pop("COLUMNS", None)
    command = [sys.executable, "-m", "ckpt_events.participants.cli", *argv]
    return subprocess.run(
        ["sh", "-c", script, "sh", *command],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


@pytest.fixture
def log(tmp_path: Path) -> Path:
    """A small run log: three commits of one participant."""
    path = tmp_path / "run.jsonl"

    async def write() -> None:
        async with Bus() as bus:
            bus.subscribe(JsonLinesSink(path))
            tel = Telemetry(bus, kind="resources", instance="resources-0")
            for index in range(3):
                with tel.operation("commit", checkpoint_id=f"c{index}") as op:
                    op.set(records=index)

    anyio.run(write)
    return path


@pytest.mark.parametrize("command", ["report", "diff", "watch"])
def test_a_closed_stdout_is_one_line_and_exit_2(log: Path, command: str) -> None:
    """``report LOG >&-`` (and ``diff``, ``watch --once``) was an AttributeError traceback (exit
    1): now one line saying stdout is closed, exit 2, as ``cat >&-`` says a write error."""
    argv = {
        "report": ("report", str(log)),
        "diff": ("diff", str(log), str(log)),
        "watch": ("watch", "--once", "--follow", str(log)),
    }[command]
    done = _cli(">&-", *argv)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"ckpt-events {command}: error: stdout is closed: nothing to print to "
        "(run it without '>&-', or '>/dev/null')"
    ]


def test_serve_under_a_low_descriptor_limit_is_refused_in_one_line() -> None:
    """``ulimit -n 12; ckpt-events serve``: uvloop's event loop could not start (EMFILE), a
    traceback of three chained exceptions and asyncio's warnings (exit 1). Now one line naming
    the limit and the fix, exit 2, and nothing listening."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = _cli("ulimit -n 12;", "serve", "resources", "--port", str(port))
    assert done.returncode == 2, done.stderr
    # How many are free depends on what the process inherited and opened: at most 12 - 3.
    assert re.fullmatch(
        r"ckpt-events serve: error: only \d file descriptors free \(the limit is 12\), 16 needed to "
        r"start serving and one more per connection: raise it \(ulimit -n 1024\)\n",
        done.stderr,
    ), done.stderr


#: The OpenTelemetry Collector's default ``max_request_body_size`` for OTLP/HTTP.
_COLLECTOR_LIMIT = 20 * 1024 * 1024


class _BoundedCollector(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP JSON receiver that answers 413 past the Collector's default bound, and
    keeps the span names of what it accepts."""

    spans: list[str] = []
    sizes: list[int] = []

    def do_POST(self) -> None:
        size = int(self.headers["content-length"])
        body = self.rfile.read(size)
        self.sizes.append(size)
        status = 413 if size > _COLLECTOR_LIMIT else 200
        if status == 200:
            for resource in json.loads(body)["resourceSpans"]:
                for scope in resource["scopeSpans"]:
                    self.spans.extend(span["name"] for span in scope["spans"])
        self.send_response(status)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002  # the base's name
        """Quiet."""


def test_huge_attributes_do_not_take_their_batch_down() -> None:
    """50 commits, three of them with an 8 MB attribute, exported in one batch: one 25 MB
    request, answered 413, and all 50 spans lost. Now the batch goes in requests of at most
    4 MiB (a huge span alone): the collector takes all 50."""
    _BoundedCollector.spans = []
    _BoundedCollector.sizes = []
    big = "x" * (8 * 1024 * 1024)

    async def run(endpoint: str) -> None:
        environ = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json",
            "OTEL_METRICS_EXPORTER": "none",
        }
        async with Bus() as bus, sinks.configure(bus, environ=environ):
            tel = Telemetry(bus, kind="resources", instance="resources-0")
            for index in range(50):
                with tel.operation("commit", checkpoint_id=f"c{index}") as op:
                    if index % 20 == 5:
                        op.set_attribute("note", big)

    with serving(_BoundedCollector) as collector:
        anyio.run(run, f"http://127.0.0.1:{collector.server_port}")
    assert _BoundedCollector.spans == ["gym.checkpoint.commit"] * 50
    assert sum(_BoundedCollector.sizes) > _COLLECTOR_LIMIT  # one request would have been refused
    assert all(size < _COLLECTOR_LIMIT for size in _BoundedCollector.sizes)


_EXPORT_PROCESS_APP = """
import anyio
from ckpt_events import Bus, ConfigurationError, sinks

async def main():
    async with Bus() as bus:
        try:
            async with sinks.configure(bus, jsonl_path="events.jsonl", export_process=True):
                pass
        except ConfigurationError as exc:
            print(exc)

anyio.run(main)
"""


def test_the_export_process_out_of_descriptors_is_said_as_such(tmp_path: Path) -> None:
    """``configure(export_process=True)`` under ``ulimit -n 12``: the child could not be
    started (EMFILE), and the error blamed the interpreter ("an embedded interpreter may lack"
    it), a false cause. Now it names the descriptors, the limit and the fix."""
    env = {**os.environ, "PYTHONPATH": str(_ROOT)}
    done = subprocess.run(
        ["sh", "-c", 'ulimit -n 12; exec "$@"', "sh", sys.executable, "-c", _EXPORT_PROCESS_APP],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        "the export process could not be started: out of file descriptors (Too many open files; "
        "the limit is 12): raise it (ulimit -n 1024), or run without export_process\n"
    )


def _status_while_holding(ulimit: str, held: int) -> tuple[str, str]:
    """Start ``serve`` under ``ulimit``, hold ``held`` idle connections, then ask ``/status`` on
    a new one: its answer (or the error), and what the server said on stderr."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(_ROOT), "CKPT_EVENTS_TOKEN": "t" * 32}
    command = [
        sys.executable,
        "-m",
        "ckpt_events.participants.cli",
        "serve",
        "resources",
        "--port",
        str(port),
    ]
    server = subprocess.Popen(
        ["sh", "-c", f'ulimit {ulimit}; exec "$@"', "sh", *command],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    sockets: list[socket.socket] = []
    try:
        for _ in range(200):  # up within 20 s
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        sockets = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(held)]
        time.sleep(0.5)  # the server has taken (or failed to take) them all
        client = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            client.request(
                "GET", "/ng-control/v1/checkpoint/status", headers={"authorization": "Bearer " + "t" * 32}
            )
            answer = str(client.getresponse().status)
        except OSError as exc:
            answer = type(exc).__name__
        finally:
            client.close()
    finally:
        for sock in sockets:
            sock.close()
        server.terminate()
        _, said = server.communicate(timeout=30)
    return answer, said


def test_serve_raises_its_soft_descriptor_limit_for_its_connections() -> None:
    """Under ``ulimit -Sn 64`` (the hard limit higher), 150 idle connections held: past ~55
    uvloop reset each new connection without a word, ``/status`` included. ``serve`` now raises
    its soft limit to what its 512 connections need: the guard handles them, ``/status`` is 200."""
    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 1024:
        pytest.skip("the hard descriptor limit here is under 1024")
    answer, said = _status_while_holding("-Sn 64", held=150)
    assert answer == "200", said
    assert "warning" not in said


def test_serve_says_when_the_hard_descriptor_limit_is_short() -> None:
    """Under ``ulimit -n 64`` (hard too) nothing can be raised: connections past the limit are
    still reset, and ``serve`` now says so at its start, in one line with the fix (it said nothing)."""
    answer, said = _status_while_holding("-n 64", held=150)
    # Reset before the request, or closed before its answer (http.client's RemoteDisconnected,
    # a ConnectionResetError too: seen on a loaded machine): not served either way.
    assert answer in ("ConnectionResetError", "RemoteDisconnected"), said
    assert (
        "ckpt-events serve: warning: the open-file limit is 64, under the 576 that 512 connections "
        "need: past that, new connections are reset without a word; raise it (ulimit -n 576)\n"
    ) in said
