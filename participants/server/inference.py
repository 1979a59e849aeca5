"""A simulated inference worker: token streams and the generation-cut route, over HTTP.

Tokens are a pure function of (prompt, index), so a continuation from a staged prefix
produces the same output as an uninterrupted call. Staged prefixes live in memory, at most
``max_staged`` of them (the oldest staged is dropped first: a call resuming from a dropped
prefix regenerates it, with the same output).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import AsyncIterator
from typing import Final

import anyio
from fastapi import Depends, FastAPI, Request, Response
from fastapi.responses import StreamingResponse

from ckpt_events import InvalidValueError
from ckpt_events.participants.errors import ProtocolRefusal, check_int, shown
from ckpt_events.participants.protocol import ErrorBody, ErrorDetail, decode, encode
from ckpt_events.participants.server.limits import DEFAULT_MAX_BODY_BYTES, BodyLimit, StopCutAnswered
from ckpt_events.participants.server.routes import bearer_auth, install_error_handlers
from ckpt_events.participants.workloads.base import finite_sleep
from ckpt_events.participants.workloads.generation_cut import (
    CUT_PATH,
    CutAck,
    CutInventory,
    CutReceipt,
    GenerateRequest,
    inventory_digest,
)
from ckpt_events.vocab import Disposition, ErrorCode

__all__ = ["DEFAULT_MAX_STAGED", "create_inference_app", "token_at"]

#: How many staged prefixes a worker keeps by default (each at most 4,096 tokens).
DEFAULT_MAX_STAGED: Final = 1024


def token_at(prompt: str, index: int) -> str:
    """The ``index``-th token the worker generates for ``prompt``."""
    return hashlib.sha256(f"{prompt}\x00{index}".encode()).hexdigest()[:8]


def _prefix_digest(tokens: list[str]) -> str:
    return hashlib.sha256(" ".join(tokens).encode()).hexdigest()


class _Generation:
    __slots__ = ("max_tokens", "tokens")

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.tokens: list[str] = []


def create_inference_app(
    *,
    token: str,
    token_seconds: float = 0.005,
    fail_cuts: bool = False,
    cut_seconds: float = 0.0,
    server_name: str = "inference",
    max_staged: int = DEFAULT_MAX_STAGED,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> FastAPI:
    """The worker: ``POST /generate`` (NDJSON token stream) and ``POST /ng-control/v1/generation-cut``.

    ``fail_cuts=True`` makes every cut round fail with 503 (the protocol's error body),
    ``cut_seconds`` delays its answer (both exercise ``durable_failure``). At most
    ``max_staged`` prefixes are kept staged, the oldest dropped first. Request bodies over
    ``max_body_bytes`` (8 MiB by default, as a participant's) are 413 ``payload_too_large``.
    """
    if not token:
        raise InvalidValueError("the inference worker needs a bearer token")
    check_int(max_staged, f"max_staged must be an int >= 1, not {shown(max_staged)}", minimum=1)
    body_bound = f"max_body_bytes must be a positive int, not {shown(max_body_bytes)}"
    check_int(max_body_bytes, body_bound, minimum=1)
    delay = finite_sleep(token_seconds)
    cut_delay = finite_sleep(cut_seconds)
    active: dict[int, _Generation] = {}
    staged: dict[str, list[str]] = {}
    app = FastAPI(title=f"inference worker {server_name}")
    auth = [Depends(bearer_auth(token))]
    # The worker is not a checkpoint participant: it counts no refusals.
    install_error_handlers(app, None)
    app.state.staged = staged
    # A prompt or an inventory is read whole: unbounded, one request could take the memory.
    app.add_middleware(BodyLimit, max_body_bytes=max_body_bytes)
    # A cut round its server's stop cancels is answered 503, as a participant's request is.
    app.add_middleware(StopCutAnswered)

    @app.post("/generate", dependencies=auth)
    async def generate(request: Request) -> Response:
        req = decode(await request.body(), GenerateRequest)
        generation = _Generation(req.max_tokens)
        resumed = 0
        if req.resume_from is not None:
            prefix = staged.get(req.resume_from.staging_key)
            if prefix is not None and _prefix_digest(prefix) == req.resume_from.prefix_digest:
                generation.tokens.extend(prefix[: req.max_tokens])
                resumed = len(generation.tokens)
        active[req.ticket_id] = generation

        stream = _token_stream(req, generation, resumed, delay, active)
        return StreamingResponse(stream, media_type="application/x-ndjson")

    @app.post(CUT_PATH, dependencies=auth)
    async def generation_cut(request: Request) -> Response:
        await anyio.sleep(cut_delay)
        if fail_cuts:
            body = ErrorBody(error=ErrorDetail(code="cut_unavailable", detail="cut unavailable"))
            return Response(content=encode(body), status_code=503, media_type="application/json")
        inventory = decode(await request.body(), CutInventory)
        expected = inventory_digest(inventory.checkpoint_id, inventory.server_name, inventory.active_prefixes)
        if expected != inventory.inventory_digest:
            raise ProtocolRefusal(ErrorCode.CHECKPOINT_ERROR, "inventory digest does not match")
        receipt = _cut_receipt(inventory, active, staged, max_staged)
        return Response(content=encode(receipt), media_type="application/json")

    return app


async def _token_stream(
    req: GenerateRequest, generation: _Generation, resumed: int, delay: float, active: dict[int, _Generation]
) -> AsyncIterator[bytes]:
    """The NDJSON stream of one generation: the resumed prefix at once, then a token per
    ``delay``, then the done line; the generation leaves ``active`` when the stream ends."""
    try:
        for token_text in generation.tokens:
            yield encode({"token": token_text}) + b"\n"
        for index in range(len(generation.tokens), req.max_tokens):
            await anyio.sleep(delay)
            token_text = token_at(req.prompt, index)
            generation.tokens.append(token_text)
            yield encode({"token": token_text}) + b"\n"
        yield encode({"done": True, "tokens": len(generation.tokens), "resumed_prefix": resumed}) + b"\n"
    finally:
        # A later call with the same ticket may have taken the slot: leave its entry alone.
        if active.get(req.ticket_id) is generation:
            del active[req.ticket_id]


def _cut_receipt(
    inventory: CutInventory, active: dict[int, _Generation], staged: dict[str, list[str]], max_staged: int
) -> CutReceipt:
    """One cut round: each active prefix named in ``inventory`` staged under its key (a durable
    prefix), each one no longer active a durable failure; past ``max_staged`` prefixes, the
    oldest staged are dropped."""
    cut_id = secrets.token_hex(6)
    acks = []
    for prefix in inventory.active_prefixes:
        generation = active.get(prefix.ticket_id)
        if generation is None:
            acks.append(CutAck(ticket_id=prefix.ticket_id, disposition=Disposition.DURABLE_FAILURE))
            continue
        tokens = list(generation.tokens)
        key = f"{inventory.checkpoint_id}/{prefix.model_call_id}"
        staged.pop(key, None)  # a key staged again counts as the newest
        staged[key] = tokens
        while len(staged) > max_staged:
            del staged[next(iter(staged))]  # dicts keep insertion order: the oldest first
        done = len(tokens) >= generation.max_tokens
        acks.append(
            CutAck(
                ticket_id=prefix.ticket_id,
                disposition=Disposition.DURABLE_PREFIX,
                cut_kind="terminal_completion" if done else "active_prefix",
                frozen_buffer_id=f"buf-{cut_id}-{prefix.ticket_id}",
                staging_keys=[key],
                prefix_token_count=len(tokens),
                prefix_digest=_prefix_digest(tokens),
                effective_output_limit=max(generation.max_tokens - len(tokens), 1),
            )
        )
    return CutReceipt(
        checkpoint_id=inventory.checkpoint_id,
        cut_id=cut_id,
        inventory_digest=inventory.inventory_digest,
        inventory=inventory.active_prefixes,
        backend_snapshot_id=f"snap-{cut_id}",
        prefixes=acks,
    )
