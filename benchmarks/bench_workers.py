"""Workers benchmark: one server's restore and commit of N rollouts with 1, 2 and 4 workers,
sinks off and on, and the cost of the worker hop beside a direct in-process call.

The server is a real FastAPI app reached through httpx's ASGI transport. With 2 or 4
workers its episodes live in worker *tasks* of this process, each behind a real Unix socket
and the real frames (msgpack, length-prefixed), so what is measured is the hop: encoding,
the socket, decoding and the coordinator's gathering of every worker's share. Worker
*processes* would add parallelism on top, which a shared 2-core machine cannot show fairly.
The rollouts are put in place by restoring one seed checkpoint (a 1-worker commit), which
also spreads them over the workers; then the server resumes, prepares and commits them.

* off: a bus with no sink subscribed; on: ``SpanSink`` (in-memory exporter), ``MetricSink``
  and a JSON-lines file, on the one bus the server and its workers share.

Each worker count runs in its own process (FastAPI's caches keep every app alive); rounds
alternate off and on; medians are kept. Run
``python -m benchmarks.bench_workers [--quick] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import httpx
import msgspec

from ckpt_events import Bus, Telemetry
from participants import create_app
from participants.protocol import CONTROL_PREFIX, EpisodeId
from participants.server.app import make_workload

from . import report
from .bench_scale import subscribe_all_sinks

DEFAULT_JSON = Path(__file__).parent / "results" / "workers.json"
TOKEN = "bench-" + secrets.token_hex(8)
HEADERS = {"authorization": f"Bearer {TOKEN}"}
KIND = "environment"
INSTANCE = "environment-0"
WORKER_COUNTS = (1, 2, 4)
#: Checkpoints on tmpfs where there is one; the participants' checkpoint root holds them.
ROOT = "/dev/shm" if Path("/dev/shm").is_dir() else tempfile.gettempdir()


def _app(bus: Bus, workers: int) -> Any:
    if workers == 1:
        return create_app(KIND, instance=INSTANCE, token=TOKEN, bus=bus, checkpoint_root=ROOT)
    return create_app(
        KIND,
        instance=INSTANCE,
        token=TOKEN,
        bus=bus,
        workers=workers,
        checkpoint_root=ROOT,
        worker_factory=lambda i: make_workload(KIND, Telemetry(bus, kind=KIND, instance=INSTANCE, worker=i)),
    )


async def _post(client: httpx.AsyncClient, op: str, body: Any) -> Any:
    reply = await client.post(f"{CONTROL_PREFIX}/{op}", content=msgspec.json.encode(body), headers=HEADERS)
    if reply.status_code != 200:
        raise RuntimeError(f"{op}: {reply.status_code} {reply.text[:300]}")
    return reply.json()


def _deadline() -> float:
    return time.time() + 600


async def _seed(n: int, directory: Path) -> None:
    """A 1-worker commit of ``n`` rollouts at ``directory``, the runs' starting point."""
    async with Bus() as bus:
        app = _app(bus, 1)
        for i in range(n):
            app.state.workload.start(EpisodeId(f"r{i:06d}", 0), 4)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://s", timeout=600) as client:
            await _post(client, "prepare", {"checkpoint_id": "seed", "deadline_ts": _deadline()})
            body = {"checkpoint_id": "seed", "deadline_ts": _deadline(), "checkpoint_dir": str(directory)}
            await _post(client, "commit", body)


async def _one(n: int, workers: int, on: bool, seed: Path, workdir: Path) -> dict[str, float]:
    """Restore the seed into a fresh server of ``workers`` workers, then commit it; wall seconds."""
    episodes = [EpisodeId(f"r{i:06d}", 0) for i in range(n)]
    async with AsyncExitStack() as stack:
        bus = await stack.enter_async_context(Bus(buffer_size=1 << 20))
        if on:
            await subscribe_all_sinks(stack, bus, workdir)
        app = _app(bus, workers)
        await stack.enter_async_context(app.router.lifespan_context(app))
        transport = httpx.ASGITransport(app=app)
        client = await stack.enter_async_context(
            httpx.AsyncClient(transport=transport, base_url="http://s", timeout=600)
        )
        restore = {"checkpoint_id": "r1", "deadline_ts": _deadline(), "checkpoint_dir": str(seed)}
        gc.collect()
        start = time.perf_counter()
        restored = await _post(client, "restore", {**restore, "episode_ids": episodes})
        restore_s = time.perf_counter() - start
        assert len(restored["restored"]) == n, restored.keys()
        await _post(client, "resume", {"checkpoint_id": "r1", "deadline_ts": _deadline()})
        await _post(client, "prepare", {"checkpoint_id": "c1", "deadline_ts": _deadline()})
        directory = workdir / f"ck-{workers}-{int(on)}-{secrets.token_hex(3)}"
        gc.collect()
        start = time.perf_counter()
        body = {"checkpoint_id": "c1", "deadline_ts": _deadline(), "checkpoint_dir": str(directory)}
        committed = await _post(client, "commit", body)
        commit_s = time.perf_counter() - start
        assert committed["manifest"]["record_count"] == n
        await _post(client, "resume", {"checkpoint_id": "c1", "deadline_ts": _deadline()})
    return {"restore_s": restore_s, "commit_s": commit_s}


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


