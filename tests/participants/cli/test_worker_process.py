"""``participants.cli.worker_process``: the worker command a supervisor runs, and its metrics port."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ckpt_events.participants.cli.worker_process import (
    WorkerCommand,
    _prometheus_port_of_worker,
    port_taken,
    worker_command,
    worker_metrics_port,
)
from tests.sinks.helpers import ipv6_loopback


def test_the_command_names_the_worker_and_carries_its_options_but_never_the_token() -> None:
    """``argv`` ends in index and options JSON; the inference token goes in ``env`` only."""
    command = worker_command("model", "model-0", {"latency": 0.5, "inference_token": "sekrit"})
    assert isinstance(command, WorkerCommand)
    argv = command(3)
    assert argv[:5] == [
        sys.executable,
        "-m",
        "ckpt_events.participants.cli.worker_process",
        "model",
        "model-0",
    ]
    assert argv[5] == "3"
    assert json.loads(argv[6]) == {"latency": 0.5}
    assert all("sekrit" not in part for part in argv)
    assert command.env == {"CKPT_EVENTS_INFERENCE_TOKEN": "sekrit"}


def test_without_a_token_the_command_adds_nothing_to_the_environment() -> None:
    """An absent or empty token leaves ``env`` empty; each index gets its own argv."""
    assert WorkerCommand("environment", "environment-0", {}).env == {}
    command = WorkerCommand("environment", "environment-0", {"inference_token": ""})
    assert command.env == {}
    assert command(0)[-2:] == ["0", "{}"] and command(1)[-2:] == ["1", "{}"]


def test_each_worker_s_metrics_port_follows_the_server_s() -> None:
    """Worker ``i`` scrapes on base + 1 + i (the base stays the supervisor's)."""
    assert [worker_metrics_port(9464, i) for i in range(3)] == [9465, 9466, 9467]


def test_a_free_port_is_not_taken_and_a_listening_one_is() -> None:
    """A port someone listens on is taken, with the OS's reason; once closed it is free again."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        assert port_taken("127.0.0.1", port) == "Address already in use"
    assert port_taken("127.0.0.1", port) is None


@pytest.mark.parametrize(("port", "why"), [(0, "not a port"), (-1, "not a port"), (65536, "past 65535")])
def test_ports_out_of_range_are_named_without_binding(port: int, why: str) -> None:
    """0, negatives and numbers past 65535 are refused before any socket is made."""
    assert port_taken("127.0.0.1", port) == why


def test_a_host_that_is_not_this_machine_s_is_taken_with_the_os_reason() -> None:
    """Binding an address the machine does not have fails: that reason is returned, not raised."""
    why = port_taken("192.0.2.1", 9464)  # TEST-NET-1: never a local address
    assert why == "Cannot assign requested address"


@pytest.mark.skipif(not ipv6_loopback(), reason="this machine has no IPv6 loopback (::1) to bind")
@pytest.mark.parametrize("host", ["::1", "[::1]"])
def test_a_worker_probes_an_ipv6_host_as_configure_binds_it(
    host: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OTEL_EXPORTER_PROMETHEUS_HOST=[::1]: the worker's port is probed on ::1 and kept; the host
    was probed as a name that does not resolve, "taken", and the worker sent to any free port."""
    with socket.socket(socket.AF_INET6) as probe:
        probe.bind(("::1", 0))
        base = probe.getsockname()[1] - 1  # worker 0's port is base + 1: this one, free once closed
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "prometheus")
    monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_HOST", host)
    monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_PORT", str(base))
    assert _prometheus_port_of_worker(0) is None
    assert os.environ["OTEL_EXPORTER_PROMETHEUS_PORT"] == str(base + 1)


def _worker(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Worker 0 of an environment server, run as ``serve`` runs it, with ``env`` added."""
    root = str(Path(__file__).resolve().parents[3])
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("CKPT_EVENTS_", "OTEL_"))}
    environ.update({"PYTHONPATH": root, "CKPT_EVENTS_WORKER_SECRET": "s", **env})
    module = "ckpt_events.participants.cli.worker_process"
    argv = [sys.executable, "-m", module, "environment", "env-0", "0", "{}"]
    return subprocess.run(argv, env=environ, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("fault", ["no coordinator", "unwritable log"])
def test_a_worker_that_cannot_start_says_why_in_one_line_and_exits_1(tmp_path: Path, fault: str) -> None:
    """A coordinator socket that is gone, or a log it cannot open: one line naming the worker and
    the cause, exit 1; each was a traceback of 30 to 50 lines, repeated at every restart."""
    env = {"CKPT_EVENTS_COORDINATOR_SOCKET": str(tmp_path / "gone.sock")}
    if fault == "unwritable log":
        (tmp_path / "log.jsonl.w0").mkdir()
        env["CKPT_EVENTS_JSONL"] = str(tmp_path / "log.jsonl")
    done = _worker(tmp_path, **env)
    lines = done.stderr.splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert lines[0].startswith("ckpt-events serve: worker 0: "), lines
    why = "gone.sock" if fault == "no coordinator" else "log.jsonl.w0"
    assert why in lines[0] and "Traceback" not in done.stderr, lines
