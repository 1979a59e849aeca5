"""``participants.controller.discovery``: which configured servers are participants, in stage order."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from ckpt_events import Bus, InvalidValueError, Telemetry
from ckpt_events.participants import create_app
from ckpt_events.participants.controller.client import ControlClient
from ckpt_events.participants.controller.coordinator import Coordinator
from ckpt_events.participants.controller.discovery import discover_members
from ckpt_events.participants.controller.types import CoordinationError, Member
from ckpt_events.participants.protocol import CONTROL_PREFIX
from tests.participants.helpers import ROOT, TOKEN

pytestmark = pytest.mark.anyio


def _status_app(*replies: tuple[int, dict[str, Any]]) -> tuple[FastAPI, list[int]]:
    """An app whose ``GET /status`` gives ``replies`` in turn (the last one for ever); counts calls."""
    app = FastAPI()
    calls: list[int] = []

    @app.get(CONTROL_PREFIX + "/status")
    async def status() -> JSONResponse:
        calls.append(1)
        code, body = replies[min(len(calls), len(replies)) - 1]
        return JSONResponse(body, status_code=code)

    return app, calls


def _status(kind: str, instance: str) -> tuple[int, dict[str, Any]]:
    return 200, {"kind": kind, "instance": instance, "phase": "idle"}


@asynccontextmanager
async def _control(apps: dict[str, FastAPI]) -> AsyncIterator[ControlClient]:
    """A control client whose ``http://<host>`` reaches ``apps[host]`` in process (lifespans run)."""
    async with AsyncExitStack() as stack:
        for app in apps.values():
            await stack.enter_async_context(app.router.lifespan_context(app))
        mounts = {f"http://{host}": httpx.ASGITransport(app=app) for host, app in apps.items()}
        http = await stack.enter_async_context(httpx.AsyncClient(mounts=mounts))
        yield ControlClient(TOKEN, client=http)


async def test_participants_come_in_stage_order_and_a_404_is_not_one() -> None:
    """Real participant apps sorted (stage, name); a plain app's 404 is skipped; a URL list names
    each member by its instance, a mapping by its config name."""
    async with Bus() as bus:
        apps: dict[str, FastAPI] = {
            kind: create_app(kind, instance=f"{kind}-7", token=TOKEN, bus=bus, checkpoint_root=ROOT)
            for kind in ("resources", "model", "environment")
        }
        apps["plain"] = FastAPI()
        async with _control(apps) as control:
            members = await discover_members([f"http://{h}" for h in apps], control, retry_delay=0)
            assert members == [
                Member("environment-7", "environment", "environment-7", "http://environment"),
                Member("model-7", "model", "model-7", "http://model"),
                Member("resources-7", "resources", "resources-7", "http://resources"),
            ]
            named = await discover_members({"m": "http://model", "p": "http://plain"}, control)
            assert [(m.name, m.instance) for m in named] == [("m", "model-7")]


async def test_a_failing_server_is_retried_and_then_found() -> None:
    """A 500 then a good reply: the second try finds the participant."""
    app, calls = _status_app(
        (500, {"error": {"code": "checkpoint_error", "detail": "x"}}), _status("model", "m-0")
    )
    async with _control({"m": app}) as control:
        [member] = await discover_members(["http://m"], control, tries=2, retry_delay=0)
    assert (member.kind, member.instance, len(calls)) == ("model", "m-0", 2)


async def test_each_server_that_is_not_a_usable_participant_is_named_in_one_error() -> None:
    """Failures after ``tries``, a controller and a malformed kind are all collected, by name."""
    broken, broken_calls = _status_app((503, {"error": {"code": "unavailable", "detail": "busy"}}))
    controller, _ = _status_app(_status("controller", "coordination"))
    odd, _ = _status_app(_status("Not A Kind!", "odd-0"))
    model, _ = _status_app(_status("model", "model-0"))
    apps = {"broken": broken, "ctl": controller, "odd": odd, "model": model}
    async with _control(apps) as control:
        with pytest.raises(CoordinationError) as info:
            await discover_members({h: f"http://{h}" for h in apps}, control, tries=3, retry_delay=0)
    assert info.value.operation == "discover"
    assert sorted(info.value.failures) == ["broken", "ctl", "odd"]
    assert info.value.failures["ctl"] == "a controller is not a participant"
    assert info.value.failures["odd"].startswith(
        "status reply is not a participant's: invalid participant kind 'Not A Kind!'"
    )
    assert info.value.failures["broken"].startswith("http://broken/ng-control/v1/checkpoint/status: 503")
    assert len(broken_calls) == 3


async def test_servers_that_would_be_one_participant_or_one_member_are_refused() -> None:
    """Two servers answering as one kind and instance (they would write one checkpoint
    directory), or as one member name, are each named in the error, the first kept."""
    app = {
        "env-a": _status("environment", "environment-0"),
        "env-b": _status("environment", "environment-0"),
        "model": _status("model", "shared-0"),
        "res": _status("resources", "shared-0"),
    }
    apps = {host: _status_app(reply)[0] for host, reply in app.items()}
    async with _control(apps) as control:
        with pytest.raises(CoordinationError) as info:
            await discover_members([f"http://{h}" for h in apps], control, retry_delay=0)
        named = {"a": "http://env-a", "b": "http://env-a", "m": "http://model"}
        with pytest.raises(CoordinationError) as again:
            await discover_members(named, control, retry_delay=0)
    assert info.value.failures == {
        "http://env-b": "answers as environment/environment-0, as http://env-a does: two servers "
        "would write one checkpoint directory (give each its own --instance)",
        "http://res": "would be member 'shared-0', as http://model is: give each server its own "
        "--instance, or name each (a mapping of names to URLs)",
    }
    assert list(again.value.failures) == ["b"]


async def test_a_fleet_without_a_model_is_refused() -> None:
    """Participants found but none of kind model: ``CoordinationError`` naming the model."""
    env, _ = _status_app(_status("environment", "environment-0"))
    async with _control({"env": env}) as control:
        with pytest.raises(CoordinationError) as info:
            await discover_members(["http://env"], control)
    assert info.value.failures == {"model": "no model participant was found"}
    assert str(info.value) == "discover failed: model: no model participant was found"


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("http://127.0.0.1:99999", "no valid port"),  # was OverflowError out of the task group
        ("http://127.0.0.1:80a", "no valid port"),  # was httpx.InvalidURL
        ("ftp://127.0.0.1:9", "not an http"),
        ("127.0.0.1:9", "not an http"),
    ],
)
async def test_a_url_that_cannot_be_a_participant_s_is_refused_before_any_call(url: str, said: str) -> None:
    """A server URL with a port past 65535 or not a number escaped discovery (and a member's, a
    fan-out, cancelling the other members' calls) as ``OverflowError`` or httpx's ``InvalidURL``;
    discovery and a coordinator built from members refuse it as ``InvalidValueError``."""
    async with ControlClient(TOKEN) as control:
        with pytest.raises(InvalidValueError, match=said):
            await discover_members([url], control, tries=1, timeout=1)
    member = Member(name="model-0", kind="model", instance="model-0", url=url)
    with pytest.raises(InvalidValueError, match=said):
        Coordinator([member], token=TOKEN, telemetry=Telemetry(Bus(), kind="controller", instance="c"))
