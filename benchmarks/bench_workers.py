"""Workers benchmark: what several workers per server buy, on real server processes.

Every figure comes from real ``ckpt-events serve environment`` processes on 127.0.0.1 (no
sink), measured side by side in one run:

* **CPU per work call.** A sequential keep-alive client calls ``POST /work/advance``
  ``calls`` times (steps that neither wait nor compute, so the call is all overhead), at 1
  worker (the single-process server), and at 2 workers through the main port (forwarded)
  and straight to the worker's own port (routed, as the controller does). CPU of each process
  is read from ``/proc/<pid>/stat`` before and after, so it holds however loaded the cores are.
* **Throughput with a CPU-bound step** (``--step-cpu-ms``: each step spends that much CPU
  hashing): ``sessions`` sessions driven for ``seconds`` by a lean load generator (raw
  keep-alive HTTP/1.1 over anyio streams, routed to the workers), at 1 and 2 workers. The
  generator is pinned to the last core where the OS allows it; the servers may use every core.
* **Commit and restore** of ``rollouts`` rollouts at 1, 2 and 4 workers: a fresh server
  restores a seed checkpoint (one records file, made by a single-process commit), then
  resumes, prepares and commits; both timed by the client, rounds rotating the worker counts.
* **The hop** left for clients that do not route: a control and a work frame over a real
  Unix socket beside the same call made directly (the forwarded call's frame round trip).

Run ``python -m ckpt_events.benchmarks.bench_workers [--quick] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, Final

import anyio
import httpx
import msgspec
from anyio.streams.buffered import BufferedByteReceiveStream

from ckpt_events import Bus, Telemetry
from ckpt_events.participants import create_app
from ckpt_events.participants.cli.fleet import ServerProcess, write_token_file
from ckpt_events.participants.protocol import CONTROL_PREFIX, EpisodeId
from ckpt_events.participants.server.app import make_workload

from . import report
from .load import cpu_seconds

DEFAULT_JSON: Final = Path(__file__).parent / "results" / "workers.json"
TOKEN: Final = "bench-" + secrets.token_hex(8)
HEADERS: Final = {"authorization": f"Bearer {TOKEN}"}
KIND: Final = "environment"
INSTANCE: Final = "environment-0"
WORKER_COUNTS: Final = (1, 2, 4)
#: Checkpoints on tmpfs where there is one; the servers' checkpoint root holds them.
ROOT: Final = "/dev/shm" if Path("/dev/shm").is_dir() else tempfile.gettempdir()
_STEPS: Final = 10_000  # the most a session may take: more than any run here makes


# -- processes and their CPU ----------------------------------------------------------------


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


@asynccontextmanager
async def _server(workers: int, workdir: Path, *extra: str) -> AsyncIterator[tuple[ServerProcess, list[int]]]:
    """A ``serve environment`` process with ``workers`` workers; yields it and its workers' pids."""
    server = ServerProcess(
        KIND,
        instance=INSTANCE,
        token_file=write_token_file(workdir / "token", TOKEN),
        log_dir=workdir / "logs",
        extra_args=["--workers", str(workers), "--checkpoint-root", ROOT, *extra],
    )
    try:
        await server.wait_listening(60)
        pids: list[int] = []
        with anyio.fail_after(30):
            while workers > 1 and len(pids := _children(server.proc.pid)) < workers:
                await anyio.sleep(0.05)
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            with anyio.fail_after(30):  # every worker has joined (and bound its own port)
                while workers > 1:
                    status = (await client.get(f"{CONTROL_PREFIX}/status", headers=HEADERS)).json()
                    if all(w["connected"] and w["url"] for w in status["workers"]):
                        break
                    await anyio.sleep(0.05)
        yield server, pids
    finally:
        server.terminate()


# -- a lean HTTP/1.1 client: the load generator ---------------------------------------------


