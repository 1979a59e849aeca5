"""Rollout collection against real participant apps served by uvicorn in this process."""

from __future__ import annotations

import errno
import os
import re
import signal
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import msgspec
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import Response

from ckpt_events import CollectionFinished, CoordinateFinished, InvalidValueError, Telemetry
from ckpt_events.participants.cli.fleet import local_fleet, serving
from ckpt_events.participants.controller import collection as collection_module
from ckpt_events.participants.controller.collection import Collection, CollectionSummary
from ckpt_events.participants.controller.coordinator import Coordinator, Member
from ckpt_events.participants.errors import CoordinationError, InvalidCheckpointError, ParticipantCallError
from ckpt_events.testing import capture_events
from tests.participants.helpers import ROOT

TOKEN = "collection-test-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}


@asynccontextmanager
async def collection(
    bus: Any, run_dir: Path, **options: Any
) -> AsyncIterator[tuple[Collection, httpx.AsyncClient]]:
    """A fresh fleet on ``bus`` and a collection over it."""
    tel = Telemetry(bus, kind="controller", instance="coordination")
    async with (
        local_fleet(token=TOKEN, bus=bus, checkpoint_root=ROOT) as urls,
        httpx.AsyncClient(headers=AUTH) as http,
    ):
        async with await Coordinator.discover(urls, token=TOKEN, telemetry=tel, client=http) as co:
            yield Collection(co, run_dir, telemetry=tel, **{"rollouts": 6, "steps": 5, **options}), http


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.01)


def some_progress(col: Collection) -> Callable[[], bool]:
    return lambda: sum(r.status == "running" and bool(r.started) for r in col.rollouts.values()) >= 3


async def run_and(col: Collection, action: Callable[[], Any]) -> tuple[CollectionSummary, Any]:
    """Run ``col`` while ``action`` (after some progress) runs beside it."""
    out: dict[str, Any] = {}

    async def runner() -> None:
        out["summary"] = await col.run()

    async with anyio.create_task_group() as tg:
        tg.start_soon(runner)
        await until(some_progress(col))
        out["action"] = await action()
    return out["summary"], out["action"]


async def test_checkpoint_publishes_collection_json_then_latest(tmp_path: Path) -> None:
    """A mid-flight checkpoint is published, the run finishes, and the spans nest under it."""
    async with capture_events() as (bus, events):
        async with collection(bus, tmp_path) as (col, _):
            summary, checkpoint_id = await run_and(col, col.checkpoint)
    assert summary.completed == 6 and not summary.stopped and summary.checkpoints == [checkpoint_id]
    assert (tmp_path / "LATEST").read_text().strip() == checkpoint_id
    manifest = msgspec.json.decode((tmp_path / checkpoint_id / "collection.json").read_bytes())
    assert manifest["checkpoint_id"] == checkpoint_id and manifest["steps"] == 5
    assert len(manifest["continued"]) + len(manifest["restarted"]) + len(manifest["completed"]) <= 6
    assert (tmp_path / checkpoint_id / "gym" / "model" / "model-0" / "manifest.json").is_file()
    (span, publish) = sorted(
        (e for e in events if isinstance(e, CollectionFinished)), key=lambda e: e.action != "checkpoint"
    )
    assert span.action == "checkpoint" and span.checkpoint_id == checkpoint_id
    assert span.published is True and span.stop is False and span.in_flight >= 1
    # Publishing the collection record and renewing the leases meanwhile are named spans too.
    assert publish.action == "publish" and publish.parent_span_id == span.span_id
    coordinate = [e for e in events if isinstance(e, CoordinateFinished)]
    assert [e.operation for e in coordinate] == ["prepare", "commit", "renew", "resume"]
    assert {e.parent_span_id for e in coordinate} == {span.span_id}
    # Every span of the checkpoint, on the controller and on each participant, is in one trace.
    assert {e.trace_id for e in events if hasattr(e, "trace_id")} == {span.trace_id}


