"""The simulated inference worker: deterministic tokens, resumable streams, the cut route."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import anyio
import httpx
import pytest
from fastapi import FastAPI

from ckpt_events import InvalidValueError
from ckpt_events.participants.server.inference import create_inference_app, token_at
from ckpt_events.participants.workloads.generation_cut import CUT_PATH, ActivePrefix, inventory_digest
from tests.participants.helpers import AUTH, TOKEN, error_code


def _client(app: FastAPI) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app)
    return httpx.AsyncClient(transport=transport, base_url="http://test", headers=AUTH)


def _generate(ticket: int = 1, prompt: str = "p", max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    return {
        "ticket_id": ticket,
        "rollout_id": "r1",
        "model_call_id": f"call-{ticket}",
        "prompt": prompt,
        "max_tokens": max_tokens,
        **extra,
    }


def _lines(reply: httpx.Response) -> list[dict[str, Any]]:
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"] == "application/x-ndjson"
    return [json.loads(line) for line in reply.text.splitlines()]


def _inventory(
    prefixes: list[ActivePrefix], checkpoint_id: str = "c1", digest: str | None = None
) -> dict[str, Any]:
    return {
        "checkpoint_id": checkpoint_id,
        "server_name": "inference",
        "active_prefixes": [
            {
                "ticket_id": p.ticket_id,
                "rollout_id": p.rollout_id,
                "attempt": p.attempt,
                "model_call_id": p.model_call_id,
                "admitted_at": p.admitted_at,
            }
            for p in prefixes
        ],
        "inventory_digest": digest or inventory_digest(checkpoint_id, "inference", prefixes),
    }


def _prefix(ticket: int) -> ActivePrefix:
    return ActivePrefix(
        ticket_id=ticket, rollout_id="r1", attempt=0, model_call_id=f"call-{ticket}", admitted_at=1.0
    )


def _digest(tokens: list[str]) -> str:
    return hashlib.sha256(" ".join(tokens).encode()).hexdigest()


def test_tokens_are_a_pure_function_of_prompt_and_index() -> None:
    """token_at is the first 8 hex digits of SHA-256(prompt NUL index): stable and distinct."""
    assert token_at("p", 3) == hashlib.sha256(b"p\x003").hexdigest()[:8]
    assert token_at("p", 3) == token_at("p", 3)
    assert len({token_at("p", 0), token_at("p", 1), token_at("q", 0)}) == 3


def test_the_worker_needs_a_token() -> None:
    """An empty token is refused when the app is built."""
    with pytest.raises(InvalidValueError, match="the inference worker needs a bearer token"):
        create_inference_app(token="")


async def test_both_routes_refuse_a_missing_or_wrong_token() -> None:
    """/generate and the cut route answer 401 unauthorized without the worker's token."""
    async with _client(create_inference_app(token=TOKEN, token_seconds=0)) as client:
        for path, payload in (("/generate", _generate()), (CUT_PATH, _inventory([]))):
            reply = await client.post(path, json=payload, headers={"authorization": "Bearer other"})
            assert error_code(reply) == (401, "unauthorized")


async def test_a_generation_streams_its_tokens_then_a_done_line() -> None:
    """max_tokens token lines (token_at of the prompt), then done with the count and no resumed prefix."""
    async with _client(create_inference_app(token=TOKEN, token_seconds=0)) as client:
        lines = _lines(await client.post("/generate", json=_generate(prompt="hello", max_tokens=3)))
    assert lines == [
        {"token": token_at("hello", 0)},
        {"token": token_at("hello", 1)},
        {"token": token_at("hello", 2)},
        {"done": True, "tokens": 3, "resumed_prefix": 0},
    ]


async def test_a_malformed_generate_body_is_422() -> None:
    """A request outside the schema (max_tokens 0) is 422 invalid_request."""
    async with _client(create_inference_app(token=TOKEN, token_seconds=0)) as client:
        reply = await client.post("/generate", json=_generate(max_tokens=0))
    assert error_code(reply) == (422, "invalid_request")


async def test_a_continuation_from_a_staged_prefix_gives_the_uninterrupted_output() -> None:
    """A matching staged prefix is sent at once and counted as resumed; the output equals a fresh call."""
    app = create_inference_app(token=TOKEN, token_seconds=0)
    prefix = [token_at("p", i) for i in range(2)]
    app.state.staged["c1/call-1"] = prefix
    resume = {"staging_key": "c1/call-1", "prefix_token_count": 2, "prefix_digest": _digest(prefix)}
    async with _client(app) as client:
        fresh = _lines(await client.post("/generate", json=_generate(max_tokens=5)))
        resumed = _lines(await client.post("/generate", json=_generate(max_tokens=5, resume_from=resume)))
        short = _lines(await client.post("/generate", json=_generate(max_tokens=1, resume_from=resume)))
    assert resumed[:-1] == fresh[:-1]
    assert resumed[-1] == {"done": True, "tokens": 5, "resumed_prefix": 2}
    assert short == [{"token": prefix[0]}, {"done": True, "tokens": 1, "resumed_prefix": 1}]


