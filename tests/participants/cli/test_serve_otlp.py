"""``serve`` with an OTLP endpoint (a real rotel): the spans it holds when SIGTERM comes are
exported before it exits."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import anyio
import pytest

from ckpt_events.benchmarks.rotel_spans import received_spans
from ckpt_events.participants.cli.fleet import ServerProcess, write_token_file
from ckpt_events.participants.controller.client import ControlClient
from ckpt_events.participants.protocol import PrepareReply, PrepareRequest, ResumeReply, ResumeRequest
from tests.sinks.otlp.test_collector import _wait_for, collector

__all__ = ["collector"]

pytestmark = [pytest.mark.collector, pytest.mark.e2e]

TOKEN = "serve-otlp-token"
ROUNDS = 4


def test_spans_held_at_sigterm_reach_the_collector(collector: tuple[str, Path], tmp_path: Path) -> None:
    """Eight operations back to back under a 60 s batch linger (past the prompt exports' burst,
    the last wait their turn), then SIGTERM at once: the collector holds all eight."""
    endpoint, out = collector
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_SERVICE_NAME": "ckpt-serve-sigterm",
        "OTEL_BSP_SCHEDULE_DELAY": "60000",
    }
    token_file = write_token_file(tmp_path / "token", TOKEN)
    server = ServerProcess(
        "resources", instance="resources-0", token_file=token_file, log_dir=tmp_path / "logs", env=env
    )

    async def operate() -> None:
        await server.wait_listening()
        async with ControlClient(TOKEN) as control:
            for n in range(ROUNDS):
                deadline = time.time() + 10
                for operation, request, reply in (
                    ("prepare", PrepareRequest, PrepareReply),
                    ("resume", ResumeRequest, ResumeReply),
                ):
                    body = request(checkpoint_id=f"c-sigterm-{n}", deadline_ts=deadline)
                    await control.call(server.url, operation, body, reply, deadline_ts=deadline)
        server.send(signal.SIGTERM)

    try:
        anyio.run(operate)
        # uvicorn re-raises the signal once its graceful shutdown (our lifespan: the flush) is done.
        assert server.wait(15) in (0, -signal.SIGTERM)
    finally:
        server.terminate()
    text = _wait_for(out, [f"c-sigterm-{ROUNDS - 1}"])
    names = sorted(
        (s.attributes["nemo.gym.checkpoint.id"], s.name)
        for s in received_spans(text)
        if s.service == "ckpt-serve-sigterm" and "nemo.gym.checkpoint.id" in s.attributes
    )
    wanted = sorted(
        (f"c-sigterm-{n}", f"gym.checkpoint.{op}") for n in range(ROUNDS) for op in ("prepare", "resume")
    )
    assert names == wanted
