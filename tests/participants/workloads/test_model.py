"""The model participant: generation calls, held responses and the generation-cut round."""

from __future__ import annotations

import contextlib
import http.server
import time
import tracemalloc

import anyio
import httpx
import pytest
from fastapi import FastAPI, Response

from ckpt_events import GenerationCut, OperationFinished, StepFinished
from ckpt_events.participants import create_app, create_inference_app
from ckpt_events.participants.replies import MAX_REPLY_BYTES
from ckpt_events.participants.server.inference import token_at
from ckpt_events.testing import capture_events
from tests.http_servers import serving
from tests.participants.helpers import (
    ROOT,
    TOKEN,
    control,
    error_code,
    post_json,
    run_episode,
    running,
    status,
    wait_until,
)

INFERENCE_TOKEN = "inference-token"
MAX_TOKENS = 12


def make(inference, bus=None, **options):
    return create_app(
        "model",
        instance="model-0",
        token=TOKEN,
        bus=bus,
        checkpoint_root=ROOT,
        inference_url="http://inference",
        inference_token=INFERENCE_TOKEN,
        inference_transport=httpx.ASGITransport(app=inference),
        max_tokens=MAX_TOKENS,
        **options,
    )


def worker(**options):
    return create_inference_app(token=INFERENCE_TOKEN, **options)


async def test_generation_calls_stream_from_the_worker():
    """Each advance is one generation call; its row records the tokens the worker produced."""
    async with running(make(worker(token_seconds=0.0))) as client:
        await client.post("/work/start", json={"rollout_id": "r1", "steps": 2})
        assert await run_episode(client, "r1") == 2
        rows = (await client.get("/work/r1")).json()["state"]["rows"]
        assert [(r["call"], r["tokens"]) for r in rows] == [(0, MAX_TOKENS), (1, MAX_TOKENS)]


async def test_the_worker_refuses_a_wrong_token():
    """The inference worker's routes need its bearer token."""
    async with running(worker()) as client:
        reply = await client.post(
            "/generate", json={"ticket_id": 1, "rollout_id": "r", "model_call_id": "m", "prompt": "p"}
        )
        assert error_code(reply) == (401, "unauthorized")


