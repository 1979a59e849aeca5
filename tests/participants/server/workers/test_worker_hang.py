"""A worker process that hangs (SIGSTOP) during a commit, in a real ``serve --workers 2``.

The commit answers 503 within its deadline plus a small margin, never after the fixed reply
wait, and the part the worker writes once it runs again is never placed beside the others.
"""

from __future__ import annotations

import functools
import os
import signal
import time
from pathlib import Path

import anyio
import httpx
import msgspec
import pytest

from ckpt_events.participants.cli.fleet import ServerProcess, write_token_file
from ckpt_events.participants.protocol import CONTROL_PREFIX
from ckpt_events.participants.server.store import participant_dir

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TOKEN = "worker-hang-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
#: The commit's deadline, in seconds from its request; it must answer within this plus 5 s.
DEADLINE = 4.0


def _worker_pid(server: ServerProcess, index: int) -> int | None:
    """The pid of worker ``index`` of ``server`` (its argv: ... <kind> <instance> <index> <options>)."""
    path = Path(f"/proc/{server.proc.pid}/task/{server.proc.pid}/children")
    for pid in (int(p) for p in path.read_text().split()):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"ckpt_events.participants.cli.worker_process" in argv and argv[-3] == str(index).encode():
            return pid
    return None


async def _control(
    client: httpx.AsyncClient, op: str, cid: str, seconds: float, **extra: str
) -> httpx.Response:
    body = {"checkpoint_id": cid, "deadline_ts": time.time() + seconds, **extra}
    return await client.post(f"{CONTROL_PREFIX}/{op}", json=body, headers=AUTH)


def _left(directory: Path) -> list[str]:
    return sorted(os.listdir(directory)) if directory.exists() else []


async def test_a_worker_stopped_during_commit_costs_it_its_deadline_and_its_late_part_is_dropped(
    tmp_path: Path,
) -> None:
    """SIGSTOP worker 1 with the commit's frame on its socket: 503 within the deadline + 5 s;
    SIGCONT: its late part never lands in the checkpoint; the next commit there publishes both."""
    server = ServerProcess(
        "environment",
        instance="environment-0",
        token_file=write_token_file(tmp_path / "token", TOKEN),
        log_dir=tmp_path / "logs",
        extra_args=["--workers", "2", "--checkpoint-root", str(tmp_path)],
    )
    directory = participant_dir(tmp_path / "ck", "environment", "environment-0")
    stopped: int | None = None
    try:
        await server.wait_listening(30)
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            for i in range(4):
                body = {"rollout_id": f"r{i}", "steps": 3}
                assert (await client.post("/work/start", json=body, headers=AUTH)).status_code == 200
            assert (await _control(client, "prepare", "c1", 10)).json()["phase"] == "prepared"
            stopped = _worker_pid(server, 1)
            assert stopped is not None
            os.kill(stopped, signal.SIGSTOP)
            started = time.monotonic()
            commit = await _control(client, "commit", "c1", DEADLINE, checkpoint_dir=str(tmp_path / "ck"))
            answered = time.monotonic() - started
            print(f"commit answered {commit.status_code} after {answered:.1f} s (deadline {DEADLINE:g} s)")
            assert commit.json()["error"]["code"] == "checkpoint_coordinator_unavailable", commit.text
            assert answered <= DEADLINE + 5.0
            assert _left(directory) == []  # worker 0's part was taken out again
            os.kill(stopped, signal.SIGCONT)
            stopped = None
            # The worker now reads the commit's frame and tries its part; its late answer is logged.
            with anyio.fail_after(10):
                while "late reply" not in server.stderr_path.read_text(errors="replace"):
                    await anyio.sleep(0.05)
            assert [n for n in _left(directory) if n.startswith(("records", ".records"))] == []
            assert (await _control(client, "resume", "c1", 5)).status_code == 200
            assert (await _control(client, "prepare", "c2", 10)).json()["phase"] == "prepared"
            again = await _control(client, "commit", "c2", 10, checkpoint_dir=str(tmp_path / "ck"))
            assert again.status_code == 200, again.text
        manifest = msgspec.json.decode((directory / "manifest.json").read_bytes())
        assert [p["worker"] for p in manifest["parts"]] == [0, 1]
        assert _left(directory) == sorted(["manifest.json", *(p["records_file"] for p in manifest["parts"])])
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGCONT)
        server.terminate()


async def test_a_server_stopped_during_a_commit_aborts_it_whole_and_says_which(tmp_path: Path) -> None:
    """SIGTERM to ``serve`` while worker 1 (SIGSTOPped) holds a commit: the commit is aborted
    whole (no manifest, and worker 0's part taken out again), one line names the checkpoint,
    and the server is gone within its 2 s grace and a margin. Worker 0's part was left behind:
    the parts written were noted only once every worker had answered. Then, 1 run in 20 under
    load, worker 1's: woken by the stop while the socket was still open, it wrote its part after
    the parent's delete (test_parts: a part placed after its commit was cancelled)."""
    server = ServerProcess(
        "environment",
        instance="environment-0",
        token_file=write_token_file(tmp_path / "token", TOKEN),
        log_dir=tmp_path / "logs",
        extra_args=["--workers", "2", "--checkpoint-root", str(tmp_path)],
    )
    directory = participant_dir(tmp_path / "ck", "environment", "environment-0")
    try:
        await server.wait_listening(30)
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            for i in range(4):
                body = {"rollout_id": f"r{i}", "steps": 3}
                assert (await client.post("/work/start", json=body, headers=AUTH)).status_code == 200
            assert (await _control(client, "prepare", "c1", 10)).json()["phase"] == "prepared"
            stopped = _worker_pid(server, 1)
            assert stopped is not None
            os.kill(stopped, signal.SIGSTOP)
            async with anyio.create_task_group() as tg:
                tg.start_soon(
                    functools.partial(
                        _control, client, "commit", "c1", 20, checkpoint_dir=str(tmp_path / "ck")
                    )
                )
                with anyio.fail_after(10):  # worker 0 has placed its part; worker 1 holds the commit
                    while not [n for n in _left(directory) if n.startswith("records")]:
                        await anyio.sleep(0.02)
                started = time.monotonic()
                server.proc.send_signal(signal.SIGTERM)
                await anyio.to_thread.run_sync(server.wait, 20.0)
                took = time.monotonic() - started
                tg.cancel_scope.cancel()
        lines = server.stderr_path.read_text(errors="replace").splitlines()
        print(f"stopped in {took:.1f} s: {lines}")
        assert _left(directory) == []
        [said] = [line for line in lines if "c1" in line]
        assert "commit of checkpoint c1" in said and "no manifest" in said, said
        assert took < 5.0
    finally:
        server.kill()
