"""Hostile input to the control and work planes: body bounds, the work token, what counts as
served work, identical concurrent prepares, deadline bounds, the checkpoint root, error bodies."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import anyio
import httpx
import pytest

from ckpt_events import InvalidArgumentError
from ckpt_events.participants import create_app
from ckpt_events.participants.cli.main import main
from ckpt_events.participants.server.limits import ACCEPT_LOGGERS, log_resource_exhaustion_once
from tests.participants.helpers import AUTH, ROOT, TOKEN, control, error_code, post_json, running, status


def _app(kind: str = "resources", **options: object):
    return create_app(kind, instance=f"{kind}-0", token=TOKEN, checkpoint_root=ROOT, **options)


async def test_a_body_over_the_bound_is_413_with_the_error_body():
    """Declared or streamed, a body over max_body_bytes is 413 payload_too_large, before auth."""
    async with running(_app(max_body_bytes=1024)) as client:
        big = b"x" * 4096
        for path in ("/work/start", "/ng-control/v1/checkpoint/prepare"):
            reply = await client.post(path, content=big, headers={"authorization": ""})
            assert error_code(reply) == (413, "payload_too_large")

        async def chunks():
            for _ in range(64):
                yield b"y" * 512

        reply = await client.post("/work/start", content=chunks())
        assert error_code(reply) == (413, "payload_too_large") and "1024-byte" in reply.text
        ok = await client.post("/work/start", json={"rollout_id": "r1", "steps": 2})
        assert ok.status_code == 200


async def test_a_client_hanging_up_mid_body_ends_quietly():
    """A disconnect mid-body sends nothing and raises nothing (no traceback per disconnect)."""
    app = _app()
    messages = [
        {"type": "http.request", "body": b'{"rollout', "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent: list[dict] = []

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": "/work/start", "raw_path": b"/work/start", "query_string": b"",
        "root_path": "", "headers": [(b"authorization", AUTH["authorization"].encode())],
        "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2),
    }  # fmt: skip
    async with app.router.lifespan_context(app):
        await app(scope, receive, send)
    assert sent == []


async def test_the_work_plane_needs_the_token():
    """Work calls without the bearer token, or with a wrong one, are 401 unauthorized."""
    async with running(_app()) as client:
        body = {"rollout_id": "r1", "steps": 2}
        for headers in ({"authorization": ""}, {"authorization": "Bearer nope"}):
            assert error_code(await client.post("/work/start", json=body, headers=headers)) == (
                401,
                "unauthorized",
            )
            assert (await client.get("/work/r1", headers=headers)).status_code == 401
        assert (await status(client))["episodes"] == 0


async def test_only_well_formed_authenticated_work_counts_as_served(tmp_path):
    """Stray 401/404/405/422 work calls leave a participant fresh: its restore still succeeds."""
    async with running(_app()) as client:
        await client.post("/work/start", json={"rollout_id": "r1", "steps": 2})
        await control(client, "prepare")
        assert (await control(client, "commit", checkpoint_dir=str(tmp_path))).status_code == 200
    async with running(_app()) as fresh:
        strays = [
            await fresh.post(
                "/work/start", json={"rollout_id": "r2", "steps": 2}, headers={"authorization": ""}
            ),
            await fresh.get("/work/nothing"),
            await fresh.put("/work/start"),
            await fresh.post("/work/start", content=b"hello", headers={"content-type": "text/plain"}),
            await fresh.post("/work/advance", json={"rollout_id": "ghost"}),
        ]
        assert [r.status_code for r in strays] == [401, 404, 405, 422, 404]
        scope = [{"rollout_id": "r1"}]
        reply = await control(fresh, "restore", "rs1", checkpoint_dir=str(tmp_path), episode_ids=scope)
        assert reply.status_code == 200, reply.text


async def test_unknown_routes_and_methods_use_the_error_body():
    """404 and 405 answer {"error": {"code", "detail"}}, not FastAPI's {"detail"}."""
    async with running(_app()) as client:
        assert error_code(await client.get("/nope")) == (404, "not_found")
        assert error_code(await client.get("/ng-control/v1/checkpoint/prepare")) == (
            405,
            "method_not_allowed",
        )
        assert error_code(await client.delete("/work/start")) == (405, "method_not_allowed")