async def test_a_prefix_that_does_not_match_its_digest_or_is_unknown_starts_afresh() -> None:
    """A staged prefix whose digest differs, or a key never staged, is ignored: resumed_prefix 0."""
    app = create_inference_app(token=TOKEN, token_seconds=0)
    app.state.staged["c1/call-1"] = ["forged", "tokens"]
    async with _client(app) as client:
        for key, digest in (("c1/call-1", _digest([token_at("p", 0)])), ("nowhere", "0" * 64)):
            resume = {"staging_key": key, "prefix_token_count": 2, "prefix_digest": digest}
            lines = _lines(await client.post("/generate", json=_generate(max_tokens=2, resume_from=resume)))
            assert lines[0] == {"token": token_at("p", 0)}
            assert lines[-1] == {"done": True, "tokens": 2, "resumed_prefix": 0}


async def test_a_cut_of_a_generation_no_longer_active_is_a_durable_failure() -> None:
    """A finished call (it left the active set) and a ticket never seen get durable_failure,
    with no evidence, and nothing is staged."""
    app = create_inference_app(token=TOKEN, token_seconds=0)
    async with _client(app) as client:
        _lines(await client.post("/generate", json=_generate(ticket=1)))
        reply = await client.post(CUT_PATH, json=_inventory([_prefix(1), _prefix(7)]))
    receipt = reply.json()
    assert reply.status_code == 200
    assert [
        (a["ticket_id"], a["disposition"], a["staging_keys"], a["prefix_digest"]) for a in receipt["prefixes"]
    ] == [
        (1, "durable_failure", [], None),
        (7, "durable_failure", [], None),
    ]
    assert receipt["checkpoint_id"] == "c1" and receipt["backend_snapshot_id"] == f"snap-{receipt['cut_id']}"
    assert [p["ticket_id"] for p in receipt["inventory"]] == [1, 7]
    assert app.state.staged == {}


async def test_a_cut_mid_generation_stages_its_prefix_for_a_continuation() -> None:
    """A cut while a call streams stages the tokens so far under checkpoint/call; a continuation
    from them reproduces the uninterrupted output."""
    app = create_inference_app(token=TOKEN, token_seconds=0.005)
    async with _client(app) as client:
        results: dict[str, httpx.Response] = {}

        async def generate() -> None:
            results["stream"] = await client.post("/generate", json=_generate(max_tokens=60))

        async with anyio.create_task_group() as tg:
            tg.start_soon(generate)
            await anyio.sleep(0.05)
            results["cut"] = await client.post(CUT_PATH, json=_inventory([_prefix(1)]))
        (ack,) = results["cut"].json()["prefixes"]
        staged = app.state.staged["c1/call-1"]
        assert 1 <= len(staged) < 60
        assert ack["disposition"] == "durable_prefix" and ack["cut_kind"] == "active_prefix"
        assert ack["staging_keys"] == ["c1/call-1"] and ack["prefix_token_count"] == len(staged)
        assert ack["prefix_digest"] == _digest(staged)
        assert ack["effective_output_limit"] == 60 - len(staged)
        assert staged == [token_at("p", i) for i in range(len(staged))]

        resume = {
            "staging_key": "c1/call-1",
            "prefix_token_count": len(staged),
            "prefix_digest": _digest(staged),
        }
        fast = create_inference_app(token=TOKEN, token_seconds=0)
        fast.state.staged.update(app.state.staged)
        async with _client(fast) as other:
            resumed = _lines(await other.post("/generate", json=_generate(max_tokens=60, resume_from=resume)))
    assert resumed[:-1] == _lines(results["stream"])[:-1]
    assert resumed[-1]["resumed_prefix"] == len(staged)


async def test_a_cut_with_a_wrong_digest_is_409_checkpoint_error() -> None:
    """An inventory whose digest does not match its contents is refused."""
    async with _client(create_inference_app(token=TOKEN, token_seconds=0)) as client:
        reply = await client.post(CUT_PATH, json=_inventory([_prefix(1)], digest="0" * 64))
    assert error_code(reply) == (409, "checkpoint_error")
    assert reply.json()["error"]["detail"] == "inventory digest does not match"


