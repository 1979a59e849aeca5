"""A request cut by its server's stop is said cancelled, apart from the failures: the cause, the
participant's row, the per-operation table, the waterfall's marks and folded rows, the failure
lines, in the terminal and the HTML page. A real FastAPI app under httpx's ASGI transport writes
the log; its request's task is cancelled as uvicorn cancels it at its shutdown deadline."""

from __future__ import annotations

import asyncio
import io
import re
from pathlib import Path

import pytest
from fastapi import FastAPI, Request
from rich.console import Console

from ckpt_events import Telemetry
from ckpt_events.participants.cli.main import main
from ckpt_events.participants.cli.report.cancels import is_cancelled
from ckpt_events.participants.cli.report.folding import Folded, waterfall_rows
from ckpt_events.participants.cli.report.html import FILLS, waterfall_svg
from ckpt_events.participants.cli.report.model import Span
from ckpt_events.participants.cli.report.terminal import render_waterfall
from ckpt_events.participants.fastapi import instrument, operation, telemetry
from tests.participants.cli.report.own_server import client_of

#: What uvicorn's shutdown deadline cancels each open connection's task with.
UVICORN = "Task cancelled, timeout graceful shutdown exceeded"


def _cut_log(tmp_path: Path, *, controller: bool = True, also_fails: bool = False) -> Path:
    """A checkpoint c1 (a controller's, or without ``controller`` the participant's own
    prepare) whose prepare on environment-0 is cut mid-step (the request's task cancelled with
    uvicorn's message); with ``also_fails``, a commit of c0 on the same participant that raised
    ``KeyError`` before it."""
    log = tmp_path / "events.jsonl"
    app = FastAPI()
    instrument(app, kind="environment", instance="environment-0", jsonl_path=str(log))

    @app.post("/checkpoint/prepare")
    async def prepare(request: Request) -> dict[str, str]:
        with operation(request, "prepare", checkpoint_id="c1") as op:
            with op.step("snapshot"):
                await asyncio.sleep(30)  # cut long before
        return {}

    @app.post("/checkpoint/commit")
    async def commit(request: Request) -> dict[str, str]:
        with operation(request, "commit", checkpoint_id="c0"):
            raise KeyError("r7")

    async def run() -> None:
        async with client_of(app, raise_app_exceptions=False) as client:
            if also_fails:
                assert (await client.post("/checkpoint/commit")).status_code == 500
            ctl = Telemetry(telemetry(app).bus, kind="controller", instance="coordination")
            if not controller:
                ctl = Telemetry(None, kind="controller", instance="coordination")  # no-op: nothing emitted
            with pytest.raises(asyncio.CancelledError):
                with ctl.collection("checkpoint", checkpoint_id="c1") as coll:
                    with ctl.coordinate("prepare", checkpoint_id="c1", parent=coll) as coord:
                        headers = {"traceparent": coord.traceparent()} if controller else {}
                        call = asyncio.ensure_future(client.post("/checkpoint/prepare", headers=headers))
                        await asyncio.sleep(0.05)  # in the step's 30 s sleep
                        call.cancel(UVICORN)  # as uvicorn's shutdown deadline does
                        await call

    asyncio.run(run())
    return log


