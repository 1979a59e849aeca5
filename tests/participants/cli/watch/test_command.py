"""``ckpt-events watch`` against a real fleet (uvicorn in this process) with one participant stalled
in prepare; StallWatch and the open-work gauges see the same stall."""

from __future__ import annotations

import fcntl
import functools
import io
import logging
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from rich.console import Console

from ckpt_events import Bus, Telemetry
from ckpt_events.participants.cli.fleet import free_port, local_fleet
from ckpt_events.participants.cli.main import main
from ckpt_events.participants.cli.watch.command import live, show, snapshot
from ckpt_events.participants.cli.watch.follow import LogFollower
from ckpt_events.participants.cli.watch.view import FleetView
from ckpt_events.participants.protocol import CONTROL_PREFIX
from ckpt_events.sinks import JsonLinesSink, StallWatch
from ckpt_events.sinks.otel import MetricSink
from ckpt_events.vocab import METRIC_EVENTS, METRIC_OLDEST_OPEN
from tests.participants.helpers import ROOT
from tests.sinks.helpers import metric_points

TOKEN = "watch-test-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
P = "nemo.gym.checkpoint."
PREPARE_ENV = frozenset({(P + "operation", "prepare"), (P + "participant_kind", "environment")})
TWO = (("environment", "environment-0"), ("resources", "resources-0"))


@asynccontextmanager
async def stalled_fleet(
    log: Path, step_seconds: float = 2.5
) -> AsyncIterator[tuple[dict[str, str], StallWatch, InMemoryMetricReader]]:
    """Two participants; environment-0 has a step in flight (2.5 s) when a prepare comes, so its first
    prepare (0.3 s deadline) reports the blocker and a retried one stays open until the step ends:
    a stall of about 1.9 s, over before the servers stop (nothing in flight is cancelled)."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    async with Bus() as bus:
        watch = StallWatch(after=0.5, bus=bus)
        bus.subscribe(watch)
        bus.subscribe(MetricSink(provider))
        bus.subscribe(JsonLinesSink(log), linger=0.0)
        options = {"environment-0": {"step_seconds": step_seconds}}
        async with local_fleet(
            token=TOKEN, bus=bus, members=TWO, options=options, checkpoint_root=ROOT
        ) as urls:
            env = urls["environment-0"]
            async with httpx.AsyncClient(headers=AUTH, timeout=10) as http, anyio.create_task_group() as tg:
                started = await http.post(
                    env + "/work/start", json={"rollout_id": "r1", "attempt": 0, "steps": 3}
                )
                assert started.status_code == 200, started.text
                tg.start_soon(_post, http, env + "/work/advance", {"rollout_id": "r1", "attempt": 0})
                await anyio.sleep(0.2)
                first = await http.post(
                    env + CONTROL_PREFIX + "/prepare",
                    json={"checkpoint_id": "c-stall", "deadline_ts": time.time() + 0.3},
                )
                assert first.json()["report"]["blockers"] == ["r1"], first.text
                retry = {"checkpoint_id": "c-stall", "deadline_ts": time.time() + 5.0}
                tg.start_soon(_post, http, env + CONTROL_PREFIX + "/prepare", retry)
                await anyio.sleep(0.1)
                yield urls, watch, reader
    provider.shutdown()


async def _post(http: httpx.AsyncClient, url: str, payload: dict[str, Any]) -> None:
    await http.post(url, json=payload)


def _render(view: FleetView, width: int) -> str:
    out = Console(width=width, record=True, color_system=None, file=io.StringIO())
    out.print(view.render())
    return out.export_text()


async def test_watch_names_the_stalled_participant_its_blockers_lease_and_open_prepare(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Within 2 s of the stall: not ready with its blocker, lease left, the open prepare with its age
    (stalled); one StallWatch warning, one ``stalled`` counted, the oldest-open gauge growing."""
    caplog.set_level(logging.WARNING, logger="ckpt_events.sinks.stall")
    log = tmp_path / "events.jsonl"
    async with stalled_fleet(log) as (urls, watch, reader):
        stall_began = time.monotonic()
        first_age = metric_points(reader)[METRIC_OLDEST_OPEN][1][PREPARE_ENV]
        view = FleetView(list(urls.values()), stall_after=0.5)
        with LogFollower([str(tmp_path)]) as follower:
            async with httpx.AsyncClient(headers=AUTH) as client:
                await anyio.sleep(0.6)
                await snapshot(view, client, follower, 0.8)
        assert time.monotonic() - stall_began < 2.0
        texts = {width: _render(view, width) for width in (80, 160)}
        await anyio.sleep(0.6)
        later_age = metric_points(reader)[METRIC_OLDEST_OPEN][1][PREPARE_ENV]
    for width, text in texts.items():
        assert "environment environment-0" in text, text
        assert "NOT READY: 1 blocking: r1" in text, text
        assert re.search(r"lease \d+\.\d (s|min) left", text), text
        assert re.search(r"open prepare c-stall \d\.\d s STALLED", text), text
        assert "phase preparing  checkpoint c-stall" in text or width == 80, text
        assert "resources resources-0" in text and "…" not in text
        assert max(len(line) for line in text.splitlines()) <= width
    assert first_age < later_age and later_age > 1.0
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.name == "ckpt_events.sinks.stall" and "stalled:" in r.message
    ]
    assert len(warnings) == 1 and "prepare of environment environment-0 (checkpoint c-stall" in warnings[0]
    assert watch.stalls == 1
    events = metric_points(reader)[METRIC_EVENTS][1]
    assert events[frozenset({(P + "event", "stalled"), *PREPARE_ENV})] == 1
    print(texts[80])