async def test_failing_cuts_answer_503() -> None:
    """fail_cuts=True: every cut round is 503 with the protocol's error body, before its body is read."""
    async with _client(create_inference_app(token=TOKEN, token_seconds=0, fail_cuts=True)) as client:
        reply = await client.post(CUT_PATH, content=b"not even json")
    assert error_code(reply) == (503, "cut_unavailable")
    assert reply.json() == {"error": {"code": "cut_unavailable", "detail": "cut unavailable"}}
    assert reply.headers["content-type"] == "application/json"


async def _cut_while_streaming(app: FastAPI, calls: list[dict[str, Any]], ticket_ids: list[int]) -> Any:
    """Start ``calls`` one after another, cut ``ticket_ids`` once the first call has ended
    (the others still streaming); returns the cut's receipt."""
    async with _client(app) as client:
        done: list[httpx.Response] = []
        async with anyio.create_task_group() as tg:
            for call in calls:
                tg.start_soon(lambda call=call: _post_into(client, call, done))
                await anyio.sleep(0.01)
            with anyio.fail_after(5):
                while not done:
                    await anyio.sleep(0.005)
            cut = await client.post(CUT_PATH, json=_inventory([_prefix(t) for t in ticket_ids]))
    assert cut.status_code == 200, cut.text
    return cut.json()


async def _post_into(client: httpx.AsyncClient, call: dict[str, Any], done: list[httpx.Response]) -> None:
    done.append(await client.post("/generate", json=call))


async def test_a_call_ending_leaves_a_later_call_with_the_same_ticket_active() -> None:
    """Two calls with one ticket: when the first ends, the second (still streaming) stays active
    and is cut durable_prefix; once it ends too, the ticket is no longer active."""
    app = create_inference_app(token=TOKEN, token_seconds=0.01)
    receipt = await _cut_while_streaming(app, [_generate(max_tokens=3), _generate(max_tokens=40)], [1])
    assert [a["disposition"] for a in receipt["prefixes"]] == ["durable_prefix"]
    async with _client(app) as client:
        after = await client.post(CUT_PATH, json=_inventory([_prefix(1)], checkpoint_id="c2"))
    assert [a["disposition"] for a in after.json()["prefixes"]] == ["durable_failure"]


async def test_staged_prefixes_are_bounded_the_oldest_dropped_first() -> None:
    """max_staged=2: a cut staging three prefixes keeps the last two; a later cut drops the oldest;
    max_staged under 1 is refused."""
    app = create_inference_app(token=TOKEN, token_seconds=0.01, max_staged=2)
    calls = [_generate(ticket=1, max_tokens=3), *(_generate(ticket=t, max_tokens=40) for t in (2, 3, 4))]
    await _cut_while_streaming(app, calls, [2, 3, 4])
    assert list(app.state.staged) == ["c1/call-3", "c1/call-4"]
    await _cut_while_streaming(
        app, [_generate(ticket=1, max_tokens=3), _generate(ticket=5, max_tokens=40)], [5]
    )
    assert list(app.state.staged) == ["c1/call-4", "c1/call-5"]
    with pytest.raises(InvalidValueError, match="max_staged must be an int >= 1, not 0"):
        create_inference_app(token=TOKEN, max_staged=0)


async def test_bodies_over_the_bound_are_413_before_anything_is_read() -> None:
    """The worker bounds request bodies as the participants do: a prompt or an inventory over
    ``max_body_bytes`` (default 8 MiB) is 413 ``payload_too_large``, nothing generated or staged."""
    app = create_inference_app(token=TOKEN, token_seconds=0, max_body_bytes=1024)
    async with _client(app) as client:
        reply = await client.post("/generate", json=_generate(prompt="x" * 2000, max_tokens=1))
        assert error_code(reply) == (413, "payload_too_large")
        inventory = _inventory([_prefix(1)] * 40)
        assert error_code(await client.post(CUT_PATH, json=inventory)) == (413, "payload_too_large")
        assert app.state.staged == {}
        assert len(_lines(await client.post("/generate", json=_generate(max_tokens=1)))) == 2
    default = create_inference_app(token=TOKEN, token_seconds=0)
    async with _client(default) as client:
        big = _generate(prompt="x" * (8 * 1024 * 1024), max_tokens=1)
        assert error_code(await client.post("/generate", json=big)) == (413, "payload_too_large")


def test_the_body_bound_is_checked() -> None:
    """max_body_bytes is a positive int, else a precise error."""
    with pytest.raises(InvalidValueError, match="max_body_bytes must be a positive int, not 0"):
        create_inference_app(token=TOKEN, max_body_bytes=0)