async def test_only_the_two_newest_checkpoints_are_kept(tmp_path: Path) -> None:
    """Three checkpoints leave two directories, and LATEST names the newest."""

    async def three() -> list[str]:
        return [await col.checkpoint() for _ in range(3)]

    async with capture_events() as (bus, _):
        async with collection(bus, tmp_path, rollouts=4, steps=10) as (col, _):
            _, ids = await run_and(col, three)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == sorted(ids[1:])
    assert (tmp_path / "LATEST").read_text().strip() == ids[2]


async def test_restart_restores_latest_and_continues_as_next_attempt(tmp_path: Path) -> None:
    """Checkpoint-and-stop, then fresh participants: the episodes finish as attempt 1, attempt 0 is fenced."""
    async with capture_events() as (bus, events):
        async with collection(bus, tmp_path) as (col, _):
            first, checkpoint_id = await run_and(col, lambda: col.checkpoint(stop=True))
        assert first.stopped and first.completed < 6
        continued = msgspec.json.decode((tmp_path / checkpoint_id / "collection.json").read_bytes())[
            "continued"
        ]
        assert continued
        async with collection(bus, tmp_path) as (col, http):
            second = await col.run()
            assert second.restored_from == checkpoint_id and second.completed == 6
            for episode in continued:
                assert second.attempts[episode["rollout_id"]] == 1
            for member in col.coordinator.members:
                late = await http.post(
                    member.url + "/work/advance",
                    json={"rollout_id": continued[0]["rollout_id"], "attempt": 0},
                )
                assert late.status_code == 409 and late.json()["error"]["code"] == "stale_attempt"
            forgotten = await col.forget_finished()
            assert continued[0]["rollout_id"] in forgotten
    restore = [e for e in events if isinstance(e, CollectionFinished) and e.action == "restore"]
    assert (
        len(restore) == 1 and restore[0].rows == len(continued) and restore[0].checkpoint_id == checkpoint_id
    )
    nested = [e for e in events if isinstance(e, CoordinateFinished) and e.trace_id == restore[0].trace_id]
    assert [e.operation for e in nested] == ["restore", "retire", "resume"]


async def test_signals_checkpoint_and_stop(tmp_path: Path) -> None:
    """SIGUSR1 takes a checkpoint and goes on; SIGTERM takes one and stops."""

    async def signal_twice() -> None:
        os.kill(os.getpid(), signal.SIGUSR1)
        await until(lambda: len(col.checkpoints) == 1)
        os.kill(os.getpid(), signal.SIGTERM)

    async with capture_events() as (bus, events):
        async with collection(bus, tmp_path, rollouts=4, steps=40, handle_signals=True) as (col, _):
            summary, _ = await run_and(col, signal_twice)
    assert summary.stopped and len(summary.checkpoints) == 2
    spans = [e for e in events if isinstance(e, CollectionFinished) and e.action == "checkpoint"]
    assert [(e.stop, e.published) for e in spans] == [(False, True), (True, True)]


async def test_failed_restore_restarts_the_rollouts_past_the_retired_attempts(tmp_path: Path) -> None:
    """A corrupt participant directory: nothing is installed, the rollouts restart as attempt 2."""
    async with capture_events() as (bus, events):
        async with collection(bus, tmp_path) as (col, _):
            _, checkpoint_id = await run_and(col, lambda: col.checkpoint(stop=True))
        continued = msgspec.json.decode((tmp_path / checkpoint_id / "collection.json").read_bytes())[
            "continued"
        ]
        records = next((tmp_path / checkpoint_id / "gym" / "resources" / "resources-0").glob("records-*"))
        records.write_bytes(records.read_bytes()[:-2] + b"\n")
        async with collection(bus, tmp_path) as (col, _):
            summary = await col.run()
    assert summary.restored_from is None and summary.completed == 6
    assert all(summary.attempts[e["rollout_id"]] == 2 for e in continued)
    (restore,) = [e for e in events if isinstance(e, CollectionFinished) and e.action == "restore"]
    assert restore.outcome == "error"


