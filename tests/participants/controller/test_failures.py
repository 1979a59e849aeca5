"""A participant that refuses: the controller's spans end in error and say who refused and how."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import socket
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import Response

from ckpt_events import CoordinateFinished, Refused, StageFinished, Telemetry
from ckpt_events.participants import create_app
from ckpt_events.participants.cli.fleet import local_fleet, serving
from ckpt_events.participants.controller.collection import Collection
from ckpt_events.participants.controller.coordinator import CoordinationError, Coordinator, Member
from ckpt_events.participants.controller.types import (
    FAILURES_ATTRIBUTE,
    MemberFailure,
    PrepareResult,
    read_failures,
)
from ckpt_events.participants.errors import (
    CheckpointNotPrepared,
    ParticipantCallError,
)
from ckpt_events.participants.protocol import PrepareReply, PrepareReport
from ckpt_events.testing import capture_events
from ckpt_events.vocab import Outcome, Phase
from tests.participants.controller.test_coordinator import FOUR, TOKEN


@contextlib.contextmanager
def _silent_member(kind: str, instance: str) -> Iterator[Member]:
    """A member of ``kind`` whose address takes connections (the kernel accepts them) and never
    reads or answers: a hung process."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        yield Member(instance, kind, instance, f"http://127.0.0.1:{silent.getsockname()[1]}")


@asynccontextmanager
async def one_with_another_token(root: Path) -> AsyncIterator[tuple[Coordinator, list[Any]]]:
    """The four kinds on one captured bus; ``agent-0`` was started with another token."""
    others = [m for m in FOUR if m[1] != "agent-0"]
    async with capture_events() as (bus, events):
        async with (
            local_fleet(token=TOKEN, bus=bus, members=others, checkpoint_root=root) as started,
            serving(
                create_app("agent", instance="agent-0", token="another-token", bus=bus, checkpoint_root=root)
            ) as agent,
        ):
            urls = {**started, "agent-0": agent}
            members = [Member(name=i, kind=k, instance=i, url=urls[i]) for k, i in FOUR]
            tel = Telemetry(bus, kind="controller", instance="coordination")
            async with Coordinator(members, token=TOKEN, telemetry=tel) as coordinator:
                yield coordinator, events
        await bus.flush()


async def run_refused_checkpoint(root: Path) -> list[Any]:
    """A checkpoint through a fleet whose agent refuses the controller's token; its events."""
    async with one_with_another_token(root) as (co, events):
        with pytest.raises(CoordinationError) as info:
            await co.checkpoint("c1", str(root / "ck"), deadline_ts=time.time() + 10)
        assert info.value.failures == {
            "agent-0": "refused: unauthorized (401): missing or wrong bearer token"
        }
    return events


async def test_a_refusal_ends_the_stage_and_prepare_in_error_naming_who(tmp_path: Path) -> None:
    """The agent stage and coordinate.prepare end ``error`` with ``prepared=False``,
    ``stopped_at=agent`` and the agent's refusal recorded; the participant's own ``refused``
    names no checkpoint (it never reads an unauthenticated body), the controller's record does."""
    events = await run_refused_checkpoint(tmp_path)
    stage = next(e for e in events if isinstance(e, StageFinished) and e.stage == "agent")
    prepare = next(e for e in events if isinstance(e, CoordinateFinished) and e.operation == "prepare")
    assert stage.outcome is prepare.outcome is Outcome.ERROR
    assert (prepare.prepared, prepare.stopped_at, prepare.checkpoint_id) == (False, "agent", "c1")
    refusal = MemberFailure("agent", "agent-0", "refused: unauthorized (401): missing or wrong bearer token")
    for span in (stage, prepare):
        assert read_failures((span.attributes or {})[FAILURES_ATTRIBUTE]) == [refusal]
    # The stages before it prepared and were resumed; the one after it never ran.
    assert {e.stage for e in events if isinstance(e, StageFinished)} == {"environment", "model", "agent"}
    refused = [e for e in events if isinstance(e, Refused)]
    assert refused and {(e.instance, e.code.value, e.checkpoint_id) for e in refused} == {
        ("agent-0", "unauthorized", None)
    }
    # The resume after the abort was refused too, and says so on its own span.
    resume = next(e for e in events if isinstance(e, CoordinateFinished) and e.operation == "resume")
    assert resume.outcome is Outcome.ERROR
    assert read_failures((resume.attributes or {})[FAILURES_ATTRIBUTE]) == [refusal]


