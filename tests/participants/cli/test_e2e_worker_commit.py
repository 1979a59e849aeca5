"""A worker process SIGKILLed during commit: the commit fails fast and publishes no manifest."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import anyio
import httpx
import pytest

from ckpt_events.participants.cli.fleet import ServerProcess, write_token_file
from ckpt_events.participants.protocol import CONTROL_PREFIX
from ckpt_events.participants.server.store import participant_dir

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TOKEN = "e2e-worker-commit-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


async def _control(client: httpx.AsyncClient, op: str, cid: str, **extra: object) -> httpx.Response:
    body = {"checkpoint_id": cid, "deadline_ts": time.time() + 10, **extra}
    return await client.post(f"{CONTROL_PREFIX}/{op}", json=body, headers=AUTH)


async def test_a_worker_killed_during_commit_publishes_no_manifest(tmp_path: Path) -> None:
    """Worker stopped so its export hangs, then SIGKILLed: 503 at once, no manifest; the next commit works."""
    server = ServerProcess(
        "environment",
        instance="environment-0",
        token_file=write_token_file(tmp_path / "token", TOKEN),
        log_dir=tmp_path / "logs",
        extra_args=["--workers", "2", "--checkpoint-root", str(tmp_path)],
    )
    manifest = participant_dir(tmp_path / "ck", "environment", "environment-0") / "manifest.json"
    try:
        await server.wait_listening(30)
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
            for i in range(4):
                assert (
                    await client.post("/work/start", json={"rollout_id": f"r{i}", "steps": 3}, headers=AUTH)
                ).status_code == 200
            with anyio.fail_after(10):
                while len(workers := _children(server.proc.pid)) < 2:
                    await anyio.sleep(0.05)
            assert (await _control(client, "prepare", "c1")).json()["phase"] == "prepared"
            os.kill(workers[0], signal.SIGSTOP)  # its share of the export will not come
            replies: list[httpx.Response] = []
            async with anyio.create_task_group() as tg:

                async def commit() -> None:
                    replies.append(
                        await _control(client, "commit", "c1", checkpoint_dir=str(tmp_path / "ck"))
                    )

                tg.start_soon(commit)
                await anyio.sleep(0.5)
                assert not replies  # waiting on the stopped worker
                os.kill(workers[0], signal.SIGKILL)
                with anyio.fail_after(5):  # the lost connection fails the export now, not at 30 s
                    while not replies:
                        await anyio.sleep(0.02)
            assert replies[0].status_code == 503, replies[0].text
            assert replies[0].json()["error"]["code"] == "checkpoint_coordinator_unavailable"
            assert not manifest.exists()
            assert (await _control(client, "resume", "c1")).status_code == 200
            with anyio.fail_after(30):  # the supervisor restarts the worker; then a checkpoint works
                while True:
                    again = await _control(client, "prepare", "c2")
                    if again.json()["phase"] == "prepared":
                        break
                    await _control(client, "resume", "c2")
                    await anyio.sleep(0.2)
            committed = await _control(client, "commit", "c2", checkpoint_dir=str(tmp_path / "ck2"))
            assert committed.status_code == 200, committed.text
    finally:
        server.kill()