async def test_each_rollout_is_placed_on_one_server_of_each_kind_and_balanced(tmp_path: Path) -> None:
    """With two servers of each kind a rollout's session goes to one of each, the least loaded
    (eight rollouts, four in flight at a time, reach every server), and a checkpoint records
    where each continued rollout was."""
    members = [(k, f"{k}-{i}") for k in ("environment", "model", "agent", "resources") for i in range(2)]
    async with capture_events() as (bus, _events):
        tel = Telemetry(bus, kind="controller", instance="coordination")
        async with (
            local_fleet(token=TOKEN, bus=bus, members=members, checkpoint_root=ROOT) as urls,
            httpx.AsyncClient(headers=AUTH) as http,
            await Coordinator.discover(urls, token=TOKEN, telemetry=tel, client=http) as co,
        ):
            col = Collection(co, tmp_path, telemetry=tel, rollouts=8, steps=5, concurrency=4)
            summary, checkpoint_id = await run_and(col, col.checkpoint)
    assert summary.completed == 8
    ran: dict[str, int] = {}
    for rollout in col.rollouts.values():
        assert sorted(m.kind for m in rollout.placed) == ["agent", "environment", "model", "resources"]
        for member in rollout.placed:
            ran[member.name] = ran.get(member.name, 0) + 1
    # Totals vary with the order rollouts finish in; each server takes its share.
    assert set(ran) == {name for _, name in members} and all(2 <= n <= 6 for n in ran.values())
    manifest = msgspec.json.decode((tmp_path / checkpoint_id / "collection.json").read_bytes())
    assert sorted(manifest["members"]) == sorted(name for _, name in members)
    assert set(manifest["placement"]) == {e["rollout_id"] for e in manifest["continued"]}
    for where in manifest["placement"].values():
        assert sorted(n.rsplit("-", 1)[0] for n in where) == ["agent", "environment", "model", "resources"]


def _leaves(group: BaseExceptionGroup[Any]) -> Iterator[BaseException]:
    for error in group.exceptions:
        yield from _leaves(error) if isinstance(error, BaseExceptionGroup) else [error]


async def test_a_work_call_the_participants_refuse_is_a_participant_error(tmp_path: Path) -> None:
    """A start every participant refuses (422: more steps than the protocol carries) ends the run
    with a ``ParticipantCallError`` naming the field, not an ``HTTPStatusError`` traceback."""
    errors: list[ParticipantCallError] = []
    async with capture_events() as (bus, _), collection(bus, tmp_path, rollouts=1, steps=10_001) as (col, _):
        try:
            await col.run()
        except* ParticipantCallError as group:
            errors = [e for e in _leaves(group) if isinstance(e, ParticipantCallError)]
    assert errors and {(e.status, e.raw_code) for e in errors} == {(422, "invalid_request")}
    assert all("$.steps" in e.detail and e.url.endswith("/work/start") for e in errors)


def _answering(status: int, body: bytes, media_type: str = "application/json") -> FastAPI:
    """A participant whose every work call is answered with ``status`` and ``body``."""
    app = FastAPI()

    @app.post("/work/{action}")
    async def work(action: str) -> Response:
        return Response(body, status_code=status, media_type=media_type)

    return app


async def _work_failure(
    tmp_path: Path, status: int, body: bytes, media_type: str = "application/json"
) -> ParticipantCallError:
    """Run one rollout on a participant that always answers ``status`` and ``body``; its error."""
    errors: list[BaseException] = []
    async with capture_events() as (bus, _), serving(_answering(status, body, media_type)) as url:
        tel = Telemetry(bus, kind="controller", instance="coordination")
        member = Member(name="model-0", kind="model", instance="model-0", url=url)
        async with Coordinator([member], token=TOKEN, telemetry=tel) as co:
            col = Collection(co, tmp_path / str(status), telemetry=tel, rollouts=1, steps=1)
            with anyio.fail_after(10):
                try:
                    await col.run()
                except* ParticipantCallError as group:
                    errors = list(_leaves(group))
    (error,) = errors
    assert isinstance(error, ParticipantCallError)
    return error


