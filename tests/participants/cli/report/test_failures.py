"""Why a span failed, said where the report names the failure: the exception's message under the
waterfall and in the HTML tooltip, once per message, clipped and inert. A real FastAPI app
under httpx's ASGI transport writes the log."""

from __future__ import annotations

import re
import time
from pathlib import Path

import anyio
import pytest
from fastapi import FastAPI, Request

from ckpt_events.participants.cli.main import main
from ckpt_events.participants.cli.report.failures import MESSAGE_SHOWN, failure_lines
from ckpt_events.participants.cli.report.model import Span
from ckpt_events.participants.fastapi import instrument, operation
from tests.participants.cli.report.own_server import client_of

BAD_ROWS = "bad rows: ['a', 'b'] at offset 3"
#: A message anyone could raise: terminal escapes (clear screen, window title), markup, newlines
#: and 10 KB of one token.
HOSTILE = "\x1b[2J\x1b]0;pwned\x07<script>alert(1)</script>\nsecond line\n" + "x" * 10_000


def _app(log: Path, message: str) -> FastAPI:
    app = FastAPI()
    instrument(app, kind="judge", instance="judge-0", jsonl_path=str(log))

    @app.post("/checkpoint/commit")
    async def commit(request: Request) -> dict[str, int]:
        body = await request.json()
        with operation(request, "commit", checkpoint_id=body["checkpoint_id"]) as op:
            with op.step("upload"):
                if body["fail"]:
                    raise ValueError(message)
        return {"records": 0}

    return app


def _log(tmp_path: Path, message: str) -> Path:
    """A log of one ok commit (``c1``) and three that raised ``ValueError(message)`` (``c2``)."""
    log = tmp_path / "events.jsonl"

    async def serve() -> None:
        async with client_of(_app(log, message), raise_app_exceptions=False) as client:
            assert (
                await client.post("/checkpoint/commit", json={"checkpoint_id": "c1", "fail": False})
            ).is_success
            for _ in range(3):
                reply = await client.post("/checkpoint/commit", json={"checkpoint_id": "c2", "fail": True})
                assert reply.status_code == 500

    anyio.run(serve)
    return log


def _report(log: Path, page: Path, capsys: pytest.CaptureFixture[str], checkpoint: str = "c2") -> str:
    assert main(["report", str(log), "--checkpoint", checkpoint, "--report", str(page)]) == 0
    return capsys.readouterr().out


