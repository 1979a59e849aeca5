"""Multi-worker servers as real processes: the demo crash/restore 2 -> 3 workers, a worker SIGKILLed."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import anyio
import httpx
import msgspec
import pytest
from rich.console import Console

from ckpt_events.participants.cli.demo.runner import DemoOptions, run_demo
from ckpt_events.participants.cli.fleet import ServerProcess, write_token_file
from ckpt_events.participants.protocol import CONTROL_PREFIX
from ckpt_events.participants.server.store import participant_dir
from tests.processes import alive

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TOKEN = "e2e-workers-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}


async def test_demo_crash_and_restore_from_two_workers_into_three(tmp_path: Path) -> None:
    """serve processes with 2 workers each, SIGKILLed after a checkpoint, restored into 3 workers."""
    options = DemoOptions(
        rollouts=40, concurrency=8, processes=True, workers=2, restore_workers=3, workdir=tmp_path
    )
    with open(os.devnull, "w") as quiet:
        result = await run_demo(options, Console(file=quiet))
    assert len(result.checks) >= 4 and result.continued
    checkpoint = tmp_path / "run" / result.checkpoint_id
    # Each of the 2 workers wrote its own records file; the manifest lists both.
    manifest = (participant_dir(checkpoint, "environment", "environment-0") / "manifest.json").read_bytes()
    assert [part["worker"] for part in msgspec.json.decode(manifest)["parts"]] == [0, 1]


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


async def _control(client: httpx.AsyncClient, op: str, cid: str, seconds: float) -> httpx.Response:
    body = {"checkpoint_id": cid, "deadline_ts": time.time() + seconds}
    return await client.post(f"{CONTROL_PREFIX}/{op}", json=body, headers=AUTH)


async def test_a_worker_killed_during_prepare_aborts_cleanly_and_comes_back(tmp_path: Path) -> None:
    """SIGKILL one worker mid-prepare: worker-lost, no manifest; once restarted the next checkpoint works."""
    token_file = write_token_file(tmp_path / "token", TOKEN)
    server = ServerProcess(
        "environment", instance="environment-0", token_file=token_file, log_dir=tmp_path / "logs",
        extra_args=["--workers", "2", "--checkpoint-root", str(tmp_path)],
    )  # fmt: skip
    try:
        await server.wait_listening(30)
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
            for i in range(4):
                body = {"rollout_id": f"r{i}", "steps": 3}
                assert (await client.post("/work/start", json=body, headers=AUTH)).status_code == 200
            with anyio.fail_after(10):
                while len(workers := _children(server.proc.pid)) < 2:
                    await anyio.sleep(0.05)
            async with anyio.create_task_group() as tg:
                replies: list[httpx.Response] = []

                async def prepare() -> None:
                    replies.append(await _control(client, "prepare", "c1", 1.5))

                tg.start_soon(prepare)
                await anyio.sleep(0.2)
                os.kill(workers[0], signal.SIGKILL)
            first = replies[0]
            if first.status_code == 200:
                report = first.json()["report"]
                assert first.json()["phase"] in ("preparing", "prepared")
            else:  # the worker died with the prepare's frame in flight: the socket answer
                assert first.json()["error"]["code"] == "checkpoint_coordinator_unavailable", first.text
                report = {"blockers": []}
            commit = await client.post(
                f"{CONTROL_PREFIX}/commit",
                json={
                    "checkpoint_id": "c1",
                    "deadline_ts": time.time() + 5,
                    "checkpoint_dir": str(tmp_path / "ck"),
                },
                headers=AUTH,
            )
            assert commit.status_code in (409, 503), (commit.status_code, commit.text, replies[0].text)
            # The kill lands during the prepare (a blocker names the lost worker) or, on a loaded
            # machine, just after it: the commit is refused all the same (readiness regressed, or
            # the worker unreachable). tests/participants/server/workers covers the blocker itself.
            if report["blockers"]:
                assert any("worker" in b for b in report["blockers"]), report
            assert not (
                participant_dir(tmp_path / "ck", "environment", "environment-0") / "manifest.json"
            ).exists()
            assert (await _control(client, "resume", "c1", 5)).status_code == 200
            # Until the restarted worker reports, a prepare answers preparing (or an error body while
            # its socket is not back); each try is a new checkpoint, since a resumed id is stale.
            with anyio.fail_after(20):
                for attempt in range(1, 100):
                    cid = f"c2-{attempt}"
                    again = await _control(client, "prepare", cid, 2.0)
                    if again.status_code == 200 and again.json()["phase"] == "prepared":
                        break
                    await _control(client, "resume", cid, 5)
                    await anyio.sleep(0.2)
                else:
                    pytest.fail(f"never prepared again after the worker's restart: {again.text}")
            assert again.json()["report"]["counts"]["workers"] == 2
    finally:
        server.kill()


async def test_calls_routed_to_a_worker_port_skip_the_main_process_and_survive_its_death(
    tmp_path: Path,
) -> None:
    """Work calls go straight to the worker's own port (the main process spends nothing on
    them); once that worker is killed its port refuses at once, and through the main port
    the session's loss is a clear 404 while a new session is placed on a live worker."""
    token_file = write_token_file(tmp_path / "token", TOKEN)
    server = ServerProcess(
        "environment",
        instance="environment-0",
        token_file=token_file,
        log_dir=tmp_path / "logs",
        extra_args=["--workers", "2", "--checkpoint-root", str(tmp_path), "--step-seconds", "0"],
    )
    try:
        await server.wait_listening(30)
        async with httpx.AsyncClient(base_url=server.url, timeout=10, headers=AUTH) as client:
            with anyio.fail_after(30):
                while True:
                    workers = (await client.get(f"{CONTROL_PREFIX}/status")).json()["workers"]
                    if all(w["connected"] and w["url"] for w in workers):
                        break
                    await anyio.sleep(0.1)
            started = (await client.post("/work/start", json={"rollout_id": "r0", "steps": 50})).json()
            direct = started["worker_url"]
            assert direct in {w["url"] for w in workers} and direct != server.url
            owner = next(w["index"] for w in workers if w["url"] == direct)
            # The worker's port takes the token like the main port, and serves only its sessions.
            async with httpx.AsyncClient(timeout=10) as bare:
                assert (
                    await bare.post(f"{direct}/work/advance", json={"rollout_id": "r0"})
                ).status_code == 401
            assert (
                await client.post(f"{direct}/work/start", json={"rollout_id": "x", "steps": 1})
            ).status_code in (404, 405)
            main_pid = server.proc.pid
            before = _cpu_ticks(main_pid)
            for boundary in range(1, 41):
                reply = await client.post(f"{direct}/work/advance", json={"rollout_id": "r0"})
                assert reply.json() == {"boundary": boundary, "done": False}
            assert _cpu_ticks(main_pid) - before <= 5  # 40 calls: at most the main's idle ticks
            view = (await client.get("/work/r0")).json()  # the main port still forwards
            assert view["boundary"] == 40 and view["worker"] == owner

            pid = _children(main_pid)[owner]
            os.kill(pid, signal.SIGKILL)
            refused = None
            with anyio.fail_after(5):
                while refused is None:  # a kept-alive connection is reset first, then none is taken
                    try:
                        await client.post(f"{direct}/work/advance", json={"rollout_id": "r0"})
                    except httpx.ConnectError as exc:
                        refused = exc
                    except (httpx.ReadError, httpx.RemoteProtocolError):
                        pass
                    await anyio.sleep(0.05)
            with anyio.fail_after(10):
                while (await client.get(f"{CONTROL_PREFIX}/status")).json()["workers"][owner][
                    "url"
                ] == direct:
                    await anyio.sleep(0.1)
            lost = await client.post("/work/advance", json={"rollout_id": "r0"})
            assert lost.status_code == 404 and lost.json()["error"]["code"] == "not_found", lost.text
            again = await client.post("/work/start", json={"rollout_id": "r1", "steps": 5})
            assert again.status_code == 200, again.text
            moved = again.json()["worker_url"]
            assert moved and moved != direct
            assert (await client.post(f"{moved}/work/advance", json={"rollout_id": "r1"})).json()[
                "boundary"
            ] == 1
    finally:
        server.kill()


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