def test_a_prepare_cut_by_its_server_s_stop_is_said_cancelled_not_failed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The cause, the participant's row, the marks and the failure line, in the terminal and the
    page, say "cancelled" and ``⊘``, quoting the message; nothing calls it a failure or an error.
    It read "prepare failed on ... (CancelledError: ...)", "(1 error: asyncio...CancelledError)"
    and ``✗``."""
    log = _cut_log(tmp_path)
    page = tmp_path / "report.html"
    assert main(["report", str(log), "--report", str(page)]) == 0
    out = capsys.readouterr().out
    assert (
        f"prepare cancelled on environment/environment-0 at step snapshot (CancelledError: {UVICORN})" in out
    )
    assert "environment/environment-0 (1 cancelled: asyncio.exceptions.CancelledError)" in out
    assert f"⊘ CancelledError: {UVICORN} (" in out
    assert re.search(r"prepare environment-0 ⊘ +▶", out) and re.search(r"snapshot environment-0 ⊘ ", out)
    assert "failed on" not in out and "error:" not in out and "✗" not in out
    html = page.read_text()
    assert "✗" not in html
    tips = re.findall(r"<title>gym\.checkpoint\.(?:prepare|snapshot) [^<]*</title>", html)
    assert len(tips) == 2 and all(f"⊘ CancelledError: {UVICORN}" in t for t in tips)
    assert f"⊘ CancelledError: {UVICORN}" in html
    cause = f"prepare cancelled on environment/environment-0 at step snapshot (CancelledError: {UVICORN})"
    assert cause in html


def test_a_participant_s_errors_and_cancellations_are_counted_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A participant's own commit that raised and prepare that was cut (no controller): one error
    and one cancelled on its row, each with its types, and in the per-operation table a
    ``cancelled`` column beside ``errors`` (terminal and page). It read "(2 errors: ...)" and
    errors 1 on the prepare and its step."""
    log = _cut_log(tmp_path, controller=False, also_fails=True)
    page = tmp_path / "report.html"
    assert main(["report", str(log), "--report", str(page)]) == 0
    out = capsys.readouterr().out
    assert "(1 error: KeyError, 1 cancelled: asyncio.exceptions.CancelledError)" in out
    header = next(line for line in out.splitlines() if " errors " in line).split()
    assert header[3:6] == ["n", "errors", "cancelled"]
    table = [line.split() for line in out.splitlines() if line.startswith("  environment ")]
    rows = {tuple(cells[:3]): cells for cells in table}
    assert rows[("environment", "commit", "1")][2:5] == ["1", "1", "0"]
    assert rows[("environment", "prepare", "1")][2:5] == ["1", "0", "1"]
    assert rows[("environment", "prepare", "snapshot")][3:6] == ["1", "0", "1"]
    html = page.read_text()
    assert "<th>n</th><th>errors</th><th>cancelled</th>" in html
    assert f"⊘ CancelledError: {UVICORN}" in html


def _call(i: int, error_type: str | None, *, step_error: str | None = None) -> list[Span]:
    """Call ``i`` of parallel prepares under span 1 (the later, the longer), ``error_type`` its own
    end (``None``: ok), with one step ending in ``step_error``."""
    details = {} if error_type is None else {"error_type": error_type}
    call = Span(
        "prepare", f"environment/environment-{i}", 10 + i, 100 + 3 * i, 1, error_type is not None,
        span_id=100 + i, parent_span_id=1, details=details,
    )  # fmt: skip
    step_details = {} if step_error is None else {"error_type": step_error}
    step = Span(
        "snapshot", f"environment/environment-{i}", 11 + i, 90 + i, 2, step_error is not None,
        span_id=200 + i, parent_span_id=100 + i, details=step_details,
    )  # fmt: skip
    return [call, step]


def test_a_folded_group_counts_its_cancelled_calls_apart_from_its_failed_ones() -> None:
    """Sixteen prepares: ten cancelled (asyncio's, trio's), one whose step raised ``OSError`` and
    then was cancelled, five ok. The slowest and the first eight cut are drawn; the folded row
    says "1 failed, 2 more cancelled" (it said "3 more failed"): a call that raised is failed,
    whatever else of it was cancelled."""
    root = Span("coordinate.prepare", "controller", 0, 200, 0, False, span_id=1)
    spans = [root]
    for i in range(16):
        if i < 10:
            spans += _call(i, "trio.Cancelled" if i % 2 else "asyncio.exceptions.CancelledError")
        elif i == 10:
            spans += _call(i, "asyncio.exceptions.CancelledError", step_error="builtins.OSError")
        else:
            spans += _call(i, None)
    [folded] = [r for r in waterfall_rows(spans) if isinstance(r, Folded)]
    # Drawn: the slowest (15, ok) and the first eight by start of the eleven cut or failed calls.
    assert (folded.cancelled, folded.cancelled_drawn, folded.errors, folded.errors_drawn) == (2, 8, 1, 0)
    assert folded.summary.endswith(", 1 failed, 2 more cancelled")


