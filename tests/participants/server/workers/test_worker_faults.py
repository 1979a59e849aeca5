"""Faults and hostile peers on the worker socket: real Unix sockets, the app in process.

A hostile peer is this test speaking frames on a real socket: it joins as a worker (or plays
the coordinator to a real worker) and then misbehaves. Nothing may crash, hang or go quiet.
"""

from __future__ import annotations

import logging
import socket
import struct
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import msgspec
import pytest
from anyio.abc import SocketAttribute, SocketStream

from ckpt_events import Bus, OperationFinished, PrepareNotReady, Telemetry
from ckpt_events.participants.errors import WorkerChannelError
from ckpt_events.participants.protocol import NOT_READY_WORKER_BLOCKERS, NOT_READY_WORKERS
from ckpt_events.participants.server.app import make_workload
from ckpt_events.participants.server.workers import coordinator as worker_coordinator
from ckpt_events.participants.server.workers import create_worker_app, run_worker
from ckpt_events.participants.server.workers.coordinator import WorkerCoordinator
from ckpt_events.participants.server.workers.frames import (
    Close,
    Get,
    Hello,
    Message,
    Reply,
    WorkerState,
    encode_body,
    encode_frame,
    read_frame,
)
from ckpt_events.testing import MemorySink
from ckpt_events.vocab import Operation
from tests.participants.helpers import TOKEN, control, error_code, running, status

pytestmark = pytest.mark.anyio
STATE = WorkerState(admission_open=True, marks={})


def _app(
    reply_seconds: float = 30.0, factory_for: tuple[int, ...] = (0, 1), bus: Bus | None = None, **options: Any
) -> Any:
    bus = Bus() if bus is None else bus

    def workload() -> Any:
        return make_workload("environment", Telemetry(bus, kind="environment", instance="env-0"), **options)

    app = create_worker_app(
        workload(),
        token=TOKEN,
        workers=2,
        worker_factory=lambda i: workload(),
        reply_seconds=reply_seconds,
        checkpoint_root=Path(tempfile.gettempdir()),  # holds every tmp_path
    )
    return app


async def _both_serving(client: Any) -> None:
    """A session on each worker: both have had their hello answered (dropping one before that
    would fail its hello, which in process ends the app's task group)."""
    for rollout_id in ("w-a", "w-b"):
        assert (
            await client.post("/work/start", json={"rollout_id": rollout_id, "steps": 9})
        ).status_code == 200


async def _drop(app: Any, index: int) -> None:
    """End worker ``index``'s socket, as when its process dies, and wait until it is lost."""
    coordinator = app.state.coordinator
    coordinator.channels[index].stream.extra(SocketAttribute.raw_socket).shutdown(socket.SHUT_RDWR)
    with anyio.fail_after(5):
        while index in coordinator.connected():
            await anyio.sleep(0.01)


async def _join(coordinator: WorkerCoordinator, index: int) -> SocketStream:
    """A misbehaving worker's hello as worker ``index`` (with the secret of a new start of it);
    returns its stream once the hello is answered."""
    stream = await anyio.connect_unix(coordinator.socket_path)
    hello = Hello(index, coordinator.new_secret(index))
    await stream.send(encode_frame(Message(1, hello)))
    with anyio.fail_after(5):
        reply = await read_frame(stream)
    assert isinstance(reply, Reply) and reply.ok, reply
    return stream


async def test_a_lost_worker_makes_prepare_answer_not_ready_at_once() -> None:
    """A worker lost while prepare waits on a busy episode: worker-lost now, not at the 20 s deadline."""
    app = _app(step_seconds=3.0)
    async with running(app) as client, anyio.create_task_group() as tg:
        for i in range(2):
            assert (
                await client.post("/work/start", json={"rollout_id": f"r{i}", "steps": 3})
            ).status_code == 200
        tg.start_soon(partial(client.post, "/work/advance", json={"rollout_id": "r0"}))  # busy for 3 s
        tg.start_soon(_drop_later, app)
        start = time.monotonic()
        with anyio.fail_after(10):
            reply = await control(client, "prepare", seconds=20.0)
        elapsed = time.monotonic() - start
        report = reply.json()["report"]
        assert reply.json()["phase"] == "preparing" and "environment-worker-lost" in report["blockers"]
        assert elapsed < 10  # the deadline was 20 s away
        tg.cancel_scope.cancel()


