"""create_app: arguments, its own bus from the lifespan, configure_sinks and shutdown."""

from __future__ import annotations

import re

import httpx
import pytest

from ckpt_events import InvalidArgumentError, InvalidTypeError, InvalidValueError, OperationFinished
from ckpt_events.participants import PARTICIPANT_KINDS, create_app
from ckpt_events.participants.server.app import make_workload
from ckpt_events.participants.server.builder import build_work_app
from ckpt_events.participants.server.routes import work_router
from ckpt_events.participants.server.work import LocalWork
from ckpt_events.testing import MemorySink
from tests.participants.helpers import AUTH, TOKEN, control, running


def test_bad_arguments_are_refused():
    """Unknown kinds, unsafe instances, empty tokens and bad lease graces are refused up front."""
    with pytest.raises(InvalidValueError, match="kind must be one of .*, not 'judge'") as refused:
        create_app("judge", instance="x", token=TOKEN)  # a valid kind the registry has no row of
    assert "kinds=KINDS.replacing(KindRow('judge', " in str(refused.value)  # names the fix
    with pytest.raises(InvalidValueError, match="invalid participant kind 'Judge!'"):
        create_app("Judge!", instance="x", token=TOKEN)
    with pytest.raises(InvalidArgumentError):
        create_app("controller", instance="x", token=TOKEN)
    with pytest.raises(InvalidArgumentError):
        create_app("agent", instance="../x", token=TOKEN)
    with pytest.raises(InvalidArgumentError):
        create_app("agent", instance="x", token="")
    with pytest.raises(InvalidArgumentError):
        create_app("agent", instance="x", token=TOKEN, lease_grace_seconds=0)
    with pytest.raises(TypeError, match="step_seconds"):
        create_app("agent", instance="x", token=TOKEN, step_seconds=1)
    assert PARTICIPANT_KINDS == ("environment", "model", "agent", "resources")


@pytest.mark.parametrize("kinds", [["judge"], {"judge": object}, None])
def test_kinds_that_are_not_a_registry_are_refused(kinds: object) -> None:
    """``kinds=`` of another type is one precise error naming what to pass (was a bare
    ``TypeError: list indices must be integers or slices, not str``)."""
    with pytest.raises(InvalidTypeError, match=r"kinds must be a KindRegistry \(KINDS.replacing\(row\)"):
        create_app("judge", instance="x", token=TOKEN, kinds=kinds)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("given", "fragment"),
    [
        # Was accepted: its start waited 30 s for workers nothing started, then every prepare,
        # commit and restore was 503 checkpoint_coordinator_unavailable.
        ({}, "workers=2 needs its workers started: worker_command= (processes) or worker_factory="),
        # Was accepted: the factory's tasks ran and the command was silently ignored.
        (
            {"worker_command": lambda i: ["true"], "worker_factory": lambda i: None},
            "workers=2 takes worker_command= or worker_factory=, not both",
        ),
    ],
)
def test_several_workers_need_one_way_to_start_them(given: dict[str, object], fragment: str) -> None:
    """``workers`` > 1 is refused up front unless exactly one of ``worker_command`` and
    ``worker_factory`` says how its workers start."""
    with pytest.raises(InvalidArgumentError, match=re.escape(fragment)):
        create_app("agent", instance="x", token=TOKEN, workers=2, **given)  # type: ignore[arg-type]


async def test_the_lifespan_owns_its_bus_and_sinks():
    """Without a bus, the lifespan starts one, calls configure_sinks, and closes both."""
    sink = MemorySink()
    closed = []

    class Handle:
        async def aclose(self) -> None:
            closed.append(True)

    def configure(bus):
        bus.subscribe(sink, name="memory")
        return Handle()

    app = create_app("resources", instance="res-0", token=TOKEN, configure_sinks=configure)
    async with running(app) as client:
        assert (await control(client, "prepare")).json()["phase"] == "prepared"
        await app.state.bus.flush()
        assert app.state.telemetry.enabled
    assert closed == [True] and sink.closed
    finished = sink.of_type(OperationFinished)
    assert [(e.operation.value, str(e.kind), e.instance) for e in finished] == [
        ("prepare", "resources", "res-0")
    ]


_DOCS_PATHS = ("/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json")


async def test_no_api_docs_are_served_with_or_without_the_token():
    """/docs, /redoc and /openapi.json are not served (404 not_found, token or not), on the
    participant app and on a worker's own work app; the schema is still built in process."""
    app = create_app("resources", instance="res-0", token=TOKEN)
    async with running(app) as client:
        for path in _DOCS_PATHS:
            for headers in (AUTH, {"authorization": ""}):
                reply = await client.get(path, headers=headers)
                assert reply.status_code == 404, (path, reply.text)
                assert reply.json()["error"]["code"] == "not_found"
    assert app.openapi()["paths"]

    workload = make_workload("resources", app.state.telemetry)
    work = build_work_app(
        title="worker 0",
        tel=app.state.telemetry,
        work_router=work_router(LocalWork(workload, worker=0), TOKEN, start=False),
        max_body_bytes=1024,
    )
    transport = httpx.ASGITransport(app=work)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        for path in _DOCS_PATHS:
            assert (await client.get(path, headers=AUTH)).status_code == 404, path
