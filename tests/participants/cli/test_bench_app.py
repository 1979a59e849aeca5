"""``ckpt-events bench --app``: a tiny instrumented app, real uvicorn servers, wrk or httpx.

These assert the table's rows and the JSON's shape, never a time: the machine is shared.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from ckpt_events.benchmarks import bench_app, rotel
from ckpt_events.benchmarks.bench_app import BenchAppError
from ckpt_events.benchmarks.load import Load, Request
from ckpt_events.participants.cli.main import main

APP = """
from fastapi import FastAPI, Request

from ckpt_events.participants.fastapi import instrument, operation

app = FastAPI()
instrument(app, kind="judge", instance="judge-0", jsonl_path="events.jsonl")


@app.post("/commit")
async def commit(request: Request) -> dict[str, int]:
    body = await request.json()
    with operation(request, "commit", checkpoint_id=body["checkpoint_id"]) as op:
        with op.step("upload"):
            records = len(body["rows"])
        op.set(records=records)
    return {"records": records}
"""
BODY = '{"checkpoint_id": "c1", "rows": ["a", "b"]}'


def _bench(
    project: Path, *options: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    (project / "tinyapp.py").write_text(APP)
    command = [sys.executable, "-m", "ckpt_events.participants.cli.main", "bench", "--app", "tinyapp:app"]
    command += ["--request", "POST /commit", "--body", BODY, "--rounds", "3", "--duration", "1"]
    command += ["--connections", "4", "--json", str(project / "out.json"), *options]
    return subprocess.run(
        command,
        cwd=project,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def _table(project: Path) -> dict[str, Any]:
    figures: dict[str, Any] = json.loads((project / "out.json").read_text())["figures"]["app"]
    return figures


@pytest.mark.slow
def test_off_and_on_with_a_missing_collector(tmp_path: Path) -> None:
    """wrk drives both variants (httpx where wrk is not installed, the bench's own choice); the
    otlp row says why it was skipped and how to get rotel."""
    absent = tmp_path / "no-rotel-agent"
    run = _bench(tmp_path, "--sinks", "jsonl,otlp", env={"CKPT_EVENTS_BENCH_ROTEL": str(absent)})
    assert run.returncode == 0, run.stderr[-3000:]
    assert "ckpt-events bench --app tinyapp:app" in run.stdout and "skipped:" in run.stdout
    figures = _table(tmp_path)
    rows = {what: value for what, value, _, _ in figures["table"]}
    ratio = rows["server CPU per request, on / off (--sinks jsonl)"]
    assert "over 3 rounds" in ratio
    assert "over 3 rounds" in rows["requests per second, on / off (--sinks jsonl)"]
    skipped = next(what for what in rows if what.startswith("otlp: "))
    assert "rotel collector" in skipped and str(absent) in skipped and "pip install rotel" in skipped
    assert figures["skipped"] == {"otlp": rotel.why_missing({rotel.ENV_BINARY: str(absent)})}
    assert rows["server CPU per request, off (CKPT_EVENTS_DISABLED=true)"].endswith(")")
    assert "server CPU per request, on: jsonl" in rows
    assert not [what for what in rows if "unknown" in what or "failed under load" in what], rows
    # The default driver is wrk when it is on the PATH, else httpx (this asserted wrk, and failed
    # on every machine without it).
    driver = "httpx" if shutil.which("wrk") is None else "wrk"
    assert figures["driver"] == driver and figures["rounds"] == 3 and figures["sinks_on"] == ["jsonl"]
    # Off is the no-op path though the app's code names a JSON-lines file; on has that sink.
    assert figures["variants"]["off"]["sinks"] == []
    assert figures["variants"]["on"]["sinks"] == ["jsonl"]
    for variant in figures["variants"].values():
        assert len(variant["us_per_request"]) == len(variant["requests_per_second"]) == 3
        assert all(n > 0 for n in variant["requests"]) and not any(variant["failed"])
    assert set(figures["ratio_on_off"]["cpu_per_request"]) == {
        "median",
        "low",
        "high",
        "rounds",
        "no_measurable_difference",
    }
    assert not (tmp_path / "events.jsonl").exists()  # the servers ran in a directory of their own


@pytest.mark.slow
def test_the_builtin_driver_and_the_export_process(tmp_path: Path) -> None:
    """--driver httpx (what runs without wrk) measures the same rows; with --export-process the
    sinks run in the server's child, whose CPU has rows of its own."""
    run = _bench(
        tmp_path, "--sinks", "prometheus", "--driver", "httpx", "--export-process", "--duration", "2"
    )
    assert run.returncode == 0, run.stderr[-3000:]
    figures = _table(tmp_path)
    rows = {what: value for what, value, _, _ in figures["table"]}
    assert "server CPU per request, on / off (--sinks prometheus)" in rows
    assert "over 3 rounds" in rows["server + export process CPU per request, on / off (--sinks prometheus)"]
    assert rows["export process CPU per request, on"].endswith(")")
    # The app's own JSON lines stay on: the table names what the server really had.
    assert figures["variants"]["on"]["sinks"] == ["export process (jsonl, prometheus, /metrics endpoint)"]
    assert figures["export_process"] and figures["driver"] == "httpx"
    # The child worked: its CPU is more than nothing in every round; off has no child.
    assert all(us > 0 for us in figures["variants"]["on"]["children_us_per_request"])
    assert figures["variants"]["off"]["children_us_per_request"] == [0.0, 0.0, 0.0]


@pytest.mark.slow
def test_an_app_that_is_not_instrumented_is_refused(tmp_path: Path) -> None:
    """An app without instrument(): the server's error, not a table of nothing."""
    (tmp_path / "plain.py").write_text("from fastapi import FastAPI\n\napp = FastAPI()\n")
    run = subprocess.run(
        [sys.executable, "-m", "ckpt_events.participants.cli.main", "bench", "--app", "plain:app"]
        + ["--request", "GET /", "--json", str(tmp_path / "out.json")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 1
    # One line saying why and what to do, not the server's traceback.
    assert "Traceback" not in run.stderr and "File " not in run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last == (
        "ckpt-events bench: --app plain:app is not instrumented: call "
        "ckpt_events.participants.fastapi.instrument(app, ...) where the app is made (docs/fastapi.md)"
    )


@pytest.mark.parametrize(
    ("module", "spec", "message"),
    [
        (
            "",
            "nosuch:app",
            "--app nosuch:app: no module named 'nosuch' on the import path (run ckpt-events bench",
        ),
        ("", "nosuch.sub:app", "--app nosuch.sub:app: no module named 'nosuch' on the import path"),
        ("app = 1\n", "mine:apq", "--app mine:apq: mine has no attribute 'apq'"),
        (
            "app = 1\n",
            "mine:app",
            "--app mine:app is a int, not a FastAPI (or Starlette) app: name the app instrument() was",
        ),
        # A factory said what it was not, not what to do.
        (
            "def create_app(): pass\n",
            "mine:create_app",
            "--app mine:create_app is a function, not a FastAPI (or Starlette) app: call it at import "
            "(app = create_app() in a module) and give --app MODULE:app",
        ),
        ("from fastapi import FastAPI\napp = FastAPI()\n", "mine:app", "--app mine:app is not instrumented"),
    ],
)
def test_an_app_that_cannot_be_served_is_one_line_from_its_server(
    module: str,
    spec: str,
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The bench's server process says why it cannot serve --app in one line, with the exit
    status the bench shows as that line alone (the bench's own run is the test above)."""
    from ckpt_events.benchmarks import app_server, bench_app

    (tmp_path / "mine.py").write_text(module)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "mine", raising=False)  # each case's own module
    assert app_server.main([spec, "0", str(tmp_path / "state.json")]) == bench_app.REFUSED
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err


def test_an_import_error_inside_the_app_is_the_users_to_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module the app itself imports is missing: the error propagates (its traceback, shown
    by the bench, points into the user's code), not turned into "no module named mine"."""
    from ckpt_events.benchmarks import app_server

    (tmp_path / "mine.py").write_text("import a_dependency_not_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "mine", raising=False)
    with pytest.raises(ModuleNotFoundError, match="a_dependency_not_installed"):
        app_server.load_app("mine:app")


@pytest.mark.parametrize(
    ("module", "raised"),
    [
        # Printed bare, as if the bench said it: "Expecting property name enclosed in double quotes".
        ('import json\nCONFIG = json.loads("{oops")\n', "Expecting property name"),
        # Told "is not instrumented: call instrument()", the opposite of what was wrong.
        (
            "from fastapi import FastAPI\n"
            "from ckpt_events.participants.fastapi import instrument\n"
            "app = FastAPI()\n"
            "instrument(app, kind='judge', instance='judge-0')\n"
            "instrument(app, kind='judge', instance='judge-0')\n",
            "instrumented already",
        ),
    ],
)
def test_what_the_app_raises_while_imported_is_not_taken_for_a_refusal(
    module: str, raised: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ValueError (or ConfigurationError, one too) raised by the app's own module propagates,
    its traceback shown by the bench, rather than passing for the server's one-line refusal."""
    from ckpt_events.benchmarks import app_server

    (tmp_path / "mine.py").write_text(module)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "mine", raising=False)
    with pytest.raises(ValueError, match=raised):
        app_server.main(["mine:app", "0", str(tmp_path / "state.json")])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--app", "app:app"], "--app needs --request"),
        (["--app", "app:app", "--request", "/commit"], "--request takes 'METHOD /path'"),
        (["--app", "app:app", "--request", "GET /", "--only", "core"], "leave out --only"),
        (["--app", "app:app", "--request", "GET /", "--header", "novalue"], "--header takes"),
        # Each of these passed, and was a traceback at the first request, the servers started.
        (["--app", "app:app", "--request", "GET /", "--header", "X-A: a\r\nX-B: b"], "--header takes"),
        (["--app", "app:app", "--request", "GET /", "--header", "X-\u00e9: a"], "--header takes"),
        (["--app", "app:app", "--request", "GET /\u00e9"], "--request takes 'METHOD /path'"),
        (["--app", "app:app", "--request", "GET /a\tb"], "--request takes 'METHOD /path'"),
        # The first waited 30 s for chunks never sent and blamed the route; the second cut the body.
        (["--app", "app:app", "--request", "POST /", "--header", "Transfer-Encoding: chunked"], "frames"),
        (["--app", "app:app", "--request", "POST /", "--header", "content-length: 3"], "frames"),
        # Every request timed out in wrk, blamed on the route's speed.
        (["--app", "app:app", "--request", "HEAD /", "--driver", "wrk"], "use --driver httpx"),
        (["--export-process"], "--export-process is for --app"),
        (["--request", "GET /"], "--request is for --app"),
    ],
)
def test_options_that_do_not_fit_are_one_line(
    options: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A usage mistake is one line and status 2, before any server starts."""
    assert main(["bench", *options, "--json", str(tmp_path / "out.json")]) == 2
    assert message in capsys.readouterr().err


def test_a_body_named_by_its_file_says_how_to_give_it(capsys: pytest.CaptureFixture[str]) -> None:
    """curl's ``-d @body.json`` habit was told only "not JSON (Expecting value: ...)"."""
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--app", "app:app", "--request", "POST /", "--body", "@my body.json"])
    assert exit_.value.code == 2
    assert "takes the JSON itself, not a file: --body \"$(cat 'my body.json')\"" in capsys.readouterr().err


@pytest.mark.parametrize(
    "options",
    [
        ["--rounds", "2"],
        ["--sinks", "kafka"],
        ["--body", "{not json"],
        ["--connections", "99999999"],
        ["--app", ""],
        ["--app", "nocolon"],
        ["--app", "module: "],
    ],
)
def test_bad_values_are_refused_when_parsed(options: list[str], tmp_path: Path) -> None:
    """Fewer than three rounds, an unknown sink, a body that is not JSON or more connections than
    a driver opens (99,999,999 had wrk ask for 834 GB, a traceback): argparse refuses them. So
    is an --app that is not MODULE:ATTR ('' was taken for no --app, 'nocolon' refused only once
    the first round's servers had started)."""
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--app", "app:app", "--request", "GET /", *options])
    assert exit_.value.code == 2


#: Slices of the tests whose subject is a row, not the figures: long enough that a round holds
#: the CPU ticks the bench needs on a loaded machine (a full run beside another suite measured
#: 4 to 8 of the 10 in 1 s slices, and the bench refused, as it should).
ROW_TEST_SECONDS = "2"


def _bench_of(
    project: Path,
    source: str,
    request: str,
    driver: str = "httpx",
    duration: str = "1",
    *,
    min_ticks: int = 0,
) -> subprocess.CompletedProcess[str]:
    """``ckpt-events bench --app userapp:app`` of ``source`` in a process of its own; with
    ``min_ticks``, the bench's least CPU a round must read (``MIN_CPU_TICKS``) is that instead."""
    (project / "userapp.py").write_text(source)
    command = [sys.executable, "-m", "ckpt_events.participants.cli.main", "bench", "--app", "userapp:app"]
    if min_ticks:
        program = (
            "import sys\n"
            "from ckpt_events.benchmarks import bench_app\n"
            "from ckpt_events.participants.cli.main import main\n"
            f"bench_app.MIN_CPU_TICKS = {min_ticks}\n"
            "sys.exit(main(sys.argv[1:]))\n"
        )
        command[1:3] = ["-c", program]
    command += ["--request", request, "--rounds", "3", "--duration", duration, "--connections", "2"]
    command += ["--driver", driver, "--json", str(project / "out.json")]
    return subprocess.run(command, cwd=project, capture_output=True, text=True, timeout=300, check=False)


#: An app whose startup (its lifespan) raises, line 7 of its file.
LIFESPAN_RAISES = (
    "from contextlib import asynccontextmanager\n"
    "from fastapi import FastAPI\n"
    "from ckpt_events.participants.fastapi import instrument\n\n"
    "@asynccontextmanager\n"
    "async def lifespan(app):\n"
    "    raise RuntimeError('database unreachable')\n"
    "    yield\n\n"
    "app = FastAPI(lifespan=lifespan)\n"
    "instrument(app, kind='judge', instance='judge-0')\n"
)


@pytest.mark.slow
def test_an_app_whose_startup_fails_shows_why(tmp_path: Path) -> None:
    """uvicorn exits 3 when the app's startup fails, the code the bench took for its own one-line
    refusals: it showed only uvicorn's "Application startup failed. Exiting." The cause now
    shows, from the server's log."""
    run = _bench_of(tmp_path, LIFESPAN_RAISES, "GET /x")
    assert run.returncode == 1
    assert "did not start" in run.stderr and "RuntimeError: database unreachable" in run.stderr, run.stderr


@pytest.mark.slow
def test_what_the_app_prints_stays_out_of_the_benchs_stdout(tmp_path: Path) -> None:
    """The servers' stdout was the bench's own: an app's print() in a handler put a line per
    request (79,879 in a quick run) among the table's. It goes to the server's log now."""
    source = (
        "from fastapi import FastAPI\n"
        "from ckpt_events.participants.fastapi import instrument\n\n"
        "print('imported the app')\n"
        "app = FastAPI()\n"
        "instrument(app, kind='judge', instance='judge-0')\n\n"
        "@app.get('/broken')\n"
        "async def broken() -> None:\n"
        "    print('handling a request')\n"
        "    raise RuntimeError('not yet')\n"
    )
    run = _bench_of(tmp_path, source, "GET /broken")
    assert run.returncode == 1 and "answered 500" in run.stderr, run.stderr
    assert "imported the app" not in run.stdout and "handling a request" not in run.stdout, run.stdout


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("wrk") is None,
    reason="needs wrk (apt-get install wrk): it counts no request a slice did not finish",
)
def test_a_route_too_slow_for_a_slice_says_so(tmp_path: Path) -> None:
    """A route taking 1.5 s answered no request within wrk's 1 s slice; the bench said it "failed
    0 of 0 times under load", blaming errors. Too many connections do the same to a fast route
    (wrk -c1000 on the quickstart's), so the line names both causes, not the route alone."""
    source = (
        "import asyncio\n"
        "from fastapi import FastAPI\n"
        "from ckpt_events.participants.fastapi import instrument\n\n"
        "app = FastAPI()\n"
        "instrument(app, kind='judge', instance='judge-0')\n\n"
        "@app.get('/slow')\n"
        "async def slow() -> dict[str, int]:\n"
        "    await asyncio.sleep(1.5)\n"
        "    return {'ok': 1}\n"
    )
    run = _bench_of(tmp_path, source, "GET /slow", driver="wrk")
    assert run.returncode == 1
    last = run.stderr.strip().splitlines()[-1]
    assert "answered no request within a 1 s load slice" in last and "failed 0 of 0" not in last, run.stderr
    assert "over 2 connections" in last and last.endswith("or use fewer --connections"), last


@pytest.mark.slow
def test_a_server_that_exits_under_load_says_so(tmp_path: Path) -> None:
    """An app that dies under load was a traceback from wrk ("unable to connect") or, driven by
    httpx, "failed 1760 of 0 times under load": now one line naming the server that exited."""
    source = (
        "import os\n"
        "from fastapi import FastAPI\n"
        "from ckpt_events.participants.fastapi import instrument\n\n"
        "app = FastAPI()\n"
        "instrument(app, kind='judge', instance='judge-0')\n"
        "seen = [0]\n\n"
        "@app.get('/x')\n"
        "async def x() -> dict[str, int]:\n"
        "    seen[0] += 1\n"
        "    if seen[0] > 20:\n"
        "        os._exit(1)\n"
        "    return {'ok': 1}\n"
    )
    run = _bench_of(tmp_path, source, "GET /x")
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "ckpt-events bench: the off server of userapp:app exited (1) under load of GET /x"
    ), last


ROUTES = """
import asyncio
import sys

from fastapi import FastAPI
from fastapi.responses import RedirectResponse, StreamingResponse

from ckpt_events.participants.fastapi import instrument

app = FastAPI()
instrument(app, kind="judge", instance="judge-0")


@app.get("/x")
async def x() -> dict[str, int]:
    return {"ok": 1}


@app.get("/hang")
async def hang() -> dict[str, int]:
    await asyncio.sleep(3600)
    return {"ok": 1}


@app.get("/stream")
async def stream() -> StreamingResponse:
    async def endless():
        while True:
            yield b"x" * 1024
            await asyncio.sleep(0.01)

    return StreamingResponse(endless())


@app.get("/old")
async def old() -> RedirectResponse:
    return RedirectResponse("/x", status_code=307)
"""


def _first_request(
    project: Path, request: str, monkeypatch: pytest.MonkeyPatch, source: str = ROUTES
) -> BenchAppError:
    """Start one real server of ``source`` as the bench does and send ``request`` first: the error."""
    (project / "routes.py").write_text(source)
    monkeypatch.setattr(bench_app, "PREFLIGHT_SECONDS", 2.0)
    method, path = bench_app.parse_request(request)
    bench = bench_app.AppBench(app="routes:app", request=Request(method, path), project=project)
    with pytest.raises(BenchAppError) as raised, bench_app._server(bench, "off", None, None):
        pass
    return raised.value


@pytest.mark.slow
@pytest.mark.parametrize(
    ("request_line", "message"),
    [
        # A TimeoutError traceback after 30 s, the servers stopped.
        ("GET /hang", "GET /hang did not answer within 2 s"),
        # Read to its end, which never came: the bench hung until killed.
        ("GET /stream", "GET /stream did not finish its answer within 2 s"),
        # Measured as the route, a redirect being a success to wrk: a fast server of nothing.
        ("GET /old", "GET /old answered 307, a redirect to /x: bench the route itself (--request 'GET /x')"),
        # FastAPI's own trailing-slash redirect, to a whole URL: its path is what to bench.
        ("GET /x/?a=1", "GET /x/?a=1 answered 307, a redirect to /x?a=1: bench the route itself"),
    ],
)
def test_a_first_request_that_does_not_answer_the_route_is_one_line(
    request_line: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first request is bounded in time, whole, and a redirect is refused, not measured."""
    started = time.monotonic()
    error = _first_request(tmp_path, request_line, monkeypatch)
    assert str(error).startswith(message) and "\n" not in str(error), error
    assert time.monotonic() - started < 20  # the server stopped too, its hung request cancelled


HUNG_STARTUP = """
import asyncio
from contextlib import asynccontextmanager

from fastapi import FastAPI

from ckpt_events.participants.fastapi import instrument


@asynccontextmanager
async def lifespan(app):
    await asyncio.sleep(3600)
    yield


app = FastAPI(lifespan=lifespan)
instrument(app, kind="judge", instance="judge-0")
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("source", "message"),
    [
        # Both were "the off server of routes:app did not start:" and an empty line.
        (
            "import sys\nsys.exit(0)\n",
            "the off server of routes:app did not start: it exited (0) before it listened, printing nothing",
        ),
        (
            HUNG_STARTUP,
            "the off server of routes:app did not start within 2 s: its startup (lifespan) did not "
            "finish, printing nothing",
        ),
    ],
)
def test_a_server_that_does_not_start_says_how(
    source: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that exits quietly, or whose startup never ends, is named with what it did."""
    monkeypatch.setattr(bench_app, "START_TIMEOUT", 2.0)
    started = time.monotonic()
    error = _first_request(tmp_path, "GET /x", monkeypatch, source)
    assert str(error) == message
    assert time.monotonic() - started < 20  # a server that never started is not given 30 s to stop


@pytest.mark.slow
def test_sigterm_while_httpx_drives_is_a_plain_interrupt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """SIGTERM (``timeout``, a cancelled CI job) while the built-in driver runs: raised inside one
    of its tasks, the interrupt ended the event loop with a task failed, and asyncio printed
    "unhandled exception during asyncio.run() shutdown" with its traceback before
    "interrupted". It is now delivered as Ctrl-C is, through the loop's own handler."""
    from ckpt_events.benchmarks.load import drive
    from ckpt_events.participants.cli.bench import _sigterm_as_interrupt

    (tmp_path / "routes.py").write_text(ROUTES)
    bench = bench_app.AppBench(app="routes:app", request=Request("GET", "/x"), project=tmp_path)
    with bench_app._server(bench, "off", None, None) as server:
        timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM))
        timer.start()
        try:
            with pytest.raises(KeyboardInterrupt), _sigterm_as_interrupt():
                # 64 connections keep the loop in the driver's tasks, where the signal lands.
                drive("httpx", f"http://127.0.0.1:{server.port}", bench.request, 5, 64)
        finally:
            timer.cancel()
    assert not [r for r in caplog.records if r.name == "asyncio"], caplog.text


@pytest.mark.slow
def test_too_little_cpu_to_measure_is_refused(tmp_path: Path) -> None:
    """A route that sleeps, driven over two connections, cost each server a tick or two of CPU a
    round: /proc counts in 10 ms ticks, and the table printed "server CPU per request 20,000.0
    us" and ratios of 0.5 or 2 that were the clock's grain (a round of no tick at all would
    divide by zero). Refused, saying how much was measured and what to change.

    The least a round must read is raised past any server's here: an idle uvicorn server's own
    CPU in a 3 s round reads 3 to 8 ticks on a calm machine and 16 in a loaded CI run (a
    virtual CPU's time while its host runs others counts), so the bench's real least (10)
    refused this route on one machine and measured it on another."""
    source = (
        "import asyncio\n"
        "from fastapi import FastAPI\n"
        "from ckpt_events.participants.fastapi import instrument\n\n"
        "app = FastAPI()\n"
        "instrument(app, kind='judge', instance='judge-0')\n\n"
        "@app.get('/idle')\n"
        "async def idle() -> dict[str, int]:\n"
        "    await asyncio.sleep(0.5)\n"
        "    return {'ok': 1}\n"
    )
    run = _bench_of(tmp_path, source, "GET /idle", min_ticks=100_000)
    assert run.returncode == 1, run.stdout
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "ckpt-events bench: too little CPU to measure per request: the off server used "
    ), last
    assert "clock tick" in last and last.endswith("use a longer --duration, or more --connections"), last
    assert not (tmp_path / "out.json").exists()


def test_sinks_none_of_which_can_run_are_refused_before_any_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--sinks otlp`` without rotel measured "off" alone, every round, and exited 0 with a
    table of no ratio: nothing the user asked for. One line now, before any server starts."""
    absent = tmp_path / "no-rotel-agent"
    monkeypatch.setenv(rotel.ENV_BINARY, str(absent))
    (tmp_path / "tinyapp.py").write_text(APP)
    monkeypatch.chdir(tmp_path)
    status = main(
        ["bench", "--app", "tinyapp:app", "--request", "GET /x", "--sinks", "otlp", "--json", "out.json"]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 1 and "round" not in "\n".join(err), err
    assert err[-1] == (
        "ckpt-events bench: none of --sinks otlp can run, so there is no 'on' to measure: otlp: "
        f"{rotel.why_missing({rotel.ENV_BINARY: str(absent)})}"
    )
    assert not (tmp_path / "out.json").exists()


def test_more_connections_than_file_descriptors_are_refused_up_front(tmp_path: Path) -> None:
    """Under ``ulimit -n 256``, ``--connections 1000`` had wrk fail 750 connects a slice, and the
    bench blamed the route ("GET /x failed 748 of 2183 times under load") after starting its
    servers. Refused before any server starts, naming the limit and both ways out."""
    import resource

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    (tmp_path / "tinyapp.py").write_text(APP)
    run = subprocess.run(
        [sys.executable, "-m", "ckpt_events.participants.cli.main", "bench", "--app", "tinyapp:app"]
        + ["--request", "POST /commit", "--body", BODY, "--connections", "1000", "--json", "out.json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        preexec_fn=low_limit,
    )
    assert run.returncode == 2 and "round" not in run.stderr, run.stderr
    assert run.stderr.strip().splitlines()[-1] == (
        "ckpt-events bench: error: --connections 1000 opens 1,000 sockets in the load driver and in "
        "each server, but this shell's open-file limit is 256 (ulimit -n): raise it (ulimit -n 1064), "
        "or use --connections 192 or fewer"
    )


#: An app whose route fails 1 request in 500 and whose shutdown raises: one bench run of it is
#: read by the two tests below (each ran a 3-round bench of its own; neither fault touches what
#: the other test reads: the failures are the driver's counts, the drops the shutdown's report).
FLAKY_AND_FAILING_SHUTDOWN = (
    "from contextlib import asynccontextmanager\n"
    "from fastapi import FastAPI\n"
    "from ckpt_events.participants.fastapi import instrument\n\n"
    "@asynccontextmanager\n"
    "async def lifespan(app):\n"
    "    yield\n"
    "    raise RuntimeError('shutdown failed')\n\n"
    "app = FastAPI(lifespan=lifespan)\n"
    "instrument(app, kind='judge', instance='judge-0')\n"
    "seen = [0]\n\n"
    "@app.get('/flaky')\n"
    "async def flaky() -> dict[str, int]:\n"
    "    seen[0] += 1\n"
    "    if seen[0] % 500 == 0:\n"
    "        raise RuntimeError('flaky')\n"
    "    return {'ok': 1}\n"
)


@pytest.fixture(scope="module")
def flaky_app_with_a_failing_shutdown(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """The bench of ``FLAKY_AND_FAILING_SHUTDOWN``: its run and its figures."""
    project = tmp_path_factory.mktemp("flaky")
    run = _bench_of(project, FLAKY_AND_FAILING_SHUTDOWN, "GET /flaky", duration=ROW_TEST_SECONDS)
    assert run.returncode == 0, run.stderr[-3000:]
    return run, _table(project)


@pytest.mark.slow
def test_failures_under_the_refusal_share_have_a_row(
    flaky_app_with_a_failing_shutdown: tuple[subprocess.CompletedProcess[str], dict[str, Any]],
) -> None:
    """A route failing 1 request in 500 stays under the 1% that stops the bench: its failures
    were in the JSON only, and the table read as a clean run. Each variant's count is a row.
    (Each raise counts about twice, its connection closed: 1 in 200 measured 36 of 3,590, and
    1 in 300 left no margin for what a loaded machine adds; a variant serves thousands.)"""
    run, figures = flaky_app_with_a_failing_shutdown
    assert run.returncode == 0, run.stderr[-3000:]
    rows = {what: (value, target, met) for what, value, target, met in figures["table"]}
    for variant in ("off", "on"):
        failed = sum(figures["variants"][variant]["failed"])
        answered = sum(figures["variants"][variant]["requests"])
        row = rows.get(f"requests that failed under load, {variant} (up to 1% are measured)")
        assert failed > 0 and row == (f"{failed:,} of {answered:,}", "0", False), (variant, row)


@pytest.mark.parametrize(
    ("spec", "hint"),
    [
        # A TypeError traceback from importlib ("the 'package' argument is required"), both
        # servers started, and "no module named 'app.py'" for the file's own name.
        ("./app.py:app", ", with --app app:app"),
        ("app.py:app", ", with --app app:app"),
        ("src/service/main.py:api", ", with --app src.service.main:api"),
        (".app:app", ", with --app app:app"),
        # From the current folder: "--app srv.app:app" and "--app api.app:app", which import
        # from neither the current folder nor the file's.
        ("/srv/app.py:app", " (cd /srv), with --app app:app"),
        ("../api/app.py:app", " (cd ../api), with --app app:app"),
        ("/srv/my api/app.py:app", " (cd '/srv/my api'), with --app app:app"),
    ],
)
def test_an_app_named_by_its_file_is_refused_with_its_module_name(
    spec: str, hint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--app takes a module, as uvicorn does: a file path is refused when parsed, naming the
    module to give instead."""
    (tmp_path / "app.py").write_text(APP)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--app", spec, "--request", "GET /"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"not a file path ({spec!r}): run from the folder that holds it{hint}" in err, err


@pytest.mark.slow
def test_a_shutdown_that_fails_leaves_the_drops_unknown(
    flaky_app_with_a_failing_shutdown: tuple[subprocess.CompletedProcess[str], dict[str, Any]],
) -> None:
    """An app whose shutdown raises never reports its sinks' counters: the table had no row on
    drops, as a run that dropped nothing has. It now says they are unknown, and why."""
    run, figures = flaky_app_with_a_failing_shutdown
    assert run.returncode == 0, run.stderr[-3000:]
    rows = {what: value for what, value, _, _ in figures["table"]}
    assert (
        rows.get(
            "on: events the sinks dropped: unknown, the server's shutdown did not report in 3 of 3 rounds"
        )
        == "n/a"
    ), rows


@pytest.mark.slow
def test_a_port_taken_before_the_server_binds_it_is_not_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bench chose a free port and the server bound it later, after its startup: another
    process listening there by then got the first request and the warm-up (a stray
    http.server answered 200), and the bench said the server "exited (3) under load". The
    server now binds a port of its own choosing before its startup and reports it."""
    import http.server

    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    taken = other.server_address[1]
    threading.Thread(target=other.serve_forever, daemon=True).start()
    monkeypatch.setattr(rotel, "free_port", lambda: taken)
    (tmp_path / "routes.py").write_text(ROUTES)
    bench = bench_app.AppBench(app="routes:app", request=Request("GET", "/x"), project=tmp_path)
    try:
        with bench_app._server(bench, "off", None, None) as server:
            assert server.port != taken and server.proc.poll() is None
            with httpx.Client() as client:
                assert client.get(f"http://127.0.0.1:{server.port}/x").json() == {"ok": 1}
    finally:
        other.shutdown()
        other.server_close()


def test_a_server_whose_shutdown_hangs_is_killed_and_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An app whose lifespan hangs after its yield: each server waited out its stop deadline in
    turn (3 min 18 s for a 3-round bench of 1 s) and nothing said why. It is still killed at the
    deadline, and a line on stderr says which server and why its telemetry did not drain."""
    (tmp_path / "stuck.py").write_text(
        "import contextlib, time\n"
        "from fastapi import FastAPI\n"
        "from ckpt_events.participants.fastapi import instrument\n\n"
        "@contextlib.asynccontextmanager\n"
        "async def lifespan(app):\n"
        "    yield\n"
        "    time.sleep(3600)\n\n"
        "app = FastAPI(lifespan=lifespan)\n"
        "instrument(app, kind='judge', instance='judge-0')\n\n"
        "@app.get('/x')\n"
        "async def x() -> dict[str, int]:\n"
        "    return {'ok': 1}\n"
    )
    monkeypatch.setattr(bench_app, "STOP_TIMEOUT", 1.0)
    bench = bench_app.AppBench(app="stuck:app", request=Request("GET", "/x"), project=tmp_path)
    started = time.monotonic()
    with bench_app._server(bench, "off", None, None) as server:
        assert server.port
    assert time.monotonic() - started < 20
    assert server.proc.returncode == -signal.SIGKILL
    err = capsys.readouterr().err
    assert "the off server did not stop within 1 s of SIGTERM and was killed" in err


def test_a_route_that_emits_no_event_has_no_ratio(tmp_path: Path) -> None:
    """A route of an instrument()ed app that runs no operation() emits nothing: the "on"
    server's sinks sat idle and the table printed "server CPU per request, on / off 1.032",
    a ratio of nothing read as the telemetry's cost. The real "on" server's counters (0 events)
    now give a row saying so, and no ratio."""
    (tmp_path / "routes.py").write_text(ROUTES)
    bench = bench_app.AppBench(
        app="routes:app", request=Request("GET", "/x"), sinks=("jsonl",), project=tmp_path
    )
    with bench_app._server(bench, "on", None, None) as server, httpx.Client() as client:
        for _ in range(20):
            assert client.get(f"http://127.0.0.1:{server.port}/x").status_code == 200
    assert server.state["stopped"]["sinks"], server.state  # the counters were reported
    runs = {
        variant: [bench_app._Run(100.0 + r, 1_000.0, Load(1_000, 0, 1.0), state) for r in range(3)]
        for variant, state in (("off", {}), ("on", server.state))
    }
    figures = bench_app._figures(bench, runs, {}, ["jsonl"], pinned=False)
    rows = {what: value for what, value, _, _ in figures["rows"]}
    assert not any("on / off" in what and value is not None for what, value in rows.items()), rows
    why = (
        "GET /x emitted no events in 3,000 requests, so the sinks had nothing to do: bench a route "
        "whose handler runs operation(request, ...) (docs/fastapi.md)"
    )
    assert rows == {**rows, f"on / off (--sinks jsonl): not measured, {why}": None}
    assert figures["ratio_on_off"] == {"not_measured": why}


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (
            LIFESPAN_RAISES,
            "its startup (lifespan) raised RuntimeError: database unreachable (routes.py, line 7)",
        ),
        (
            "import json\nCONFIG = json.loads('{oops')\n",
            "it exited (1), raising json.decoder.JSONDecodeError: Expecting property name enclosed in "
            "double quotes: line 1 column 2 (char 1) (routes.py, line 2)",
        ),
    ],
)
def test_a_server_that_raises_before_it_listens_is_one_line(
    source: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A startup that raised was the last 12 lines of the server's log, a traceback cut
    mid-frame ending in uvicorn's "Application startup failed. Exiting.": now one line, the
    exception and the line of the user's own file it came from."""
    error = _first_request(tmp_path, "GET /x", monkeypatch, source)
    assert str(error) == (
        f"the off server of routes:app did not start: {message}: fix that, or run uvicorn routes:app "
        "from here to see its whole traceback"
    )


def test_what_the_app_printed_is_not_taken_for_why_it_was_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's stdout and stderr go to one log, whose last line says why it was refused:
    what the app printed while imported sat in stdout's buffer (outside PYTHONUNBUFFERED) and
    came last, and the bench said "connecting to db..." for why."""
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    source = "print('connecting to db...')\nfrom fastapi import FastAPI\napp = FastAPI()\n"
    error = _first_request(tmp_path, "GET /x", monkeypatch, source)
    assert str(error).startswith("--app routes:app is not instrumented: call "), error