class _Connection:
    """One keep-alive HTTP/1.1 connection sending pre-built requests (no client library, so
    the generator's own CPU per call stays far below the servers')."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.receive = BufferedByteReceiveStream(stream)

    @classmethod
    async def open(cls, url: str) -> _Connection:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        return cls(await anyio.connect_tcp(host, int(port)))

    async def call(self, request: bytes) -> bytes:
        await self.stream.send(request)
        head = await self.receive.receive_until(b"\r\n\r\n", 65536)
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"answered {head[:200]!r}")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        return await self.receive.receive_exactly(length)

    async def aclose(self) -> None:
        await self.stream.aclose()


def _post(path: str, body: Any) -> bytes:
    payload = msgspec.json.encode(body)
    head = (
        f"POST {path} HTTP/1.1\r\nhost: bench\r\nauthorization: Bearer {TOKEN}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


async def _start(url: str, rollout_id: str) -> str:
    """Start a session through the main port; the URL its work calls go to (its worker's port)."""
    connection = await _Connection.open(url)
    try:
        reply = msgspec.json.decode(
            await connection.call(_post("/work/start", {"rollout_id": rollout_id, "steps": _STEPS}))
        )
    finally:
        await connection.aclose()
    return str(reply.get("worker_url") or url)


# -- CPU per work call ----------------------------------------------------------------------


async def _cpu_per_call(workers: int, routed: bool, calls: int, workdir: Path) -> dict[str, float]:
    """Microseconds of CPU per ``advance``, of the main process and of the workers together."""
    async with _server(workers, workdir, "--step-seconds", "0") as (server, pids):
        target = await _start(server.url, "cpu")
        url = target if routed else server.url
        request = _post("/work/advance", {"rollout_id": "cpu"})
        connection = await _Connection.open(url)
        try:
            for _ in range(200):  # warm up (imports, caches, the first connection)
                await connection.call(request)
            main_before = cpu_seconds(server.proc.pid)
            workers_before = sum(cpu_seconds(p) for p in pids)
            start = time.perf_counter()
            for _ in range(calls):
                await connection.call(request)
            wall = time.perf_counter() - start
            main = cpu_seconds(server.proc.pid) - main_before
            spent = sum(cpu_seconds(p) for p in pids) - workers_before
        finally:
            await connection.aclose()
    return {"main_us": main / calls * 1e6, "workers_us": spent / calls * 1e6, "wall_us": wall / calls * 1e6}


# -- throughput with a CPU-bound step -------------------------------------------------------


@contextmanager
def _pinned_to_last_core() -> Iterator[str]:
    """This process (the load generator) on the last core while inside, if the OS allows it;
    yields what it did. Entered only once the servers run: a child started while pinned would
    inherit the pin and share the one core."""
    try:
        every = os.sched_getaffinity(0)
    except (AttributeError, OSError) as exc:
        yield f"not pinned ({exc})"
        return
    cores = sorted(every)
    if len(cores) < 2:
        yield "not pinned (one core)"
        return
    os.sched_setaffinity(0, {cores[-1]})
    try:
        yield f"pinned to core {cores[-1]}"
    finally:
        os.sched_setaffinity(0, every)


async def _throughput(
    workers: int, step_cpu_ms: float, sessions: int, seconds: float, workdir: Path
) -> tuple[float, str]:
    """Work calls per second, ``sessions`` sessions each with one call in flight, routed."""
    async with _server(workers, workdir, "--step-seconds", "0", "--step-cpu-ms", str(step_cpu_ms)) as (
        server,
        _,
    ):
        targets = [await _start(server.url, f"s{i}") for i in range(sessions)]
        counts = [0] * sessions
        measuring = False

        async def drive(index: int, deadline: float) -> None:
            request = _post("/work/advance", {"rollout_id": f"s{index}"})
            connection = await _Connection.open(targets[index])
            try:
                while time.perf_counter() < deadline:
                    await connection.call(request)
                    if measuring:
                        counts[index] += 1
            finally:
                await connection.aclose()

        warm = 1.0
        with _pinned_to_last_core() as pinning:
            start = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for index in range(sessions):
                    tg.start_soon(drive, index, start + warm + seconds)
                await anyio.sleep(warm)
                measuring = True
                measured_from = time.perf_counter()
            elapsed = time.perf_counter() - measured_from
    return sum(counts) / elapsed, pinning


# -- commit and restore ---------------------------------------------------------------------


async def _seed(n: int, directory: Path) -> None:
    """A single-process commit of ``n`` rollouts at ``directory``, the runs' starting point."""
    async with Bus() as bus:
        app = create_app(KIND, instance=INSTANCE, token=TOKEN, bus=bus, checkpoint_root=ROOT)
        for i in range(n):
            app.state.workload.start(EpisodeId(f"r{i:06d}", 0), 4)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://s", timeout=600) as client:
            await _control(client, "prepare", {"checkpoint_id": "seed"})
            await _control(client, "commit", {"checkpoint_id": "seed", "checkpoint_dir": str(directory)})


async def _control(client: httpx.AsyncClient, op: str, body: dict[str, Any]) -> Any:
    content = msgspec.json.encode({**body, "deadline_ts": time.time() + 600})
    reply = await client.post(f"{CONTROL_PREFIX}/{op}", content=content, headers=HEADERS)
    if reply.status_code != 200:
        raise RuntimeError(f"{op}: {reply.status_code} {reply.text[:300]}")
    return reply.json()


async def _checkpoint_round(n: int, workers: int, seed: Path, workdir: Path) -> dict[str, float]:
    """Restore the seed into a fresh ``workers``-worker server, then commit it; seconds, and
    the main process's CPU seconds over both."""
    episodes = [EpisodeId(f"r{i:06d}", 0) for i in range(n)]
    async with _server(workers, workdir) as (server, _):
        async with httpx.AsyncClient(base_url=server.url, timeout=600) as client:
            main_before = cpu_seconds(server.proc.pid)
            start = time.perf_counter()
            restored = await _control(
                client,
                "restore",
                {"checkpoint_id": "r1", "checkpoint_dir": str(seed), "episode_ids": episodes},
            )
            restore_s = time.perf_counter() - start
            assert len(restored["restored"]) == n, len(restored["restored"])
            await _control(client, "resume", {"checkpoint_id": "r1"})
            await _control(client, "prepare", {"checkpoint_id": "c1"})
            directory = Path(ROOT) / f"ckpt-bench-{workers}-{secrets.token_hex(4)}"
            start = time.perf_counter()
            committed = await _control(
                client, "commit", {"checkpoint_id": "c1", "checkpoint_dir": str(directory)}
            )
            commit_s = time.perf_counter() - start
            main_cpu = cpu_seconds(server.proc.pid) - main_before
            assert committed["manifest"]["record_count"] == n
            await _control(client, "resume", {"checkpoint_id": "c1"})
    _remove_tree(directory)
    return {"restore_s": restore_s, "commit_s": commit_s, "main_cpu_s": main_cpu}


def _remove_tree(directory: Path) -> None:
    import shutil

    shutil.rmtree(directory, ignore_errors=True)


# -- the hop ----------------------------------------------------------------------------------


async def _hop(calls: int) -> dict[str, float]:
    """Microseconds per call: a control call (``close_admission``) and a work call (``get`` of
    one session's view) sent as frames over a real Unix socket pair, beside the direct call."""
    from ckpt_events.participants.server.workers.channel import FrameChannel
    from ckpt_events.participants.server.workers.frames import Close, Get, Message, Request
    from ckpt_events.participants.server.workers.worker import WorkerHost

    workload = make_workload(KIND, Telemetry(None, kind=KIND, instance=INSTANCE))
    key = workload.start(EpisodeId("r000001", 0), 4).key
    host = WorkerHost(workload, 0)
    figures: dict[str, float] = {}
    async with anyio.create_task_group() as tg:
        left, right = await _socket_pair()
        near = FrameChannel(left, _refuse, name="bench coordinator")
        far = FrameChannel(right, host.handle, name="bench worker")
        tg.start_soon(near.run)
        tg.start_soon(far.run)
        bodies: tuple[tuple[str, Request[Any]], ...] = (("close_admission", Close()), ("get", Get(key)))
        for kind, body in bodies:
            message = Message(0, body)
            for _ in range(50):  # warm both paths
                await near.request(body)
                await host.handle(message)
            start = time.perf_counter()
            for _ in range(calls):
                await host.handle(message)
            direct = (time.perf_counter() - start) / calls
            start = time.perf_counter()
            for _ in range(calls):
                await near.request(body)
            hop = (time.perf_counter() - start) / calls
            figures[f"{kind}_direct_us"] = direct * 1e6
            figures[f"{kind}_hop_us"] = hop * 1e6
        tg.cancel_scope.cancel()  # each run() closes its stream once its read is cancelled
    return figures


async def _refuse(message: Any) -> Any:
    raise RuntimeError(f"the bench coordinator takes no {message.kind!r}")


async def _socket_pair() -> tuple[Any, Any]:
    """Two connected ends of a real Unix socket (listener in a private temporary directory)."""
    directory = tempfile.mkdtemp(prefix="ckpt-hop-")
    path = os.path.join(directory, "hop.sock")
    listener = await anyio.create_unix_listener(path)
    async with listener:
        client = await anyio.connect_unix(path)
        server = await listener.accept()
    os.unlink(path)
    os.rmdir(directory)
    return client, server


# -- the run ----------------------------------------------------------------------------------


async def _measure(quick: bool) -> dict[str, Any]:
    calls = 1_000 if quick else 4_000
    n = 2_000 if quick else 16_000
    rounds = 1 if quick else 3
    seconds = 2.0 if quick else 5.0
    step_cpu_ms = 2.0
    sessions = 8
    figures: dict[str, Any] = {
        "calls": calls,
        "rollouts": n,
        "rounds": rounds,
        "step_cpu_ms": step_cpu_ms,
        "sessions": sessions,
        "seconds": seconds,
    }
    with tempfile.TemporaryDirectory(prefix="ckpt-bench-workers-", dir=ROOT) as tmp:
        workdir = Path(tmp)
        figures["cpu"] = {
            "single": await _cpu_per_call(1, False, calls, workdir),
            "forwarded": await _cpu_per_call(2, False, calls, workdir),
            "routed": await _cpu_per_call(2, True, calls, workdir),
        }
        seed = workdir / "seed"
        await _seed(n, seed)
        runs: dict[int, list[dict[str, float]]] = {w: [] for w in WORKER_COUNTS}
        for index in range(rounds):
            order = WORKER_COUNTS[index % len(WORKER_COUNTS) :] + WORKER_COUNTS[: index % len(WORKER_COUNTS)]
            for workers in order:
                runs[workers].append(await _checkpoint_round(n, workers, seed, workdir))
        figures["checkpoint"] = {
            w: {k: statistics.median(r[k] for r in got) for k in ("restore_s", "commit_s", "main_cpu_s")}
            for w, got in runs.items()
        }
        throughput: dict[int, list[float]] = {1: [], 2: []}
        for index in range(rounds):
            for workers in (1, 2) if index % 2 == 0 else (2, 1):
                rate, figures["pinning"] = await _throughput(workers, step_cpu_ms, sessions, seconds, workdir)
                throughput[workers].append(rate)
        figures["throughput"] = {w: statistics.median(v) for w, v in throughput.items()}
    figures["hop"] = await _hop(300 if quick else 2000)
    return figures


def run(quick: bool = False) -> dict[str, Any]:
    """Run the workers benchmark; returns the figures and the rows of the ratio table."""
    figures = anyio.run(_measure, quick)
    rows: list[Any] = []
    cpu = figures["cpu"]
    single = cpu["single"]["main_us"]
    rows.append(("CPU per work call, us: single-process server", f"{single:.0f}", "", None))
    for mode, what in (("forwarded", "through the main port"), ("routed", "routed to the worker's port")):
        got = cpu[mode]
        rows.append(
            (
                f"CPU per work call, us, 2 workers {what}: main / workers",
                f"{got['main_us']:.0f} / {got['workers_us']:.0f}",
                "",
                None,
            )
        )
    routed = cpu["routed"]["main_us"] / single
    rows.append(
        (
            "main-process CPU per routed work call / single-process CPU per call",
            routed,
            "<= 0.1",
            routed <= 0.1,
        )
    )
    rows.append(
        (
            "main-process CPU per forwarded work call / single-process CPU per call",
            cpu["forwarded"]["main_us"] / single,
            "",
            None,
        )
    )
    through = figures["throughput"]
    rows.append(
        (
            f"work calls/s with a {figures['step_cpu_ms']:g} ms CPU step, 1 / 2 workers "
            f"(load generator {figures['pinning']})",
            f"{through[1]:.0f} / {through[2]:.0f}",
            "",
            None,
        )
    )
    scale = through[2] / through[1]
    rows.append(("work-call throughput, 2 workers / 1 worker", scale, ">= 1.7", scale >= 1.7))
    by = figures["checkpoint"]
    n = figures["rollouts"]
    one = by[1]["restore_s"] + by[1]["commit_s"]
    for workers in WORKER_COUNTS:
        got = by[workers]
        rows.append(
            (
                f"workers {workers}: restore / commit of {n:,} rollouts, ms (main-process CPU, ms)",
                f"{got['restore_s'] * 1e3:.0f} / {got['commit_s'] * 1e3:.0f} ({got['main_cpu_s'] * 1e3:.0f})",
                "",
                None,
            )
        )
    for workers in WORKER_COUNTS[1:]:
        ratio = (by[workers]["restore_s"] + by[workers]["commit_s"]) / one
        rows.append((f"workers {workers} / 1 worker: restore+commit", ratio, "<= 1.0", ratio <= 1.0))
    hop = figures["hop"]
    for kind, what in (("close_admission", "control call"), ("get", "work call (get a view)")):
        direct, through_socket = hop[f"{kind}_direct_us"], hop[f"{kind}_hop_us"]
        rows.append(
            (f"hop, {what}: us direct / us over the socket", f"{direct:.1f} / {through_socket:.1f}", "", None)
        )
    return {**figures, "rows": rows}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None, allow_abbrev=False
    )
    parser.add_argument("--quick", action="store_true", help="fewer calls, 2,000 rollouts, one round")
    parser.add_argument(
        "--json", type=report.output_path, default=DEFAULT_JSON, help="where to write the figures"
    )
    args = parser.parse_args(argv)
    with report.failure_in_one_line("workers"):
        result = run(args.quick)
        rows = result.pop("rows")
        title = "ckpt-events workers: CPU per call, throughput, restore and commit, the hop"
        report.publish(title, rows, args.json, json.loads(json.dumps(result)))
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