async def test_a_work_reply_that_does_not_decode_is_a_participant_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 409 whose body is not JSON was a JSONDecodeError traceback, a 200 that is not the reply
    an uncaught ``msgspec`` error, and a participant that kept admission closed a bare
    ``RuntimeError``: each is a ``ParticipantCallError`` naming the participant and what it said."""
    html = await _work_failure(tmp_path, 409, b"<html>Conflict</html>")
    assert (html.status, html.raw_code, html.detail) == (409, None, "<html>Conflict</html>")
    wrong = await _work_failure(tmp_path, 200, b'{"boundary": "x"}')
    assert wrong.status == 200 and wrong.detail.startswith("unexpected reply: Expected `int`")
    assert "it was" not in wrong.detail  # JSON, said as such: what did not fit is enough
    # A 200 that is no JSON at all (a proxy's sign-in page): what came back, not only "malformed".
    page = await _work_failure(tmp_path, 200, b"<html>sign in</html>", media_type="text/html")
    assert page.detail.endswith("; it was text/html: '<html>sign in</html>'"), page.detail
    monkeypatch.setattr(collection_module, "_MAX_REFUSALS", 3)  # 2,000 in a real run
    closed = b'{"error": {"code": "admission_closed", "detail": "a checkpoint is open"}}'
    refused = await _work_failure(tmp_path, 409, closed)
    assert (refused.status, refused.raw_code) == (409, "admission_closed")
    # Over however many seconds the three tries took (0 s on a quiet machine, 1 s on a loaded one).
    assert re.match(r"r00000 refused 3 times in a row over \d+ s, the last: a checkpoint", refused.detail)
    assert refused.url.endswith("/work/start")


def _refusing(target: str, operation: str = "retire", detail: str | None = None) -> FastAPI:
    """A proxy to the participant at ``target`` that refuses every ``operation`` (409), saying
    ``detail`` (``"<operation> broke"`` by default)."""
    app = FastAPI()
    forward_headers = ("authorization", "content-type", "traceparent")
    said = f"{operation} broke" if detail is None else detail

    @app.api_route("/{path:path}", methods=["GET", "POST"])
    async def forward(path: str, request: Request) -> Response:
        if path.endswith("/" + operation):
            refused = msgspec.json.encode({"error": {"code": "checkpoint_error", "detail": said}})
            return Response(refused, status_code=409, media_type="application/json")
        headers = {k: v for k, v in request.headers.items() if k in forward_headers}
        async with httpx.AsyncClient() as http:
            reply = await http.request(
                request.method, f"{target}/{path}", content=await request.body(), headers=headers
            )
        return Response(reply.content, status_code=reply.status_code, media_type="application/json")

    return app


async def test_a_restore_whose_fencing_fails_after_it_took_is_undone(tmp_path: Path) -> None:
    """The restore took everywhere, then the retire of the old attempts was refused by one member:
    everyone stayed restored (admission closed, attempt 1 live) until the leases ran out and the
    rollouts went on as attempt 0; it is undone as a failed restore is: everyone resumed, the
    rollouts restart past the retired attempts (2)."""
    async with capture_events() as (bus, _):
        async with collection(bus, tmp_path, rollouts=3, steps=40) as (col, _):
            _, checkpoint_id = await run_and(col, lambda: col.checkpoint(stop=True))
        continued = msgspec.json.decode((tmp_path / checkpoint_id / "collection.json").read_bytes())[
            "continued"
        ]
        tel = Telemetry(bus, kind="controller", instance="coordination")
        async with (
            local_fleet(token=TOKEN, bus=bus, checkpoint_root=ROOT) as urls,
            serving(_refusing(urls["agent-0"])) as agent,
        ):
            members = [Member(name=n, kind=n.split("-")[0], instance=n, url=u) for n, u in urls.items()]
            members = [m if m.name != "agent-0" else msgspec.structs.replace(m, url=agent) for m in members]
            async with Coordinator(members, token=TOKEN, telemetry=tel) as co:
                again = Collection(co, tmp_path, telemetry=tel, rollouts=3, steps=40)
                with pytest.raises(CoordinationError, match="retire failed: agent-0"):
                    await again.restore(checkpoint_id)
                phases = {m.name: (await co.control.status(m.url)).phase.value for m in members}
    assert set(phases.values()) == {"idle"}
    assert continued and {again.rollouts[e["rollout_id"]].attempt for e in continued} == {2}


async def test_a_failed_restore_is_logged_escaped_and_redacted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A member refusing the restore's retire with a detail holding a clear screen, an OSC 8
    link, a bidi override and a token: ``run`` logs "restore of ... failed, restarting its
    rollouts" with the detail's controls as escapes and the token redacted (the detail was
    redacted but its 5 ESC and the U+202E reached the log raw)."""
    hostile = "no \x1b[2J\x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x1b\\ \u202eexe.gnp token=abc123"
    async with capture_events() as (bus, _):
        async with collection(bus, tmp_path, rollouts=3, steps=5) as (col, _):
            await run_and(col, lambda: col.checkpoint(stop=True))
        tel = Telemetry(bus, kind="controller", instance="coordination")
        async with (
            local_fleet(token=TOKEN, bus=bus, checkpoint_root=ROOT) as urls,
            serving(_refusing(urls["agent-0"], detail=hostile)) as agent,
        ):
            members = [Member(name=n, kind=n.split("-")[0], instance=n, url=u) for n, u in urls.items()]
            members = [m if m.name != "agent-0" else msgspec.structs.replace(m, url=agent) for m in members]
            async with Coordinator(members, token=TOKEN, telemetry=tel) as co:
                again = Collection(co, tmp_path, telemetry=tel, rollouts=3, steps=5)
                with anyio.fail_after(30):
                    summary = await again.run()
    assert summary.restored_from is None and summary.completed == 3
    (said,) = [r.getMessage() for r in caplog.records if "restarting its rollouts" in r.getMessage()]
    assert "retire failed: agent-0" in said and "abc123" not in said
    assert not any(char in said for char in "\x1b\u202e"), repr(said)
    assert r"no \x1b[2J\x1b]8;;https://evil.example" in said