async def _drop_later(app: Any) -> None:
    await anyio.sleep(0.3)
    index = app.state.workload.owners["r1"]
    await _drop(app, index)


async def test_a_session_lost_with_its_worker_is_a_404_that_says_so_and_the_log_names_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Worker lost: each session it held answers 404 not_found naming the worker it was lost
    with (it said "no episode r0", as for a session never started), the log names the sessions
    lost, and a session started again is served."""
    caplog.set_level(logging.WARNING, "ckpt_events.workers")
    app = _app()
    async with running(app) as client:
        await _both_serving(client)
        index = app.state.workload.owners["w-a"]
        await _drop(app, index)
        for reply in (
            await client.post("/work/advance", json={"rollout_id": "w-a"}),
            await client.get("/work/w-a"),
        ):
            assert error_code(reply) == (404, "not_found")
            detail = reply.json()["error"]["detail"]
            assert detail == f"episode w-a was lost with worker {index}: start it again", detail
        never = await client.post("/work/advance", json={"rollout_id": "never"})
        assert never.json()["error"]["detail"] == "no episode never"
        said = [r.getMessage() for r in caplog.records if "session" in r.getMessage()]
        assert said == [f"worker {index} lost 1 session with it: w-a"], said
        again = await client.post("/work/start", json={"rollout_id": "w-a", "steps": 2})
        assert again.status_code == 200, again.text
        assert (await client.post("/work/advance", json={"rollout_id": "w-a"})).status_code == 200


async def test_a_silent_worker_gives_503_after_the_reply_deadline_and_none_connected_gives_503() -> None:
    """A worker that never answers: 503 checkpoint_coordinator_unavailable at the reply deadline, no hang."""
    app = _app(reply_seconds=0.5)
    async with running(app) as client:
        await _both_serving(client)
        await _drop(app, 1)
        silent = await _join(app.state.coordinator, 1)  # reads nothing, answers nothing
        try:
            with anyio.fail_after(5):
                reply = await client.post("/work/start", json={"rollout_id": "b", "steps": 2})
            assert error_code(reply) == (503, "checkpoint_coordinator_unavailable")
            await _drop(app, 0)
            await silent.aclose()
            with anyio.fail_after(5):
                while app.state.coordinator.connected():
                    await anyio.sleep(0.01)
            reply = await client.post("/work/start", json={"rollout_id": "c", "steps": 2})
            assert error_code(reply) == (503, "checkpoint_coordinator_unavailable")
            assert (await status(client))["phase"] == "idle"
        finally:
            await silent.aclose()


async def test_a_connected_worker_silent_through_a_prepare_is_named_once_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A worker that joined and then answers nothing (hung: SIGSTOP, a blocked loop): the prepare
    is not ready (``workers-unreported:1``) and one line says which worker did not report, each
    time a prepare ends so. Nothing named it: /status shows it connected, the blocker counts it."""
    caplog.set_level(logging.INFO, "ckpt_events.workers")
    app = _app()
    async with running(app) as client:
        await _both_serving(client)
        await _drop(app, 1)
        peer = await _join(app.state.coordinator, 1)  # reads nothing, answers nothing
        try:
            for cid in ("c1", "c2"):
                with anyio.fail_after(5):
                    prepared = await control(client, "prepare", cid, seconds=0.5)
                assert "environment-workers-unreported:1" in prepared.json()["report"]["blockers"]
                assert (await control(client, "resume", cid)).status_code == 200
            said = [r.getMessage() for r in caplog.records if "did not report" in r.getMessage()]
            assert said == [
                f"prepare of checkpoint {cid}: worker 1 did not report by the deadline (connected, "
                "no answer): not ready"
                for cid in ("c1", "c2")
            ], said
        finally:
            await peer.aclose()


