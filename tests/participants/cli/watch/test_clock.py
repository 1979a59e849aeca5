"""``watch`` ages a participant's open work by the participant's clock: a real ``ckpt-events
serve`` whose clock runs 40 s behind or 60 s ahead of ours, with a prepare open about a second."""

from __future__ import annotations

import functools
import io
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import anyio
import httpx
import pytest
from rich.console import Console

from ckpt_events import Event, OperationFinished, OperationStarted
from ckpt_events.participants.cli.fleet import free_port
from ckpt_events.participants.cli.main import main
from ckpt_events.participants.cli.watch.view import FleetView
from ckpt_events.participants.protocol import CONTROL_PREFIX, SERVER_TIME_HEADER
from tests.participants.helpers import ROOT

TOKEN = "clock-test-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
NS = 1_000_000_000

#: The server's process with its wall clock moved by SKEW seconds, before anything reads it.
_SKEWED = """
import sys, time
skew = float(sys.argv[1])
real, real_ns = time.time, time.time_ns
time.time = lambda: real() + skew
time.time_ns = lambda: real_ns() + int(skew * 1e9)
from ckpt_events.participants.cli.main import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("skew", [-40.0, 60.0])
async def test_a_prepare_open_a_second_is_a_second_old_whatever_the_participants_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], skew: float
) -> None:
    """``watch --once`` polls the participant and reads its log: the prepare, stamped by a clock
    ``skew`` seconds off ours, is shown about a second old and not stalled; the participant's line
    says its clock is off and ages are corrected. Without the correction it was 41 s STALLED (40 s
    behind) or -59 s (60 s ahead)."""
    log = tmp_path / "env.jsonl"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "CKPT_EVENTS_TOKEN": TOKEN, "CKPT_EVENTS_JSONL": str(log)}
    argv = [
        "serve",
        "environment",
        "--port",
        str(port),
        "--step-seconds",
        "20",
        "--checkpoint-root",
        str(ROOT),
    ]
    stderr = open(tmp_path / "server.stderr", "wb")  # noqa: SIM115 - closed below
    server = subprocess.Popen([sys.executable, "-c", _SKEWED, str(skew), *argv], env=env, stderr=stderr)
    try:
        async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=5) as http:
            with anyio.fail_after(30):  # the server's start-up
                while True:
                    try:
                        reply = await http.get(CONTROL_PREFIX + "/status")
                        break
                    except httpx.ConnectError:
                        await anyio.sleep(0.1)
            theirs = float(reply.headers[SERVER_TIME_HEADER])
            assert abs(theirs - time.time() - skew) < 1.0
            episode = {"rollout_id": "r1", "attempt": 0}
            assert (await http.post("/work/start", json={**episode, "steps": 3})).status_code == 200
            async with anyio.create_task_group() as tg:
                tg.start_soon(
                    functools.partial(http.post, "/work/advance", json=episode)
                )  # a 20 s step: prepare waits on it
                await anyio.sleep(0.2)
                prepare = {"checkpoint_id": "c-clock", "deadline_ts": time.time() + skew + 8.0}
                tg.start_soon(functools.partial(http.post, CONTROL_PREFIX + "/prepare", json=prepare))
                await anyio.sleep(1.0)
                monkeypatch.setenv("CKPT_EVENTS_TOKEN", TOKEN)
                monkeypatch.setenv("COLUMNS", "160")
                argv = ["watch", "--once", "--stall-after", "5", "--participant", url, "--follow", str(log)]
                code = await anyio.to_thread.run_sync(main, argv)
                tg.cancel_scope.cancel()
    finally:
        server.terminate()
        server.wait(timeout=10)
        stderr.close()
    out = capsys.readouterr().out
    assert code == 0, out
    age = re.search(r"open prepare c-clock (\S+) s(.*)", out)
    assert age is not None, out
    assert 0.8 <= float(age[1]) < 3.0 and "STALLED" not in age[2], out
    side = "behind" if skew < 0 else "ahead of"
    note = re.search(rf"clock (\d+\.\d) s {side} ours: ages corrected", out)
    assert note is not None and abs(float(note[1]) - abs(skew)) < 0.5, out
    assert "-" not in age[1]
    print(out)


def test_work_stamped_in_our_future_by_a_participant_of_unknown_clock_has_no_age() -> None:
    """A participant known only from its logs, whose clock is ahead: its open work is shown with
    its age unknown and why, never a negative age, never stalled."""
    from ckpt_events import OperationStarted

    now = time.time()
    view = FleetView([], stall_after=0.5)
    start = int((now + 60.0) * NS)
    view.add_events(
        [
            OperationStarted(
                kind="environment",
                instance="env-9",
                trace_id=1,
                span_id=1,
                start_ns=start,
                operation="prepare",
            )
        ]
    )
    out = Console(width=160, record=True, color_system=None, file=io.StringIO())
    out.print(view.render(now))
    text = out.export_text()
    assert "open prepare - age unknown (stamped 60.0 s in our future: its clock is ahead)" in text, text
    assert "STALLED" not in text and "-60" not in text


async def test_work_of_a_participant_known_from_its_logs_whose_clock_is_behind_is_not_stalled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A participant whose clock runs 120 s behind ours, followed from its log alone (no
    ``/status`` measures the offset): its prepare, open a moment, was "120.0 s STALLED" (its
    stamp read against our clock). It is at least as old as its own stamps and our reads say,
    never stalled for the clock; left with no event past ``stall_after``, it is STALLED."""
    from ckpt_events import Bus, Telemetry
    from ckpt_events.participants.cli.watch.follow import LogFollower
    from ckpt_events.sinks.jsonl import JsonLinesSink

    log = tmp_path / "env.jsonl"
    sink = JsonLinesSink(log)
    async with Bus() as bus:
        bus.subscribe(sink)
        tel = Telemetry(
            bus, kind="environment", instance="environment-0", clock=lambda: time.time_ns() - 120 * NS
        )
        with tel.operation("commit", checkpoint_id="c0"):
            pass
        prepare = tel.operation("prepare", checkpoint_id="c1").__enter__()
        await bus.flush()
        sink.flush()
        monkeypatch.setenv("COLUMNS", "160")
        argv = ["watch", "--once", "--follow", str(log), "--stall-after", "5"]
        assert await anyio.to_thread.run_sync(main, argv) == 0
        out = capsys.readouterr().out
        assert re.search(r"open prepare c1 >=[0-4]\.\d s", out) and "STALLED" not in out, out
        follower = LogFollower([str(log)], budget=None)
        view = FleetView([], stall_after=0.5)
        view.add_events(follower.read(), time.time())
        shown = Console(width=160, record=True, color_system=None, file=io.StringIO())
        shown.print(view.render())
        assert "STALLED" not in shown.export_text(), shown.export_text()
        await anyio.sleep(0.7)  # no event from it since: a stall by our clock alone
        view.add_events(follower.read(), time.time())
        shown = Console(width=160, record=True, color_system=None, file=io.StringIO())
        shown.print(view.render())
        assert re.search(r"open prepare c1 >=\d+\.\d s STALLED", shown.export_text()), shown.export_text()
        follower.close()
        prepare.__exit__(None, None, None)


