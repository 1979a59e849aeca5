"""The multi-worker app is built like the single-process one (arrival stamps and loop lag
included) and answers like it (a workload's refusal at install)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from ckpt_events import OperationFinished, Telemetry
from ckpt_events.participants import create_app
from ckpt_events.participants.errors import InvalidCheckpointError
from ckpt_events.participants.server.app import make_workload
from ckpt_events.testing import capture_events
from tests.participants.helpers import TOKEN, control, error_code, running, status

pytestmark = pytest.mark.anyio


async def test_two_worker_operations_carry_arrival_and_loop_lag(tmp_path) -> None:
    """With ``workers=2`` every control operation's event has ``received_ns`` and ``loop_lag_ms``."""
    async with capture_events() as (bus, events):
        app = create_app(
            "environment",
            instance="env-0",
            token=TOKEN,
            bus=bus,
            workers=2,
            checkpoint_root=tempfile.gettempdir(),  # holds every tmp_path
            worker_factory=lambda i: make_workload(
                "environment", Telemetry(bus, kind="environment", instance="env-0")
            ),
        )
        async with running(app) as client:
            for i in range(4):
                started = await client.post("/work/start", json={"rollout_id": f"r{i}", "steps": 2})
                assert started.status_code == 200, started.text
            before = time.time_ns()
            assert (await control(client, "prepare")).status_code == 200
            assert (await control(client, "commit", checkpoint_dir=str(tmp_path))).status_code == 200
            assert (await control(client, "resume")).status_code == 200
            assert app.state.coordinator.workers == 2
    # The main process's operations are the roots (the requests carried no traceparent); the
    # workers' shares of them are their children and saw no HTTP request.
    finished = [e for e in events if isinstance(e, OperationFinished) and e.parent_span_id is None]
    assert [e.operation for e in finished] == ["prepare", "commit", "resume"]
    for event in finished:
        assert event.received_ns is not None and before <= event.received_ns <= event.start_ns, event
        assert event.loop_lag_ms is not None and event.loop_lag_ms >= 0.0, event


async def _restore_whose_install_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int, failure: Exception
) -> tuple[httpx.Response, dict[str, Any]]:
    """Commit two episodes, then restore them into a server whose workload's ``install`` raises
    ``failure``: the restore's reply, and the server's ``/status`` after it."""
    async with capture_events() as (bus, _):

        def factory(index: int) -> Any:
            return make_workload("environment", Telemetry(bus, kind="environment", instance="env-0"))

        def build() -> Any:
            options = {"workers": workers, "worker_factory": factory} if workers > 1 else {}
            return create_app(
                "environment",
                instance="env-0",
                token=TOKEN,
                bus=bus,
                checkpoint_root=str(tmp_path),
                **options,
            )

        async with running(build()) as client:
            for i in range(2):
                started = await client.post("/work/start", json={"rollout_id": f"r{i}", "steps": 2})
                assert started.status_code == 200, started.text
            assert (await control(client, "prepare")).status_code == 200
            committed = await control(client, "commit", checkpoint_dir=str(tmp_path / "c1"))
            assert committed.status_code == 200, committed.text

        async def install(self: object, records: object, states: object) -> list[str]:
            raise failure

        kind = type(make_workload("environment", Telemetry(bus, kind="environment", instance="env-0")))
        monkeypatch.setattr(kind, "install", install)
        episodes = [{"rollout_id": f"r{i}", "attempt": 0} for i in range(2)]
        async with running(build(), raise_app_exceptions=False) as client:
            refused = await control(
                client, "restore", "c2", checkpoint_dir=str(tmp_path / "c1"), episode_ids=episodes
            )
            return refused, await status(client)


@pytest.mark.parametrize("workers", [1, 2])
async def test_a_workloads_invalid_checkpoint_at_install_is_422_at_every_worker_count(
    tmp_path, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    """A workload whose ``install`` raises ``InvalidCheckpointError`` (a record it cannot take) is
    answered 422 ``invalid_checkpoint_state``, as a record that does not check is: with workers
    it was a worker's failure, 409 ``checkpoint_error``; in one process, no answer at all."""
    failure = InvalidCheckpointError("record r0-a1 cannot be installed here")
    refused, after = await _restore_whose_install_raises(tmp_path, monkeypatch, workers, failure)
    assert error_code(refused) == (422, "invalid_checkpoint_state"), refused.text
    assert refused.json()["error"]["detail"] == "record r0-a1 cannot be installed here"
    assert after["phase"] == "idle"


@pytest.mark.parametrize("workers", [1, 2])
async def test_a_handlers_failure_is_answered_redacted_at_every_worker_count(
    tmp_path, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    """A workload's ``install`` raising with a ``user:password@`` URL and a ``Bearer`` token:
    the 409 ``checkpoint_error`` reply carried both verbatim to the client (with workers), and
    one process answered Starlette's plain-text 500, no protocol error body at all."""
    secret = "upload to https://alice:hunter2@store.example/b failed; Authorization: Bearer eyJsecret123"
    refused, after = await _restore_whose_install_raises(tmp_path, monkeypatch, workers, RuntimeError(secret))
    assert refused.headers["content-type"] == "application/json", refused.text
    assert error_code(refused) == (409, "checkpoint_error"), refused.text
    assert after["phase"] == "idle"
    assert refused.json()["error"]["detail"] == (
        "upload to https://[REDACTED]@store.example/b failed; Authorization: Bearer [REDACTED]"
    )


@pytest.mark.parametrize("workers", [1, 2])
async def test_a_failure_without_a_message_is_named_by_its_class_at_every_worker_count(
    tmp_path, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    """``RuntimeError()`` (no message) raised by a workload: one process answered its class name
    as the 409 detail, ``--workers`` an empty detail; both now say ``RuntimeError``."""
    refused, after = await _restore_whose_install_raises(tmp_path, monkeypatch, workers, RuntimeError())
    assert error_code(refused) == (409, "checkpoint_error"), refused.text
    assert refused.json()["error"]["detail"] == "RuntimeError"
    assert after["phase"] == "idle"