async def test_a_prepare_not_ready_for_a_silent_worker_names_it_on_its_span() -> None:
    """The log's ``prepare_not_ready`` keeps only a blocker count, so a worker frozen through a
    prepare was read back as "blocked by 1 episode": the prepare's span names the worker, and how
    many of the blockers that is, for the report to say instead."""
    memory = MemorySink()
    async with Bus() as bus:
        bus.subscribe(memory, name="memory")
        app = _app(bus=bus)
        async with running(app) as client:
            await _both_serving(client)
            await _drop(app, 1)
            peer = await _join(app.state.coordinator, 1)  # reads nothing, answers nothing
            try:
                with anyio.fail_after(5):
                    prepared = await control(client, "prepare", "c1", seconds=0.5)
                assert prepared.json()["phase"] == "preparing"
                assert (await control(client, "resume", "c1")).status_code == 200
            finally:
                await peer.aclose()
        await bus.flush(timeout=5)
    prepares = [
        e for e in memory.events if isinstance(e, OperationFinished) and e.operation == Operation.PREPARE
    ]
    # The main process's prepare (a root here) and worker 0's under it; worker 1 answered nothing.
    (span,) = [e for e in prepares if e.parent_span_id is None]
    assert span.attributes == {
        NOT_READY_WORKERS: "worker 1 unreported (connected, no answer)",
        NOT_READY_WORKER_BLOCKERS: 1,
    }
    (not_ready,) = [e for e in memory.events if isinstance(e, PrepareNotReady)]
    assert not_ready.blockers == 1


async def test_status_during_a_prepare_counts_only_the_silent_worker_unreported() -> None:
    """While worker 1 (frozen) holds the prepare's first ask to its deadline, /status (what
    ``watch`` shows) counted both workers unreported: worker 0's answer was kept only once the
    silent one's ask ended. It is kept as it comes."""
    app = _app()
    async with running(app) as client:
        await _both_serving(client)
        await _drop(app, 1)
        peer = await _join(app.state.coordinator, 1)  # reads nothing, answers nothing
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(partial(control, client, "prepare", "c1", seconds=2.0))
                with anyio.fail_after(5):
                    while (await status(client))["phase"] != "preparing":
                        await anyio.sleep(0.05)
                await anyio.sleep(0.5)  # worker 0 has answered long since; worker 1 never will
                report = (await status(client))["report"]
                assert report["blockers"] == ["environment-workers-unreported:1"], report
            assert (await control(client, "resume", "c1")).status_code == 200
        finally:
            await peer.aclose()