async def test_a_worker_url_that_is_not_one_is_the_participant_s_error(tmp_path: Path) -> None:
    """A start reply naming a ``worker_url`` with a port past 65535: the next call went there and
    raised ``OverflowError`` out of the run, naming no participant; the reply is refused."""
    start = b'{"capture_key": "r00000", "boundary": 0, "worker_url": "http://127.0.0.1:99999"}'
    error = await _work_failure(tmp_path, 200, start)
    assert error.url.endswith("/work/start") and error.status == 200
    assert error.detail.startswith("unexpected reply: ") and error.detail.endswith("at $.worker_url")


async def test_a_checkpoint_published_then_refused_a_resume_is_published(tmp_path: Path) -> None:
    """Commit and publish went through (LATEST names the checkpoint, the next run restores it),
    then one member refused the resume: ``checkpoint()`` raised, the span said ``published=False``
    and the checkpoint was missing from ``checkpoints``; it is published, the refusal logged."""
    async with capture_events() as (bus, events):
        tel = Telemetry(bus, kind="controller", instance="coordination")
        async with (
            local_fleet(token=TOKEN, bus=bus, checkpoint_root=ROOT) as urls,
            serving(_refusing(urls["agent-0"], "resume")) as agent,
        ):
            members = [Member(name=n, kind=n.split("-")[0], instance=n, url=u) for n, u in urls.items()]
            members = [m if m.name != "agent-0" else msgspec.structs.replace(m, url=agent) for m in members]
            async with Coordinator(members, token=TOKEN, telemetry=tel) as co:
                col = Collection(co, tmp_path, telemetry=tel, rollouts=1, steps=1)
                checkpoint_id = await col.checkpoint()
    assert (tmp_path / "LATEST").read_text().strip() == checkpoint_id and col.checkpoints == [checkpoint_id]
    (span,) = [e for e in events if isinstance(e, CollectionFinished) and e.action == "checkpoint"]
    assert span.published is True
    resume = [e for e in events if isinstance(e, CoordinateFinished) and e.operation == "resume"]
    assert [e.outcome.value for e in resume] == ["error"]