def test_not_prepared_counts_its_blockers_in_words() -> None:
    """One blocker is "1 blocker" (it said "with 1 blockers")."""

    def stopped(count: int) -> str:
        report = PrepareReport(ready=False, blockers=["r1"], blocker_count=count)
        reply = PrepareReply(phase=Phase.PREPARING, report=report)
        return str(CheckpointNotPrepared(PrepareResult("c1", False, "environment", {"environment-0": reply})))

    assert stopped(1).endswith("stopped at stage environment with 1 blocker")
    assert stopped(1200).endswith("with 1,200 blockers")


async def test_a_work_call_refused_is_one_error_naming_the_participant(tmp_path: Path) -> None:
    """A work call answered with an error status (here 401; a session lost with its worker
    process is 404) raised httpx's HTTPStatusError, which ``demo`` printed as a 238-line
    traceback; it is a ``ParticipantCallError`` with the participant's own code and detail."""
    refused: list[ParticipantCallError] = []
    async with one_with_another_token(tmp_path) as (co, _):
        col = Collection(co, tmp_path / "run", telemetry=co.tel, rollouts=1, steps=1)
        try:
            await col.run()
        except* ParticipantCallError as group:  # from the rollout drivers' task groups
            refused = _leaves(group)
    assert [(e.status, e.raw_code, e.url.rsplit("/", 2)[-2:]) for e in refused] == [
        (401, "unauthorized", ["work", "start"])
    ]
    assert "missing or wrong bearer token" in str(refused[0])


def _leaves(group: BaseExceptionGroup[ParticipantCallError]) -> list[ParticipantCallError]:
    return [
        leaf
        for inner in group.exceptions
        for leaf in (_leaves(inner) if isinstance(inner, BaseExceptionGroup) else [inner])
    ]


def unreadable(route: str) -> FastAPI:
    """A participant whose every POST under ``route`` (a path with ``{action}``) answers with a
    gzip body it does not have: a reply that cannot be read."""
    app = FastAPI()

    @app.post(route)
    async def answer(action: str) -> Response:
        return Response(b"{}", headers={"content-encoding": "gzip"}, media_type="application/json")

    return app


async def test_an_unreadable_reply_is_that_participants_failure_and_everyone_resumes(tmp_path: Path) -> None:
    """A reply with a broken content-encoding raised httpx's ``DecodingError`` out of the fan-out:
    it named nobody, and the abort's resume stopped at it, leaving who had prepared with admission
    closed; it is the member's failure, and everyone else is resumed."""
    three = [m for m in FOUR if m[0] != "resources"]
    async with capture_events() as (bus, _):
        async with (
            local_fleet(token=TOKEN, bus=bus, members=three, checkpoint_root=tmp_path) as urls,
            serving(unreadable("/ng-control/v1/checkpoint/{action}")) as broken,
        ):
            members = [Member(name=i, kind=k, instance=i, url=urls[i]) for k, i in three]
            members.append(Member(name="resources-0", kind="resources", instance="resources-0", url=broken))
            tel = Telemetry(bus, kind="controller", instance="coordination")
            async with Coordinator(members, token=TOKEN, telemetry=tel) as co:
                with pytest.raises(CoordinationError) as info:
                    await co.prepare("c1", deadline_ts=time.time() + 10)
                phases = {m.name: (await co.control.status(m.url)).phase for m in members[:3]}
    assert list(info.value.failures) == ["resources-0"]
    said = info.value.failures["resources-0"]
    assert said.startswith(f"failed at {broken}") and "unreadable reply: DecodingError" in said
    assert set(phases.values()) == {Phase.IDLE}


def relaying(target: str, *, delay: float = 0.0, phase: str | None = None) -> FastAPI:
    """A participant in front of the one at ``target``: its prepare is relayed, then answered
    ``delay`` seconds late, with its phase replaced by ``phase`` if given; the rest as it is."""
    app = FastAPI()

    @app.api_route("/{path:path}", methods=["GET", "POST"])
    async def relay(path: str, request: Request) -> Response:
        headers = {k: v for k, v in request.headers.items() if k in ("authorization", "content-type")}
        async with httpx.AsyncClient() as http:
            reply = await http.request(
                request.method, f"{target}/{path}", content=await request.body(), headers=headers
            )
        content = reply.content
        if path.endswith("/prepare"):
            await anyio.sleep(delay)
            if phase is not None:
                content = json.dumps({**reply.json(), "phase": phase}).encode()
        return Response(content, status_code=reply.status_code, media_type="application/json")

    return app