async def test_watch_once_prints_one_snapshot_of_the_stall(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command itself: one plain snapshot naming the stalled participant, exit 0."""
    monkeypatch.setenv("CKPT_EVENTS_TOKEN", TOKEN)
    monkeypatch.setenv("COLUMNS", "100")
    log = tmp_path / "events.jsonl"
    async with stalled_fleet(log) as (urls, _, _):
        await anyio.sleep(0.6)
        argv = ["watch", "--once", "--stall-after", "0.5", "--follow", str(log)]
        for url in urls.values():
            argv += ["--participant", url]
        code = await anyio.to_thread.run_sync(main, argv)
    out = capsys.readouterr().out
    assert code == 0
    assert out.count("-- ckpt-events watch") == 1
    assert "NOT READY: 1 blocking: r1" in out and "STALLED" in out, out


async def test_live_redraws_until_told_to_stop(tmp_path: Path) -> None:
    """``live`` (what a terminal gets, and what ``demo --watch`` can run) redraws from a followed log
    about once a second and returns when ``until`` is set."""
    log = tmp_path / "events.jsonl"
    async with Bus() as bus:
        bus.subscribe(JsonLinesSink(log))
        tel = Telemetry(bus, kind="model", instance="model-0")
        with tel.operation("commit", checkpoint_id="c-live"):
            pass
    out = Console(width=80, record=True, force_terminal=True, file=io.StringIO())
    until = anyio.Event()
    view = FleetView([], stall_after=30.0)
    with LogFollower([str(log)]) as follower:
        async with httpx.AsyncClient() as client, anyio.create_task_group() as tg:
            tg.start_soon(functools.partial(live, view, client, follower, out, until=until))
            await anyio.sleep(1.3)
            until.set()
    text = out.export_text()
    assert "model model-0" in text and "last: c-live commit ok" in text, text


async def test_a_dumb_terminal_gets_a_snapshot_per_interval_while_it_runs(tmp_path: Path) -> None:
    """On ``TERM=dumb`` (an editor's shell, a CI log with a pty) rich's live display cannot move the
    cursor, so it drew nothing until the watch ended: an operator saw a blank screen. It gets the
    pipe's snapshots, as they come."""
    log = tmp_path / "events.jsonl"
    async with Bus() as bus:
        bus.subscribe(JsonLinesSink(log))
        tel = Telemetry(bus, kind="model", instance="model-0")
        with tel.operation("commit", checkpoint_id="c-dumb"):
            pass
    written = io.StringIO()
    out = Console(width=80, force_terminal=True, file=written, _environ={"TERM": "dumb"})
    assert out.is_dumb_terminal
    until = anyio.Event()
    view = FleetView([], stall_after=30.0)
    with LogFollower([str(log)]) as follower:
        async with httpx.AsyncClient() as client, anyio.create_task_group() as tg:
            tg.start_soon(functools.partial(show, view, client, follower, out, interval=0.2, until=until))
            await anyio.sleep(0.9)
            while_running = written.getvalue()
            until.set()
    assert while_running.count("last: c-dumb commit ok") >= 3, while_running
    assert "\x1b[1A" not in written.getvalue()  # no cursor movement


async def test_watch_once_is_a_health_check(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--once`` exits 0 when every participant answered, 2 when one could not be reached, 3 when
    one refused the token (over an unreachable one too); each failure one line on stderr."""
    monkeypatch.setenv("COLUMNS", "120")
    silent = f"http://127.0.0.1:{free_port()}"
    async with Bus() as bus, local_fleet(token=TOKEN, bus=bus, members=TWO, checkpoint_root=ROOT) as urls:
        fleet = [arg for url in urls.values() for arg in ("--participant", url)]

        async def once(token: str, *extra: str) -> tuple[int, str, str]:
            monkeypatch.setenv("CKPT_EVENTS_TOKEN", token)
            code = await anyio.to_thread.run_sync(main, ["watch", "--once", *fleet, *extra])
            out, err = capsys.readouterr()
            return code, out, err

        assert (await once(TOKEN))[::2] == (0, "")
        code, out, err = await once(TOKEN, "--participant", silent)
        assert code == 2 and "environment environment-0" in out
        assert err.splitlines() == [
            f"ckpt-events watch: {silent}: unreachable: ConnectError: All connection attempts failed "
            "(check the URL and that it runs; --timeout for a slow one)"
        ]
        code, _, err = await once("wrong-token", "--participant", silent)
        assert code == 3
        lines = err.splitlines()
        assert len(lines) == 3 and lines[-1].startswith(f"ckpt-events watch: {silent}: unreachable"), err
        assert all("HTTP 401 from /status (wrong token" in line for line in lines[:2]), err


@pytest.mark.parametrize(
    ("option", "value", "said"),
    [
        ("--timeout", "1e308", "'1e308' must be from 0.01 to 300 seconds"),
        ("--interval", "1e-300", "'1e-300' must be from 0.05 to 3600 seconds"),
        ("--stall-after", "1e9", "'1e9' must be from 0.01 to 86400 seconds"),
    ],
)
def test_watch_times_out_of_reason_are_one_line(
    option: str, value: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--once --timeout 1e308`` against a silent server never returned; ``--interval 1e-300``
    redrew 600 times a second."""
    with pytest.raises(SystemExit) as info:
        main(["watch", "--once", option, value, "--participant", "http://127.0.0.1:9"])
    assert info.value.code == 2
    assert said in capsys.readouterr().err


@pytest.mark.parametrize("logs", [[""], ["run.jsonl", " "]])
def test_an_empty_log_to_follow_is_one_line(logs: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """``watch --follow ''`` waited forever for a file named '' to appear; refused as report does."""
    assert main(["watch", "--once", "--follow", *logs]) == 2
    assert capsys.readouterr().err == (
        "ckpt-events watch: error: --follow: an empty log name (a stray comma or quotes?)\n"
    )


def test_once_on_a_log_that_cannot_be_read_is_not_healthy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``watch --once --follow`` a log name that does not exist (a typo) printed 'nothing to watch
    yet ... waiting for it' and exited 0: a health check that read nothing passed. It exits 2 with
    one line for it, as for a participant that could not be read; a log that is there is read."""
    monkeypatch.setenv("COLUMNS", "120")
    real = tmp_path / "env.jsonl"
    sink = JsonLinesSink(real)
    sink.close()
    typo = tmp_path / "evn.jsonl"
    assert main(["watch", "--once", "--follow", str(real), str(typo)]) == 2
    out, err = capsys.readouterr()
    assert err == f"ckpt-events watch: {typo}: cannot read (No such file or directory)\n"
    assert "waiting for it" not in out
    assert main(["watch", "--once", "--follow", str(real)]) == 0


def _watch_process(*argv: str) -> list[str]:
    return [sys.executable, "-m", "ckpt_events.participants.cli", "watch", *argv]


def test_a_fifo_to_follow_is_one_line_not_a_hang(tmp_path: Path) -> None:
    """``watch --follow`` a FIFO (no writer) blocked in ``open()`` for ever, Ctrl-C too; it is
    refused in one line (``--once`` exits 2), as a log that cannot be read is."""
    fifo = tmp_path / "env.jsonl"
    os.mkfifo(fifo)
    argv = _watch_process("--once", "--follow", str(fifo))
    done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done
    why = "a FIFO, not a log file: follow the file the sink writes"
    assert done.stderr == f"ckpt-events watch: {fifo}: cannot read ({why})\n"


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
def test_sigterm_ends_a_live_view_as_ctrl_c_does_and_gives_the_cursor_back(tmp_path: Path) -> None:
    """SIGTERM (``kill``, ``timeout``, a supervisor) killed a live view mid-frame: the terminal was
    left with its cursor hidden. It ends as Ctrl-C does: the cursor shown again, one line, 130."""
    log = tmp_path / "env.jsonl"
    log.touch()
    primary, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    env = {**os.environ, "TERM": "xterm"}
    watch = subprocess.Popen(
        _watch_process("--follow", str(log), "--interval", "0.1"),
        stdin=secondary,
        stdout=secondary,
        stderr=secondary,
        env=env,
        start_new_session=True,
    )
    os.close(secondary)
    seen = b""

    def read_for(seconds: float, until: bytes | None = None) -> None:
        nonlocal seen
        end = time.monotonic() + seconds
        while time.monotonic() < end and (until is None or until not in seen):
            if select.select([primary], [], [], 0.1)[0]:
                try:
                    chunk = os.read(primary, 65536)
                except OSError:  # the child closed the terminal: it has ended
                    return
                if not chunk:
                    return
                seen += chunk

    try:
        read_for(60, until=b"nothing to watch yet")  # its first frame: the live view has started
        assert b"\x1b[?25l" in seen, seen  # rich hid the cursor
        watch.send_signal(signal.SIGTERM)
        assert watch.wait(timeout=30) == 130
        read_for(10)  # what it wrote, to the end (the terminal closes with it)
    finally:
        watch.kill()
        watch.wait()
        os.close(primary)
    assert seen.rfind(b"\x1b[?25h") > seen.rfind(b"\x1b[?25l"), seen[-300:]
    assert seen.endswith(b"ckpt-events watch: interrupted\r\n"), seen[-300:]