async def test_a_worker_sending_bad_frames_is_refused_then_lost_and_the_server_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Reply to an unknown id and an unknown kind are refused on a live channel; garbage makes it lost."""
    caplog.set_level(logging.INFO, "ckpt_events.workers")
    app = _app()
    async with running(app) as client:
        await _both_serving(client)
        await _drop(app, 1)
        peer = await _join(app.state.coordinator, 1)
        await peer.send(encode_frame(Reply(999, True, encode_body("nobody asked"))))
        await peer.send(msgspec_frame({"t": "m", "id": 2, "body": {"kind": "rm -rf"}}))
        with anyio.fail_after(5):
            refused = await read_frame(peer)
        assert isinstance(refused, Reply) and refused.reply_to == 2 and not refused.ok
        assert refused.error is not None and refused.error.code == "unknown_kind"
        assert 1 in app.state.coordinator.connected()  # still on the line after both
        with anyio.fail_after(5):  # the peer never answers "closed": unreported by the deadline
            prepared = await control(client, "prepare", seconds=0.5)
        assert "environment-workers-unreported:1" in prepared.json()["report"]["blockers"]
        await peer.send(struct.pack(">I", 2**31) + b"garbage")  # over the bound
        with anyio.fail_after(5):
            while 1 in app.state.coordinator.connected():
                await anyio.sleep(0.01)
        assert "environment-worker-lost" in app.state.workload.report().blockers
        await peer.aclose()
        assert (await control(client, "resume")).status_code == 200
        assert (await client.post("/work/start", json={"rollout_id": "ok", "steps": 1})).status_code == 200
    logged = caplog.text
    assert "reply to unknown id 999" in logged and "unknown message kind 'rm -rf'" in logged
    assert "over the bound" in logged


def msgspec_frame(value: Any) -> bytes:
    """A frame of any shape (a request of an unknown kind), as a hostile peer sends it."""
    payload = msgspec.msgpack.encode(value)
    return struct.pack(">I", len(payload)) + payload


async def _coordinator_peer(path: str, script: Any) -> tuple[bool, BaseException | None]:
    """Run a real worker against a hostile coordinator playing ``script``; (worker ended, its error)."""
    outcome: list[BaseException | None] = []
    workload = make_workload("environment", Telemetry(None, kind="environment", instance="env-0"))

    async def worker() -> None:
        try:
            await run_worker(path, 0, workload, max_frame=4096, secret="s")
            outcome.append(None)
        except Exception as exc:  # the assertion below names it
            outcome.append(exc)

    async with await anyio.create_unix_listener(path) as listener, anyio.create_task_group() as tg:
        tg.start_soon(worker)
        with anyio.fail_after(5):
            stream = await listener.accept()
            hello = await read_frame(stream)
        assert isinstance(hello, Message) and isinstance(hello.body, Hello)
        await stream.send(encode_frame(Reply(hello.id, True, encode_body(STATE))))
        await script(stream)
        with anyio.fail_after(5):
            while not outcome:
                await anyio.sleep(0.01)
        await stream.aclose()
    return bool(outcome), outcome[0]


@pytest.mark.parametrize(
    "garbage",
    [
        struct.pack(">I", 5000) + b"x",
        struct.pack(">I", 100) + b"x" * 10,
        struct.pack(">I", 3) + b"\xc1\xc1\xc1",
    ],
    ids=["over-the-bound", "truncated", "undecodable"],
)
async def test_a_worker_refuses_bad_coordinator_frames_and_ends_cleanly(
    tmp_path: Any, garbage: bytes
) -> None:
    """A worker answers unknown kinds, ignores unknown reply ids, and ends without an error on garbage."""

    async def script(stream: SocketStream) -> None:
        await stream.send(encode_frame(Reply(77, True)))
        await stream.send(msgspec_frame({"t": "m", "id": 5, "body": {"kind": "format_disk"}}))
        await stream.send(encode_frame(Message(6, Get("nope"))))
        with anyio.fail_after(5):
            refused, answered = await read_frame(stream), await read_frame(stream)
        assert isinstance(refused, Reply) and refused.error is not None
        assert (refused.reply_to, refused.error.code) == (5, "unknown_kind")
        assert answered == Reply(6, True, encode_body(None))
        await stream.send(garbage)
        if garbage[4:5] == b"x" and len(garbage) == 14:
            await stream.send_eof()  # a truncated frame: the stream ends mid-frame

    ended, error = await _coordinator_peer(str(tmp_path / "c.sock"), script)
    assert ended and error is None


async def test_a_worker_whose_coordinator_socket_refuses_fails_at_once(tmp_path: Any) -> None:
    """No listener on the socket path: the worker raises promptly (its supervisor restarts it), no hang."""
    workload = make_workload("environment", Telemetry(None, kind="environment", instance="env-0"))
    with anyio.fail_after(5), pytest.raises(OSError):
        await run_worker(str(tmp_path / "nobody.sock"), 0, workload, secret="s")


async def test_closing_a_running_channel_from_outside_raises_nothing(tmp_path: Any) -> None:
    """close() on a live channel (what a stopping coordinator does) fails nothing in its run()."""
    from ckpt_events.participants.server.workers.channel import FrameChannel

    async def echo(message: Message) -> Any:
        return None

    path = str(tmp_path / "pair.sock")
    async with await anyio.create_unix_listener(path) as listener:
        near_stream = await anyio.connect_unix(path)
        far_stream = await listener.accept()
    near = FrameChannel(near_stream, echo, name="near")
    far = FrameChannel(far_stream, echo, name="far")
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(near.run)
            tg.start_soon(far.run)
            assert await near.request(Close()) is None
            near.close()
            await anyio.sleep(0.1)  # the writer meets its closed queue (it raised here, once)
            with pytest.raises(WorkerChannelError, match="closed"):
                near.post(Close())
            tg.cancel_scope.cancel()
    assert near.closed and far.closed


async def _serving_coordinator(tg: anyio.abc.TaskGroup) -> WorkerCoordinator:
    coordinator = WorkerCoordinator(1)
    await tg.start(coordinator.serve)
    return coordinator


async def test_a_peer_silent_past_the_hello_deadline_is_dropped(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A connection that sends no hello is closed once the hello deadline passes, and logged once."""
    monkeypatch.setattr(worker_coordinator, "_HELLO_SECONDS", 0.3)
    async with anyio.create_task_group() as tg:
        coordinator = await _serving_coordinator(tg)
        start = time.monotonic()
        async with await anyio.connect_unix(coordinator.socket_path) as stream:
            with anyio.fail_after(5), pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
                await stream.receive()
        assert 0.25 <= time.monotonic() - start < 5
        tg.cancel_scope.cancel()
    assert [r.message for r in caplog.records if "no hello" in r.message] == [
        "worker socket: refused a connection (no hello within 0.3 s); 1 refused so far"
    ]


