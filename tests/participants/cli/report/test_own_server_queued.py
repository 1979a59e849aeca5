"""``ckpt-events report`` says how long a request waited in a user's own server before its
operation began (``received_ns`` to start), when no controller's call in the logs frames it: the
operation is the root of its trace (no caller) or its caller's log was not given. A real FastAPI
app, a slow middleware ahead of the handler, served under httpx's ASGI transport, writing a real
JSON-lines log."""

from __future__ import annotations

import re
from pathlib import Path

import anyio
import httpx
import pytest
from fastapi import FastAPI, Request

from ckpt_events import OperationFinished
from ckpt_events.participants.cli.main import main
from ckpt_events.participants.cli.report.attribution import attribute
from ckpt_events.participants.cli.report.model import Span, drawn_extent
from ckpt_events.participants.fastapi import instrument, operation
from ckpt_events.sinks import read_events
from tests.participants.cli.report.own_server import CALLER, client_of, figures, held_restore_app

#: What the middleware holds each request before the handler runs (seconds).
_HELD = 0.1


async def _serve(log: Path, headers: dict[str, str]) -> None:
    async with client_of(held_restore_app(log, held=_HELD)) as client:
        reply = await client.post("/checkpoint/restore", json={"ms": 10}, headers=headers)
        assert reply.status_code == 200


@pytest.mark.parametrize("headers", [{}, {"traceparent": CALLER}], ids=["root", "caller-not-in-logs"])
def test_a_request_that_waited_before_its_operation_shows_its_wait(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], headers: dict[str, str]
) -> None:
    """A restore held 100 ms by a middleware: the report said ``11.2 ms total, 11.2 ms in
    participants' handlers`` and drew no wait, as if it never queued. Its line now gives the
    wait (``queued``) in a total from the request's arrival, the waterfall shades it ``▒`` and
    the HTML page draws it as a ``queued in participant`` segment, as under a controller's call."""
    log = tmp_path / "events.jsonl"
    anyio.run(_serve, log, headers)
    (restore,) = [e for _, e in read_events(log) if isinstance(e, OperationFinished)]
    assert restore.received_ns is not None
    waited = (restore.start_ns - restore.received_ns) / 1e6
    ran = (restore.end_ns - restore.start_ns) / 1e6
    assert waited >= _HELD * 1000
    page = tmp_path / "x.html"
    assert main(["report", str(log), "--report", str(page)]) == 0
    out = capsys.readouterr().out
    (line,) = [r for r in out.splitlines() if " total, " in r]
    assert figures(line) == [
        pytest.approx(waited + ran, abs=0.1),
        pytest.approx(ran, abs=0.05),
        pytest.approx(waited, abs=0.05),
    ]
    assert " queued " in line
    (title,) = [r for r in out.splitlines() if "waterfall (" in r]
    assert figures(title) == [pytest.approx(waited + ran, abs=0.1)]
    (row,) = [r for r in out.splitlines() if r.lstrip().startswith("restore judge-0")]
    bar = row.split(maxsplit=3)[3]
    # The wait is most of the drawn time, shaded before the handler's bar.
    assert bar.lstrip().startswith("▒") and bar.count("▒") > 3 * bar.count("█") > 0
    html = page.read_text()
    (queued,) = re.findall(r"<title>queued in participant: ([\d.]+) ms</title>", html)
    assert float(queued) == pytest.approx(waited, abs=0.01)


def test_an_operation_of_unknown_wait_says_no_wait() -> None:
    """A participant's root operation with no ``received_ns`` (its wait unknown: begun after
    another of its request) is given no queued time, never 0, and is drawn from its start."""
    start = 1_764_000_000_000_000_000
    root = Span("gym.checkpoint.restore", "judge/judge-0", start, start + 5_000_000, 0, False, span_id=1)
    attribution = attribute([root])
    assert attribution is not None and not attribution.coordinated
    assert attribution.total_ms == attribution.handlers_ms == 5.0
    assert "queued" not in attribution.line() and "queued in participants" not in attribution.parts
    assert drawn_extent([root]) == (start, start + 5_000_000)


