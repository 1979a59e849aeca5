"""``ckpt-events report`` on a trace with several top-level operations: requests to a user's own
server that came with one caller's ``traceparent``, the caller in no log given. The line explains
the time the waterfall draws (the first arrival to the last end), every millisecond once, the time
between the requests named as such. Real FastAPI apps under httpx's ASGI transport, writing real
JSON-lines logs."""

from __future__ import annotations

import dataclasses
import html
import json
import re
import time
from pathlib import Path

import anyio
import pytest
from fastapi import FastAPI, Request

from ckpt_events import Bus, OperationFinished, Telemetry
from ckpt_events.participants.cli.main import main
from ckpt_events.participants.cli.report.attribution import attribute
from ckpt_events.participants.cli.report.model import Span, drawn_extent
from ckpt_events.participants.fastapi import instrument, operation
from ckpt_events.sinks import read_events
from tests.participants.cli.report.own_server import CALLER, client_of, figures, held_restore_app


async def _serve(app: FastAPI, durations: list[int], *, overlap: bool) -> None:
    """One request per duration, all with ``CALLER``: together (each 5 ms after the last) or
    one after another (20 ms apart)."""
    async with client_of(app) as client:

        async def one(ms: int) -> None:
            headers = {"traceparent": CALLER}
            reply = await client.post("/checkpoint/restore", json={"ms": ms}, headers=headers)
            assert reply.status_code == 200

        async with anyio.create_task_group() as tg:
            for ms in durations:
                if overlap:
                    tg.start_soon(one, ms)
                    await anyio.sleep(0.005)
                else:
                    await one(ms)
                    await anyio.sleep(0.02)


def _report(logs: list[Path], page: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, str, str, str]:
    """The terminal's attribution line and waterfall title, the page's line and waterfall title."""
    assert main(["report", *map(str, logs), "--report", str(page)]) == 0
    out = capsys.readouterr().out
    (line,) = [r for r in out.splitlines() if " total, " in r]
    (title,) = [r for r in out.splitlines() if "waterfall (" in r]
    html = page.read_text()
    (page_line,) = re.findall(r'<p class="line"[^>]*>([^<]*)</p>', html)
    (page_title,) = re.findall(r'<text x="4" y="16"[^>]*>([^<]*)</text>', html)
    return line, title, page_line, page_title


@pytest.mark.parametrize(
    ("durations", "overlap", "held"),
    [([10, 20], False, 0.0), ([10, 20, 5], False, 0.02), ([30, 10, 20], True, 0.02)],
    ids=["two-one-after-another", "three-one-after-another-held", "three-together-held"],
)
def test_requests_sharing_a_caller_are_explained_over_what_the_waterfall_draws(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    durations: list[int],
    overlap: bool,
    held: float,
) -> None:
    """Two restores 20 ms apart under one caller read ``21.6 ms total`` (the longer one alone)
    over a ``waterfall (67.5 ms)``; three together, ``52.1 ms`` over ``53.9 ms``. The line's total
    is now the waterfall's, on the terminal and the page, from the first arrival to the last end,
    its parts adding up to it, the time between the requests said as such, never as a handler's."""
    log = tmp_path / "events.jsonl"
    anyio.run(lambda: _serve(held_restore_app(log, held=held), durations, overlap=overlap))
    ops = [e for _, e in read_events(log) if isinstance(e, OperationFinished)]
    assert len(ops) == len(durations) and len({e.trace_id for e in ops}) == 1
    first = min(e.start_ns if e.received_ns is None else e.received_ns for e in ops)
    drawn_ms = (max(e.end_ns for e in ops) - first) / 1e6
    line, title, page_line, page_title = _report([log], tmp_path / "x.html", capsys)
    total, handlers, *rest = figures(line)
    assert total == pytest.approx(drawn_ms, abs=0.05 + 1e-9)  # rounded to 0.1 ms
    assert figures(title) == figures(page_title) == [total]
    assert figures(page_line) == figures(line)
    # Each figure rounded to 0.1 ms: at most 0.05 off each, the total's too.
    assert total == pytest.approx(handlers + sum(rest), abs=0.05 * (len(rest) + 2) + 1e-9)
    assert f"({len(durations)} top-level operations of participants: " in line
    assert handlers >= max(durations)  # at least the longest handler ran all along
    if overlap:
        assert " between them" not in line  # one of them ran or waited all along
    else:
        # At least the pauses between one reply and the next request, never a handler's time.
        assert re.search(r", ([\d.]+) ms between them", line)
        between = float(re.findall(r", ([\d.]+) ms between them", line)[0])
        assert between >= 20 * (len(durations) - 1) - 0.5
        assert handlers < total - between + 0.05