async def test_a_collection_over_no_participants_is_refused(tmp_path: Path) -> None:
    """A coordinator built over no members (``Coordinator([])``): every rollout was reported
    ``completed`` without one call, and a checkpoint of nothing was published; it is refused."""
    tel = Telemetry(None, kind="controller", instance="coordination")
    async with Coordinator([], token="t", telemetry=tel) as co:
        with pytest.raises(InvalidValueError, match="no participants"):
            Collection(co, tmp_path / "run", telemetry=tel, rollouts=5, steps=3)
    assert not (tmp_path / "run").exists()


async def test_an_aborted_checkpoint_leaves_no_directory(tmp_path: Path) -> None:
    """One member refused the commit: the records the others wrote (``<id>/gym/...``) stayed in
    the run directory for ever, never pruned (no ``collection.json``), so a fleet that aborts often
    filled its disk. They are removed; the published checkpoint is not, and a restore of an
    aborted one is one line naming it."""
    async with capture_events() as (bus, events):
        tel = Telemetry(bus, kind="controller", instance="coordination")
        async with (
            local_fleet(token=TOKEN, bus=bus, checkpoint_root=ROOT) as urls,
            serving(_refusing(urls["agent-0"], "commit")) as agent,
        ):
            async with await Coordinator.discover(urls, token=TOKEN, telemetry=tel) as co:
                published = await Collection(co, tmp_path, telemetry=tel, rollouts=1, steps=1).checkpoint()
            members = [Member(name=n, kind=n.split("-")[0], instance=n, url=u) for n, u in urls.items()]
            members = [m if m.name != "agent-0" else msgspec.structs.replace(m, url=agent) for m in members]
            async with Coordinator(members, token=TOKEN, telemetry=tel) as co:
                col = Collection(co, tmp_path, telemetry=tel, rollouts=1, steps=1)
                for _ in range(3):
                    with pytest.raises(CoordinationError, match="commit"):
                        await col.checkpoint()
                assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == [published]
                assert (tmp_path / published / "collection.json").is_file()
                (aborted, *_) = [
                    e.checkpoint_id
                    for e in events
                    if isinstance(e, CollectionFinished) and e.action == "checkpoint" and not e.published
                ]
                with pytest.raises(InvalidCheckpointError) as info:
                    await col.restore(aborted)
                assert str(info.value).startswith(f"no checkpoint {aborted} in {tmp_path} "), info.value
                assert str(info.value).endswith(f"restore a published one (the latest is {published})")
    assert (tmp_path / "LATEST").read_text().strip() == published


async def test_a_publish_that_fails_aborts_the_checkpoint_not_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run directory's disk full at ``LATEST`` (an injected ENOSPC at ``os.replace``: no
    unprivileged way fills a disk there only): the ``OSError`` escaped the periodic checkpoint
    and ended the whole run, and the checkpoint's directory (the participants' records and its
    ``collection.json``) stayed. Now each such checkpoint is aborted and removed, logged, and
    the rollouts finish."""
    real_replace = os.replace

    def replace(src: Any, dst: Any, **kwargs: Any) -> None:
        if dst == "LATEST":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_replace(src, dst, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    async with (
        capture_events() as (bus, events),
        collection(bus, tmp_path, checkpoint_every_s=0.05) as (col, _),
    ):
        with anyio.fail_after(30):
            summary = await col.run()
    assert summary.completed == 6 and summary.checkpoints == []
    tried = [e for e in events if isinstance(e, CollectionFinished) and e.action == "checkpoint"]
    assert tried and not any(e.published for e in tried)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["LOCK"]
