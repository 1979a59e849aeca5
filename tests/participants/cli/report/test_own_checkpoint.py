"""``ckpt-events report LOG --checkpoint ID`` on the log of a user's own server (no controller): a
checkpoint there is several requests, each its own trace, and every one of them is drawn."""

from __future__ import annotations

import re
from pathlib import Path

import anyio
import pytest
from fastapi import FastAPI, Request

from ckpt_events import Bus, OperationFinished, OperationStarted, Telemetry
from ckpt_events.participants.cli.main import main
from ckpt_events.participants.cli.report.logs import LogProblems, merged_events
from ckpt_events.participants.cli.report.named import DRAWN_TRACES, NamedTraces
from ckpt_events.participants.cli.report.overview import overview
from ckpt_events.participants.fastapi import instrument, operation
from ckpt_events.sinks import JsonLinesSink
from tests.participants.cli.report.own_server import client_of

#: c1's prepare, its commit that fails, the commit retried, its restore; c2's between them.
_CALLS = (
    ("prepare", "c1"),
    ("prepare", "c2"),
    ("commit", "c1"),
    ("commit", "c2"),
    ("commit", "c1"),
    ("restore", "c2"),
    ("restore", "c1"),
)


def _serve(log: Path) -> None:
    """A user's own FastAPI app (the README's ``instrument``), the calls above through httpx."""
    app = FastAPI()
    instrument(app, kind="judge", instance="judge-0", jsonl_path=str(log))
    failed: list[str] = []

    @app.post("/{name}")
    async def handle(request: Request, name: str, checkpoint_id: str) -> dict[str, str]:
        with operation(request, name, checkpoint_id=checkpoint_id) as op, op.step("work"):
            if name == "commit" and checkpoint_id == "c1" and not failed:
                failed.append(name)
                raise ConnectionError("store down")
        return {"ok": name}

    async def serve() -> None:
        async with client_of(app, raise_app_exceptions=False) as client:
            for name, checkpoint_id in _CALLS:
                await client.post(f"/{name}", params={"checkpoint_id": checkpoint_id})

    anyio.run(serve)


def test_each_request_of_a_checkpoint_is_drawn_in_time_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """c1 was a prepare, a commit that raised ConnectionError, its retry and a restore, with c2's
    requests between them: ``--checkpoint c1`` drew the restore alone (one request of four). It
    now draws the four in time order, each a line (operation, outcome with error type, total,
    handlers, queued) and a waterfall, none of c2's; the HTML page has the same four sections."""
    log = tmp_path / "events.jsonl"
    _serve(log)
    assert main(["report", str(log), "--checkpoint", "c1", "--report", str(tmp_path / "c1.html")]) == 0
    out = capsys.readouterr().out
    lines = [x for x in out.splitlines() if x.startswith("#") and " total, " in x]
    said = [re.sub(r":.*", "", x) for x in lines]
    assert said == [
        "#1 prepare judge-0 ok",
        "#2 commit judge-0 ✗ ConnectionError",
        "#3 commit judge-0 ok",
        "#4 restore judge-0 ok",
    ], out
    assert all("in participants' handlers" in x for x in lines), lines
    # The excerpt docs/reading-a-trace.md shows is this run's (its figures are one machine's).
    doc = (Path(__file__).parents[4] / "docs" / "reading-a-trace.md").read_text()
    excerpt = doc.split("c1: 4 requests, each its own trace, in time order\n")[1].split("```")[0]
    assert [x.split(":")[0] for x in excerpt.splitlines()] == said, excerpt
    assert "c1: 4 requests, each its own trace, in time order" in out
    assert [x.split(":")[0] for x in out.splitlines() if ": waterfall (" in x] == [
        "#1 prepare c1",
        "#2 commit c1",
        "#3 commit c1",
        "#4 restore c1",
    ], out
    assert "c2" not in out.split("per operation and step")[1], out
    page = (tmp_path / "c1.html").read_text()
    headings = re.findall(r'<section id="trace-\d+"><h2>([^<]*)</h2>', page)
    assert headings == [x for x in said], page
    assert page.count("<svg") == 4


async def _retries(log: Path, n: int) -> None:
    """``n`` commits of c1 (each its own trace), one of c2 after every 100th."""
    async with Bus() as bus:
        bus.subscribe(JsonLinesSink(log))
        tel = Telemetry(bus, kind="judge", instance="judge-0")
        for i in range(n):
            with tel.operation("commit", checkpoint_id="c1") as op, op.step("upload"):
                pass
            if i % 100 == 0:
                with tel.operation("commit", checkpoint_id="c2"):
                    pass
                await bus.flush()  # the sink's buffer bounded: none dropped however long the run


