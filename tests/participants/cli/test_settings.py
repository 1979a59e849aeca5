"""Bad settings: ``serve`` and ``demo`` answer one line naming the variable, exit 2, before serving."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckpt_events.participants.cli.fleet import free_port, write_token_file
from tests.participants.cli.sessions import CLI, ROOT

pytestmark = pytest.mark.slow

GRPC_EXPORTER = importlib.util.find_spec("opentelemetry.exporter.otlp.proto.grpc") is not None


@pytest.fixture
def listener() -> Iterator[str]:
    """Something listening on 127.0.0.1 (a collector as far as a reachability check goes)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def _run(argv: list[str], env: dict[str, str], tmp_path: Path) -> tuple[int, list[str]]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "CKPT_EVENTS_"))}
    proc = subprocess.run(
        [*CLI, *argv],
        check=False,
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    return proc.returncode, proc.stderr.decode().splitlines()


def _serve_argv(tmp_path: Path) -> list[str]:
    token = write_token_file(tmp_path / "token", "settings-test-token")
    return ["serve", "environment", "--port", str(free_port()), "--token-file", str(token)]


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("OTEL_METRIC_EXPORT_INTERVAL", "abc"),
        ("CKPT_EVENTS_JSONL", "{tmp}/no-such-folder/events.jsonl"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:{closed}"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "ftp://127.0.0.1:4318"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon"),
        pytest.param(
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            "grpc",
            marks=pytest.mark.skipif(GRPC_EXPORTER, reason="the gRPC exporter is installed: grpc is valid"),
        ),
    ],
)
def test_serve_refuses_a_bad_setting_in_one_line(
    tmp_path: Path, listener: str, variable: str, value: str
) -> None:
    """serve exits 2 with one line naming the variable, before uvicorn starts (no traceback); a
    collector nobody answers at is refused only with --require-collector (else serve starts)."""
    env = {variable: value.format(tmp=tmp_path, closed=free_port())}
    if variable == "OTEL_EXPORTER_OTLP_PROTOCOL":
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = listener
    strict = ["--require-collector"] if "{closed}" in value else []
    status, lines = _run([*_serve_argv(tmp_path), *strict], env, tmp_path)
    assert status == 2 and len(lines) == 1, lines
    assert lines[0].startswith("ckpt-events serve: error:") and variable in lines[0]


def test_demo_refuses_a_protocol_it_would_not_use(tmp_path: Path, listener: str) -> None:
    """demo does not export over HTTP when OTEL_EXPORTER_OTLP_PROTOCOL says otherwise: one line, exit 2."""
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": listener, "OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon"}
    status, lines = _run(["demo", "--rollouts", "2", "--workdir", str(tmp_path / "w")], env, tmp_path)
    assert status == 2 and len(lines) == 1, lines
    assert "OTEL_EXPORTER_OTLP_PROTOCOL" in lines[0]
    assert not (tmp_path / "w" / "run").exists()  # refused before any fleet started


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ("taken", "(Address already in use): another process listens there: stop it, or pick another --port"),
        # TEST-NET-1 (RFC 5737): never an address of this machine.
        ("192.0.2.1", "cannot listen on 192.0.2.1:0 (Cannot assign requested address): --host must be"),
        ("nonsense.invalid", "--host nonsense.invalid: not an address of this machine"),
    ],
)
def test_serve_refuses_an_address_it_cannot_listen_on_in_one_line(
    tmp_path: Path, listener: str, where: str, expected: str
) -> None:
    """A port another process has, or a --host that is not this machine's: one line with what
    to do, exit 2, before the app is built (uvicorn said "ERROR: [Errno 98] ..." and exited 3)."""
    argv = _serve_argv(tmp_path)
    if where == "taken":
        argv[argv.index("--port") + 1] = listener.rsplit(":", 1)[1]
    else:
        argv[argv.index("--port") + 1] = "0"
        argv += ["--host", where]
    status, lines = _run(argv, {}, tmp_path)
    assert status == 2 and len(lines) == 1, lines
    assert lines[0].startswith("ckpt-events serve: error:") and expected in lines[0], lines


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "--require-collector, but nothing is exported over OTLP: set OTEL_EXPORTER_OTLP_ENDPOINT"),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"},
            "--require-collector, but OTEL_SDK_DISABLED turns every export off",
        ),
        (
            {
                "OTEL_TRACES_EXPORTER": "none",
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://127.0.0.1:{closed}",
            },
            "--require-collector: $OTEL_EXPORTER_OTLP_METRICS_ENDPOINT:",
        ),
    ],
)
def test_require_collector_refuses_what_it_cannot_check(
    tmp_path: Path, env: dict[str, str], expected: str
) -> None:
    """--require-collector with no OTLP export set (or the SDK disabled) refuses to start instead
    of serving with nothing to require; with metrics alone over OTLP it checks their endpoint."""
    env = {k: v.format(closed=free_port()) for k, v in env.items()}
    status, lines = _run([*_serve_argv(tmp_path), "--require-collector"], env, tmp_path)
    assert status == 2 and len(lines) == 1, lines
    assert lines[0].startswith("ckpt-events serve: error:") and expected in lines[0], lines