@asynccontextmanager
async def agent_relayed(root: Path, **relay: Any) -> AsyncIterator[tuple[Coordinator, dict[str, str]]]:
    """The four kinds, the agent's calls through ``relaying(**relay)``; the coordinator and
    each member's own URL (past the relay)."""
    async with capture_events() as (bus, _):
        async with local_fleet(token=TOKEN, bus=bus, members=FOUR, checkpoint_root=root) as urls:
            async with serving(relaying(urls["agent-0"], **relay)) as relayed:
                members = [
                    Member(name=i, kind=k, instance=i, url=relayed if i == "agent-0" else urls[i])
                    for k, i in FOUR
                ]
                tel = Telemetry(bus, kind="controller", instance="coordination")
                async with Coordinator(members, token=TOKEN, telemetry=tel) as co:
                    yield co, urls


async def idle_everywhere(co: Coordinator, urls: dict[str, str]) -> bool:
    return {(await co.control.status(url)).phase for url in urls.values()} == {Phase.IDLE}


async def test_a_prepare_answered_past_its_deadline_is_that_participants_failure(tmp_path: Path) -> None:
    """An agent that answers ``prepared`` a second past the deadline: the next stage was asked
    after it and refused (``resources-0 refused: deadline_exceeded``), a false cause; the
    failure is the agent's, saying how late it answered, and everyone is resumed."""
    async with agent_relayed(tmp_path, delay=1.5) as (co, urls):
        with pytest.raises(CoordinationError) as info:
            await co.checkpoint("c1", str(tmp_path / "ck"), deadline_ts=time.time() + 1.0)
        assert await idle_everywhere(co, urls)
    assert list(info.value.failures) == ["agent-0"]
    assert re.fullmatch(
        r"answered prepare \(prepared\) \d\.\d s after its deadline", info.value.failures["agent-0"]
    )


