"""A wide fleet's failures are drawn, never folded into a count only (``folding``): a prepare on
1,000 environment servers where 3 of the fastest failed (two raised, one's step failed) names
each of them with its error type in the terminal, on the checkpoint's page and on the run page,
in the waterfall and in the breakdown; past ``FAILED_DRAWN`` failures (``FAILED_LISTED`` in the
breakdown) the rest are counted."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path
from typing import Any

import anyio
import pytest
from rich.console import Console

from ckpt_events import CollectionFinished, CoordinateFinished, OperationFinished, StepFinished
from ckpt_events.participants.cli.main import main
from ckpt_events.participants.cli.report.durations import durations
from ckpt_events.participants.cli.report.folding import FAILED_DRAWN, Folded, waterfall_rows
from ckpt_events.participants.cli.report.html import waterfall_svg
from ckpt_events.participants.cli.report.model import Span, trace_spans
from ckpt_events.participants.cli.report.operations import ROWS_SHOWN, operation_rows
from ckpt_events.participants.cli.report.paths import on_critical_path
from ckpt_events.participants.cli.report.terminal import render_waterfall
from ckpt_events.participants.cli.report.timeline import FAILED_LISTED, breakdown, shown_rows
from ckpt_events.sinks import JsonLinesSink
from ckpt_events.testing import EventCapture
from ckpt_events.vocab import CollectionAction, Kind, Operation, Outcome

MS = 1_000_000
T = 11
#: Some time in 2026: a log's times are Unix ns.
T0 = 1_790_000_000 * 10**9
#: Instance -> how it failed: its prepare raised, or (``step:``) its upload step did.
FAILURES = {"env-1": "RuntimeError", "env-2": "ValueError", "env-3": "step:OSError"}


def _fleet(n: int, failures: dict[str, str], *, parallel: bool = True) -> list[Any]:
    """A collection checkpoint whose prepare calls ``n`` environment servers (in parallel or
    in turn), each prepare with an ``upload`` step; those in ``failures`` the fastest."""
    span = 100
    prepares: list[Any] = []
    at = T0 + MS
    for i in range(n):
        who = f"env-{i}"
        how = failures.get(who)
        ms = 0.01 if how else 1 + (i % 7) * 0.1
        start = at if parallel else at + i * 2 * MS
        a, b = start, start + int(ms * MS)
        span += 2
        op_error = how is not None and not how.startswith("step:")
        prepares.append(
            OperationFinished(
                Kind.ENVIRONMENT,
                who,
                T,
                span,
                a,
                b,
                Operation.PREPARE,
                "k",
                2,
                parent_remote=True,
                outcome=Outcome.ERROR if op_error else Outcome.OK,
                error_type=how if op_error else None,
            )
        )
        step_error = how is not None and how.startswith("step:")
        prepares.append(
            StepFinished(
                Kind.ENVIRONMENT,
                who,
                T,
                span + 1,
                a,
                b,
                "upload",
                "k",
                span,
                outcome=Outcome.ERROR if step_error else Outcome.OK,
                error_type=how.removeprefix("step:") if step_error and how else None,
            )
        )
    end = max(e.end_ns for e in prepares) + MS
    return [  # in the order they finished, as a log holds them
        *prepares,
        CoordinateFinished(Kind.CONTROLLER, "coordination", T, 2, T0, end, Operation.PREPARE, "k", 1),
        CollectionFinished(Kind.CONTROLLER, "coordination", T, 1, T0, end, CollectionAction.CHECKPOINT, "k"),
    ]


def _named(text: str) -> dict[str, str]:
    """Each failed instance named in ``text``'s waterfall with its error type: ``env-1`` ->
    ``RuntimeError``."""
    return dict(re.findall(r"(env-\d+) ✗ (\w+)", text))


def _listed(text: str) -> dict[str, str]:
    """Each failed participant listed in ``text``'s breakdown with its error type."""
    return dict(re.findall(r"environment/(?:<wbr>)?(env-\d+) \(1 error: (\w+)\)", text))


@pytest.mark.parametrize("parallel", [True, False])
def test_three_failures_among_1000_are_each_drawn_with_their_error_type(parallel: bool) -> None:
    """The waterfall's rows keep the 3 failed calls (the one whose step failed with its step),
    the terminal and the SVG name each with its error type, and no folded row counts them again."""
    spans = trace_spans(_fleet(1000, FAILURES, parallel=parallel), T)
    rows = waterfall_rows(spans, on_critical_path(spans))
    drawn = {r.who for r in rows if isinstance(r, Span) and r.participant}
    assert {"environment/env-1", "environment/env-2", "environment/env-3"} <= drawn
    (folded,) = [r for r in rows if isinstance(r, Folded)]
    assert (
        folded.errors == 0
        and folded.count + len({r.who for r in rows if isinstance(r, Span) and r.short == "prepare"}) == 1000
    )
    console = Console(file=io.StringIO(), width=160, record=True)
    console.print(render_waterfall(spans, 160, title="fleet"))
    text = console.export_text()
    want = {"env-1": "RuntimeError", "env-2": "ValueError", "env-3": "OSError"}
    assert _named(text) == want, text
    assert _named(waterfall_svg(spans, title="fleet")) == want
    assert len(rows) < 20


