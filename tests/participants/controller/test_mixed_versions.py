"""Rolling upgrades: a controller and participants one version apart still talk.

A newer participant is the real app behind an ASGI layer that adds to every JSON reply what a
newer version would; a newer controller is a request with a field this participant does not know.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from ckpt_events import Bus
from ckpt_events.participants import create_app
from ckpt_events.participants.controller.client import ControlClient, ParticipantCallError
from ckpt_events.participants.protocol import (
    CONTROL_PREFIX,
    PrepareReply,
    PrepareRequest,
    ResumeReply,
    ResumeRequest,
)
from ckpt_events.vocab import ErrorCode

TOKEN = "mixed-versions-token"
_Scope = dict[str, Any]


def _newer(app: FastAPI, extra: dict[str, Any]) -> Any:
    """``app`` as a newer participant: ``extra`` added to the top of every JSON reply body."""

    async def newer(scope: _Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        start: dict[str, Any] = {}

        async def rewrite(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
                return
            body = json.dumps({**json.loads(message["body"]), **extra}).encode()
            headers = [(k, v) for k, v in start["headers"] if k.lower() != b"content-length"]
            await send({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})

        await app(scope, receive, rewrite)

    return newer


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[FastAPI]:
    async with Bus() as bus:
        yield create_app("agent", instance="agent-0", token=TOKEN, bus=bus, checkpoint_root=tmp_path)


def _client(asgi: Any) -> ControlClient:
    return ControlClient(TOKEN, client=httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi)))


async def test_controller_reads_replies_with_a_field_it_does_not_know(app: FastAPI) -> None:
    """Status, prepare and resume replies with a new field decode; the field is ignored."""
    deadline = time.time() + 10
    async with _client(_newer(app, {"zzz_new_field": {"any": [1, 2]}})) as client:
        status = await client.status("http://p")
        prepared = await client.call(
            "http://p",
            "prepare",
            PrepareRequest(checkpoint_id="c1", deadline_ts=deadline),
            PrepareReply,
            deadline_ts=deadline,
        )
        resumed = await client.call(
            "http://p",
            "resume",
            ResumeRequest(checkpoint_id="c1", deadline_ts=deadline),
            ResumeReply,
            deadline_ts=deadline,
        )
    assert (status.kind, status.phase) == ("agent", "idle")
    assert prepared.phase == "prepared" and prepared.report.ready
    assert resumed.phase == "idle"


async def test_a_newer_error_body_keeps_its_code(app: FastAPI) -> None:
    """An error body with a new field still gives the refusal's code: without it, a stale
    checkpoint was reported as a bare 409 showing the raw body."""
    deadline = time.time() + 10
    async with _client(_newer(app, {"retry_after": 1})) as client:
        await client.call(
            "http://p",
            "resume",
            ResumeRequest(checkpoint_id="c1", deadline_ts=deadline),
            ResumeReply,
            deadline_ts=deadline,
        )
        with pytest.raises(ParticipantCallError) as refused:
            await client.call(
                "http://p",
                "prepare",
                PrepareRequest(checkpoint_id="c1", deadline_ts=deadline),
                PrepareReply,
                deadline_ts=deadline,
            )
    assert refused.value.code is ErrorCode.STALE_CHECKPOINT
    assert refused.value.detail == "checkpoint c1 was already resumed"


async def test_a_phase_the_controller_does_not_know_is_named(app: FastAPI) -> None:
    """A new enum value is not guessed at: the call fails naming the value and where it was."""
    async with _client(_newer(app, {"phase": "draining"})) as client:
        with pytest.raises(ParticipantCallError, match=r"Invalid enum value 'draining' - at `\$.phase`"):
            await client.status("http://p")


async def test_a_request_field_the_participant_does_not_know_is_refused_by_name(app: FastAPI) -> None:
    """Requests stay strict (SPEC section 5): a newer controller's new field is 422 naming it,
    and nothing happens (the participant stays idle)."""
    headers = {"authorization": f"Bearer {TOKEN}"}
    body = {"checkpoint_id": "c2", "deadline_ts": time.time() + 10, "zzz_new_field": 1}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as http:
        reply = await http.post(f"{CONTROL_PREFIX}/prepare", json=body, headers=headers)
        status = await http.get(f"{CONTROL_PREFIX}/status", headers=headers)
    assert reply.status_code == 422
    assert reply.json() == {
        "error": {"code": "invalid_request", "detail": "Object contains unknown field `zzz_new_field`"}
    }
    assert status.json()["phase"] == "idle"