async def _log_across_a_clock_step(log: Path, *, open_before: bool) -> None:
    """A participant whose clock ran 300 s ahead, then was stepped back to ours (NTP): a commit
    before the step, a prepare opened after it (or, ``open_before``, before it and left open),
    and a commit after it."""
    from ckpt_events import Bus, Telemetry
    from ckpt_events.sinks.jsonl import JsonLinesSink

    skew = [300 * NS]
    async with Bus() as bus:
        bus.subscribe(JsonLinesSink(log))
        tel = Telemetry(
            bus, kind="environment", instance="environment-0", clock=lambda: time.time_ns() + skew[0]
        )
        with tel.operation("commit", checkpoint_id="c0"):
            pass
        if open_before:
            tel.operation("prepare", checkpoint_id="c1").__enter__()
        skew[0] = 0  # the step back
        if not open_before:
            tel.operation("prepare", checkpoint_id="c1").__enter__()
        with tel.operation("commit", checkpoint_id="c-other"):
            pass


@pytest.mark.parametrize("live", [False, True])
async def test_a_clock_stepped_back_never_makes_work_opened_after_it_stalled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], live: bool
) -> None:
    """A log written by a clock that ran 300 s ahead and was stepped back: its later prepare, open
    a moment, was ">=5.0 min STALLED" (its stamps before the step taken as the least its clock is
    ahead). Folded at once (the backlog) or read as it is written, it is a moment old."""
    from ckpt_events.participants.cli.watch.follow import LogFollower

    log = tmp_path / "env.jsonl"
    if not live:
        await _log_across_a_clock_step(log, open_before=False)
        monkeypatch.setenv("COLUMNS", "160")
        argv = ["watch", "--once", "--follow", str(log), "--stall-after", "30"]
        assert await anyio.to_thread.run_sync(main, argv) == 0
        text = capsys.readouterr().out
    else:
        log.touch()
        view = FleetView([], stall_after=30.0)
        with LogFollower([str(log)]) as follower:
            view.add_events(follower.read(), time.time())  # the backlog: empty
            await _log_across_a_clock_step(log, open_before=False)
            view.add_events(follower.read(), time.time())
        shown = Console(width=160, record=True, color_system=None, file=io.StringIO())
        shown.print(view.render())
        text = shown.export_text()
    assert re.search(r"open prepare c1 >=[0-4]\.\d s", text) and "STALLED" not in text, text