def _caller(log: Path, store: FastAPI, *, from_step: bool) -> FastAPI:
    """A judge whose restore calls ``store``'s restore with its step's (or operation's)
    ``traceparent``: the store's operation is a participant's child, no controller's call."""
    app = FastAPI()
    instrument(app, kind="judge", instance="judge-0", jsonl_path=str(log))

    async def call(traceparent: str | None) -> None:
        assert traceparent is not None
        transport = httpx.ASGITransport(app=store)
        async with httpx.AsyncClient(transport=transport, base_url="http://store") as client:
            reply = await client.post(
                "/checkpoint/restore", json={"ms": 10}, headers={"traceparent": traceparent}
            )
            assert reply.status_code == 200

    @app.post("/checkpoint/restore")
    async def restore(request: Request) -> dict[str, int]:
        with operation(request, "restore", checkpoint_id="c1") as op:
            with op.step("read") as step:
                await anyio.sleep(0.005)
                if from_step:
                    await call(step.traceparent())
            if not from_step:
                await call(op.traceparent())
        return {"records": 0}

    return app


@pytest.mark.parametrize("from_step", [False, True], ids=["operation-calls", "step-calls"])
def test_a_participant_called_by_a_participant_has_its_wait_drawn_and_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], from_step: bool
) -> None:
    """A judge's restore calls a store held 100 ms by a middleware, both logs given: the line said
    ``queued`` for the store's wait but its row drew no ``▒`` (only a controller's call drew one),
    nor the page a segment; called from the judge's step, the wait was not even counted (``47.3 ms
    in participants' handlers, 6.5 ms queued``: the step's). It is now counted, shaded before the
    store's bar and drawn as a ``queued in participant`` segment, as under a controller's call."""
    judge_log, store_log = tmp_path / "judge.jsonl", tmp_path / "store.jsonl"
    store = held_restore_app(store_log, held=_HELD, kind="store")
    judge = _caller(judge_log, store, from_step=from_step)

    async def serve() -> None:
        async with store.router.lifespan_context(store), client_of(judge) as client:
            assert (await client.post("/checkpoint/restore")).status_code == 200

    anyio.run(serve)
    ops = {e.kind: e for _, e in read_events(store_log) if isinstance(e, OperationFinished)}
    ops |= {e.kind: e for _, e in read_events(judge_log) if isinstance(e, OperationFinished)}
    waits = {kind: (e.start_ns - e.received_ns) / 1e6 for kind, e in ops.items() if e.received_ns is not None}
    assert waits["store"] >= _HELD * 1000
    page = tmp_path / "x.html"
    assert main(["report", str(judge_log), str(store_log), "--report", str(page)]) == 0
    out = capsys.readouterr().out
    (line,) = [r for r in out.splitlines() if " total, " in r]
    total, handlers, queued = figures(line)
    assert queued == pytest.approx(sum(waits.values()), abs=0.1)
    assert total == pytest.approx(handlers + queued, abs=0.15 + 1e-9)  # three figures rounded to 0.1 ms
    (row,) = [r for r in out.splitlines() if r.lstrip().startswith("restore store-0")]
    bar = row.split(maxsplit=3)[3]
    # The store's wait, most of the drawn time, shaded on its own row right before its bar.
    assert bar.count("▒") > 3 * bar.count("█") > 0
    assert re.fullmatch(r"\s*▒+█+\s*", bar)
    segments = [
        float(ms) for ms in re.findall(r"<title>queued in participant: ([\d.]+) ms</title>", page.read_text())
    ]
    assert pytest.approx(waits["store"], abs=0.01) in segments
    assert sum(segments) == pytest.approx(queued, abs=0.1)