def test_another_process_s_wait_under_one_of_several_requests_is_queued(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two requests to a judge that each call a store held 30 ms, both logs given: the line read
    one request's ``49.7 ms total`` over a ``waterfall (119.8 ms)``. It now explains the drawn
    time, the store's waits queued (as under one request), the pause between them named."""
    judge_log, store_log = tmp_path / "judge.jsonl", tmp_path / "store.jsonl"
    store = held_restore_app(store_log, held=0.03, kind="store")
    judge = held_restore_app(judge_log, held=0.0, downstream=store)

    async def both() -> None:
        async with store.router.lifespan_context(store):
            await _serve(judge, [5, 5], overlap=False)

    anyio.run(both)
    line, title, page_line, page_title = _report([judge_log, store_log], tmp_path / "x.html", capsys)
    total, handlers, queued, between = figures(line)
    assert figures(title) == figures(page_title) == [total]
    assert figures(page_line) == figures(line)
    assert queued >= 2 * 30 - 0.5  # each store request's wait behind its middleware
    assert between >= 20 - 0.5
    assert total == pytest.approx(handlers + queued + between, abs=0.2 + 1e-9)  # four rounded to 0.1 ms


def _root(start_ms: float, end_ms: float, span_id: int, *, arrived_ms: float | None = None) -> Span:
    at = 1_764_000_000_000_000_000
    received = None if arrived_ms is None else at + int(arrived_ms * 1e6)
    return Span(
        "gym.checkpoint.restore",
        "judge/judge-0",
        at + int(start_ms * 1e6),
        at + int(end_ms * 1e6),
        0,
        False,
        span_id=span_id,
        received_ns=received,
    )


def test_a_handler_running_wins_over_another_request_s_wait() -> None:
    """Two overlapping requests: while one's handler runs the other waits: handler time, once;
    the instants before the first handler began are queued; a single root is swept as before."""
    a = _root(10, 40, 1, arrived_ms=0)  # waited 0-10, ran 10-40
    b = _root(30, 50, 2, arrived_ms=5)  # waited 5-30 (the handler of a ran 10-30), ran 30-50
    attribution = attribute([a, b])
    assert attribution is not None
    assert (attribution.total_ms, attribution.handlers_ms, attribution.transit_ms) == (50.0, 40.0, 10.0)
    assert attribution.between_ms == 0.0 and attribution.roots == 2
    assert drawn_extent([a, b]) == (a.received_ns, b.end_ns)
    alone = attribute([a])
    assert alone is not None and (alone.total_ms, alone.handlers_ms, alone.roots) == (40.0, 30.0, 1)


def _clock_apart(log: Path, out: Path, skew_ms: int) -> None:
    """``log`` as its process would have written it with its wall clock ``skew_ms`` apart."""
    with out.open("w") as f:
        for line in log.read_text().splitlines():
            event = json.loads(line)
            for key in ("start_ns", "end_ns", "received_ns", "time_ns"):
                if event.get(key) is not None:
                    event[key] += skew_ms * 1_000_000
            f.write(json.dumps(event) + "\n")


def test_a_called_participant_on_a_clock_apart_leaves_where_the_time_went_unknown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A judge's restore calls a store held 30 ms by a middleware, the store's clock 50 ms behind
    or ahead of the judge's (no controller's call aligns them): the line read '41.7 ms in
    participants' handlers, 3.1 ms queued', the store's wait said as the judge's handler. Its
    operation sits outside the restore that called it: where the time went is unknown, said as
    such; on one clock, its wait is queued as before."""
    judge_log, store_log = tmp_path / "judge.jsonl", tmp_path / "store.jsonl"
    store = held_restore_app(store_log, held=0.03, kind="store")
    judge = held_restore_app(judge_log, held=0.0, downstream=store)

    async def both() -> None:
        async with store.router.lifespan_context(store):
            await _serve(judge, [5], overlap=False)

    anyio.run(both)
    lines = {}
    for skew_ms in (0, -50, 50):
        apart = tmp_path / f"store{skew_ms}.jsonl"
        _clock_apart(store_log, apart, skew_ms)
        page = tmp_path / f"{skew_ms}.html"
        assert main(["report", str(judge_log), str(apart), "--report", str(page)]) == 0
        out = " ".join(capsys.readouterr().out.split())  # the terminal wraps a long line
        (lines[skew_ms],) = re.findall(r'<p class="line"[^>]*>([^<]*)</p>', page.read_text())
        lines[skew_ms] = html.unescape(lines[skew_ms])
        assert f"restore c1 (restore): {lines[skew_ms]}" in out  # the terminal says the same
    total, handlers, queued = figures(lines[0])
    assert queued >= 30 - 0.5 and total == pytest.approx(
        handlers + queued, abs=0.15 + 1e-9
    )  # three rounded to 0.1
    for skew_ms in (-50, 50):
        line = lines[skew_ms]
        assert f"{total} ms total; where it went unknown: store/store-0's restore sits " in line
        assert "outside judge/judge-0's restore that called it (the two processes' clocks apart" in line
        assert "handlers" not in line and "queued" not in line


def test_a_root_of_unknown_duration_has_no_total(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A judge's restore whose clock stepped back 50 ms while it ran (its duration unknown, drawn
    ``?``) read '0 ms total, 0 ms in participants' handlers' beside its waterfall's 5.5 ms: its
    total is now unknown, said with why, on the terminal and the page."""
    log = tmp_path / "judge.jsonl"
    back = [0]
    app = FastAPI()
    clock = Telemetry(Bus(), kind="judge", instance="judge-0", clock=lambda: time.time_ns() - back[0])
    instrument(app, telemetry=clock, jsonl_path=str(log))

    @app.post("/checkpoint/restore")
    async def restore(request: Request) -> dict[str, int]:
        with operation(request, "restore", checkpoint_id="c1") as op:
            with op.step("read"):
                await anyio.sleep(0.005)
            back[0] = 50_000_000  # an NTP step back while the restore runs
        return {"records": 0}

    anyio.run(lambda: _serve(app, [5], overlap=False))
    page = tmp_path / "x.html"
    assert main(["report", str(log), "--report", str(page)]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the terminal wraps a long line
    said = "total unknown: judge/judge-0's restore: its duration unknown (its clock went back during it)"
    assert f"restore c1 (restore): {said}" in out
    assert re.findall(r'<p class="line"[^>]*>([^<]*)</p>', page.read_text()) == [html.escape(said)]
    assert " 0 ms total" not in out


def test_a_caller_of_unknown_duration_bounds_no_end() -> None:
    """A store called by a judge's step whose clock went back (its end is its start): the store
    ending after it is no sign of clocks apart; one that arrived before the step began is."""
    at = 1_764_000_000_000_000_000
    judge = _root(0, 100, 1)
    step = dataclasses.replace(
        _root(10, 10, 2), name="gym.checkpoint.read", depth=1, parent_span_id=1, known=False
    )
    store = dataclasses.replace(
        _root(50, 60, 3, arrived_ms=20), who="store/store-0", depth=2, parent_span_id=2
    )
    attribution = attribute([judge, step, store])
    assert attribution is not None and attribution.unknown is None
    early = dataclasses.replace(store, received_ns=at + 5_000_000)
    attribution = attribute([judge, step, early])
    assert attribution is not None and attribution.unknown is not None
    assert attribution.unknown.startswith("store/store-0's restore sits 5.0 ms outside judge/judge-0's read")