async def test_work_opened_before_its_clock_was_stepped_back_is_of_unknown_age(tmp_path: Path) -> None:
    """A prepare stamped by the clock 300 s ahead, before it was stepped back: its age by the
    participant's clock is unknown (not 'in our future', never stalled for it)."""
    from ckpt_events.participants.cli.watch.follow import LogFollower

    log = tmp_path / "env.jsonl"
    await _log_across_a_clock_step(log, open_before=True)
    view = FleetView([], stall_after=1.0)
    with LogFollower([str(log)], budget=None) as follower:
        view.add_events(follower.read(), time.time())
    shown = Console(width=160, record=True, color_system=None, file=io.StringIO())
    shown.print(view.render(time.time() + 5))
    text = shown.export_text()
    said = "open prepare c1 age unknown (its stamps went back since it opened: clock stepped back?)"
    assert said in text, text
    assert "STALLED" not in text


def test_workers_logs_read_one_after_the_other_are_no_clock_step() -> None:
    """Two workers of one participant, each its own log, read one file after the other: the second
    file's stamps go back in time without any clock stepping. The prepare worker 1 opened 600 s
    ago, with later work from both, is 600 s old by their stamps (STALLED), not of unknown age."""
    from ckpt_events import OperationFinished, OperationStarted

    now = time.time()
    at = int(now * NS)
    minute = 60 * NS

    def done(worker: int, span: int, end: int) -> OperationFinished:
        return OperationFinished(
            kind="environment",
            instance="env-0",
            trace_id=1,
            span_id=span,
            start_ns=end - NS,
            end_ns=end,
            operation="commit",
            outcome="ok",
            checkpoint_id=f"c{span}",
            worker=worker,
        )

    view = FleetView([], stall_after=30.0)
    # worker 0's file, then worker 1's: as LogFollower reads a folder
    view.add_events([done(0, 1, at - 9 * minute), done(0, 2, at - 1 * NS)], now)
    prepare = OperationStarted(
        kind="environment",
        instance="env-0",
        trace_id=1,
        span_id=3,
        start_ns=at - 10 * minute,
        operation="prepare",
        checkpoint_id="c9",
        worker=1,
    )
    view.add_events([prepare, done(1, 4, at - 2 * NS)], now)
    shown = Console(width=160, record=True, color_system=None, file=io.StringIO())
    shown.print(view.render(now))
    text = shown.export_text()
    assert re.search(r"open prepare c9 on worker 1 >=10\.0 min STALLED", text), text