async def test_a_peer_gone_before_its_hello_is_no_protocol_error(caplog: pytest.LogCaptureFixture) -> None:
    """A connection that closes before its hello ends its handler at once: no wait, no error logged."""
    async with anyio.create_task_group() as tg:
        coordinator = await _serving_coordinator(tg)
        stream = await anyio.connect_unix(coordinator.socket_path)
        await stream.aclose()
        await anyio.sleep(0.2)
        tg.cancel_scope.cancel()
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


# -- who may take a worker slot, and what a stranger can cost ---------------------------------


async def test_a_hello_without_the_slots_current_secret_is_refused_and_closed() -> None:
    """No secret, another slot's secret, or a secret already used: refused, connection closed."""
    async with anyio.create_task_group() as tg:
        coordinator = WorkerCoordinator(2)
        await tg.start(coordinator.serve)
        old = coordinator.new_secret(1)
        first, kept = await _hello_as(coordinator.socket_path, 1, old)
        assert first.ok  # the slot's current secret joins
        other = coordinator.new_secret(0)
        for index, secret in ((0, None), (1, other), (0, old)):
            refused, gone = await _hello_as(coordinator.socket_path, index, secret)
            await gone.aclose()
            assert not refused.ok and refused.error is not None and "secret" in refused.error.detail
        assert coordinator.connected() == [1] and coordinator.refused == 3
        await _close_and_wait(coordinator, kept, 1)
        tg.cancel_scope.cancel()


async def _close_and_wait(coordinator: WorkerCoordinator, stream: SocketStream, index: int) -> None:
    """Close a peer's end and wait until the coordinator saw it go: a read cancelled (at the
    test's end) in the very iteration its socket turns readable trips anyio's Unix stream."""
    await stream.aclose()
    with anyio.fail_after(5):
        while index in coordinator.connected():
            await anyio.sleep(0.01)


async def _hello_as(path: str, index: int, secret: str | None) -> tuple[Reply, SocketStream]:
    stream = await anyio.connect_unix(path)
    await stream.send(encode_frame(Message(1, Hello(index, secret))))
    with anyio.fail_after(5):
        reply = await read_frame(stream)
    assert isinstance(reply, Reply), reply
    if not reply.ok:
        with anyio.fail_after(5), pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
            await stream.receive()  # closed after the refusal
    return reply, stream


