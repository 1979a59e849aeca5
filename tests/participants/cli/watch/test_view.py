"""``FleetView``: what each participant's block says, at 80 and 160 columns, wrapped and never cut."""

from __future__ import annotations

import io
import re
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from ckpt_events import CoordinateStarted, Event, OperationFinished, OperationStarted, Stalled
from ckpt_events.participants.cli.watch.follow import LogFollower
from ckpt_events.participants.cli.watch.sources import PollResult
from ckpt_events.participants.cli.watch.view import MAX_FROM_LOGS, FleetView
from ckpt_events.participants.protocol import PrepareReport, StatusReply
from ckpt_events.sinks.jsonl import JsonLinesSink
from ckpt_events.testing import EventCapture
from ckpt_events.vocab import CONTROLLER_INSTANCE, Kind, Operation, Outcome, Phase

NOW = 1_800_000_000.0
NS = 1_000_000_000
#: Long on purpose: a 62-character instance and a checkpoint id nearly as wide as a terminal.
INSTANCE = "environment-" + "x" * 50
CHECKPOINT = "ckpt-20261202T010525-" + "0123456789abcdef" * 3
URL = "http://127.0.0.1:41831/a/prefix/that/is/long/enough/to/wrap/at/eighty/columns"
BLOCKERS = [f"rollout-{i:04d}-a0" for i in range(150)]