def test_past_the_bound_the_most_recent_are_drawn_and_the_earlier_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """3,000 commits of c1: the 8 most recent are drawn (#2993 to #3000) and the 2,992 before
    them said in one line, only those 8 traces' events held (4 each), never the 12,000 of c1."""
    log = tmp_path / "events.jsonl"
    anyio.run(_retries, log, 3_000)
    run = overview(merged_events([log], LogProblems()), again=lambda: merged_events([log], LogProblems()))
    whole = run.whole("c1")
    assert (len(whole.named), whole.earlier) == (DRAWN_TRACES, 3_000 - DRAWN_TRACES)
    assert [len(events) for events in whole.named] == [4] * DRAWN_TRACES
    assert whole.events is whole.named[-1]
    assert main(["report", str(log), "--checkpoint", "c1"]) == 0
    out = capsys.readouterr().out
    assert "+2,992 earlier traces of c1 not drawn" in out, out
    numbers = re.findall(r"^#(\d+) commit judge-0 ok: ", out, flags=re.M)
    assert numbers == [str(n) for n in range(2_993, 3_001)], out


def test_a_long_request_seen_again_after_newer_ones_is_counted_once() -> None:
    """A commit whose start was let go past the bound, its end read after 8 newer requests of
    the id began, is the same trace: counted once among the earlier, not drawn as a ninth."""
    seen = NamedTraces("c1", limit=2)
    started = [
        OperationStarted(
            kind="judge",
            instance="j",
            trace_id=t,
            span_id=t,
            start_ns=t * 10,
            operation="commit",
            checkpoint_id="c1",
        )
        for t in (1, 2, 3)
    ]
    for e in started:
        seen.see(e)
    long = OperationFinished(
        kind="judge",
        instance="j",
        trace_id=1,
        span_id=1,
        start_ns=10,
        end_ns=100,
        operation="commit",
        checkpoint_id="c1",
        outcome="ok",
    )
    seen.see(long)
    assert (seen.order(), seen.earlier) == ([2, 3], 1)


def test_an_svg_of_a_checkpoint_says_which_of_its_requests_it_draws(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An SVG is one waterfall: of c1's four requests it draws the last, and said 'SVG waterfall
    of the checkpoint', titled 'report of events.jsonl' alone. It now names the request drawn,
    on the command line and in the picture's title, and says the page draws each."""
    log = tmp_path / "events.jsonl"
    _serve(log)
    svg = tmp_path / "c1.svg"
    assert main(["report", str(log), "--checkpoint", "c1", "--report", str(svg)]) == 0
    written = capsys.readouterr().out.splitlines()[-1]
    assert written == (
        f"report written to {svg} (SVG waterfall of the last of c1's 4 requests, "
        "#4 restore judge-0 ok; an .html page draws the last 4)"
    ), written
    assert ">report of events.jsonl: #4 restore judge-0 ok (" in svg.read_text()


def test_an_svg_of_logs_without_a_checkpoint_says_it_draws_their_last_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without ``--checkpoint``, a controller-less log's SVG is its last trace: it said 'SVG
    waterfall of the checkpoint' of logs that name none."""
    log = tmp_path / "events.jsonl"
    _serve(log)
    svg = tmp_path / "last.svg"
    assert main(["report", str(log), "--report", str(svg)]) == 0
    written = capsys.readouterr().out.splitlines()[-1]
    assert written == (
        f"report written to {svg} (SVG waterfall of the logs' last trace: no controller's checkpoint "
        "in them to draw)"
    ), written
    assert svg.read_text().startswith("<svg")


def test_own_requests_beside_a_controllers_log_are_drawn_not_denied(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A controller's log given with one's own server's: ``--checkpoint c1``, an id of the own
    server's four requests, read 'no checkpoint 'c1' in the logs', exit 2. The four are drawn as on
    the own log alone, and said so; an id in neither log is still that one line."""
    log = tmp_path / "events.jsonl"
    _serve(log)
    controller = Path(__file__).parent / "data" / "demo-fault-stall-checkpoint.jsonl"
    assert main(["report", str(controller), str(log), "--checkpoint", "c1"]) == 0
    captured = capsys.readouterr()
    said = [re.sub(r":.*", "", x) for x in captured.out.splitlines() if x.startswith("#") and " total, " in x]
    assert said == [
        "#1 prepare judge-0 ok",
        "#2 commit judge-0 ✗ ConnectionError",
        "#3 commit judge-0 ok",
        "#4 restore judge-0 ok",
    ], captured.out
    assert "'c1': no controller's checkpoint or restore in these logs has that id" in captured.err
    assert main(["report", str(controller), str(log), "--checkpoint", "c9"]) == 2
    assert capsys.readouterr().err.startswith("ckpt-events report: error: no checkpoint 'c9' in the logs")
