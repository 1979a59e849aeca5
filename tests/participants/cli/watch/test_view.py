"""``FleetView``: what each participant's block says, at 80 and 160 columns, wrapped and never cut."""

from __future__ import annotations

import io
import time

import pytest
from rich.console import Console

from ckpt_events import CoordinateStarted, OperationFinished, OperationStarted, Stalled
from ckpt_events.participants.cli.watch.sources import PollResult
from ckpt_events.participants.cli.watch.view import FleetView
from ckpt_events.participants.protocol import PrepareReport, StatusReply
from ckpt_events.vocab import CONTROLLER_INSTANCE, Kind, Operation, Outcome, Phase

NOW = 1_800_000_000.0
NS = 1_000_000_000
#: Long on purpose: a 62-character instance and a checkpoint id nearly as wide as a terminal.
INSTANCE = "environment-" + "x" * 50
CHECKPOINT = "ckpt-20261202T010525-" + "0123456789abcdef" * 3
URL = "http://127.0.0.1:41831/a/prefix/that/is/long/enough/to/wrap/at/eighty/columns"
BLOCKERS = [f"rollout-{i:04d}-a0" for i in range(150)]


def _view() -> FleetView:
    """Four participants: one preparing and stuck (150 blockers, lease nearly out, a prepare
    StallWatch reported and a renew), one ready, one unreachable, one not answered yet; the controller's open
    work from the logs; a note from a followed log."""
    ready_url, down_url, waiting_url = (f"http://127.0.0.1:{port}" for port in (42001, 42002, 42003))
    view = FleetView([URL, ready_url, down_url, waiting_url], stall_after=60.0)
    stuck = StatusReply(
        kind="environment",
        instance=INSTANCE,
        phase=Phase.PREPARING,
        checkpoint_id=CHECKPOINT,
        lease_expires_at=NOW + 10.0,
        report=PrepareReport(ready=False, blockers=BLOCKERS[:100], blocker_count=150),
    )
    ready = StatusReply(
        kind="model",
        instance="model-0",
        phase=Phase.PREPARED,
        checkpoint_id=CHECKPOINT,
        lease_expires_at=NOW + 10.0,
        report=PrepareReport(ready=True),
    )
    view.add_polls(
        [
            PollResult(url=URL, seconds=0.01, status=stuck),
            PollResult(url=ready_url, seconds=0.01, status=ready),
            PollResult(url=down_url, seconds=0.8, error="unreachable: ConnectError: [Errno 111] refused"),
        ],
        NOW - 100.0,  # the lease was given 110 s: 10 s left is under 20%, red
    )
    env, start = Kind.ENVIRONMENT, int((NOW - 45.0) * NS)

    def began(kind: Kind, instance: str, span_id: int, op: Operation, cid: str, at: int) -> OperationStarted:
        return OperationStarted(
            kind=kind,
            instance=instance,
            trace_id=1,
            span_id=span_id,
            start_ns=at,
            operation=op,
            checkpoint_id=cid,
        )

    view.add_events(
        [
            began(env, INSTANCE, 1, Operation.PREPARE, CHECKPOINT, start),
            began(env, INSTANCE, 2, Operation.RENEW, CHECKPOINT, int((NOW - 2.0) * NS)),
            # StallWatch's word for it: stalled though 45 s is short of the view's own 60 s
            Stalled(
                kind=env,
                instance=INSTANCE,
                time_ns=start + 31 * NS,
                operation=Operation.PREPARE,
                age_s=31.0,
                phase=Phase.PREPARING,
                checkpoint_id=CHECKPOINT,
            ),
            began(Kind.MODEL, "model-0", 3, Operation.PREPARE, "ckpt-old", start),
            OperationFinished(
                kind=Kind.MODEL,
                instance="model-0",
                trace_id=1,
                span_id=3,
                start_ns=start,
                end_ns=start + NS // 100,
                operation=Operation.PREPARE,
                checkpoint_id="ckpt-old",
                outcome=Outcome.OK,
            ),
            CoordinateStarted(
                kind=Kind.CONTROLLER,
                instance=CONTROLLER_INSTANCE,
                trace_id=1,
                span_id=4,
                start_ns=start,
                operation=Operation.PREPARE,
                checkpoint_id=CHECKPOINT,
            ),
        ]
    )
    view.notes = ["/var/log/fleet/environment-0.jsonl: truncated, reading again from the start"]
    return view


