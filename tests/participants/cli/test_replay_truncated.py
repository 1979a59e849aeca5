"""Open work at a crash reaches the collector (rotel): ``replay`` of a log a SIGKILL cut
mid-commit, and ``serve`` started again on that log, each send the open commit as a truncated
span (status ERROR, ``nemo.gym.checkpoint.truncated``) of the checkpoint's trace."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from ckpt_events import Bus, Telemetry
from ckpt_events.benchmarks.rotel_spans import ReceivedSpan, received_spans
from ckpt_events.participants.cli.fleet import ServerProcess, write_token_file
from ckpt_events.participants.cli.main import main
from ckpt_events.participants.controller.client import ControlClient
from ckpt_events.participants.errors import ParticipantCallError
from ckpt_events.participants.faults import FAULT_ENV
from ckpt_events.participants.protocol import CommitReply, CommitRequest, PrepareReply, PrepareRequest
from ckpt_events.sinks.jsonl import read_events
from ckpt_events.testing import MemorySink
from ckpt_events.vocab import Attr
from tests.sinks.jsonl.test_open_spans import PARENT_HEX, TRACE_HEX, write_log_with_an_open_commit
from tests.sinks.otlp.test_collector import _wait_for, collector

__all__ = ["collector"]

pytestmark = pytest.mark.collector


def _truncated(text: str) -> dict[str, ReceivedSpan]:
    return {s.name: s for s in received_spans(text) if s.attributes.get(Attr.TRUNCATED) == "Bool(true)"}


def _check(spans: dict[str, ReceivedSpan], ids: dict[str, int], service: str) -> None:
    assert set(spans) == {"gym.checkpoint.commit", "gym.checkpoint.write"}, spans
    commit, write = spans["gym.checkpoint.commit"], spans["gym.checkpoint.write"]
    assert {commit.trace_id, write.trace_id} == {TRACE_HEX}
    assert (commit.span_id, commit.parent_id) == (f"{ids['commit']:016x}", PARENT_HEX)
    assert (write.span_id, write.parent_id) == (f"{ids['write']:016x}", f"{ids['commit']:016x}")
    assert {commit.status, write.status} == {"STATUS_CODE_ERROR"}
    assert commit.service == service and commit.attributes[Attr.ID] == "c-crash"


def test_replay_sends_the_open_commit_as_a_truncated_span(
    collector: tuple[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ckpt-events replay` of the cut log: the commit and its write are at the collector in the
    checkpoint's trace, under the controller's span, ERROR and truncated (before: nothing)."""
    endpoint, out = collector
    log = tmp_path / "resources-0.jsonl"
    ids = anyio.run(write_log_with_an_open_commit, log)
    assert main(["replay", str(log), "--otlp-endpoint", endpoint, "--service-name", "ckpt-replay"]) == 0
    assert "2 spans left open by a stopped process" in capsys.readouterr().out
    _wait_for(out, ["nemo.gym.checkpoint.truncated"])
    _check(_truncated(_wait_for(out, ["gym.checkpoint.write"])), ids, "ckpt-replay")


@pytest.mark.e2e
def test_serve_started_again_on_the_log_closes_its_predecessors_open_commit(
    collector: tuple[str, Path], tmp_path: Path
) -> None:
    """A real `serve resources` on the cut log: at start-up it exports the predecessor's open
    commit as truncated spans and appends their ends to the log, so it reads as finished."""
    endpoint, out = collector
    log = tmp_path / "resources-0.jsonl"
    ids = anyio.run(write_log_with_an_open_commit, log)
    lines_before = len(log.read_bytes().splitlines())
    env = {
        "CKPT_EVENTS_JSONL": str(log),
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_SERVICE_NAME": "ckpt-serve-again",
    }
    token_file = write_token_file(tmp_path / "token", "t0ken")
    server = ServerProcess(
        "resources", instance="resources-0", token_file=token_file, log_dir=tmp_path / "logs", env=env
    )
    try:
        anyio.run(server.wait_listening)
        text = _wait_for(out, ["nemo.gym.checkpoint.truncated", "gym.checkpoint.write"])
        _check(_truncated(text), ids, "ckpt-serve-again")
    finally:
        server.terminate()
    appended: list[Any] = [event for _, event in read_events(log)][lines_before:]
    ends = {(type(e).__name__, e.span_id) for e in appended}
    assert {("OperationFinished", ids["commit"]), ("StepFinished", ids["write"])} <= ends
    assert "closed as truncated" in server.stderr_path.read_text()