def _read_live(view: FleetView, events: list[Event]) -> None:
    """Fold ``events`` in as a live watch reads them: each as it is written (by its own stamp).
    A participant known from its logs alone is aged from them: its work is at least as old as
    the stamps it wrote since, and our reads since its last, say."""
    for event in events:
        stamp = getattr(event, "end_ns", None) or getattr(event, "start_ns", None) or event.time_ns  # type: ignore[attr-defined]
        view.add_events([event], stamp / NS)


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

    _read_live(
        view,
        [
            began(env, INSTANCE, 1, Operation.PREPARE, CHECKPOINT, start),
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
            began(env, INSTANCE, 2, Operation.RENEW, CHECKPOINT, int((NOW - 2.0) * NS)),
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
        ],
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
        f"open prepare {CHECKPOINT} >=45.0 s STALLED",
        f"open renew {CHECKPOINT} >=2.0 s",
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
    assert _squeezed(f"controller coordination open prepare {CHECKPOINT} >=45.0 s /var/log") in whole
    assert _squeezed(f"open renew {CHECKPOINT} >=2.0 s model model-0") in whole
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


def test_events_built_by_keyword_with_plain_strings() -> None:
    """Kinds, operations, outcomes and phases as plain strings (a user's own kind too): folded
    and shown as their words, with no ``.value`` on a string."""
    view = FleetView([], stall_after=30.0)
    start = int((NOW - 40.0) * NS)
    common = {"instance": "judge-0", "trace_id": 1, "checkpoint_id": "c1"}
    _read_live(
        view,
        [
            OperationStarted(kind="judge", span_id=1, start_ns=start, operation="commit", **common),
            OperationFinished(
                kind="judge",
                span_id=1,
                start_ns=start,
                end_ns=start + NS // 50,
                operation="commit",
                outcome="ok",
                **common,
            ),
            OperationStarted(kind="judge", span_id=2, start_ns=start, operation="prepare", **common),
            Stalled(
                kind="judge",
                instance="judge-0",
                time_ns=start,
                operation="prepare",
                checkpoint_id="c1",
                age_s=31.0,
                phase="preparing",
            ),
            CoordinateStarted(kind="controller", span_id=3, start_ns=start, operation="renew", **common),
        ],
    )
    text = _render(view, 120)
    assert "judge judge-0" in text and "last: c1 commit ok 20 ms" in text, text
    assert "open prepare c1 >=40.0 s STALLED" in text and "open renew c1 >=40.0 s" in text, text
    assert "Operation." not in text and "Outcome." not in text


def _fleet_of_64() -> FleetView:
    """64 participants polled (one unreachable, one not ready with a prepare stalled, one with a
    62-character name), and the controller's stalled prepare from its log."""
    urls = [f"http://127.0.0.1:{42100 + i}" for i in range(64)]
    view = FleetView(urls, stall_after=30.0)
    kinds = ("environment", "model", "agent", "resources")
    results = []
    for i, url in enumerate(urls):
        kind = kinds[i % 4]
        instance = f"{kind}-{i // 4}" if i != 5 else f"{kind}-{'x' * 54}-1"
        if i == 9:
            error = "unreachable: ConnectError: [Errno 111] refused"
            results.append(PollResult(url=url, seconds=0.8, error=error, failure="unreachable"))
            continue
        ready = (
            PrepareReport(ready=False, blockers=["r1"], blocker_count=1)
            if i == 12
            else PrepareReport(ready=True)
        )
        status = StatusReply(
            kind=kind,
            instance=instance,
            phase=Phase.PREPARING,
            checkpoint_id=CHECKPOINT,
            lease_expires_at=NOW + 50.0,
            report=ready,
        )
        results.append(PollResult(url=url, seconds=0.01, status=status, clock_offset=0.0, clock_error=0.001))
    view.add_polls(results, NOW - 10.0)
    start = int((NOW - 45.0) * NS)
    _read_live(
        view,
        [
            OperationStarted(
                kind="environment",
                instance="environment-3",
                trace_id=1,
                span_id=1,
                start_ns=start,
                operation="prepare",
                checkpoint_id=CHECKPOINT,
                parent_span_id=2,  # a call of the controller's prepare
                parent_remote=True,
            ),
            CoordinateStarted(
                kind="controller",
                instance=CONTROLLER_INSTANCE,
                trace_id=1,
                span_id=2,
                start_ns=start,
                operation="prepare",
                checkpoint_id=CHECKPOINT,
            ),
        ],
    )
    return view


@pytest.mark.parametrize("width", [80, 160])
def test_64_participants_on_a_24_line_terminal_are_one_line_each_problems_first(width: int) -> None:
    """A terminal of 24 lines: a summary, then one line per participant, cut at the width with the
    name cut in its middle; the unreachable, the not-ready and the stalled come first, with what is
    wrong at the start of their line, and the rest are counted; nothing wraps."""
    out = Console(
        width=width, height=24, force_terminal=True, record=True, color_system=None, file=io.StringIO()
    )
    out.print(_fleet_of_64().render(NOW))
    lines = out.export_text().splitlines()
    assert len(lines) <= 22 and max(len(line) for line in lines) <= width, lines
    # The controller waiting on environment-3 is no problem of its own (was: "3 with a problem",
    # its prepare STALLED beside the participant that held it).
    assert lines[0].startswith("65 participants: 63 preparing, 1 not read; 2 with a problem")
    assert lines[1].startswith("127.0.0.1:42109") and "unreachable: ConnectError" in lines[1]
    assert lines[2].startswith("environment-3 ")
    assert "NOT READY 1  open prepare 45.0 s STALLED" in lines[2]
    assert lines[-1] == "... and 45 more participants, none with a problem"
    names = [line.split()[0] for line in lines[3:-1]]
    assert len(set(names)) == len(names) == 18  # each participant once, on its own line
    long_name = [n for n in names if "…" in n]
    assert long_name and long_name[0].startswith("model-xxx") and long_name[0].endswith("x-1")


def test_64_participants_piped_are_all_there_one_line_each() -> None:
    """Piped (no height): every participant has its one line, and the controller's open work."""
    out = Console(width=80, record=True, color_system=None, file=io.StringIO())
    out.print(_fleet_of_64().render(NOW))
    lines = out.export_text().splitlines()
    assert len(lines) == 1 + 64 + 1 and max(len(line) for line in lines) <= 80
    assert lines[-1].startswith("controller ") and "STALLED" not in lines[-1]
    assert "open prepare >=45.0 s waiting on environment-3 (stalled)" in lines[-1]
    assert sum(1 for line in lines if line.startswith("environment-3 ")) == 1


@pytest.mark.parametrize("rows", [False, True], ids=["blocks", "rows"])
def test_a_participant_that_stops_answering_is_one_entry_with_its_error(rows: bool) -> None:
    """A participant killed mid-watch was shown twice: its URL's error, and again "(from logs
    only)" with its open work. It stays one entry: who it was, the error, what its logs say."""
    url = "http://127.0.0.1:18003"
    view = FleetView([url], stall_after=60.0, rows=rows)
    status = StatusReply(kind="resources", instance="resources-0", phase=Phase.IDLE)
    view.add_polls([PollResult(url=url, seconds=0.01, status=status)], NOW - 5.0)
    view.add_events(
        [
            OperationStarted(
                kind=Kind.RESOURCES,
                instance="resources-0",
                trace_id=1,
                span_id=7,
                start_ns=int((NOW - 3.0) * NS),
                operation=Operation.COMMIT,
                checkpoint_id="c1",
            )
        ]
    )
    down = "unreachable: ConnectError: [Errno 111] Connection refused"
    view.add_polls([PollResult(url=url, seconds=0.8, error=down)], NOW)
    text = _render(view, 160)
    assert text.count("resources-0") == 1 and "logs only" not in text, text
    assert down in text and "open commit" in text, text


@pytest.mark.parametrize("finished_first", [False, True])
def test_work_a_participant_passed_by_later_work_is_of_unknown_age_never_stalled(
    finished_first: bool,
) -> None:
    """model-0 opened a prepare of c1 40 s ago and never ended it (killed mid-checkpoint), then,
    restarted under its name to a new log, prepared c2: the old prepare is not shown stalled (it
    was "40.0 s STALLED"); in either order (a backlog hands finished work on first). Another
    worker's later work, a later resume of the same checkpoint, or a prepare refused (a
    conflict: c1 still active) passes nothing."""
    view = FleetView([], stall_after=30.0)
    start = int((NOW - 40.0) * NS)
    common = {"kind": "model", "instance": "model-0", "outcome": "ok"}
    opened = [
        OperationStarted(kind="model", instance="model-0", trace_id=1, span_id=1, start_ns=start,
                         operation="prepare", checkpoint_id="c1"),
        OperationStarted(kind="model", instance="model-0", trace_id=1, span_id=2, start_ns=start,
                         operation="commit", checkpoint_id="c1", worker=0),
    ]  # fmt: skip
    later = [
        OperationFinished(**common, trace_id=1, span_id=3, start_ns=start + NS, end_ns=start + 2 * NS,
                          operation="resume", checkpoint_id="c1"),
        OperationFinished(**common, trace_id=1, span_id=4, start_ns=start + NS, end_ns=start + 2 * NS,
                          operation="prepare", checkpoint_id="c3", worker=1),
        OperationFinished(kind="model", instance="model-0", outcome="error", trace_id=3, span_id=6,
                          start_ns=start + NS, end_ns=start + 2 * NS, operation="prepare", checkpoint_id="c4",
                          error_type="ProtocolRefusal", error_message="checkpoint_conflict"),
    ]  # fmt: skip
    _read_live(view, [*later, *opened] if finished_first else [*opened, *later])
    text = _render(view, 160)
    assert "open prepare c1 >=40.0 s STALLED" in text, text
    assert "open commit c1 on worker 0 >=40.0 s STALLED" in text, text
    restarted = OperationFinished(**common, trace_id=2, span_id=5, start_ns=start + 3 * NS,
                                  end_ns=start + 4 * NS, operation="prepare", checkpoint_id="c2")  # fmt: skip
    _read_live(view, [restarted])
    text = _render(view, 160)
    assert "open prepare c1 age unknown (later work finished since: restarted?)" in text, text
    assert "open commit c1 on worker 0 >=40.0 s STALLED" in text, text  # c2 was the main process's
    again = FleetView([], stall_after=30.0)
    _read_live(again, [restarted, *opened] if finished_first else [*opened, restarted])
    assert "open prepare c1 age unknown (later work finished since: restarted?)" in _render(again, 160)


def test_a_span_whose_end_was_read_first_is_never_shown_open() -> None:
    """Live, two files read one after the other (a worker's own log and its copy, a file out of
    time order) can give a span's end before its start: the start opened it again, shown open,
    then STALLED past ``stall_after``, for work long finished. Its end is remembered."""
    view = FleetView([], stall_after=30.0)
    start = int((NOW - 120.0) * NS)
    began = OperationStarted(
        kind="agent",
        instance="agent-0",
        trace_id=9,
        span_id=5,
        start_ns=start,
        operation="commit",
        checkpoint_id="c1",
    )
    ended = OperationFinished(
        kind="agent",
        instance="agent-0",
        trace_id=9,
        span_id=5,
        start_ns=start,
        end_ns=start + NS,
        operation="commit",
        checkpoint_id="c1",
        outcome="ok",
    )
    view.add_events([ended], NOW - 60.0)
    view.add_events([began], NOW - 60.0)
    out = Console(width=160, record=True, color_system=None, file=io.StringIO())
    out.print(view.render(NOW))
    text = out.export_text()
    assert "open commit" not in text and "STALLED" not in text
    assert "c1 commit ok" in text


def test_participants_known_from_logs_alone_are_bounded_and_counted() -> None:
    """A log naming 100,000 instances kept a block of state each and rendered a row each on
    every refresh (353 MiB, 19 s a frame, measured); past ``MAX_FROM_LOGS`` they are counted in
    a note, while a participant polled by URL is always shown."""
    view = FleetView(["http://127.0.0.1:42009"], stall_after=30.0)
    start = int((NOW - 5.0) * NS)
    many = [
        OperationStarted(
            kind="agent",
            instance=f"agent-{i}",
            trace_id=1,
            span_id=i + 1,
            start_ns=start,
            operation="prepare",
            checkpoint_id="c1",
        )
        for i in range(MAX_FROM_LOGS + 500)
    ]
    view.add_events(many, NOW)
    polled = StatusReply(kind="model", instance="model-0", phase=Phase.IDLE)
    view.add_polls([PollResult(url="http://127.0.0.1:42009", seconds=0.01, status=polled)], NOW)
    assert len(view.seen) == MAX_FROM_LOGS + 1
    out = Console(width=160, height=40, record=True, color_system=None, file=io.StringIO())
    out.print(view.render(NOW))
    assert "500 more participants in the logs not tracked" in out.export_text()


def test_two_servers_answering_as_one_participant_are_not_merged() -> None:
    """Two URLs answering as ``agent/agent-0`` (two servers started with one ``--instance``)
    were folded into one participant: the one in sync was said to run 120 min ahead of our
    clock and its prepare, stuck for 30 s, to be 1 s old. The second is shown as a twin."""
    first, second = "http://127.0.0.1:42011", "http://127.0.0.1:42012"
    view = FleetView([first, second], stall_after=30.0)
    preparing = StatusReply(kind="agent", instance="agent-0", phase=Phase.PREPARING, checkpoint_id="c1")
    idle = StatusReply(kind="agent", instance="agent-0", phase=Phase.IDLE)
    for i in range(30):
        view.add_polls(
            [
                PollResult(url=first, seconds=0.01, status=preparing, clock_offset=0.0, clock_error=0.01),
                PollResult(url=second, seconds=0.01, status=idle, clock_offset=7200.0, clock_error=0.005),
            ],
            NOW + i,
        )
    out = Console(width=160, record=True, color_system=None, file=io.StringIO())
    out.print(view.render(NOW + 30, rows=False))
    text = out.export_text()
    assert "ahead of ours" not in text and "for >=30.0 s" in text
    assert f"answers as agent/agent-0, as {first} does" in text


def test_once_exits_non_zero_for_two_servers_answering_as_one_participant(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--once`` printed the twin in red and exited 0: a script reading its status saw a healthy
    fleet. The twin is a failure of its own kind, one line on stderr, exit as unreadable."""
    from ckpt_events.participants.cli.watch.command import EXIT_UNREACHABLE, once_status

    first, second = "http://127.0.0.1:42011", "http://127.0.0.1:42012"
    view = FleetView([first, second], stall_after=30.0)
    idle = StatusReply(kind="agent", instance="agent-0", phase=Phase.IDLE)
    view.add_polls(
        [
            PollResult(url=first, seconds=0.01, status=idle, clock_offset=0.0, clock_error=0.01),
            PollResult(url=second, seconds=0.01, status=idle, clock_offset=0.0, clock_error=0.01),
        ],
        NOW,
    )
    assert view.polls[second].failure == "duplicate"
    assert once_status([view.polls[first], view.polls[second]]) == EXIT_UNREACHABLE
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"ckpt-events watch: {second}: answers as agent/agent-0")
    assert "check the URL" not in line


def test_a_url_now_answered_by_another_participant_leaves_no_false_entry() -> None:
    """A server replaced on its port by another (a different kind, a new instance name): the one
    gone stayed an entry "(from logs only)" with no log followed, and one was kept per name a
    URL ever answered as (a server restarted under a new name each time grew the view for ever).
    Known from its logs too, it stays, from them."""
    url = "http://127.0.0.1:18003"
    view = FleetView([url], stall_after=60.0)
    for n in range(1000):
        status = StatusReply(kind="agent", instance=f"agent-{n}", phase=Phase.IDLE)
        view.add_polls([PollResult(url=url, seconds=0.01, status=status)], NOW - 1000 + n)
    env = StatusReply(kind="environment", instance="environment-0", phase=Phase.IDLE)
    view.add_polls([PollResult(url=url, seconds=0.01, status=env)], NOW - 1.0)
    view.add_events(
        [
            OperationStarted(
                kind=Kind.ENVIRONMENT,
                instance="environment-0",
                trace_id=1,
                span_id=7,
                start_ns=int((NOW - 3.0) * NS),
                operation=Operation.COMMIT,
                checkpoint_id="c1",
            )
        ]
    )
    assert len(view.seen) == 1
    agent = StatusReply(kind="agent", instance="agent-new", phase=Phase.IDLE)
    view.add_polls([PollResult(url=url, seconds=0.01, status=agent)], NOW)
    text = _render(view, 160)
    assert "agent agent-new" in text and "agent-999" not in text, text
    assert "environment environment-0\n  (from logs only)\n  open commit c1" in text, text
    assert len(view.seen) == 2


@pytest.mark.parametrize(
    "gap",
    [
        PollResult(url="http://127.0.0.1:18004", seconds=0.8, error="unreachable: ConnectError: refused"),
        PollResult(
            url="http://127.0.0.1:18004",
            seconds=0.01,
            status=StatusReply(kind="agent", instance="agent-other", phase=Phase.IDLE),
        ),
    ],
    ids=["unreachable", "another-answered"],
)
def test_time_in_phase_does_not_count_across_a_gap_in_its_answers(gap: PollResult) -> None:
    """A participant seen prepared, unreachable for 100 s, then prepared again was shown "for
    101.0 s", as if seen in that phase all along: it may have restarted and prepared again. After
    a gap its time in phase is what it has been seen since, a lower bound (``>=``). Known from its
    logs too, it stays an entry while its URL answers as another participant."""
    url = "http://127.0.0.1:18004"
    view = FleetView([url], stall_after=60.0, rows=False)
    view.add_events(
        [
            OperationFinished(
                kind=Kind.AGENT,
                instance="agent-0",
                trace_id=1,
                span_id=7,
                start_ns=int((NOW - 102.0) * NS),
                end_ns=int((NOW - 101.5) * NS),
                operation=Operation.PREPARE,
                checkpoint_id="c1",
                outcome=Outcome.OK,
            )
        ],
        NOW - 101.0,
    )
    prepared = StatusReply(kind="agent", instance="agent-0", phase=Phase.PREPARED, checkpoint_id="c1")
    view.add_polls([PollResult(url=url, seconds=0.01, status=prepared)], NOW - 101.0)
    view.add_polls([PollResult(url=url, seconds=0.01, status=prepared)], NOW - 100.0)
    for t in range(99, 0, -1):
        view.add_polls([gap], NOW - t)
    view.add_polls([PollResult(url=url, seconds=0.01, status=prepared)], NOW - 1.0)
    text = _render(view, 160)
    assert "phase prepared" in text and "for >=1.0 s" in text, text
    assert "101.0 s" not in text, text


def test_open_work_of_a_worker_names_the_worker() -> None:
    """A ``serve --workers`` participant killed in a commit: its main process and its worker 1
    each left a commit of c1 open, shown as two identical lines ('open commit c1 >=40.0 s
    STALLED' twice), so which process hung was not said. A worker's work names its worker."""
    view = FleetView([], stall_after=30.0)
    start = int((NOW - 40.0) * NS)
    common = {"kind": "environment", "instance": "environment-0", "trace_id": 1, "operation": "commit"}
    main_commit = OperationStarted(**common, span_id=1, start_ns=start, checkpoint_id="c1")
    worker_commit = OperationStarted(**common, span_id=2, start_ns=start + 1, checkpoint_id="c1", worker=1)
    _read_live(view, [main_commit, worker_commit])
    text = _render(view, 160)
    assert "open commit c1 >=40.0 s STALLED" in text, text
    assert "open commit c1 on worker 1 >=40.0 s STALLED" in text, text


def test_a_workers_stall_report_marks_its_own_work_alone(tmp_path: Path) -> None:
    """A ``serve --workers`` participant whose worker 1 reported its commit of c1 stalled
    (StallWatch's ``stalled`` event, worker 1) while its main process had just opened its own
    commit of c1: both were shown STALLED, the main process's a moment old. Read live or folded
    from a real log (the backlog), the report marks the worker's commit alone."""
    common = {"kind": "environment", "instance": "environment-0", "trace_id": 1, "operation": "commit"}
    worker_commit = OperationStarted(
        **common, span_id=2, start_ns=int((NOW - 40) * NS), checkpoint_id="c1", worker=1
    )
    main_commit = OperationStarted(**common, span_id=1, start_ns=int(NOW * NS), checkpoint_id="c1")
    report = Stalled(
        kind="environment",
        instance="environment-0",
        time_ns=int(NOW * NS),
        operation="commit",
        age_s=40.0,
        checkpoint_id="c1",
        worker=1,
    )
    live = FleetView([], stall_after=30.0)
    _read_live(live, [worker_commit, main_commit, report])
    log = tmp_path / "env.jsonl"
    sink = JsonLinesSink(log)
    sink.handle([worker_commit, main_commit, report])
    sink.close()
    folded = FleetView([], stall_after=30.0)
    with LogFollower([str(log)], budget=None) as follower:
        folded.add_events(follower.read(), NOW)
    for view in (live, folded):
        text = _render(view, 160)
        assert "open commit c1 on worker 1 >=40.0 s STALLED" in text, text
        assert re.search(r"open commit c1 >=0\.0 s\n", text), text


def test_a_backlog_keeps_a_workers_stall_report_and_its_main_processs() -> None:
    """Both the main process and worker 1 reported their commit of c1 stalled: the backlog kept
    one report per operation and checkpoint, so the worker's overwrote the main process's."""
    from ckpt_events.participants.cli.watch.backlog import Backlog

    common = {"kind": "environment", "instance": "environment-0", "trace_id": 1, "operation": "commit"}
    start = int((NOW - 40) * NS)
    opened = [
        OperationStarted(**common, span_id=1, start_ns=start, checkpoint_id="c1"),
        OperationStarted(**common, span_id=2, start_ns=start, checkpoint_id="c1", worker=1),
    ]
    reports = [
        Stalled(
            kind="environment",
            instance="environment-0",
            time_ns=int(NOW * NS),
            operation="commit",
            age_s=40.0,
            checkpoint_id="c1",
            worker=worker,
        )
        for worker in (None, 1)
    ]
    backlog = Backlog()
    backlog.add_all([*opened, *reports])
    assert [e for e in backlog.events() if isinstance(e, Stalled)] == reports


def test_ends_read_before_their_start_are_kept_newest_first_past_the_bound() -> None:
    """Past ``_ENDED_KEPT`` ends kept per participant (and of unread ends), the oldest is let go
    (an ``OrderedDict.popitem``, was ``del d[next(iter(d))]``): its start read later opens its
    span; the newest still close theirs."""
    from ckpt_events.participants.cli.watch.view import _ENDED_KEPT

    view = FleetView([], stall_after=30.0)
    start = int((NOW - 5.0) * NS)
    total = _ENDED_KEPT + 2

    def span(n: int, *, end: bool) -> OperationStarted | OperationFinished:
        fields: dict[str, Any] = {
            "kind": "agent",
            "instance": "agent-0",
            "trace_id": 1,
            "span_id": n,
            "start_ns": start,
            "operation": "commit",
            "checkpoint_id": "c1",
        }
        return (
            OperationFinished(**fields, end_ns=start + 1, outcome="ok") if end else OperationStarted(**fields)
        )

    view.add_events([span(n, end=True) for n in range(1, total + 1)], NOW)
    unread = [(2, n) for n in range(1, total + 1)]  # ends read in lines this version cannot read
    view.add_events([], NOW, ended=unread)
    view.add_events([span(n, end=False) for n in range(1, total + 1)], NOW)
    assert sorted(view.seen[("agent", "agent-0")].open) == [(1, 1), (1, 2)]
    assert list(view._unread_ends) == unread[2:]


def test_a_worker_s_finished_operation_names_its_worker() -> None:
    """Two workers' commits of one checkpoint are two lines that say which worker (they read
    "c5 commit ok 0 ms" twice); a single process's line is as it was."""
    with EventCapture() as capture:
        for worker in (0, 1):
            with capture.telemetry("judge", "judge-0", worker=worker).operation("commit", checkpoint_id="c5"):
                pass
        with capture.telemetry("model", "model-0").operation("commit", checkpoint_id="c5"):
            pass
        events = capture.events
    view = FleetView([])
    view.add_events(events, NOW)
    text = _render(view, 160)
    assert "last: c5 commit on worker 0 ok 1 ms | c5 commit on worker 1 ok 1 ms" in text, text
    assert "last: c5 commit ok 1 ms" in text, text
    out = Console(width=160, record=True, color_system=None, file=io.StringIO())
    out.print(view.render(NOW, rows=True))
    rows = out.export_text()
    assert "last c5 commit on worker 1 ok 1 ms" in rows, rows
