"""Work calls under a flaky upstream: a failed unit of work is retried, a lasting failure named once."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest

from ckpt_events import Bus, Telemetry
from ckpt_events.participants.cli.fleet import local_fleet, serving
from ckpt_events.participants.controller.collection import Collection
from ckpt_events.participants.controller.coordinator import Coordinator
from ckpt_events.participants.controller.types import Member
from ckpt_events.participants.controller.work_calls import WORK_CALL_TRIES, WorkClients
from ckpt_events.participants.errors import ParticipantCallError
from tests.participants.controller.test_failures import unreadable

TOKEN = "work-calls-test-token"
FAST = {"environment-0": {"step_seconds": 0.001}, "agent-0": {"turn_seconds": 0.001}}


class FlakyInference(httpx.AsyncBaseTransport):
    """The model's way to the inference worker: the first try of every other model call times out
    (``always``: every try of every call does)."""

    def __init__(self, *, always: bool = False) -> None:
        self.always = always
        self.requests = 0
        self.failures = 0
        self._seen: set[str] = set()
        self._real = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        call = json.loads(request.content)["model_call_id"]
        first_try = call not in self._seen
        self._seen.add(call)
        if self.always or (first_try and len(self._seen) % 2):
            self.failures += 1
            raise httpx.ReadTimeout("injected: the inference worker took too long", request=request)
        return await self._real.handle_async_request(request)

    async def aclose(self) -> None:
        await self._real.aclose()


async def _run(tmp_path: Path, flaky: FlakyInference, rollouts: int) -> Any:
    options: dict[str, dict[str, Any]] = {**FAST, "model-0": {"max_tokens": 2, "inference_transport": flaky}}
    async with Bus() as bus:
        tel = Telemetry(bus, kind="controller", instance="coordination")
        async with local_fleet(token=TOKEN, bus=bus, options=options) as urls:
            async with await Coordinator.discover(urls, token=TOKEN, telemetry=tel) as coordinator:
                collection = Collection(
                    coordinator, tmp_path / "run", telemetry=tel, rollouts=rollouts, steps=3
                )
                return await collection.run()


async def test_a_transient_upstream_failure_is_retried(tmp_path: Path) -> None:
    """Half the inference calls time out once (502 upstream_error at the model): all rollouts finish."""
    flaky = FlakyInference()
    summary = await _run(tmp_path, flaky, rollouts=6)
    assert summary.completed == 6 and flaky.failures >= 3
    assert set(summary.attempts.values()) == {0}


async def test_a_lasting_upstream_failure_names_its_cause(tmp_path: Path) -> None:
    """When every try fails, the error names the participant's code and the upstream detail."""
    flaky = FlakyInference(always=True)
    with pytest.raises(BaseExceptionGroup) as raised:
        await _run(tmp_path, flaky, rollouts=1)
    errors = raised.value.split(ParticipantCallError)[0]
    assert errors is not None
    leaf: BaseException = errors
    while isinstance(leaf, BaseExceptionGroup):
        leaf = leaf.exceptions[0]
    text = str(leaf)
    assert "502 upstream_error" in text and "took too long" in text and f"{WORK_CALL_TRIES} times" in text
    assert flaky.requests == WORK_CALL_TRIES


async def test_a_silent_or_unreadable_participant_is_named_with_what_happened() -> None:
    """A participant that never answers said only 'ReadTimeout: ' (httpx's timeouts have no
    message): the detail says how long it waited. A reply that cannot be read (a broken
    content-encoding) escaped as httpx's ``DecodingError``: it is a ``ParticipantCallError``."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # the kernel takes the connection; nobody ever reads or answers
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        member = Member(name="model-0", kind="model", instance="model-0", url=url)
        work = WorkClients(1, 0.2)
        async with work.open([member]):
            with pytest.raises(ParticipantCallError) as quiet:
                await work.post(member, url + "/work/start", {}, tries=1)
    assert quiet.value.detail == "ReadTimeout: no answer within 0.2 s"
    async with serving(unreadable("/work/{action}")) as url:
        member = Member(name="model-0", kind="model", instance="model-0", url=url)
        async with work.open([member]):
            with pytest.raises(ParticipantCallError) as unread:
                await work.post(member, url + "/work/start", {})
    assert unread.value.detail.startswith("unreadable reply: DecodingError: ")
