"""Each kind end to end: work, checkpoint, restore in a fresh app, continue as attempt + 1."""

from __future__ import annotations

import json

import pytest

from ckpt_events import OperationFinished, StepFinished
from ckpt_events.participants import create_app
from ckpt_events.participants.server.store import MANIFEST_NAME, participant_dir
from ckpt_events.testing import capture_events
from tests.participants.helpers import ROOT, TOKEN, control, error_code, run_episode, running, status

FAST = {
    "environment": {"step_seconds": 0.001},
    "agent": {"turn_seconds": 0.001},
    "resources": {"request_seconds": 0.0},
}
STEPS = 4


def make(kind, bus=None):
    return create_app(kind, instance=f"{kind}-0", token=TOKEN, bus=bus, checkpoint_root=ROOT, **FAST[kind])


async def view(client, key):
    reply = await client.get(f"/work/{key}")
    assert reply.status_code == 200, reply.text
    return reply.json()


@pytest.mark.parametrize("kind", sorted(FAST))
async def test_checkpoint_restore_and_continue(kind, tmp_path):
    """Work parks at a boundary, a fresh app restores it as attempt + 1 and finishes it."""
    async with running(make(kind)) as reference:
        for rollout in ("r1", "r2"):
            await reference.post("/work/start", json={"rollout_id": rollout, "steps": STEPS})
            await run_episode(reference, rollout)
        expected = {r: (await view(reference, r))["state"] for r in ("r1", "r2")}
    async with capture_events() as (bus, events):
        async with running(make(kind, bus)) as client:
            for rollout in ("r1", "r2"):
                started = await client.post("/work/start", json={"rollout_id": rollout, "steps": STEPS})
                assert started.json() == {"capture_key": rollout, "boundary": 0}
            await run_episode(client, "r1", until=2)
            await run_episode(client, "r2", until=1)
            assert (await control(client, "prepare")).json()["phase"] == "prepared"
            commit = await control(client, "commit", checkpoint_dir=str(tmp_path))
            assert commit.json()["episode_ids"] == ["r1", "r2"]
            await control(client, "resume")
        async with running(make(kind, bus)) as fresh:
            scope = [{"rollout_id": "r1", "attempt": 0}, {"rollout_id": "r2", "attempt": 0}]
            restore = await control(
                fresh, "restore", "restore-1", checkpoint_dir=str(tmp_path), episode_ids=scope
            )
            assert restore.json()["restored"] == ["r1-a1", "r2-a1"]
            late = await fresh.post("/work/advance", json={"rollout_id": "r1", "attempt": 0})
            assert error_code(late) == (409, "stale_attempt")
            assert error_code(await fresh.post("/work/advance", json={"rollout_id": "r1", "attempt": 1})) == (
                409,
                "admission_closed",
            )
            await control(fresh, "resume", "restore-1")
            assert (await view(fresh, "r1-a1"))["boundary"] == 2
            assert (await view(fresh, "r2-a1"))["boundary"] == 1
            for rollout in ("r1", "r2"):
                assert await run_episode(fresh, rollout, 1) == STEPS
                done = await view(fresh, f"{rollout}-a1")
                assert done["done"] is True and done["attempt"] == 1
                assert done["state"] == expected[rollout]
            # After an explicit retire of attempt 0, the fence holds too.
            await control(fresh, "retire", "cleanup", episode_ids=[{"rollout_id": "r1", "attempt": 0}])
            assert error_code(await fresh.post("/work/start", json={"rollout_id": "r1"})) == (
                409,
                "stale_attempt",
            )
    ops = {(e.operation.value, e.instance): e for e in events if isinstance(e, OperationFinished)}
    assert ops[("commit", f"{kind}-0")].records == 2 and ops[("commit", f"{kind}-0")].bytes > 0
    restore_op = ops[("restore", f"{kind}-0")]
    assert restore_op.records == 2 and restore_op.bytes == ops[("commit", f"{kind}-0")].bytes
    steps = {str(e.step): e for e in events if isinstance(e, StepFinished)}
    assert steps["read"].records == 2 and steps["install"].records == 2
    assert steps["read"].parent_span_id == steps["install"].parent_span_id == restore_op.span_id


