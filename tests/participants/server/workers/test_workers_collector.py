"""One checkpoint of a 2-worker ``serve`` process reaches a real collector (rotel) as one trace.

The controller's spans come from this process; the participant's main process and each of
its two worker processes export their own spans over OTLP, configured from the environment.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from ckpt_events import Bus, Telemetry
from ckpt_events.participants.cli.fleet import ServerProcess, write_token_file
from ckpt_events.participants.protocol import CONTROL_PREFIX
from ckpt_events.sinks.otel import OtlpSpanSink
from ckpt_events.vocab import Attr
from tests.sinks.otlp.test_collector import _RECEIVE_SECONDS, collector

__all__ = ["collector"]

pytestmark = [pytest.mark.collector, pytest.mark.e2e, pytest.mark.slow]

TOKEN = "collector-workers-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}


def _all_spans(text: str) -> list[dict[str, str]]:
    """Every span in rotel's detailed debug log: its id fields and its text."""
    spans = []
    for chunk in text.split("Span #")[1:]:
        fields = {"text": chunk}
        for line in chunk.splitlines():
            name, colon, value = line.partition(":")
            if colon and name.strip() in ("Trace ID", "Parent ID", "ID", "Name"):
                fields.setdefault(name.strip(), value.strip())
        spans.append(fields)
    return spans


def _complete(spans: list[dict[str, str]], commit_hex: str) -> bool:
    """Every span the test checks has arrived: the controller's collection, the participant's
    prepare and commit (the commit under the controller's), and four shares per worker."""
    names = {s.get("Name") for s in spans}
    participant = [s for s in spans if f"-> {Attr.WORKER}:" not in s["text"]]
    commit_under = any(
        s.get("Name") == "gym.checkpoint.commit" and s.get("Parent ID") == commit_hex for s in participant
    )
    prepared = any(s.get("Name") == "gym.checkpoint.prepare" for s in participant)
    shares = [
        sum(f"-> {Attr.WORKER}: Int({worker})" in s["text"] for s in spans) for worker in (0, 1)
    ]  # prepare, commit and its export and write steps, per worker
    return "gym.checkpoint.collection.checkpoint" in names and commit_under and prepared and shares >= [4, 4]


def _wait_for_trace(out: Path, trace_hex: str, commit_hex: str) -> list[dict[str, str]]:
    """The spans of ``trace_hex`` in the collector's log, once all that ``_complete`` names are in
    (or after ``_RECEIVE_SECONDS``: the assertions then say what is missing)."""
    deadline = time.monotonic() + _RECEIVE_SECONDS
    while True:
        spans = [s for s in _all_spans(out.read_text(errors="replace")) if s.get("Trace ID") == trace_hex]
        if _complete(spans, commit_hex) or time.monotonic() > deadline:
            return spans
        time.sleep(0.1)


async def _checkpoint(url: str, tel: Telemetry, tmp_path: Path) -> tuple[str, str]:
    """Four sessions, then prepare and commit under one collection span; (trace hex, commit span hex)."""
    async with httpx.AsyncClient(base_url=url, timeout=20) as client:
        for i in range(4):
            reply = await client.post("/work/start", json={"rollout_id": f"r{i}", "steps": 2}, headers=AUTH)
            assert reply.status_code == 200, reply.text
        with tel.collection("checkpoint", checkpoint_id="c-w") as collection:
            for op, extra in (("prepare", {}), ("commit", {"checkpoint_dir": str(tmp_path / "ck")})):
                with tel.coordinate(op, checkpoint_id="c-w", parent=collection) as co:
                    body = {"checkpoint_id": "c-w", "deadline_ts": time.time() + 10, **extra}
                    headers = {**AUTH, "traceparent": co.traceparent() or ""}
                    reply = await client.post(f"{CONTROL_PREFIX}/{op}", json=body, headers=headers)
                    assert reply.status_code == 200, reply.text
                    if op == "commit":
                        commit_hex = f"{co.span_id:016x}"
            reply = await client.post(f"{CONTROL_PREFIX}/resume", json={"checkpoint_id": "c-w"}, headers=AUTH)
        return f"{collection.trace_id:032x}", commit_hex


async def test_a_two_worker_checkpoint_is_one_trace_with_a_span_per_worker(
    collector: tuple[str, Path], tmp_path: Path
) -> None:
    """Both workers' prepare and commit shares (export and write) arrive in the controller's
    trace, under the participant."""
    endpoint, out = collector
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_SERVICE_NAME": "ckpt-events-workers",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    server = ServerProcess(
        "environment",
        instance="environment-0",
        token_file=write_token_file(tmp_path / "token", TOKEN),
        log_dir=tmp_path / "logs",
        env=env,
        extra_args=["--workers", "2", "--checkpoint-root", str(tmp_path)],
    )
    try:
        await server.wait_listening(30)
        sink = OtlpSpanSink(endpoint, resource_attributes={"service.name": "controller"}, linger=0.05)
        async with Bus() as bus:
            bus.subscribe(sink)
            tel = Telemetry(bus, kind="controller", instance="coordination")
            trace_hex, commit_hex = await _checkpoint(server.url, tel, tmp_path)
        # One bounded wait on the whole trace: the controller, the main process and each worker
        # export on their own schedules, and a check on part of it raced the rest (on 2 cores
        # the main process's commit span came last 6 runs in 10).
        spans = _wait_for_trace(out, trace_hex, commit_hex)
    finally:
        server.terminate()
    shares = [s for s in spans if f"-> {Attr.WORKER}: Int(" in s["text"]]
    by_id = {s["ID"]: s for s in spans}
    [participant_commit] = [
        s for s in spans if s["Name"] == "gym.checkpoint.commit" and s["Parent ID"] == commit_hex
    ]
    for worker in (0, 1):
        mine = [s for s in shares if f"-> {Attr.WORKER}: Int({worker})" in s["text"]]
        names = sorted(s["Name"] for s in mine)
        # Each worker exports and writes its own records file.
        expected = [
            "gym.checkpoint.commit",
            "gym.checkpoint.export",
            "gym.checkpoint.prepare",
            "gym.checkpoint.write",
        ]
        assert names == expected, names
        [commit] = [s for s in mine if s["Name"] == "gym.checkpoint.commit"]
        assert commit["Parent ID"] == participant_commit["ID"]
        [prepare] = [s for s in mine if s["Name"] == "gym.checkpoint.prepare"]
        assert by_id[prepare["Parent ID"]]["Name"] == "gym.checkpoint.prepare"
        assert f"-> {Attr.WORKER}" not in by_id[prepare["Parent ID"]]["text"]
    assert "gym.checkpoint.collection.checkpoint" in {s["Name"] for s in spans}
