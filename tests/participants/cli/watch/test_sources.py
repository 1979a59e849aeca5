"""watch's sources: a poll round survives silent, slow and hostile participants; followed logs that
are rotated, truncated or deleted are reread or reported."""

from __future__ import annotations

import io
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
from fastapi import FastAPI, Response
from fastapi.responses import StreamingResponse
from rich.console import Console

from ckpt_events import Bus, Telemetry
from ckpt_events.participants.cli.fleet import free_port, serving
from ckpt_events.participants.cli.watch.sources import MAX_BODY, LogFollower, poll_all, status_client
from ckpt_events.participants.cli.watch.view import FleetView
from ckpt_events.participants.protocol import CONTROL_PREFIX
from ckpt_events.sinks import JsonLinesSink

GOOD = b'{"kind":"agent","instance":"agent-\\u001b[2Jx","phase":"idle"}'


def _hostile_app(release: anyio.Event) -> FastAPI:
    app = FastAPI()

    @app.get("/slow" + CONTROL_PREFIX + "/status")
    async def slow() -> Response:
        with anyio.move_on_after(10):  # answers after 10 s, or when the test is done
            await release.wait()
        return Response(GOOD, media_type="application/json")

    @app.get("/invalid" + CONTROL_PREFIX + "/status")
    async def invalid() -> Response:
        return Response(b"{not json", media_type="application/json")

    @app.get("/huge" + CONTROL_PREFIX + "/status")
    async def huge() -> StreamingResponse:
        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(100):  # 100 MB
                yield b" " * (1 << 20)

        return StreamingResponse(chunks(), media_type="application/json")

    @app.get("/wrong" + CONTROL_PREFIX + "/status")
    async def wrong() -> Response:
        return Response(
            b'{"kind":"controller","instance":"db","phase":"idle"}', media_type="application/json"
        )

    @app.get("/escape" + CONTROL_PREFIX + "/status")
    async def escape() -> Response:
        return Response(GOOD, media_type="application/json")

    return app


async def test_a_round_with_hostile_participants_ends_within_its_timeout() -> None:
    """Silent, slow, invalid, 100 MB and wrong-kind participants are one line each; the good one
    is shown, its control characters escaped; the round takes about the per-poll timeout."""
    release = anyio.Event()
    silent = f"http://127.0.0.1:{free_port()}"
    async with serving(_hostile_app(release)) as base:
        urls = [silent, *(f"{base}/{name}" for name in ("slow", "invalid", "huge", "wrong", "escape"))]
        # watch's own client: five of them share one origin, so one pool of five connections
        async with status_client(urls, headers={}, timeout=0.8) as client:
            started = time.monotonic()
            results = await poll_all(client, urls, 0.8)
            took = time.monotonic() - started
        release.set()
    assert took < 1.6
    errors = {r.url.rsplit("/", 1)[-1]: r.error for r in results}
    assert errors[silent.rsplit("/", 1)[-1]].startswith("unreachable: ConnectError")
    assert errors["slow"] == "no answer within 0.8 s"
    assert errors["invalid"].startswith("invalid status reply: JSON is malformed")
    assert errors["huge"] == f"reply larger than {MAX_BODY // 1024} KiB: not a participant status"
    assert errors["wrong"] == "not a checkpoint participant: kind 'controller'"
    assert errors["escape"] is None
    view = FleetView(urls)
    view.add_polls(results, time.time())
    out = Console(width=80, record=True, file=io.StringIO())
    out.print(view.render())
    text = out.export_text(styles=False)
    assert "agent agent-\\x1b[2Jx" in text and "\x1b" not in text
    assert all(url in text for url in urls) and "…" not in text  # long lines wrap, never cut


async def _write(path: Path, checkpoint_id: str) -> None:
    async with Bus() as bus:
        bus.subscribe(JsonLinesSink(path))
        tel = Telemetry(bus, kind="model", instance="model-0")
        with tel.operation("commit", checkpoint_id=checkpoint_id):
            pass


async def test_followed_logs_rotated_truncated_and_deleted(tmp_path: Path) -> None:
    """Appended lines are read once; a replaced or truncated file is read again from its start; a
    deleted one is one note until it is back."""
    log = tmp_path / "events.jsonl"
    await _write(log, "c1")
    follower = LogFollower([str(tmp_path / "*.jsonl")])
    assert [e.checkpoint_id for e in follower.read()] == ["c1", "c1"]
    assert follower.read() == [] and follower.notes == {}
    await _write(log, "c2")
    assert [e.checkpoint_id for e in follower.read()] == ["c2", "c2"]
    os.replace(log, tmp_path / "events.jsonl.1")  # rotated: a new file under the old name
    await _write(log, "c3")
    assert [e.checkpoint_id for e in follower.read()] == ["c3", "c3"]
    assert follower.notes == {str(log): f"{log}: replaced (rotated), reading the new file"}
    log.write_bytes(b"")  # truncated in place: same inode, shorter than what was read
    assert follower.read() == []
    assert follower.notes == {str(log): f"{log}: truncated, reading again from the start"}
    await _write(log, "c4")
    assert [e.checkpoint_id for e in follower.read()] == ["c4", "c4"]
    follower = LogFollower([str(log)])
    log.unlink()
    assert follower.read() == []
    assert follower.notes[str(log)].startswith(f"{log}: cannot read (No such file or directory)")