def test_past_the_bound_the_first_failures_are_drawn_and_the_rest_counted() -> None:
    """12 failed calls of 300 in turn: the first ``FAILED_DRAWN`` by start are drawn, the folded row
    says ``4 more failed`` (terminal and page alike), and drawn plus folded are every call."""
    failures = {f"env-{i}": "TimeoutError" for i in range(0, 24, 2)}
    spans = trace_spans(_fleet(300, failures, parallel=False), T)
    rows = waterfall_rows(spans, on_critical_path(spans))
    (folded,) = [r for r in rows if isinstance(r, Folded)]
    failed = [r.who for r in rows if isinstance(r, Span) and r.error]
    assert failed == [f"environment/env-{i}" for i in range(0, 2 * FAILED_DRAWN, 2)]
    assert folded.errors == 12 - FAILED_DRAWN and folded.summary.endswith(", 4 more failed")
    assert folded.count + sum(isinstance(r, Span) and r.short == "prepare" for r in rows) == 300
    console = Console(file=io.StringIO(), width=160, record=True)
    console.print(render_waterfall(spans, 160, title="fleet"))
    text = console.export_text()  # the name column folds the row's words over two lines
    assert "+291 more prepare on" in text and ", 4 more failed" in text
    assert ", 4 more failed</text>" in waterfall_svg(spans, title="fleet")


def test_report_command_names_the_failed_participants_everywhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``report LOG --checkpoint k --report page.html`` and the run page of the same JSON-lines
    log: the terminal, the checkpoint's page and the run page each name the 3 failed of 1,000."""
    log = tmp_path / "log.jsonl"
    sink = JsonLinesSink(log)
    sink.handle(_fleet(1000, FAILURES))
    anyio.run(sink.aclose)
    monkeypatch.setenv("COLUMNS", "160")
    want = {"env-1": "RuntimeError", "env-2": "ValueError", "env-3": "OSError"}
    page, run_page = tmp_path / "c.html", tmp_path / "run.html"
    assert main(["report", str(log), "--checkpoint", "k", "--report", str(page)]) == 0
    out = capsys.readouterr().out
    assert _named(out) == want and _listed(out) == want
    assert _named(page.read_text()) == want and _listed(page.read_text()) == want
    assert "environment x1000 (longest) (3 errors)" in out
    assert main(["report", str(log), "--report", str(run_page)]) == 0
    capsys.readouterr()
    assert _named(run_page.read_text()) == want


def test_past_the_bound_the_breakdown_lists_the_first_failed_and_counts_the_rest() -> None:
    """12 failed participants of 300: the kind's row says ``12 errors, 4 participants not
    listed`` and the first ``FAILED_LISTED`` follow it, each its own row with its error type."""
    failures = {f"env-{i}": "TimeoutError" for i in range(0, 24, 2)}
    rows = shown_rows(breakdown(_fleet(300, failures), "k"))
    assert [r.instance for r in rows] == ["x300 (longest)", *sorted(failures)[:FAILED_LISTED]]
    assert rows[0].errors_said == " (12 errors; 4 failed participants not listed)"
    assert {r.errors_said for r in rows[1:]} == {" (1 error: TimeoutError)"}


def test_the_operation_table_keeps_a_failed_step_row_past_its_40_rows() -> None:
    """A commit of 60 own steps, ``own-03`` failed among them (no ok span: no max, so the last
    by the slowest-first fold): its row is in the table with its error, not summed into
    ``+N more steps``; the fold counts the rest."""
    with EventCapture() as capture:
        agent = capture.telemetry("agent", "agent-0")
        with agent.operation("commit", checkpoint_id="c1") as op:
            for i in range(60):
                with contextlib.suppress(OSError), op.step(f"own-{i:02d}"):
                    if i == 3:
                        raise OSError("gone")
        events = capture.events
    table = operation_rows(durations(events))
    assert [(r.step, r.errors) for r in table if r.errors] == [("own-03", 1)]
    assert len(table) == ROWS_SHOWN + 1 and table[-1].step == "+21 more steps"
    assert sum(r.count for r in table) == 61


#: What a request's task cut by its server's stop ends with.
CUT = "asyncio.exceptions.CancelledError"


@pytest.mark.parametrize(
    ("failures", "said"),
    [
        (
            {f"env-{i}": CUT for i in range(0, 20, 2)} | {"env-21": "TimeoutError", "env-23": "TimeoutError"},
            " (2 errors, 10 cancelled; 4 cancelled participants not listed)",
        ),
        (
            {f"env-{i}": CUT for i in range(0, 24, 2)},
            " (12 cancelled; 4 cancelled participants not listed)",
        ),
        (
            {f"env-{i}": "TimeoutError" for i in range(0, 20, 2)}
            | {f"env-{i}": CUT for i in range(21, 26, 2)},
            " (10 errors, 3 cancelled; 2 failed participants and 3 cancelled participants not listed)",
        ),
    ],
)
def test_past_the_bound_the_failed_are_listed_before_the_cancelled_and_each_counted_apart(
    failures: dict[str, str], said: str
) -> None:
    """Of 300 participants, some whose prepare was cut by their server's stop, some failed: the
    failed are listed first (the 8 first listed were the cut ones, the 2 that raised went
    unnamed), and the unlisted are counted as what they are (it read "4 participants with errors
    or cancellations not listed" of 4 cancelled ones)."""
    rows = shown_rows(breakdown(_fleet(300, failures), "k"))
    listed = {r.instance for r in rows[1:]}
    assert len(listed) == FAILED_LISTED and listed <= failures.keys()
    failed = {who for who, how in failures.items() if how != CUT}
    assert len(listed & failed) == min(len(failed), FAILED_LISTED)
    assert rows[0].errors_said == said
