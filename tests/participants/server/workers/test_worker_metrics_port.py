"""A worker's Prometheus port (base + 1 + index) already taken, in a real ``serve --workers 2``.

At start-up ``serve`` says so in one line (the cause and the fix) and exits at once; a worker
started again later, whose port was taken meanwhile, serves its metrics on a free port and
says which. Neither ends in the crash loop that spent the restart budget (6 exits in 32 s).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import httpx
import pytest

from ckpt_events.participants.cli.fleet import ServerProcess, write_token_file
from ckpt_events.participants.cli.worker_process import port_taken
from ckpt_events.participants.protocol import CONTROL_PREFIX

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TOKEN = "metrics-port-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
HOST = "127.0.0.1"


def _free_run(count: int) -> int:
    """A base port with the ``count - 1`` ports above it free too (bounded tries)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind((HOST, 0))
            base = int(probe.getsockname()[1])
        if base + count - 1 <= 65535 and all(port_taken(HOST, base + n) is None for n in range(count)):
            return base
    raise AssertionError(f"no {count} consecutive free ports")


@contextmanager
def _taken(port: int) -> Iterator[socket.socket]:
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind((HOST, port))
        squatter.listen(1)
        yield squatter


def _server(tmp_path: Path, base: int) -> ServerProcess:
    env = {
        "OTEL_METRICS_EXPORTER": "prometheus",
        "OTEL_EXPORTER_PROMETHEUS_HOST": HOST,
        "OTEL_EXPORTER_PROMETHEUS_PORT": str(base),
    }
    return ServerProcess(
        "environment",
        instance="environment-0",
        token_file=write_token_file(tmp_path / "token", TOKEN),
        log_dir=tmp_path / "logs",
        env=env,
        extra_args=["--workers", "2", "--checkpoint-root", str(tmp_path)],
    )


def test_port_taken_says_why_a_port_cannot_be_bound() -> None:
    """Free: None; listened on: the OS's reason; out of range: so."""
    base = _free_run(1)
    assert port_taken(HOST, base) is None
    with _taken(base):
        assert port_taken(HOST, base) == "Address already in use"
    assert port_taken(HOST, 65536) == "past 65535"


async def test_a_taken_worker_port_at_start_is_one_line_and_serve_exits_at_once(tmp_path: Path) -> None:
    """Worker 1's port taken before ``serve``: one line naming the port, its cause and the fix; exit 2."""
    base = _free_run(3)
    with _taken(base + 2):
        started = time.monotonic()
        server = _server(tmp_path, base)
        try:
            code = await anyio.to_thread.run_sync(server.wait, 30.0)
        finally:
            server.kill()
        took = time.monotonic() - started
    lines = [line for line in server.stderr_path.read_text(errors="replace").splitlines() if line.strip()]
    print(f"serve exited {code} after {took:.1f} s: {lines}")
    assert code == 2
    assert len(lines) == 1, lines
    assert f"worker 1's Prometheus port {base + 2}" in lines[0]
    assert "Address already in use" in lines[0] and "OTEL_EXPORTER_PROMETHEUS_PORT" in lines[0]
    assert took < 10


def test_a_taken_worker_port_is_refused_before_the_server_stack_is_imported(tmp_path: Path) -> None:
    """The refusal comes before the app is built: no fastapi imported, so the exit costs the
    interpreter and the CLI only (0.18 s of CPU, was 0.75 s; under load, 11 s before the one line)."""
    base = _free_run(3)
    token = write_token_file(tmp_path / "token", TOKEN)
    script = (
        "import sys\n"
        "from ckpt_events.participants.cli.main import main\n"
        "code = main(sys.argv[1:])\n"
        "print(code, sorted(m for m in ('fastapi', 'uvicorn', 'starlette') if m in sys.modules))\n"
    )
    argv = ["serve", "environment", "--port", "0", "--token-file", str(token), "--workers", "2"]
    env = {
        **os.environ,
        "OTEL_METRICS_EXPORTER": "prometheus",
        "OTEL_EXPORTER_PROMETHEUS_HOST": HOST,
        "OTEL_EXPORTER_PROMETHEUS_PORT": str(base),
    }
    with _taken(base + 2):
        done = subprocess.run(
            [sys.executable, "-c", script, *argv],
            check=False,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert f"worker 1's Prometheus port {base + 2}" in done.stderr and done.stderr.count("\n") == 1
    assert done.stdout.strip() == "2 []"


async def test_a_worker_restarted_onto_a_taken_port_serves_its_metrics_on_another(tmp_path: Path) -> None:
    """Worker 1 killed, its port taken before it is back: it comes back on a free port, says so
    in one line, serves its metrics there, and the server keeps both workers."""
    base = _free_run(3)
    server = _server(tmp_path, base)
    try:
        await server.wait_listening(30)
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
            status = (await client.get(f"{CONTROL_PREFIX}/status", headers=AUTH)).json()
            assert [w["connected"] for w in status["workers"]] == [True, True]
            children = Path(f"/proc/{server.proc.pid}/task/{server.proc.pid}/children").read_text().split()
            [victim] = [
                int(pid)
                for pid in children
                if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[-3] == b"1"
            ]
            os.kill(victim, signal.SIGKILL)
            with anyio.fail_after(5):  # the port is free once the worker has exited
                while port_taken(HOST, base + 2) is not None:
                    await anyio.sleep(0.01)
            with _taken(base + 2):
                with anyio.fail_after(30):
                    while "instead" not in (text := server.stderr_path.read_text(errors="replace")):
                        await anyio.sleep(0.05)
                [line] = [line for line in text.splitlines() if "instead" in line]
                assert f"worker 1: Prometheus port {base + 2} on {HOST} is taken" in line, line
                url = line.rsplit(" at ", 1)[1].split()[0]
                assert f":{base + 2}/" not in url
                assert httpx.get(url, timeout=5).status_code == 200  # it serves there
                with anyio.fail_after(30):
                    while not all(
                        w["connected"]
                        for w in (await client.get(f"{CONTROL_PREFIX}/status", headers=AUTH)).json()[
                            "workers"
                        ]
                    ):
                        await anyio.sleep(0.1)
        assert server.proc.poll() is None
        assert "restart budget" not in server.stderr_path.read_text(errors="replace")
    finally:
        server.terminate()


async def test_with_port_0_each_process_says_where_its_metrics_are(tmp_path: Path) -> None:
    """``OTEL_EXPORTER_PROMETHEUS_PORT=0`` (the taken-port error's suggestion): the server and each
    worker say their metrics URL in one line each, and serve there; before, none was said anywhere."""
    server = _server(tmp_path, 0)
    try:
        await server.wait_listening(30)
        with anyio.move_on_after(30):
            while len(lines := _said(server, "metrics at")) < 3:
                await anyio.sleep(0.05)
        assert len(lines) == 3, server.stderr_path.read_text(errors="replace")
        urls = {line.rsplit(" at ", 1)[1] for line in lines}
        assert len(urls) == 3 and sum("worker" in line for line in lines) == 2, lines
        for url in urls:
            assert httpx.get(url, timeout=5).status_code == 200
    finally:
        server.terminate()


def _said(server: ServerProcess, words: str) -> list[str]:
    """The lines of the server's stderr so far that hold ``words``."""
    return [line for line in server.stderr_path.read_text(errors="replace").splitlines() if words in line]