_HIJACK = """
import json, socket, struct, sys
import msgspec
from ckpt_events.participants.server.workers.frames import Hello, Message, decode_frame, encode_frame
path, index, secret = sys.argv[1], int(sys.argv[2]), sys.argv[3]
sock = socket.socket(socket.AF_UNIX)
sock.settimeout(10)
sock.connect(path)
sock.sendall(encode_frame(Message(1, Hello(index, secret, pid=1))))
data = b""
while len(data) < 4 or len(data) < 4 + struct.unpack(">I", data[:4])[0]:
    chunk = sock.recv(65536)
    if not chunk:
        break
    data += chunk
reply = decode_frame(data[4:])
print(json.dumps({"ok": reply.ok, "detail": reply.error.detail if reply.error else None}))
"""


async def test_a_process_replaying_a_dead_workers_secret_cannot_take_its_slot(tmp_path: Path) -> None:
    """A second process that read worker 1's environment says hello as worker 1 the moment it
    dies: refused (that secret was used); the restarted worker joins with its new one."""
    import subprocess
    import sys

    token_file = write_token_file(tmp_path / "token", TOKEN)
    server = ServerProcess(
        "environment",
        instance="environment-0",
        token_file=token_file,
        log_dir=tmp_path / "logs",
        extra_args=["--workers", "2", "--checkpoint-root", str(tmp_path)],
    )
    try:
        await server.wait_listening(30)
        async with httpx.AsyncClient(base_url=server.url, timeout=10, headers=AUTH) as client:
            with anyio.fail_after(30):
                while not all(
                    w["connected"] for w in (await client.get(f"{CONTROL_PREFIX}/status")).json()["workers"]
                ):
                    await anyio.sleep(0.1)
            victim = sorted(_children(server.proc.pid))[1]
            environ = dict(
                item.split("=", 1)
                for item in Path(f"/proc/{victim}/environ").read_text().split("\0")
                if "=" in item
            )
            index = int(environ["CKPT_EVENTS_WORKER_INDEX"])
            os.kill(victim, signal.SIGKILL)
            socket_path = environ["CKPT_EVENTS_COORDINATOR_SOCKET"]
            old_secret = environ["CKPT_EVENTS_WORKER_SECRET"]
            hijack = subprocess.run(
                [sys.executable, "-c", _HIJACK, socket_path, str(index), old_secret],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            assert hijack.returncode == 0, hijack.stderr[-2000:]
            assert json.loads(hijack.stdout) == {
                "ok": False,
                "detail": f"hello for worker {index} without its secret",
            }
            with anyio.fail_after(30):  # the supervisor's restart joins with its own secret
                while True:
                    workers = (await client.get(f"{CONTROL_PREFIX}/status")).json()["workers"]
                    if workers[index]["connected"] and victim not in _children(server.proc.pid):
                        break
                    await anyio.sleep(0.1)
            started = await client.post("/work/start", json={"rollout_id": "after", "steps": 2})
            assert started.status_code == 200, started.text
    finally:
        server.kill()


async def test_a_stopped_worker_is_not_left_behind_when_the_server_is_killed(tmp_path: Path) -> None:
    """Worker 1 hung (SIGSTOP), then the server SIGKILLed: every worker is gone within seconds.
    The stopped one never saw its socket end and stayed, stopped, reparented to init, for ever."""
    server = ServerProcess(
        "environment",
        instance="environment-0",
        token_file=write_token_file(tmp_path / "token", TOKEN),
        log_dir=tmp_path / "logs",
        extra_args=["--workers", "2", "--checkpoint-root", str(tmp_path)],
    )
    workers: list[int] = []
    try:
        await server.wait_listening(30)
        with anyio.fail_after(30):
            while len(workers := _children(server.proc.pid)) < 2:
                await anyio.sleep(0.05)
        os.kill(workers[1], signal.SIGSTOP)
        server.proc.kill()
        server.wait(10)
        with anyio.fail_after(10):
            while left := [pid for pid in workers if alive(pid)]:
                await anyio.sleep(0.05)
        assert not left
    finally:
        server.kill()
        for pid in workers:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