def test_the_message_of_a_step_that_raised_is_said_once_under_its_waterfall_and_in_its_tooltip(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The exception left the step, then the operation: one line names its message and both,
    under each of the three requests' waterfalls (``--checkpoint`` draws every request of c2)."""
    page = tmp_path / "report.html"
    out = _report(_log(tmp_path, BAD_ROWS), page, capsys)
    line = f"✗ ValueError: {BAD_ROWS} (commit, upload of judge/judge-0)"
    assert [x.strip() for x in out.splitlines() if BAD_ROWS in x] == [line] * 3
    html = page.read_text()
    said = "ValueError: bad rows: [&#x27;a&#x27;, &#x27;b&#x27;] at offset 3"
    assert html.count(f'<p class="line">✗ {said} (commit, upload of judge/judge-0)</p>') == 3
    tips = re.findall(r"<title>(gym\.checkpoint\.[^<]*)</title>", html)
    assert sorted(t.split(":", 1)[0] for t in tips if t.endswith(f"✗ {said}")) == sorted(
        ["gym.checkpoint.commit judge/judge-0", "gym.checkpoint.upload judge/judge-0"] * 3
    )


def test_a_hostile_message_is_shown_inert_on_one_clipped_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Escapes, markup and newlines are shown as text, 10 KB clipped to about 80 characters."""
    page = tmp_path / "report.html"
    out = _report(_log(tmp_path, HOSTILE), page, capsys)
    assert "\x1b" not in out and "\x07" not in out
    lines = [x.strip() for x in out.splitlines() if x.strip().startswith("✗ ValueError")]
    assert len(lines) == 3 and len(set(lines)) == 1  # one under each request's waterfall
    line = lines[0]
    # The escapes shown as text (\x1b: four characters each), then the clip's ellipsis.
    assert line.startswith("✗ ValueError: \\x1b[2J\\x1b]0;pwned\\x07<script>alert(1)</script> second line")
    assert "…" in line and len(line) < MESSAGE_SHOWN + 80
    html = page.read_text()
    assert "<script>alert" not in html and "\x1b" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt; second line" in html
    shown = re.findall(r'<p class="line">(✗ ValueError[^<]*)</p>', html)
    assert len(shown) == 3 and len(set(shown)) == 1
    said = shown[0]
    assert "…" in said and len(said) < 2 * MESSAGE_SHOWN + 80  # entities: &lt; is four characters
    # The tooltips hold the clipped message; only the hover details keep the log's 1,024.
    assert all(len(t) < 3 * MESSAGE_SHOWN for t in re.findall(r"<title>([^<]*)</title>", html))


def test_nothing_is_added_for_a_trace_that_did_not_fail(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An ok trace's view has no failure line."""
    out = _report(_log(tmp_path, BAD_ROWS), tmp_path / "report.html", capsys, checkpoint="c1")
    assert "✗" not in out


def _failed(who: str, name: str, message: str | None, span_id: int) -> Span:
    details = {"error_type": "mod.ValueError", "error_message": message}
    return Span(name, who, 0, 1, 1, True, span_id=span_id, details=details)


def test_the_same_message_from_many_participants_is_one_line_with_a_count() -> None:
    """Sixteen participants failing alike: one line naming three and counting the rest; another
    message is a line of its own; a failed span with no message adds none; the controller's,
    relaying theirs, comes last."""
    spans = [_failed("controller", "gym.checkpoint.coordinate.prepare", "prepare failed: env-0: ...", 98)]
    spans += [_failed(f"environment/env-{i}", "gym.checkpoint.prepare", "disk full", i) for i in range(16)]
    spans += [_failed("model/model-0", "gym.checkpoint.prepare", "oom", 99)]
    spans += [_failed("agent/agent-0", "gym.checkpoint.prepare", None, 100)]
    spans += [_failed("agent/agent-1", "gym.checkpoint.prepare", " ", 101)]
    assert failure_lines(spans) == [
        "✗ ValueError: disk full (prepare of 16 participants: environment/env-0, environment/env-1, "
        "environment/env-2 and 13 more)",
        "✗ ValueError: oom (prepare of model/model-0)",
        "✗ ValueError: prepare failed: env-0: ... (coordinate.prepare of controller)",
    ]


def test_a_run_page_and_overview_say_the_message_under_the_failed_rows_waterfall(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A controller's log (the demo's stall fault): its aborted row's detail says why its span failed."""
    log = Path(__file__).parent / "data" / "demo-fault-stall-checkpoint.jsonl"
    page = tmp_path / "run.html"
    assert main(["report", str(log), "--report", str(page)]) == 0
    said = (
        "✗ CheckpointNotPrepared: checkpoint ckpt-20261205T055830-cdde8c8d not prepared… "
        "(collection.checkpoint of controller)"
    )
    assert said in capsys.readouterr().out
    assert f'<p class="line">{said}</p>' in page.read_text()


def _fleet_failing(n: int) -> list[Span]:
    details = {"error_type": "ValueError", "error_message": "bad rows"}
    return [Span("prepare", f"environment/env-{i}", 0, 1, 1, True, details=details) for i in range(n)]


def _best_of_three(spans: list[Span]) -> float:
    times = []
    for _ in range(3):
        began = time.perf_counter()
        failure_lines(spans)
        times.append(time.perf_counter() - began)
    return min(times)


def test_one_message_of_a_wide_fleet_is_said_in_linear_time() -> None:
    """Participants failing with one message: each was looked for in a list of those already
    named (quadratic: 0.47 s at 10,000, 7.0 s at 40,000); 4x the fleet now takes about 4x the
    time (the old code: ~16x at these sizes), best of three each, side by side."""
    small, large = _fleet_failing(5_000), _fleet_failing(20_000)
    assert failure_lines(large) == [
        "✗ ValueError: bad rows (prepare of 20,000 participants: environment/env-0, environment/env-1, "
        "environment/env-2 and 19,997 more)"
    ]
    ratio = _best_of_three(large) / _best_of_three(small)
    assert ratio < 8, f"4x the fleet took {ratio:.1f}x the time"