@pytest.mark.e2e
@pytest.mark.slow
def test_a_serve_killed_mid_commit_is_replayed_as_a_truncated_span_of_the_trace(
    collector: tuple[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real `serve resources` whose commit write is slowed (``slow`` fault) is SIGKILLed during
    it; its log holds `operation_started` and nothing more for the commit. `replay` then puts the
    commit and its write at the collector, ERROR and truncated, under the controller's span."""
    endpoint, out = collector
    log, root = tmp_path / "resources-0.jsonl", tmp_path / "run"
    root.mkdir()
    env = {"CKPT_EVENTS_JSONL": str(log), FAULT_ENV: "slow:resources-0:20000"}
    token_file = write_token_file(tmp_path / "token", "t0ken")
    server = ServerProcess(
        "resources",
        instance="resources-0",
        token_file=token_file,
        log_dir=tmp_path / "logs",
        env=env,
        extra_args=["--checkpoint-root", str(root)],
    )
    ids: dict[str, str] = {}

    def log_holds(needle: str) -> bool:
        return log.exists() and needle in log.read_text(errors="replace")

    async def commit_then_kill() -> None:
        await server.wait_listening()
        async with Bus() as bus, ControlClient("t0ken") as control:
            bus.subscribe(MemorySink())  # spans of the controller's own, so a traceparent is sent
            ctl = Telemetry(bus, kind="controller", instance="coordination")
            deadline = time.time() + 60
            prepare = PrepareRequest(checkpoint_id="c-kill", deadline_ts=deadline)
            await control.call(server.url, "prepare", prepare, PrepareReply, deadline_ts=deadline)
            commit = CommitRequest(
                checkpoint_id="c-kill", deadline_ts=deadline, checkpoint_dir=str(root / "c-kill")
            )
            with ctl.coordinate("commit", checkpoint_id="c-kill") as co:
                ids["trace"], ids["parent"] = f"{co.trace_id:032x}", f"{co.span_id:016x}"
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_call_until_killed, control, server.url, commit, co)
                    with anyio.fail_after(20):
                        while not log_holds('"step":"write"'):
                            await anyio.sleep(0.02)
                    server.kill()

    anyio.run(commit_then_kill)
    assert not log_holds('"type":"operation_finished","kind":"resources","instance":"resources-0","trace_id"'
                         f':"{ids["trace"]}"')  # fmt: skip
    assert main(["replay", str(log), "--otlp-endpoint", endpoint, "--service-name", "ckpt-killed"]) == 0
    assert "2 spans left open by a stopped process" in capsys.readouterr().out
    spans = _truncated(_wait_for(out, ["nemo.gym.checkpoint.truncated", "gym.checkpoint.write"]))
    assert set(spans) == {"gym.checkpoint.commit", "gym.checkpoint.write"}, spans
    commit, write = spans["gym.checkpoint.commit"], spans["gym.checkpoint.write"]
    assert {commit.trace_id, write.trace_id} == {ids["trace"]}
    assert (commit.parent_id, write.parent_id) == (ids["parent"], commit.span_id)
    assert {commit.status, write.status} == {"STATUS_CODE_ERROR"} and commit.service == "ckpt-killed"


async def _call_until_killed(control: ControlClient, url: str, commit: CommitRequest, span: Any) -> None:
    """The commit call, which the SIGKILL ends with a transport error."""
    with contextlib.suppress(httpx.TransportError, ParticipantCallError):
        await control.call(url, "commit", commit, CommitReply, deadline_ts=commit.deadline_ts, span=span)