async def _checkpoint_mid_call(tmp_path, inference, events_bus):
    """Start a slow call, prepare while it is in flight, commit; returns the model app and replies."""
    app = make(inference, events_bus)
    async with running(app) as client:
        await client.post("/work/start", json={"rollout_id": "r1", "steps": 2})
        await client.post("/work/start", json={"rollout_id": "idle", "steps": 2})
        results = []

        async def advance() -> None:
            results.append(await post_json(client, "/work/advance", {"rollout_id": "r1"}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(advance)
            await wait_until(lambda: app.state.workload._inflight)
            # Let a few tokens through so the staged prefix is not empty.
            await anyio.sleep(0.05)
            prepared = (await control(client, "prepare")).json()
            assert prepared["phase"] == "prepared"
            commit = (await control(client, "commit", checkpoint_dir=str(tmp_path))).json()
            # The call finishes upstream but is held: the boundary has not moved.
            await wait_until(lambda: app.state.workload.episodes["r1"].status == "held")
            assert (await client.get("/work/r1")).json()["boundary"] == 0
            assert (await status(client))["report"]["counts"]["held"] in (0, 1)
            await control(client, "resume")
        assert results[0].json() == {"boundary": 1, "done": False}
    return prepared, commit


async def test_cut_round_stages_prefixes_and_restore_continues_from_them(tmp_path):
    """A call in flight at prepare is cut durable_prefix; after restore it continues from the prefix."""
    inference = worker(token_seconds=0.02)
    async with capture_events() as (bus, events):
        prepared, commit = await _checkpoint_mid_call(tmp_path, inference, bus)
        assert prepared["report"]["counts"] == {
            "inflight": 1,
            "held": 0,
            "cut": 1,
            "cut_failed": 0,
            "cut_skipped": 0,
        }
        assert commit["staging_keys"] == ["c1/r1-call0"]
        async with running(make(inference, bus)) as fresh:
            scope = [{"rollout_id": "r1"}, {"rollout_id": "idle"}]
            restored = await control(fresh, "restore", "rs", checkpoint_dir=str(tmp_path), episode_ids=scope)
            assert restored.json()["restored"] == ["idle-a1", "r1-a1"]
            await control(fresh, "resume", "rs")
            state = (await fresh.get("/work/r1-a1")).json()["state"]
            assert state["continuation"]["staging_key"] == "c1/r1-call0"
            prefix = state["continuation"]["prefix_token_count"]
            assert 0 < prefix < MAX_TOKENS
            assert await run_episode(fresh, "r1", 1) == 2
            state = (await fresh.get("/work/r1-a1")).json()["state"]
            assert state["resumed_prefix_tokens"] == prefix and state["continuation"] is None
            assert error_code(await fresh.post("/work/advance", json={"rollout_id": "r1"})) == (
                409,
                "stale_attempt",
            )
    staged = inference.state.staged["c1/r1-call0"]
    assert staged == [token_at("r1:turn0", i) for i in range(len(staged))]
    cuts = [e for e in events if isinstance(e, GenerationCut)]
    assert [(e.disposition.value, e.calls, e.checkpoint_id) for e in cuts] == [("durable_prefix", 1, "c1")]
    step = next(e for e in events if isinstance(e, StepFinished) and e.step == "generation_cut")
    assert (step.calls, step.cut_durable_prefix, step.cut_durable_failure) == (1, 1, 0)
    prepare = next(e for e in events if isinstance(e, OperationFinished) and e.operation == "prepare")
    assert step.parent_span_id == prepare.span_id


async def test_a_failing_worker_makes_every_call_durable_failure(tmp_path):
    """A cut round that fails marks every call durable_failure and never blocks the checkpoint."""
    inference = worker(token_seconds=0.02, fail_cuts=True)
    async with capture_events() as (bus, events):
        prepared, commit = await _checkpoint_mid_call(tmp_path, inference, bus)
        assert prepared["report"]["counts"]["cut_failed"] == 1 and prepared["report"]["counts"]["cut"] == 0
        assert commit["staging_keys"] == []
        async with running(make(inference, bus)) as fresh:
            await control(
                fresh, "restore", "rs", checkpoint_dir=str(tmp_path), episode_ids=[{"rollout_id": "r1"}]
            )
            await control(fresh, "resume", "rs")
            assert (await fresh.get("/work/r1-a1")).json()["state"]["continuation"] is None
            assert await run_episode(fresh, "r1", 1) == 2
    cuts = [e for e in events if isinstance(e, GenerationCut)]
    assert [(e.disposition.value, e.calls) for e in cuts] == [("durable_failure", 1)]
    step = next(e for e in events if isinstance(e, StepFinished) and e.step == "generation_cut")
    assert (step.calls, step.cut_durable_prefix, step.cut_durable_failure) == (1, 0, 1)


async def test_a_cut_round_past_its_timeout_fails_the_cut_not_the_checkpoint():
    """A worker slower than half the time left: the call is durable_failure and prepare succeeds."""
    inference = worker(token_seconds=0.02, cut_seconds=2.0)
    async with capture_events() as (bus, events):
        app = make(inference, bus)
        async with running(app) as client:
            await client.post("/work/start", json={"rollout_id": "r1", "steps": 1})
            async with anyio.create_task_group() as tg:
                tg.start_soon(post_json, client, "/work/advance", {"rollout_id": "r1"})
                await wait_until(lambda: app.state.workload._inflight)
                with anyio.fail_after(1.5):
                    prepared = (await control(client, "prepare", seconds=0.4)).json()
                assert prepared["phase"] == "prepared" and prepared["report"]["counts"]["cut_failed"] == 1
                await control(client, "resume")
    assert [(e.disposition.value, e.calls) for e in events if isinstance(e, GenerationCut)] == [
        ("durable_failure", 1)
    ]


async def test_no_calls_in_flight_means_an_empty_cut_step(tmp_path):
    """With nothing in flight the generation_cut step still runs, with zero calls and no events."""
    async with capture_events() as (bus, events):
        async with running(make(worker(), bus)) as client:
            assert (await control(client, "prepare")).json()["phase"] == "prepared"
    step = next(e for e in events if isinstance(e, StepFinished) and e.step == "generation_cut")
    assert (step.calls, step.cut_durable_prefix, step.cut_durable_failure) == (0, 0, 0)
    assert not [e for e in events if isinstance(e, GenerationCut)]


def _broken_worker(line: bytes) -> FastAPI:
    """An inference worker whose stream carries ``line``."""
    app = FastAPI()

    @app.post("/generate")
    async def generate() -> Response:
        return Response(content=b'{"token": "a"}\n' + line + b"\n", media_type="application/x-ndjson")

    return app


@pytest.mark.parametrize(
    "line",
    [b"not json", b'["a list"]', b'{"token": 7}', b'{"done": true, "resumed_prefix": "x"}',
     b'{"done": true, "resumed_prefix": -1}', b'{"token": "trunc'],
)  # fmt: skip
async def test_malformed_worker_lines_are_502_upstream_error(line):
    """Every malformed stream line from the inference worker is 502 upstream_error, never a 500."""
    async with running(make(_broken_worker(line))) as client:
        await client.post("/work/start", json={"rollout_id": "r1", "steps": 2})
        reply = await client.post("/work/advance", json={"rollout_id": "r1"})
        assert error_code(reply) == (502, "upstream_error"), reply.text


class _FloodingWorker(http.server.BaseHTTPRequestHandler):
    """An inference worker on a real socket: ``/generate`` streams ``GENERATE`` (a few tokens, a
    tenth of a second apart), ``/cut`` a 40 MiB receipt of spaces (HTTP/1.0: to the close)."""

    GENERATE: tuple[bytes, ...] = (b'{"token": "a"}\n',) * 10

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.end_headers()
        pieces = self.GENERATE if self.path == "/generate" else (b" " * (1 << 20),) * 40
        with contextlib.suppress(OSError):  # the client stops reading at its bound
            for piece in pieces:
                self.wfile.write(piece)
                if self.path == "/generate" and len(pieces) < 20:
                    time.sleep(0.1)


def _model_of(server: http.server.ThreadingHTTPServer, bus=None):
    return create_app(
        "model",
        instance="model-0",
        token=TOKEN,
        bus=bus,
        checkpoint_root=ROOT,
        inference_url=f"http://127.0.0.1:{server.server_address[1]}",
        max_tokens=MAX_TOKENS,
    )


async def test_a_worker_streaming_without_end_is_cut_at_the_bound_and_named():
    """A worker whose stream never ends a line: its lines were read as they came, without bound
    (972 MB in 6 s). The call fails at ``MAX_REPLY_BYTES``: 502, naming the worker and the bound."""

    class Endless(_FloodingWorker):
        GENERATE = (b"x" * (1 << 20),) * 40

    with serving(Endless) as server:
        async with running(_model_of(server)) as client:
            await client.post("/work/start", json={"rollout_id": "r1", "steps": 1})
            reply = await client.post("/work/advance", json={"rollout_id": "r1"})
    url = f"http://127.0.0.1:{server.server_address[1]}"
    assert error_code(reply) == (502, "upstream_error")
    assert reply.json()["error"]["detail"].startswith(
        f"inference worker {url}: a reply past the {MAX_REPLY_BYTES:,}-byte bound (stopped reading at "
    )


async def test_a_cut_receipt_past_the_bound_is_not_read_whole():
    """A worker answering the cut with 40 MiB: read whole (a 300 MB receipt took 605 MB), it is
    read to ``MAX_REPLY_BYTES`` and the call is durable_failure, the prepare unharmed."""
    with serving(_FloodingWorker) as server:
        app = _model_of(server)
        async with running(app) as client:
            await client.post("/work/start", json={"rollout_id": "r1", "steps": 1})
            async with anyio.create_task_group() as tg:
                tg.start_soon(post_json, client, "/work/advance", {"rollout_id": "r1"})
                await wait_until(lambda: app.state.workload._inflight)
                tracemalloc.start()
                try:
                    prepared = (await control(client, "prepare", seconds=10)).json()
                    peak = tracemalloc.get_traced_memory()[1]
                finally:
                    tracemalloc.stop()
                await control(client, "resume")
    assert prepared["phase"] == "prepared" and prepared["report"]["counts"]["cut_failed"] == 1
    assert peak < MAX_REPLY_BYTES + (8 << 20), f"{peak:,} bytes at the peak"


async def test_a_worker_cut_short_is_no_whole_reply_and_a_closed_port_unreachable():
    """A worker that closes its stream mid-reply was said "unreachable" (it answered); that is
    now "no whole reply", and only a connection never made is "unreachable"."""

    class CutShort(_FloodingWorker):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            self.send_response(200)
            self.send_header("content-length", "1000")
            self.end_headers()
            self.wfile.write(b'{"token": "a"}\n')
            self.close_connection = True

    with serving(CutShort) as server:
        async with running(_model_of(server)) as client:
            await client.post("/work/start", json={"rollout_id": "r1", "steps": 1})
            cut_short = await client.post("/work/advance", json={"rollout_id": "r1"})
    # The same port, its server gone: nothing listens there now.
    async with running(_model_of(server)) as client:
        await client.post("/work/start", json={"rollout_id": "r1", "steps": 1})
        closed = await client.post("/work/advance", json={"rollout_id": "r1"})
    url = f"http://127.0.0.1:{server.server_address[1]}"
    assert error_code(cut_short) == error_code(closed) == (502, "upstream_error")
    assert cut_short.json()["error"]["detail"].startswith(f"inference worker {url} no whole reply: ")
    assert closed.json()["error"]["detail"].startswith(f"inference worker {url} unreachable: ")
