"""``serve --workers 2`` with ``OTEL_METRICS_EXPORTER=prometheus``: one scrape target per process
(the server on the base port, worker i on base + 1 + i), scraped by a real Prometheus."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import anyio
import httpx
import pytest

from ckpt_events.participants.cli.fleet import ServerProcess, write_token_file
from ckpt_events.participants.protocol import CONTROL_PREFIX
from tests.sinks.prom_server import prometheus_binary, running_prometheus

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
TOKEN = "prom-workers-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
DURATION = "gym_checkpoint_operation_duration_ms_milliseconds"


def _three_free_ports() -> int:
    """A base port with the two above it free too (bounded tries)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = int(probe.getsockname()[1])
        if base + 2 > 65535:
            continue
        try:
            for port in (base, base + 1, base + 2):
                with socket.socket() as check:
                    check.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise AssertionError("no three consecutive free ports")


async def test_every_worker_is_its_own_scrape_target(tmp_path: Path) -> None:
    """Three targets up; a checkpoint's worker operations show up under the worker targets."""
    prometheus_binary()
    base = _three_free_ports()
    env = {
        **os.environ,
        "OTEL_METRICS_EXPORTER": "prometheus",
        "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
        "OTEL_EXPORTER_PROMETHEUS_PORT": str(base),
    }
    server = ServerProcess(
        "environment", instance="environment-0", token_file=write_token_file(tmp_path / "token", TOKEN),
        log_dir=tmp_path / "logs", extra_args=["--workers", "2", "--checkpoint-root", str(tmp_path)], env=env,
    )  # fmt: skip
    targets = [f"127.0.0.1:{base + n}" for n in range(3)]
    try:
        await server.wait_listening(30)
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
            for i in range(4):
                body = {"rollout_id": f"r{i}", "steps": 3}
                assert (await client.post("/work/start", json=body, headers=AUTH)).status_code == 200
            for op in ("prepare", "commit", "resume"):
                reply = await client.post(
                    f"{CONTROL_PREFIX}/{op}",
                    json={"checkpoint_id": "c1", "deadline_ts": time.time() + 10,
                          **({"checkpoint_dir": str(tmp_path / "ck")} if op == "commit" else {})},
                    headers=AUTH,
                )  # fmt: skip
                assert reply.status_code == 200, (op, reply.text)
        with running_prometheus(tmp_path, targets) as prom:
            up = await anyio.to_thread.run_sync(
                lambda: prom.wait_for(
                    "up", check=lambda r: len(r) == 3 and all(s["value"][1] == "1" for s in r)
                )
            )
            assert {s["metric"]["instance"] for s in up} == set(targets)
            found = await anyio.to_thread.run_sync(
                lambda: prom.wait_for(
                    f'{DURATION}_count{{nemo_gym_checkpoint_operation="commit"}}', check=lambda r: len(r) >= 2
                )
            )
            assert {s["metric"]["instance"] for s in found} >= set(targets[1:])  # both workers committed
    finally:
        server.terminate()