@pytest.mark.parametrize(
    ("error_type", "cancelled"),
    [
        ("asyncio.exceptions.CancelledError", True),
        ("concurrent.futures._base.CancelledError", True),
        ("trio.Cancelled", True),
        ("CancelledError", True),
        ("builtins.ValueError", False),
        ("myapp.OrderCancelledError", False),
        ("ckpt_events.participants.errors.ProtocolRefusal", False),
        ("", False),
        (None, False),
    ],
)
def test_a_cancellation_is_told_by_its_type_s_last_name(error_type: str | None, cancelled: bool) -> None:
    """``CancelledError`` (asyncio, concurrent.futures) and trio's ``Cancelled``, by last name."""
    assert is_cancelled(error_type) is cancelled


def test_a_cancelled_span_s_bar_is_grey_hatched_not_a_failure_s_red(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A prepare cut and one that raised, side by side: on the page the cut one's bar is hatched
    grey in a grey outline, the legend saying "cancelled ⊘", the failed one's red; in the
    terminal the cut one is a grey ``▓`` bar, the failed one a red ``█``, the legend saying ``▓
    cancelled``. Both were filled red, like a failure."""
    root = Span("coordinate.prepare", "controller", 0, 200, 0, False, span_id=1)
    spans = [root, *_call(0, "asyncio.exceptions.CancelledError"), *_call(1, "builtins.KeyError")]
    svg = waterfall_svg(spans, title="c1")
    bars = dict(re.findall(r'data-span-id="0*([0-9a-f]+)".*? fill="([^"]+)"', svg))
    hatch = "cancelled-0000000000000001"
    assert bars == {"1": FILLS["controller"], "64": f"url(#{hatch})", "65": "#dc2626"} | {
        "c8": FILLS["environment"],
        "c9": FILLS["environment"],
    }, bars
    assert svg.count(f'<pattern id="{hatch}"') == 1
    assert re.search(
        rf'<rect [^>]*fill="url\(#{hatch}\)" stroke="#4b5563"/>\s*<text [^>]*>cancelled ⊘</text>', svg
    )
    plain = waterfall_svg([root, *_call(1, "builtins.KeyError")], title="c1")
    assert "cancelled" not in plain and "<pattern" not in plain
    console = Console(file=io.StringIO(), width=100, force_terminal=True, color_system="256")
    console.print(render_waterfall(spans, 100))
    out = console.file.getvalue()  # type: ignore[attr-defined]
    grey, red = "\x1b[38;5;247m▓", "\x1b[31m█"  # grey62 is colour 247 of 256
    assert grey in out and red in out and "\x1b[31m▓" not in out, out
    log = _cut_log(tmp_path)
    page = tmp_path / "report.html"
    assert main(["report", str(log), "--report", str(page)]) == 0
    assert re.search(r"▓\s+cancelled", capsys.readouterr().out)  # the legend folds at 80 columns
    assert "cancelled ⊘</text>" in page.read_text()


def test_a_cancellation_s_failure_line_is_grey_a_failure_s_red(tmp_path: Path) -> None:
    """Under the waterfall, each failure's message is a line: a cut prepare's (``⊘
    CancelledError: ...``) was printed red like the ``✗ KeyError`` beside it; it is the
    cancelled bars' grey now, the failure's still red."""
    from ckpt_events.participants.cli.report.terminal import render
    from ckpt_events.sinks import read_events

    events = [event for _, event in read_events(_cut_log(tmp_path, also_fails=True))]
    console = Console(file=io.StringIO(), width=200, force_terminal=True, color_system="256")
    render(console, events)
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert "\x1b[38;5;247m⊘ CancelledError: " + UVICORN in out, out
    assert "\x1b[31m⊘" not in out