def _render(view: FleetView, width: int) -> str:
    out = Console(width=width, record=True, color_system=None, file=io.StringIO())
    out.print(view.render(NOW))
    return out.export_text()


def _squeezed(text: str) -> str:
    return "".join(text.split())


@pytest.mark.parametrize("width", [80, 160])
def test_every_line_fits_and_nothing_is_cut(width: int) -> None:
    """At 80 and 160 columns every line fits the width and every fact is there in full (wrapped,
    so compared with white space taken out): no ellipsis, no cropped id, URL or blocker."""
    text = _render(_view(), width)
    assert max(len(line) for line in text.splitlines()) <= width, text
    assert "…" not in text
    whole = _squeezed(text)
    expected = [
        f"environment {INSTANCE}  {URL}",
        f"phase preparing  checkpoint {CHECKPOINT}  for >=100.0 s  lease 10.0 s left",
        "NOT READY: 150 blocking: rollout-0000-a0, rollout-0001-a0, rollout-0002-a0 and 147 more",
        f"open prepare {CHECKPOINT} 45.0 s STALLED",
        f"open renew {CHECKPOINT} 2.0 s",
        "model model-0  http://127.0.0.1:42001",
        f"phase prepared  checkpoint {CHECKPOINT}",
        "ready",
        "last: ckpt-old prepare ok 10 ms",
        "http://127.0.0.1:42002  unreachable: ConnectError: [Errno 111] refused",
        "http://127.0.0.1:42003  waiting for the first answer",
        "controller coordination",
        "/var/log/fleet/environment-0.jsonl: truncated, reading again from the start",
    ]
    for fact in expected:
        assert _squeezed(fact) in whole, f"{fact!r} not in:\n{text}"
    assert text.count("STALLED") == 1  # environment's prepare, which StallWatch reported
    assert _squeezed(f"controller coordination open prepare {CHECKPOINT} 45.0 s /var/log") in whole
    assert _squeezed(f"open renew {CHECKPOINT} 2.0 s model model-0") in whole
    if width == 160:  # wide enough that no fact wraps
        for fact in expected:
            assert fact in text, f"{fact!r} wrapped at 160 columns:\n{text}"


def test_the_lease_is_red_under_a_fifth_of_its_grace_and_blockers_are_bold_red() -> None:
    """The lease left turns red under 20% of the lease given; NOT READY is bold red; ready green."""
    out = Console(width=160, record=True, color_system="truecolor", file=io.StringIO())
    view = _view()
    out.print(view.render(NOW))
    styled = out.export_text(styles=True)
    red = "\x1b[1;31m"
    assert f"{red}10.0 s left" in styled and f"{red}  NOT READY" in styled, styled
    assert "\x1b[32m  ready" in styled
    out = Console(width=160, record=True, color_system="truecolor", file=io.StringIO())
    out.print(view.render(NOW - 95.0))  # 105 s left of 110: not red
    assert f"{red}105.0 s left" not in out.export_text(styles=True)


def test_control_characters_from_a_participant_are_escaped() -> None:
    """An instance, blocker or error carrying terminal escapes is shown as \\xNN, never sent raw."""
    status = StatusReply(
        kind="agent",
        instance="agent-\x1b[2J",
        phase=Phase.PREPARING,
        report=PrepareReport(ready=False, blockers=["s\x07"], blocker_count=1),
    )
    view = FleetView(["http://a", "http://b"])
    view.add_polls(
        [
            PollResult(url="http://a", seconds=0.0, status=status),
            PollResult(url="http://b", seconds=0.0, error="invalid status reply: \x1b]0;owned\x07"),
        ],
        time.time(),
    )
    text = _render(view, 80)
    assert "agent agent-\\x1b[2J" in text and "s\\x07" in text and "\\x1b]0;owned\\x07" in text
    assert "\x1b" not in text and "\x07" not in text