async def test_a_deadline_beyond_24_hours_is_refused():
    """deadline_ts 1e308 (or now + 25 h) is 422 invalid_request naming the bound; now + 1 h is fine."""
    async with running(_app()) as client:
        for deadline in (1e308, time.time() + 25 * 3600):
            reply = await client.post(
                "/ng-control/v1/checkpoint/prepare", json={"checkpoint_id": "c1", "deadline_ts": deadline}
            )
            assert error_code(reply) == (422, "invalid_request") and "24 h" in reply.text
        assert (await control(client, "prepare", seconds=3600)).status_code == 200


async def _prepare(client: httpx.AsyncClient, cid: str, replies: list[httpx.Response]) -> None:
    replies.append(await control(client, "prepare", cid))


@pytest.mark.slow
async def test_identical_concurrent_prepares_get_identical_answers():
    """Two identical prepares while an episode is mid-step answer the same, 20 runs of 20."""
    async with running(_app("environment", step_seconds=0.05)) as client:
        for run in range(20):
            rollout = f"r{run}"
            await client.post("/work/start", json={"rollout_id": rollout, "steps": 2})
            replies: list[httpx.Response] = []
            async with anyio.create_task_group() as tg:
                tg.start_soon(post_json, client, "/work/advance", {"rollout_id": rollout})
                await anyio.sleep(0.01)  # the step is running
                tg.start_soon(_prepare, client, f"c{run}", replies)
                tg.start_soon(_prepare, client, f"c{run}", replies)
            assert [r.status_code for r in replies] == [200, 200], [r.text for r in replies]
            assert replies[0].json() == replies[1].json()
            assert (await control(client, "resume", f"c{run}")).status_code == 200


@pytest.mark.parametrize("where", ["/etc", "../outside", "link/escape"])
async def test_checkpoint_dirs_outside_the_root_are_refused(tmp_path, where):
    """Absolute paths outside the root, '..' and symlinks that escape are 422 naming the root."""
    root = tmp_path / "root"
    (root / "link").mkdir(parents=True)
    (root / "link" / "escape").symlink_to(tmp_path)
    async with running(
        create_app("resources", instance="res-0", token=TOKEN, checkpoint_root=root)
    ) as client:
        await client.post("/work/start", json={"rollout_id": "r1", "steps": 2})
        await control(client, "prepare")
        reply = await control(client, "commit", checkpoint_dir=where)
        assert error_code(reply) == (422, "invalid_checkpoint_state")
        assert "outside this participant's checkpoint root" in reply.text or "'..'" in reply.text
        inside = await control(client, "commit", checkpoint_dir="run/c1")
        assert inside.status_code == 200 and (root / "run" / "c1" / "gym" / "resources" / "res-0").is_dir()
    assert not (tmp_path / "gym").exists()


def test_a_non_ascii_token_is_refused_at_start_up(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """create_app raises InvalidArgumentError; serve prints one line and exits 2."""
    with pytest.raises(InvalidArgumentError):
        create_app("resources", instance="res-0", token="tökén")
    token = tmp_path / "token"
    token.write_text("tökén\n")
    try:
        code = main(["serve", "resources", "--port", "1", "--token-file", str(token)])
    except SystemExit as exc:
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "ASCII" in err


def test_running_out_of_descriptors_is_logged_once(caplog: pytest.LogCaptureFixture):
    """Repeated "Too many open files" from accept() give one log line, without a traceback."""
    once = log_resource_exhaustion_once()
    try:
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            for _ in range(50):
                try:
                    raise OSError(24, "Too many open files")
                except OSError:
                    logging.getLogger("asyncio").exception("socket.accept() out of system resource")
        records = [r for r in caplog.records if "out of system resource" in r.getMessage()]
        assert len(records) == 1 and records[0].exc_info is None
    finally:
        for name in ACCEPT_LOGGERS:
            logging.getLogger(name).removeFilter(once)


def test_a_token_file_of_two_lines_is_refused_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A token file holding two lines read "must be printable ASCII" alone: which file, and why
    (a line break), were left to guess."""
    token = tmp_path / "token"
    token.write_text("first-token\nsecond-token\n")
    try:
        code = main(["serve", "resources", "--port", "0", "--token-file", str(token)])
    except SystemExit as exc:
        code = int(exc.code or 0)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert str(token) in err and "line break" in err and "one line" in err, err