@pytest.mark.parametrize("kind", sorted(FAST))
async def test_a_corrupt_checkpoint_installs_nothing(kind, tmp_path):
    """A restore from a corrupted directory is 422 and leaves the fresh participant untouched."""
    async with running(make(kind)) as client:
        await client.post("/work/start", json={"rollout_id": "r1", "steps": STEPS})
        await run_episode(client, "r1", until=1)
        await control(client, "prepare")
        manifest = (await control(client, "commit", checkpoint_dir=str(tmp_path))).json()["manifest"]
    records = participant_dir(tmp_path, kind, f"{kind}-0") / manifest["records_file"]
    records.write_bytes(records.read_bytes().replace(b'"boundary":1', b'"boundary":3'))
    async with running(make(kind)) as fresh:
        reply = await control(
            fresh, "restore", "rs", checkpoint_dir=str(tmp_path), episode_ids=[{"rollout_id": "r1"}]
        )
        assert error_code(reply) == (422, "invalid_checkpoint_state")
        assert "digest" in reply.json()["error"]["detail"]
        st = await status(fresh)
        assert st["phase"] == "idle" and st["episodes"] == 0 and st["admission_open"] is True
        assert (await fresh.get("/work/r1-a1")).status_code == 404


async def test_a_record_that_does_not_check_installs_nothing(tmp_path):
    """A well-formed checkpoint whose record contradicts itself is refused before installing."""
    async with running(make("environment")) as client:
        for rollout in ("a", "b"):
            await client.post("/work/start", json={"rollout_id": rollout, "steps": STEPS})
        await control(client, "prepare")
        await control(client, "commit", checkpoint_dir=str(tmp_path))
    directory = participant_dir(tmp_path, "environment", "environment-0")
    manifest = json.loads((directory / MANIFEST_NAME).read_text())
    lines = (directory / manifest["records_file"]).read_bytes().splitlines()
    lines[1] = lines[1].replace(b'"task_digest":"', b'"task_digest":"0')
    (directory / MANIFEST_NAME).unlink()
    from ckpt_events.participants.server.store import write_checkpoint

    write_checkpoint(tmp_path, kind="environment", instance="environment-0", checkpoint_id="c1", lines=lines)
    async with running(make("environment")) as fresh:
        scope = [{"rollout_id": "a"}, {"rollout_id": "b"}]
        reply = await control(fresh, "restore", "rs", checkpoint_dir=str(tmp_path), episode_ids=scope)
        assert (
            error_code(reply) == (422, "invalid_checkpoint_state")
            and "task_digest" in reply.json()["error"]["detail"]
        )
        assert (await status(fresh))["episodes"] == 0


async def test_restore_with_an_empty_scope_verifies_the_directory(tmp_path):
    """episode_ids may be empty: nothing is installed, but the directory is still verified."""
    async with running(make("agent")) as fresh:
        missing = await control(fresh, "restore", "rs", checkpoint_dir=str(tmp_path), episode_ids=[])
        assert error_code(missing) == (422, "invalid_checkpoint_state")
    async with running(make("agent")) as client:
        await control(client, "prepare")
        await control(client, "commit", checkpoint_dir=str(tmp_path))
    async with running(make("agent")) as fresh:
        reply = await control(fresh, "restore", "rs", checkpoint_dir=str(tmp_path), episode_ids=[])
        assert reply.json() == {"phase": "restored", "restored": [], "source_checkpoint_id": "c1"}


async def test_work_api_validates_its_bodies():
    """Work bodies are validated like control bodies; an unknown episode is 404."""
    async with running(make("resources")) as client:
        bad = await client.post("/work/start", json={"rollout_id": "r-a1"})
        assert error_code(bad) == (422, "invalid_request")
        assert error_code(await client.post("/work/start", json={"rollout_id": "r", "steps": 0})) == (
            422,
            "invalid_request",
        )
        assert error_code(await client.post("/work/advance", json={"rollout_id": "ghost"})) == (
            404,
            "not_found",
        )
        first = await client.post("/work/start", json={"rollout_id": "r", "steps": 2})
        again = await client.post("/work/start", json={"rollout_id": "r", "steps": 2})
        assert first.json() == again.json()
        assert await run_episode(client, "r") == 2
        assert (await client.post("/work/advance", json={"rollout_id": "r"})).json() == {
            "boundary": 2,
            "done": True,
        }


@pytest.mark.parametrize("path", ["/work/start", "/work/advance"])
async def test_work_without_a_rollout_id_is_400(path):
    """Work that names no rollout is 400 rollout_id_required."""
    async with running(make("agent")) as client:
        assert error_code(await client.post(path, json={"attempt": 0})) == (400, "rollout_id_required")