async def test_strangers_are_bounded_in_number_in_frame_size_and_in_log_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Connections that never say hello are held at most one per worker slot plus MAX_STRANGERS
    at once; a big first frame is refused from its header; 300 bad first messages log at most a
    dozen lines."""
    caplog.set_level(logging.INFO, "ckpt_events.workers")
    async with anyio.create_task_group() as tg:
        coordinator = WorkerCoordinator(2)
        await tg.start(coordinator.serve)
        held = [
            await anyio.connect_unix(coordinator.socket_path)
            for _ in range(2 + worker_coordinator.MAX_STRANGERS)
        ]
        await anyio.sleep(0.2)
        extra = await anyio.connect_unix(coordinator.socket_path)
        with anyio.fail_after(5), pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
            await extra.receive()  # closed at once: the strangers' seats are taken
        await extra.aclose()
        for stream in held:
            await stream.aclose()
        await anyio.sleep(0.2)
        big = await anyio.connect_unix(coordinator.socket_path)
        await big.send(struct.pack(">I", 256 * 1024 * 1024))  # announces 256 MiB, sends none of it
        with anyio.fail_after(5), pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
            await big.receive()
        await big.aclose()
        for _ in range(300):
            async with await anyio.connect_unix(coordinator.socket_path) as stream:
                await stream.send(msgspec_frame({"t": "m", "id": 1, "body": {"kind": "status"}}))
                with anyio.fail_after(5):
                    reply = await read_frame(stream)
                assert isinstance(reply, Reply) and not reply.ok
        tg.cancel_scope.cancel()
    lines = [r for r in caplog.records if r.name == "ckpt_events.workers" and r.levelno >= logging.ERROR]
    assert coordinator.refused >= 301 and len(lines) <= 14, len(lines)


async def test_more_workers_than_stranger_seats_all_join_when_they_connect_at_once() -> None:
    """12 workers connected before any says hello (a start of 12, or 64 on 2 cores): every one
    joins. The strangers' seats were 8 in all, so the 9th worker on was closed unheard, died with
    a traceback and spent a restart (4 of 64 at start-up)."""
    workers = worker_coordinator.MAX_STRANGERS + 4
    async with anyio.create_task_group() as tg:
        coordinator = WorkerCoordinator(workers)
        await tg.start(coordinator.serve)
        streams = [await anyio.connect_unix(coordinator.socket_path) for _ in range(workers)]
        await anyio.sleep(0.2)  # every connection accepted, none has said hello yet
        for index, stream in enumerate(streams):
            await stream.send(encode_frame(Message(1, Hello(index, coordinator.new_secret(index)))))
        for stream in streams:
            with anyio.fail_after(5):
                reply = await read_frame(stream)
            assert isinstance(reply, Reply) and reply.ok, reply
        assert coordinator.connected() == list(range(workers)) and coordinator.refused == 0
        for index, stream in enumerate(streams):
            await _close_and_wait(coordinator, stream, index)
        tg.cancel_scope.cancel()


async def test_a_forged_work_reply_is_never_passed_to_the_client() -> None:
    """A worker (holding the slot's secret) that answers for another session, or with a body
    of the wrong shape: 503 to the client, the forged value nowhere in the answer."""
    app = _app()
    async with running(app) as client:
        await _both_serving(client)
        await _drop(app, 1)
        peer = await _join(app.state.coordinator, 1)

        async def forge() -> None:
            with anyio.fail_after(5):
                message = await read_frame(peer)
            assert isinstance(message, Message) and message.kind == "start", message
            forged = {"capture_key": "FORGED<script>", "boundary": 0}
            await peer.send(encode_frame(Reply(message.id, True, encode_body(forged))))

        async with anyio.create_task_group() as tg:
            tg.start_soon(forge)
            start = await client.post("/work/start", json={"rollout_id": "f", "steps": 2})
        assert error_code(start) == (503, "checkpoint_coordinator_unavailable")
        assert "<script>" not in start.text and "another session" in start.text, start.text
        assert "f" not in app.state.workload.owners
        await _close_and_wait(app.state.coordinator, peer, 1)


async def _spent_budget(
    program: str, *, max_restarts: int, seconds: float, settle: float = 0.0
) -> tuple[Any, list[str]]:
    """A one-worker supervisor whose worker runs ``program`` (real processes), run until its
    restart budget (``max_restarts`` within 60 s) is spent, at most ``seconds``, then ``settle``
    seconds more; the supervisor, and what its ``on_spent`` was given."""
    import sys

    from ckpt_events.participants.server.workers.supervisor import WorkerSupervisor

    spent: list[str] = []
    supervisor = WorkerSupervisor(
        1,
        lambda index: [sys.executable, "-c", program],
        max_restarts=max_restarts,
        window=60.0,
        secret_for=lambda index: "s",
        on_spent=spent.append,
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(supervisor.run)
        with anyio.fail_after(seconds):
            while not spent:
                await anyio.sleep(0.05)
        if settle:
            await anyio.sleep(settle)
        tg.cancel_scope.cancel()
    return supervisor, spent


async def test_a_worker_that_keeps_dying_spends_its_budget_once_and_stops_the_server(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Real processes that exit at once: restarted max_restarts times within the window, then
    one error line and ``on_spent`` (the server stops), never a prepare "not ready" for ever."""
    caplog.set_level(logging.WARNING, "ckpt_events.workers")
    # Half a second past the spending: nothing more is started after the budget is spent.
    supervisor, spent = await _spent_budget("raise SystemExit(3)", max_restarts=3, seconds=30, settle=0.5)
    assert supervisor.restarts == 3 and supervisor.processes == {}
    assert spent == [
        "worker 0 exited 4 times within 60 s (last exit status 3: its own error is in the lines "
        "above): restart budget of 3 spent; stopping the server"
    ]
    assert [r.message for r in caplog.records if r.levelno >= logging.ERROR] == spent


async def test_a_worker_killed_by_a_signal_spends_its_budget_naming_the_signal() -> None:
    """A worker that something keeps killing (the OOM killer) left no error of its own: the
    spent budget names the signal, where it said "last exit status -9" and serve sent the
    operator to the worker's error "in the lines above", which were not there."""
    killed = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    _, spent = await _spent_budget(killed, max_restarts=1, seconds=20)
    assert spent == [
        "worker 0 exited 2 times within 60 s (last killed by SIGKILL, not by an error of its own: "
        "something outside it kills it (the OOM killer? see dmesg)): restart budget of 1 spent; "
        "stopping the server"
    ]


async def test_restarts_spread_over_time_are_never_spent() -> None:
    """The budget is per window: exits further apart than the window restart for ever."""
    import sys

    from ckpt_events.participants.server.workers.supervisor import WorkerSupervisor

    spent: list[str] = []
    supervisor = WorkerSupervisor(
        1,
        lambda index: [sys.executable, "-c", "import time; time.sleep(0.3)"],
        max_restarts=2,
        window=0.2,
        on_spent=spent.append,
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(supervisor.run)
        with anyio.fail_after(30):
            while supervisor.restarts < 4:
                await anyio.sleep(0.05)
        tg.cancel_scope.cancel()
    assert spent == []


async def test_a_spent_restart_budget_is_a_blocker_of_every_later_prepare() -> None:
    """In an app that is not its own process nothing is signalled: the spent budget shows as a
    blocker naming it, so no prepare can ever be ready again."""
    app = _app()
    async with running(app) as client:
        await _both_serving(client)
        app.state.workload.spent = "worker 1 exited 6 times within 60 s"
        prepared = await control(client, "prepare", seconds=0.5)
        report = prepared.json()["report"]
        assert prepared.json()["phase"] == "preparing" and not report["ready"]
        assert "environment-worker-restarts-spent" in report["blockers"]
        assert (await control(client, "resume")).status_code == 200


async def test_status_names_the_workers_only_where_there_are_some() -> None:
    """A single-process server's status has no ``workers`` key (a client that predates it and
    refuses unknown fields still reads it); a multi-worker server's lists each worker."""
    from ckpt_events.participants import create_app

    single = create_app("environment", instance="env-0", token=TOKEN, checkpoint_root=tempfile.gettempdir())
    async with running(single) as client:
        assert "workers" not in await status(client)
    async with running(_app()) as client:
        await _both_serving(client)
        workers = (await status(client))["workers"]
        assert [(w["index"], w["connected"], w["url"]) for w in workers] == [(0, True, None), (1, True, None)]