async def test_a_wall_clock_step_while_a_member_answers_is_not_that_members_lateness(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host's wall clock steps an hour ahead while the agent takes 0.5 s to answer a prepare
    due in 2 s: the agent answered in time, and is not named. Was: "agent-0: answered prepare
    (prepared) 3598.5 s after its deadline", its answer timed on the wall clock."""
    async with agent_relayed(tmp_path, delay=0.5) as (co, urls):
        wall = time.time

        async def step() -> None:
            await anyio.sleep(0.2)
            monkeypatch.setattr(time, "time", lambda: wall() + 3600)

        failures: dict[str, str] = {}
        async with anyio.create_task_group() as tg:
            tg.start_soon(step)
            try:
                await co.checkpoint("c1", str(tmp_path / "ck"), deadline_ts=wall() + 2.0)
            except CoordinationError as exc:  # the next stage's own clock is past the deadline
                failures = dict(exc.failures)
        assert await idle_everywhere(co, urls)
    assert "agent-0" not in failures, failures
    assert all("refused: deadline_exceeded" in problem for problem in failures.values()), failures


async def test_a_prepare_answered_in_a_phase_prepare_never_gives_is_that_participants_failure(
    tmp_path: Path,
) -> None:
    """A prepare answered ``committed`` stopped as "not prepared with 0 blockers", as if the
    agent were not ready; it is the agent's failure, naming the phase, and everyone is resumed."""
    async with agent_relayed(tmp_path, phase="committed") as (co, urls):
        with pytest.raises(CoordinationError) as info:
            await co.checkpoint("c1", str(tmp_path / "ck"), deadline_ts=time.time() + 10)
        assert await idle_everywhere(co, urls)
    assert info.value.failures == {
        "agent-0": "answered prepare with phase committed, not prepared or preparing"
    }


async def test_a_silent_member_holds_no_other_stage_closed_after_the_abort(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A resources server that takes the connection and never answers fails the prepare; the
    abort's resume went stage by stage from resources, so its resume's timeout (10 s) kept the
    agent, model and environment closed that long. They are told at once now, and it is named."""

    from ckpt_events.participants.controller import client

    # The grace past the deadline is the original controller's 5 s: shorter here, so the prepare
    # gives up on the silent member within a second (the abort's resume still allows it 5 s).
    monkeypatch.setattr(client, "CLIENT_GRACE_SECONDS", 0.5)
    with _silent_member("resources", "resources-1") as hung:
        async with capture_events() as (bus, events), local_fleet(token=TOKEN, bus=bus, members=FOUR) as urls:
            tel = Telemetry(bus, kind="controller", instance="coordination")
            healthy = await Coordinator.discover(
                {n: u for n, u in urls.items() if not n.startswith("inference")}, token=TOKEN, telemetry=tel
            )
            async with healthy, Coordinator([*healthy.members, hung], token=TOKEN, telemetry=tel) as co:
                started = time.monotonic()
                told: dict[str, float] = {}
                closed: set[str] = set()

                async def watch() -> None:
                    # Who closed admission for the prepare, and when each reopened.
                    while len(told) < len(healthy.members):
                        for m in healthy.members:
                            status = await co.control.status(m.url, timeout=2)
                            if status.phase != Phase.IDLE:
                                closed.add(m.name)
                            elif m.name in closed and m.name not in told:
                                told[m.name] = time.monotonic() - started
                        await anyio.sleep(0.02)

                async def prepare() -> None:
                    # It raises once the silent member's resume has timed out too (5 s): later
                    # than this test waits.
                    with contextlib.suppress(CoordinationError):
                        await co.prepare("c-silent", deadline_ts=time.time() + 0.3)

                with anyio.move_on_after(8):
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(prepare)
                        await watch()
                        # Everyone healthy reopened; the silent one's resume may still be waiting.
                        tg.cancel_scope.cancel()
    assert closed == {m.name for m in healthy.members}, (closed, told)
    assert set(told) == closed and max(told.values()) < 3.0, told
    # The prepare's span ended (before the abort) naming the silent member alone.
    prepare = next(e for e in events if isinstance(e, CoordinateFinished) and e.operation == "prepare")
    (named,) = read_failures((prepare.attributes or {})[FAILURES_ATTRIBUTE])
    assert (named.instance, named.said.split(" http")[0]) == ("resources-1", "no whole reply from")


async def test_a_member_silent_in_a_restore_holds_no_others_undo(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An environment server that takes the connection and never answers fails the restore. The
    undo retired group by group, environments first, so its retire's timeout (30 s and more)
    held the others' retire and everyone's resume: restored, admission closed, for 35 s. The
    others are undone at once now, in the protocol's order, the silent one alongside."""

    from ckpt_events.participants.controller import client
    from ckpt_events.participants.protocol import EpisodeId
    from tests.participants.controller.test_coordinator import coordinated, start_work

    async with coordinated() as (co, http, _):
        await start_work(http, co, "r1")
        await co.checkpoint("c-src", str(tmp_path), deadline_ts=time.time() + 10)
    # The restore gives up on the silent member 0.5 s past its deadline (see the abort's test
    # above). The deadline leaves the healthy members time to restore on a loaded machine: at
    # 0.5 s, a loaded suite run saw none of them restored before it passed.
    monkeypatch.setattr(client, "CLIENT_GRACE_SECONDS", 0.5)
    restore_s = 2.0
    with _silent_member("environment", "environment-9") as hung:
        async with coordinated() as (healthy, _, _):
            tel = healthy.tel
            async with Coordinator([*healthy.members, hung], token=TOKEN, telemetry=tel) as co:
                started = time.monotonic()
                undone: dict[str, float] = {}
                restored: set[str] = set()
                failed: list[CoordinationError] = []

                async def watch() -> None:
                    # Who restored, and when each was idle again.
                    while len(undone) < len(healthy.members):
                        for m in healthy.members:
                            status = await co.control.status(m.url, timeout=2)
                            if status.phase == Phase.RESTORED:
                                restored.add(m.name)
                            elif m.name in restored and m.name not in undone:
                                undone[m.name] = time.monotonic() - started
                        await anyio.sleep(0.02)

                async def restore() -> None:
                    try:
                        await co.restore(
                            "restore-s", str(tmp_path), [EpisodeId("r1")], deadline_ts=time.time() + restore_s
                        )
                    except CoordinationError as exc:
                        failed.append(exc)  # raised once the silent one's undo has timed out too

                with anyio.move_on_after(restore_s + 10):
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(restore)
                        await watch()
                        tg.cancel_scope.cancel()
                statuses = [await co.control.status(m.url) for m in healthy.members]
    assert restored == {m.name for m in healthy.members}, (restored, undone)
    # Past the deadline and the silent one's grace, the others' undo is at once (was 30 s more).
    assert set(undone) == restored and max(undone.values()) < restore_s + 3.5, undone
    # Undone as a failed restore is: the next attempt retired everywhere that answered.
    assert {s.retired_rollouts.get("r1") for s in statuses} == {1}


async def test_a_refusal_quoting_a_megabyte_is_logged_in_one_bounded_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A participant refusing with a megabyte of detail: the controller's "resume after abort
    ... incomplete" warning was a 1,000,129-character line; it says the error bounded now."""
    caplog.set_level(logging.WARNING, "ckpt_events.participants.controller")
    app = FastAPI()

    @app.api_route("/{path:path}", methods=["GET", "POST"])
    async def refuse(path: str) -> Response:
        detail = "https://u:pw@collector.example " + "y" * 1_000_000
        body = json.dumps({"error": {"code": "checkpoint_error", "detail": detail}})
        return Response(body, status_code=500, media_type="application/json")

    async with capture_events() as (bus, _), serving(app) as url:
        members = [Member("environment-0", "environment", "environment-0", url)]
        tel = Telemetry(bus, kind="controller", instance="coordination")
        async with Coordinator(members, token=TOKEN, telemetry=tel) as co:
            with anyio.fail_after(30), pytest.raises(CoordinationError) as info:
                await co.checkpoint("c1", str(tmp_path / "ck"), deadline_ts=time.time() + 5)
    [line] = [r.getMessage() for r in caplog.records if "resume after abort" in r.getMessage()]
    assert line.startswith("resume after abort of c1 incomplete: CoordinationError: resume failed:")
    assert "pw@" not in line and len(line) < 500
    # The exception itself kept the megabyte, in ``failures`` and its message (1,000,119 characters).
    said = info.value.failures["environment-0"]
    assert said.startswith("refused: checkpoint_error (500): https://[REDACTED]@collector.example y")
    assert said.endswith("... (1,000,031 characters)") and len(said) < 2100
    assert str(info.value).startswith("prepare failed: environment-0: refused: checkpoint_error (500)")
    assert len(str(info.value)) < 600


class _RaisingHandler(logging.Handler):
    """A user's handler whose ``emit`` raises (not through ``handleError``)."""

    def emit(self, record: logging.LogRecord) -> None:
        raise RuntimeError("handler down")


async def test_a_raising_log_handler_never_replaces_the_coordination_error(tmp_path: Path) -> None:
    """A root handler raising in ``emit``: the coordinator's "resume after abort ... incomplete"
    warning raised ``RuntimeError: handler down`` out of ``checkpoint`` in place of the
    ``CoordinationError``; the record is lost now, not the caller's error."""
    app = FastAPI()

    @app.api_route("/{path:path}", methods=["GET", "POST"])
    async def refuse(path: str) -> Response:
        body = json.dumps({"error": {"code": "checkpoint_error", "detail": "no"}})
        return Response(body, status_code=500, media_type="application/json")

    handler = _RaisingHandler()
    logging.getLogger().addHandler(handler)
    try:
        async with capture_events() as (bus, _), serving(app) as url:
            members = [Member("environment-0", "environment", "environment-0", url)]
            tel = Telemetry(bus, kind="controller", instance="coordination")
            async with Coordinator(members, token=TOKEN, telemetry=tel) as co:
                with anyio.fail_after(30), pytest.raises(CoordinationError) as info:
                    await co.checkpoint("c1", str(tmp_path / "ck"), deadline_ts=time.time() + 5)
    finally:
        logging.getLogger().removeHandler(handler)
    assert info.value.failures == {"environment-0": "refused: checkpoint_error (500): no"}


async def test_a_refusal_quoting_terminal_escapes_is_logged_with_them_shown(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A participant refusing with a detail holding terminal controls (clear screen, an OSC 8
    link, BEL, CR, backspace, a bidi override, a zero-width space, C1 CSI): the controller's
    "resume after abort ... incomplete" warning carried 7 of them raw, to a terminal through
    logging's stderr handler; it shows each as its escape now."""
    caplog.set_level(logging.WARNING, "ckpt_events.participants.controller")
    hostile = "x\x1b[2J\x1b]8;;http://evil\x07link\r\bZ\u202eRTL\u200b\x9b31m"
    app = FastAPI()

    @app.api_route("/{path:path}", methods=["GET", "POST"])
    async def refuse(path: str) -> Response:
        body = json.dumps({"error": {"code": "checkpoint_error", "detail": hostile}})
        return Response(body, status_code=500, media_type="application/json")

    async with capture_events() as (bus, _), serving(app) as url:
        members = [Member("environment-0", "environment", "environment-0", url)]
        tel = Telemetry(bus, kind="controller", instance="coordination")
        async with Coordinator(members, token=TOKEN, telemetry=tel) as co:
            with anyio.fail_after(30), pytest.raises(CoordinationError):
                await co.checkpoint("c1", str(tmp_path / "ck"), deadline_ts=time.time() + 5)
    [line] = [r.getMessage() for r in caplog.records if "resume after abort" in r.getMessage()]
    assert line.isprintable(), [c for c in line if not c.isprintable()]
    # The CR is a space, as every run of whitespace in a one-line saying.
    assert r"x\x1b[2J\x1b]8;;http://evil\x07link \x08Z\u202eRTL\u200b\x9b31m" in line