async def _measure_workers(n: int, workers: int, pairs: int, seed: Path) -> dict[str, Any]:
    """Both modes of one worker count, alternating which goes first, in this process."""
    with tempfile.TemporaryDirectory(prefix="ckpt-workers-", dir=ROOT) as tmp:
        runs: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
        for pair in range(pairs):
            for mode in ("off", "on") if pair % 2 == 0 else ("on", "off"):
                runs[mode].append(await _one(n, workers, mode == "on", seed, Path(tmp)))
    return {
        mode: {k: _median([r[k] for r in got]) for k in ("restore_s", "commit_s")}
        for mode, got in runs.items()
    }


def _measure(quick: bool) -> dict[str, Any]:
    n = 2_000 if quick else 16_000
    pairs = 2 if quick else 5
    base = "/dev/shm" if Path("/dev/shm").is_dir() else None
    figures: dict[str, Any] = {"rollouts": n, "pairs": pairs, "workers": {}}
    module = __spec__.name if __spec__ is not None else __name__
    with tempfile.TemporaryDirectory(prefix="ckpt-workers-seed-", dir=base) as tmp:
        seed = Path(tmp) / "seed"
        anyio.run(_seed, n, seed)
        for workers in WORKER_COUNTS:
            command = [sys.executable, "-m", module, "--one", str(n), str(workers), str(pairs), str(seed)]
            # PYTHONSAFEPATH: the child's path is ours, never its working directory's modules.
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "PYTHONSAFEPATH": "1"}
            done = subprocess.run(command, capture_output=True, check=True, timeout=3600, env=env)
            figures["workers"][workers] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    figures["hop"] = anyio.run(_hop, 300 if quick else 2000)
    return figures


# -- the hop: one call through a real channel vs the same call made directly ----------------


async def _hop(calls: int) -> dict[str, float]:
    """Microseconds per call: a control call (``close_admission``) and a work call (``get`` of
    one session's view) sent as frames over a real Unix socket pair, beside the direct call."""
    from participants.server.workers.channel import FrameChannel
    from participants.server.workers.frames import Message
    from participants.server.workers.worker import INLINE_KINDS, WorkerHost

    workload = make_workload(KIND, Telemetry(None, kind=KIND, instance=INSTANCE))
    key = workload.start(EpisodeId("r000001", 0), 4).key
    host = WorkerHost(workload, 0)
    figures: dict[str, float] = {}
    async with anyio.create_task_group() as tg:
        left, right = await _socket_pair()
        near = FrameChannel(left, _refuse, name="bench coordinator")
        far = FrameChannel(right, host.handle, name="bench worker", inline=INLINE_KINDS)
        tg.start_soon(near.run)
        tg.start_soon(far.run)
        for kind, body in (("close_admission", None), ("get", {"key": key})):
            message = Message(0, kind, body)
            for _ in range(50):  # warm both paths
                await near.request(kind, body)
                await host.handle(message)
            start = time.perf_counter()
            for _ in range(calls):
                await host.handle(message)
            direct = (time.perf_counter() - start) / calls
            start = time.perf_counter()
            for _ in range(calls):
                await near.request(kind, body)
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


def run(quick: bool = False) -> dict[str, Any]:
    """Run the workers benchmark; returns the figures and the rows of the ratio table."""
    figures = _measure(quick)
    n, by = figures["rollouts"], figures["workers"]
    rows: list[Any] = []
    one_off = by[1]["off"]
    for workers in WORKER_COUNTS:
        for mode in ("off", "on"):
            got = by[workers][mode]
            ms = f"{got['restore_s'] * 1e3:.0f} / {got['commit_s'] * 1e3:.0f}"
            rows.append(
                (f"workers {workers}, sinks {mode}: restore / commit of {n:,} rollouts, ms", ms, "", None)
            )
    for workers in WORKER_COUNTS:
        got = by[workers]
        total = {m: got[m]["restore_s"] + got[m]["commit_s"] for m in ("off", "on")}
        rows.append(
            (f"workers {workers}: restore+commit, sinks on / off", total["on"] / total["off"], "", None)
        )
        if workers > 1:
            ratio = total["off"] / (one_off["restore_s"] + one_off["commit_s"])
            rows.append((f"workers {workers} / 1 worker: restore+commit (sinks off)", ratio, "", None))
    hop = figures["hop"]
    for kind, what in (("close_admission", "control call"), ("get", "work call (get a view)")):
        direct, through = hop[f"{kind}_direct_us"], hop[f"{kind}_hop_us"]
        rows.append(
            (f"hop, {what}: us direct / us over the socket", f"{direct:.1f} / {through:.1f}", "", None)
        )
        rows.append((f"hop, {what}: over the socket / direct", through / direct, "", None))
    return {**figures, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="2,000 rollouts, fewer rounds")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where to write the figures")
    parser.add_argument("--one", nargs=4, help=argparse.SUPPRESS)  # a child: n, workers, pairs, seed
    args = parser.parse_args(argv)
    if args.one is not None:
        n, workers, pairs, seed = args.one
        print(json.dumps(anyio.run(_measure_workers, int(n), int(workers), int(pairs), Path(seed))))
        return 0
    result = run(args.quick)
    rows = result.pop("rows")
    report.print_table("ckpt-events workers: restore and commit per worker count, and the worker hop", rows)
    print(report.markdown_table(rows))
    report.write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