def _commit(span: int, start: int, end: int | None = None) -> Event:
    """A commit of judge/judge-0 (two uvicorn workers given one instance): started, or finished."""
    common = {"kind": "judge", "instance": "judge-0", "trace_id": span, "span_id": span, "start_ns": start}
    if end is None:
        return OperationStarted(**common, operation="commit", checkpoint_id=f"c{span}")
    return OperationFinished(**common, end_ns=end, operation="commit", outcome="ok", checkpoint_id=f"c{span}")


@pytest.mark.parametrize("then", ["in order", "nothing", "stepped"])
def test_a_batch_another_worker_wrote_late_to_the_shared_log_is_no_clock_step(then: str) -> None:
    """Two workers of judge-0 append to one log. Worker A's commit hangs; worker B's loop is held
    up 3 s, so its batch lands 3 s behind the lines above it, then both write on. A's commit, open 20 s,
    was "age unknown (clock stepped back?)" for ever after (never STALLED); it is STALLED once the
    stamps come back. Until they do, it is of unknown age, never STALLED for it; stamps that stay
    back a second are a clock stepped back, as before."""
    now = time.time()
    at = int(now * NS)
    view = FleetView([], stall_after=5.0)
    view.add_events([_commit(1, at - 20 * NS)], now - 20)  # A's commit, the one that hangs
    for second in range(19, 2, -1):  # both workers at work, one commit a second
        view.add_events(
            [_commit(100 + second, at - second * NS, at - second * NS + NS // 10)], now - second + 0.1
        )
    late = at - 6 * NS  # 3 s behind both workers' last line
    view.add_events([_commit(50, late), _commit(50, late, late + NS // 100)], now - 2)  # B's, 3 s late
    if then == "in order":
        view.add_events([_commit(60, at - NS, at - NS + NS // 10)], now)
    elif then == "stepped":  # B's stamps run on a second, never back near A's: a step
        view.add_events([_commit(61, late + NS, late + NS + NS // 10)], now)
    shown = Console(width=160, record=True, color_system=None, file=io.StringIO())
    shown.print(view.render(now))
    text = shown.export_text()
    if then == "in order":
        assert re.search(r"open commit c1 >=20\.0 s STALLED", text), text
    else:
        assert (
            "open commit c1 age unknown (its stamps went back since it opened: clock stepped back?)" in text
        )
        assert "STALLED" not in text, text


@pytest.mark.parametrize("who", ["ours", "theirs", "theirs before the first read"])
async def test_a_wall_clock_stepped_forward_never_makes_open_work_stalled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, who: str
) -> None:
    """A commit open a moment, followed from its log alone, then a wall clock steps forward an
    hour (NTP, a VM resumed): ours (the watcher's ``time.time``), or the participant's, which
    writes a commit after the step (read live, or in the backlog of the first read). It was
    ">=60.0 min STALLED"; it is as old as our monotonic clock measured since we read it (less than
    a minute), never stalled for the step, and stalled again once that passes ``stall_after``."""
    from ckpt_events import Bus, Telemetry
    from ckpt_events.participants.cli.watch.command import plain, snapshot
    from ckpt_events.participants.cli.watch.follow import LogFollower
    from ckpt_events.sinks.jsonl import JsonLinesSink

    log = tmp_path / "env.jsonl"
    hour = 3600 * NS
    skew = [0]
    view = FleetView([], stall_after=60.0)
    out = Console(width=160, record=True, color_system=None, file=io.StringIO())
    async with Bus() as bus:
        bus.subscribe(JsonLinesSink(log))
        tel = Telemetry(
            bus, kind="environment", instance="environment-0", clock=lambda: time.time_ns() + skew[0]
        )
        commit = tel.operation("commit", checkpoint_id="c1").__enter__()
        await bus.flush()
        with LogFollower([str(log)]) as follower:
            if who != "theirs before the first read":
                await snapshot(view, None, follower, 1.0)  # the first read, before the step
            if who == "ours":
                real, real_ns = time.time, time.time_ns
                monkeypatch.setattr(time, "time", lambda: real() + 3600.0)
                monkeypatch.setattr(time, "time_ns", lambda: real_ns() + hour)
            else:
                skew[0] = hour
                with tel.operation("commit", checkpoint_id="c2"):
                    pass
                await bus.flush()
            await plain(view, None, follower, out, once=True)
        text = out.export_text()
        assert re.search(r"open commit c1 >=\d{1,2}\.\d s", text), text
        assert "STALLED" not in text and "min" not in text, text
        # Past stall_after by our monotonic clock: stalled, whatever the wall clocks did.
        later = Console(width=160, record=True, color_system=None, file=io.StringIO())
        later.print(view.render(time.time(), mono=time.monotonic() + 61.0))
        assert re.search(r"open commit c1 >=\d+\.\d s STALLED", later.export_text()), later.export_text()
        commit.__exit__(None, None, None)


def test_a_polled_participants_work_is_aged_right_after_our_wall_clock_stepped() -> None:
    """Polled in sync with tight round trips, then our wall clock stepped forward an hour (NTP, a
    VM resumed) and the polls after it had looser round trips: the sample kept (the tightest) was
    taken before the step, so a prepare open 6 s was "60.1 min STALLED" and its phase ">=60.1
    min". Samples are now against our monotonic clock: 6.0 s, not stalled, before and after the
    first poll that follows the step."""
    from ckpt_events.participants.cli.watch.sources import PollResult
    from ckpt_events.participants.protocol import StatusReply
    from ckpt_events.vocab import Phase

    url, wall, mono, step = "http://127.0.0.1:42011", 1_800_000_000.0, 1000.0, 3600.0
    view = FleetView([url], stall_after=30.0)
    status = StatusReply(kind="environment", instance="env-0", phase=Phase.PREPARING, checkpoint_id="c1")
    start = OperationStarted(
        kind="environment",
        instance="env-0",
        trace_id=1,
        span_id=1,
        start_ns=int(wall * NS),
        operation="prepare",
        checkpoint_id="c1",
    )
    view.add_events([start], wall, mono=mono)

    def poll(offset: float, error: float) -> PollResult:
        return PollResult(url=url, seconds=error, status=status, clock_offset=offset, clock_error=error)

    def shown(at: float) -> str:
        out = Console(width=160, record=True, color_system=None, file=io.StringIO())
        out.print(view.render(at + step, mono=mono + at - wall, rows=False))
        return out.export_text()

    for i in range(3):  # before the step
        view.add_polls([poll(0.0, 0.001)], wall + i, mono=mono + i)
    text = shown(wall + 3)  # stepped, not polled since
    assert "open prepare c1 3.0 s\n" in text and "for >=3.0 s" in text, text
    for i in range(3, 6):  # after it: its clock is an hour behind ours now
        view.add_polls([poll(-step, 0.01)], wall + step + i, mono=mono + i)
    text = shown(wall + 6)
    assert "open prepare c1 6.0 s\n" in text and "for >=6.0 s" in text, text
    assert "STALLED" not in text and "60.0 min behind ours" in text


def test_clock_samples_taken_before_the_participants_clock_stepped_are_dropped() -> None:
    """A participant's clock stepped back 120 s between polls: its earlier, tighter samples
    disagree with the newest past their errors and are dropped (was: kept as the tightest, so
    its correction stayed 120 s off until they left the 8 kept)."""
    from ckpt_events.participants.cli.watch.seen import Seen

    seen = Seen()
    for _ in range(3):
        seen.polled(0.0, 0.001, 0.0)
    seen.polled(-120.0, 0.01, 0.0)
    assert seen.clock(0.0) == (-120.0, 0.01)
    seen.polled(-120.002, 0.004, 0.0)  # the same clock, a tighter round trip: kept beside it
    assert seen.clock(0.0) == (-120.002, 0.004)
