"""Every documentation page (README.md and docs/*.md): its python examples run, its command lines
parse, its links resolve, its generated tables are what the code generates, and what it says of
the HTTP API, the server example, the sink and the test fixtures holds."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Final

import pytest

from ckpt_events import ConfigurationError
from ckpt_events.participants.cli.main import build_parser
from ckpt_events.participants.errors import HTTP_STATUS
from ckpt_events.participants.protocol import CONTROL_PREFIX
from ckpt_events.sinks import read_otel_env
from tests.readme_names import PAGE as NAMES_PAGE
from tests.readme_names import names_table, readme_block
from tests.readme_pages import (
    DOCS,
    LANGUAGES,
    PAGES,
    README,
    ROOT,
    all_blocks,
    anchors,
    blocks,
    links,
    name_of,
    one_block,
    run_python,
    slug,
)
from tests.typecheck import mypy_strict

PYTHON = all_blocks("python")
HTTP_API = (DOCS / "http-api.md").read_text()
_PARENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
#: Programs a page's bash line may start with that are not ours to parse; each is exercised
#: elsewhere (curl and uvicorn: the FastAPI quickstart's test; the rotel line: its own test).
_OTHER_PROGRAMS = frozenset({"curl", "uvicorn", "python3", "ruff", "mypy", "pytest"})


#: Packages an example may import that no extra of ours installs: its block is skipped, saying
#: so, where the package is missing (the page on your own OpenTelemetry setup shows logfire's).
_NOT_OURS: Final = ("logfire", "asgi_lifespan")


@pytest.mark.parametrize("block", PYTHON, ids=[block.name for block in PYTHON])
def test_every_python_block_runs(block, tmp_path: Path) -> None:
    """Each ```python block of every page runs as written, in a fresh interpreter (one that
    imports a package no extra installs is skipped where that package is missing)."""
    for package in _NOT_OURS:
        imported = re.search(rf"^import {package}$", block.code, flags=re.M) is not None
        if imported and importlib.util.find_spec(package) is None:
            pytest.skip(f"{block.name} imports {package}, which is not installed (pip install {package})")
    result = run_python(block.code, tmp_path)
    assert result.returncode == 0, result.stderr


def test_every_block_says_what_it_is() -> None:
    """Every fenced block is python (run), bash (checked) or text (a program's output)."""
    for block in all_blocks():
        assert block.language in LANGUAGES, block.name


def _check_command(words: list[str], where: str, extras: set[str]) -> None:
    """One shell command of a page: ours parse, pip installs name real extras."""
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        variable = words.pop(0).split("=", 1)[0]
        assert f"`{variable}" in (DOCS / "configuration.md").read_text() or variable.startswith(
            "OTEL_EXPORTER_PROMETHEUS"
        ), f"{where}: {variable} is not in docs/configuration.md"
    program = words[0].removeprefix(".venv/bin/")
    if program == "ckpt-events":
        try:
            build_parser().parse_args(words[1:])
        except SystemExit as exc:
            raise AssertionError(f"{where}: ckpt-events refuses {' '.join(words[1:])!r}") from exc
    elif program == "pip":
        assert words[1] == "install", where
        for word in words[2:]:
            match = re.fullmatch(r"(?:ckpt-events|\.)\[(.+)\]", word)
            if match:
                assert set(match.group(1).split(",")) <= extras, f"{where}: {word}"
    else:
        assert program in _OTHER_PROGRAMS, f"{where}: what checks {program!r}?"


def test_every_command_line_is_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each line of every ```bash block: a ckpt-events command our parser accepts, a pip install
    of extras that exist, variables that docs/configuration.md documents, or a program another
    test runs."""
    monkeypatch.chdir(tmp_path)
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    for block in all_blocks("bash"):
        for line in block.code.splitlines():
            if "rotel-agent" in line:
                continue  # test_the_rotel_command_starts_a_collector_as_pasted runs it
            for command in line.split("&&"):
                words = shlex.split(command, comments=True)
                _check_command(words, f"{block.name}: {line}", extras)


def test_every_token_file_a_page_passes_is_made_on_that_page(tmp_path: Path) -> None:
    """A page whose command passes ``--token-file NAME`` first makes NAME with a command of its
    own, and ``serve`` reads a token from what that command wrote (the Prometheus page's first
    command failed as pasted: "cannot read the token file 'token.txt'")."""
    from ckpt_events.participants.cli.serve import ENV_TOKEN, _read_token

    checked = 0
    for page in PAGES:
        made: set[str] = set()
        for block in blocks(page, "bash"):
            for line in block.code.splitlines():
                words = shlex.split(line, comments=True)
                if ">" in words:
                    subprocess.run(["bash", "-c", line], cwd=tmp_path, check=True, timeout=60)
                    made.add(words[words.index(">") + 1])
                for index, word in enumerate(words[:-1]):
                    if word == "--token-file":
                        name = words[index + 1]
                        assert name in made, f"{name_of(page)}: {line}: nothing on the page makes {name}"
                        assert _read_token(tmp_path / name, ENV_TOKEN, "token")
                        checked += 1
    assert checked


def test_the_bench_pages_list_every_suite() -> None:
    """The command-line and benchmarks pages list every suite ``bench --only`` takes, the same
    way (the command line's page left out ``fleet_trace``, ``curves`` and ``connections``)."""
    import ckpt_events.benchmarks

    listing = "|".join(ckpt_events.benchmarks.SUITES)
    for page in ("cli.md", "benchmarks.md"):
        text = (DOCS / page).read_text()
        (listed,) = re.findall(r"`((?:[a-z_]+\|)+[a-z_]+)`", text)
        assert sorted(listed.split("|")) == sorted(listing.split("|")), page


def test_every_serve_and_watch_command_names_its_token() -> None:
    """A page's ``ckpt-events serve`` or ``watch`` command names the control token both need
    (``--token-file``, or ``CKPT_EVENTS_TOKEN=`` before it): the command-line page's
    ``watch ... --once`` exited 2 as pasted ("no control token")."""
    checked = 0
    for block in all_blocks("bash"):
        for line in block.code.splitlines():
            words = shlex.split(line, comments=True)
            program = [word for word in words if not re.fullmatch(r"[A-Z_]+=\S*", word)]
            if program[:1] == ["ckpt-events"] and program[1:2] in (["serve"], ["watch"]):
                assert "--token-file" in words or any(w.startswith("CKPT_EVENTS_TOKEN=") for w in words), (
                    f"{block.name}: {line}"
                )
                checked += 1
    assert checked >= 4


def test_every_relative_link_resolves() -> None:
    """Every link from one page to a file or a heading finds it."""
    for page in PAGES:
        for target in links(page):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            found = (page.parent / path).resolve() if path else page
            assert found.exists(), f"{name_of(page)}: {target}"
            if anchor:
                assert found.suffix == ".md", f"{name_of(page)}: {target}"
                assert anchor in anchors(found), f"{name_of(page)}: {target}: no such heading"


def test_every_page_is_linked() -> None:
    """The docs index and the README's documentation table link every page."""
    pages = {page.name for page in DOCS.glob("*.md")} - {"index.md"}
    assert pages <= {target.partition("#")[0] for target in links(DOCS / "index.md")}
    from_readme = {target.partition("#")[0] for target in links(README)}
    assert {f"docs/{page}" for page in pages | {"index.md"}} <= from_readme


def test_names_table_matches_the_code() -> None:
    """The span/attribute/metric table of docs/names.md is what tests/readme_names.py generates."""
    assert readme_block(NAMES_PAGE.read_text()) == names_table(), "run: python -m tests.readme_names"


def test_error_codes_table_matches_the_protocol() -> None:
    """Every protocol error code is in the HTTP API page with the status the harness sends."""
    for code, status in HTTP_STATUS.items():
        assert f"| `{code.value}` | {status} |" in HTTP_API, code


def test_http_api_lists_every_control_route() -> None:
    """Every control route of a participant app is in the HTTP API page's route table."""
    from ckpt_events.participants.server.app import create_app

    app = create_app("resources", instance="resources-0", token="t")
    routes = {
        (method.upper(), path.removeprefix(CONTROL_PREFIX))
        for path, operations in app.openapi()["paths"].items()
        if path.startswith(CONTROL_PREFIX)
        for method in operations
    }
    assert routes
    for method, path in routes:
        assert f"| `{method} {path}` |" in HTTP_API, (method, path)
    assert f"`{CONTROL_PREFIX}`" in HTTP_API


def test_the_reply_bounds_the_http_api_page_states_are_the_codes(tmp_path: Path) -> None:
    """The reply bounds were said only in a module docstring: the HTTP API page states them as
    the code has them, and its example prints what the page shows."""
    from ckpt_events.participants.cli.watch.sources import MAX_BODY
    from ckpt_events.participants.replies import MAX_REPLY_BYTES

    said = " ".join(HTTP_API.split())
    assert MAX_REPLY_BYTES == 32 << 20 and MAX_BODY == 256 << 10
    assert "reads a participant's reply (a control call or a work call) up to 32 MiB" in said
    assert "`watch` reads a `/status` up to 256 KiB" in said
    assert "inference worker's stream and cut receipt up to 32 MiB" in said
    example = one_block("http-api.md", "max_reply_bytes=100")
    (shown,) = [b.code for b in blocks(DOCS / "http-api.md", "text") if "over the 100-byte bound" in b.code]
    result = run_python(example, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == shown


async def test_what_the_docs_say_of_the_workload_apis_auth_holds() -> None:
    """The HTTP API page says the /work routes take the bearer token (it once said "no auth"),
    and a real app answers them 401 without it and 200 with it."""
    import httpx

    from ckpt_events.participants.server.app import create_app
    from tests.participants.helpers import AUTH, TOKEN, running

    assert "The workload API takes the same bearer token (missing or wrong: 401 `unauthorized`)" in HTTP_API
    assert "no auth" not in HTTP_API
    app = create_app("resources", instance="resources-0", token=TOKEN)
    async with running(app) as client:
        work = {"rollout_id": "r1", "attempt": 0, "steps": 2}
        bare = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")
        async with bare:
            denied = await bare.post("/work/start", json=work)
            assert (denied.status_code, denied.json()["error"]["code"]) == (401, "unauthorized")
            assert (await bare.get("/work/r1-a0")).status_code == 401
        assert (await client.post("/work/start", json=work, headers=AUTH)).status_code == 200


async def test_what_the_docs_say_of_rollout_ids_holds() -> None:
    """The HTTP API page's rollout id rule holds on a real app: ``r-a3`` and ``r-a1000000`` are
    422 naming the fix, ``r_a3``, ``r-a03`` and a UUID ending in ``a`` and 11 digits start."""
    from ckpt_events.participants.protocol import MAX_ATTEMPT
    from ckpt_events.participants.server.app import create_app
    from tests.participants.helpers import TOKEN, running

    assert f"(1 to {MAX_ATTEMPT}, no leading zero: `r-a3` is attempt 3 of `r`)" in HTTP_API
    async with running(create_app("resources", instance="resources-0", token=TOKEN)) as client:
        for rollout_id in ("r-a3", f"r-a{MAX_ATTEMPT}"):
            refused = await client.post("/work/start", json={"rollout_id": rollout_id, "steps": 2})
            assert refused.status_code == 422, rollout_id
            assert refused.json()["error"]["code"] == "invalid_request"
            assert "choose another ending, such as _a<N>" in refused.json()["error"]["detail"]
        for rollout_id in ("r_a3", "r-a03", "4f1c2d3e-1ad2-421e-afa9-a04299078061"):
            started = await client.post("/work/start", json={"rollout_id": rollout_id, "steps": 2})
            assert started.json()["capture_key"] == rollout_id


def test_server_example_joins_the_callers_trace_and_logs_hex_ids(tmp_path: Path) -> None:
    """With CKPT_EVENTS_JSONL set, the library page's example continues the incoming trace,
    passes its tracestate on, and logs the trace id as the caller's hex string."""
    block = one_block("library.md", "with_tracestate")
    result = run_python(block, tmp_path, CKPT_EVENTS_JSONL=str(tmp_path / "run.jsonl"))
    assert result.returncode == 0, result.stderr
    assert f"00-{_PARENT_TRACE}-" in result.stdout
    assert "'tracestate': 'rojo=00f067aa0ba902b7'" in result.stdout
    lines = [json.loads(line) for line in (tmp_path / "run.jsonl").read_text().splitlines()]
    assert {line["trace_id"] for line in lines if "trace_id" in line} == {_PARENT_TRACE}


def test_server_example_exits_fast_when_the_collector_is_down(tmp_path: Path) -> None:
    """With OTEL_EXPORTER_OTLP_ENDPOINT where nothing listens, the server example still runs and
    exits in a few seconds, saying once per signal that its export was refused (it took 20 s,
    then 8 s: the final export backed off for its whole close budget)."""
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    block = one_block("library.md", "with_tracestate")
    started = time.monotonic()
    result = run_python(block, tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}")
    took = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    # 6 s: the interpreter's start and imports take 1-3 s on a loaded machine (4.0 failed once
    # at a load average of 8); the defects this guards took 8 s and 20 s.
    assert took < 6.0, f"the example took {took:.1f} s to exit"
    lines = result.stderr.splitlines()
    refusals = [line for line in lines if "refused or unreachable" in line]
    assert len(refusals) == 2, lines
    # And each sink's totals as it closes: what was lost, in one line each, nothing else.
    totals = [line for line in lines if line not in refusals]
    assert len(totals) == 2 and all(
        "exports failed, 0 accepted" in line or "1 export failed" in line for line in totals
    ), lines


async def test_the_library_pages_lingers_are_the_sinks(tmp_path: Path) -> None:
    """The lingers the library page gives blocking sinks are theirs (it gave 0.05 s to every
    blocking sink but ``SpanSink``; ``JsonLinesSink(blocking=True)`` lingers 0.25 s)."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from ckpt_events import Bus
    from ckpt_events.sinks import JsonLinesSink
    from ckpt_events.sinks.otel import SpanSink

    page = " ".join((DOCS / "library.md").read_text().split())
    said = {"a sink of yours": "(0.05 s by default,", "jsonl": "0.25 s for `JsonLinesSink(blocking=True)`"}
    said["spans"] = "1 s for `SpanSink`"
    assert all(phrase in page for phrase in said.values()), said

    class Yours:
        blocking = True

        def handle(self, batch: list[object]) -> None:
            pass

    async with Bus() as bus:
        jsonl = JsonLinesSink(tmp_path / "events.jsonl", blocking=True)
        subscribed = {
            "a sink of yours": bus.subscribe(Yours()),
            "jsonl": bus.subscribe(jsonl),
            "spans": bus.subscribe(SpanSink(exporter=InMemorySpanExporter())),
        }
        lingers = {name: subscription.linger for name, subscription in subscribed.items()}
    assert lingers == {"a sink of yours": 0.05, "jsonl": 0.25, "spans": 1.0}


def test_custom_sink_example_prints_its_alert(tmp_path: Path) -> None:
    """The sink page's example prints its alert and its table."""
    result = run_python(one_block("writing-a-sink.md", "RefusalAlert"), tmp_path)
    assert result.returncode == 0, result.stderr
    assert "ALERT resources/resources-0 refused a request: stale_attempt" in result.stdout
    assert "'resources/resources-0 commit':" in result.stdout


def test_every_nth_example_keeps_every_nth_event_across_batches() -> None:
    """The sink page's ``EveryNth`` keeps the n-th, 2n-th, ... event however the bus batches
    them (it sliced each batch on its own: batches of one event kept every event)."""
    namespace: dict[str, object] = {}
    exec(one_block("writing-a-sink.md", "class EveryNth"), namespace)
    sink = namespace["EveryNth"](n=2, keep=3)  # type: ignore[operator]
    for event in range(10):
        sink.handle([event])
    assert sink.seen == [1, 3, 5]
    sink = namespace["EveryNth"](n=3)  # type: ignore[operator]
    sink.handle(list(range(4)))
    sink.handle(list(range(4, 9)))
    assert sink.seen == [2, 5, 8]


@pytest.mark.slow
def test_the_sink_pages_examples_pass_mypy_strict(tmp_path: Path, mypy_cache: Path) -> None:
    """What a user copies to write a sink type-checks as their own code would (``mypy --strict``):
    the page's ``handle(self, batch: list)`` was a ``type-arg`` error in a strict project."""
    for marker in ("RefusalAlert", "class EveryNth"):
        folder = tmp_path / marker.split()[-1]
        folder.mkdir()
        assert mypy_strict(one_block("writing-a-sink.md", marker), folder, mypy_cache) == [], marker


def test_sink_members_table_names_the_protocols() -> None:
    """Each row of the sink page's members table names a protocol of ckpt_events that declares
    that member."""
    import ckpt_events

    page = (DOCS / "writing-a-sink.md").read_text()
    rows = re.findall(r"^\| `(\w+)(?:\([^)]*\))?` \| `(\w+)` \|", page, flags=re.M)
    assert len(rows) == 5
    for member, protocol in rows:
        cls = getattr(ckpt_events, protocol)
        assert member in dir(cls) or member in getattr(cls, "__annotations__", {}), (member, protocol)


def test_fastapi_page_example_continues_the_trace_and_counts_the_refusal(tmp_path: Path) -> None:
    """The FastAPI page's example answers 200 then 409, and its log holds the commit and its
    upload step in the caller's trace, then the refusal."""
    result = run_python(one_block("fastapi.md", "seen: set[str]"), tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:2] == ["200 {'records': 2}", "409 {'error': 'stale_checkpoint'}"]
    assert lines[2:] == [
        f"OperationStarted {_PARENT_TRACE}",
        f"StepStarted {_PARENT_TRACE}",
        f"StepFinished {_PARENT_TRACE}",
        f"OperationFinished {_PARENT_TRACE}",
        "Refused ",
    ]


async def test_the_fastapi_page_quotes_the_taken_prometheus_port_as_it_is_said() -> None:
    """The FastAPI page's line for a second worker on a fixed Prometheus port is what
    ``configure`` says, to the address (it quoted ``127.0.0.1:9464``; the default host is
    ``localhost``, and the error names it so)."""
    from ckpt_events import Bus, ConfigurationError
    from ckpt_events.sinks import configure

    page = (DOCS / "fastapi.md").read_text()
    (quoted,) = re.findall(r"`ckpt-events: (cannot serve Prometheus metrics on [^`]+)`", page)
    # The page quotes the line's head and its end, the middle elided ("; ... set X too").
    head, tail = " ".join(quoted.split()).split("; ... ")
    # Taken where the endpoint binds by default (localhost: loopback, whichever family it names).
    with socket.create_server(("localhost", 0)) as taken:
        port = taken.getsockname()[1]
        environ = {"OTEL_METRICS_EXPORTER": "prometheus", "OTEL_EXPORTER_PROMETHEUS_PORT": str(port)}
        async with Bus() as bus:
            with pytest.raises(ConfigurationError) as raised:
                configure(bus, environ=environ)
    said = str(raised.value)
    assert said.startswith(head.replace(":9464 ", f":{port} ") + "; "), (quoted, said)
    assert said.endswith(tail) or f"{tail}," in said, (quoted, said)


async def test_instruments_sample_ratio_default_is_what_the_fastapi_page_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``instrument``'s default ``sample_ratio`` is the environment's sampler when it configures
    the sinks, and 1.0 with ``configure_sinks=`` (the page said the environment's, always: a
    ratio of 0 there still sampled every trace), unless given ``sinks.sample_ratio_from_env``."""
    from fastapi import FastAPI

    from ckpt_events import OperationFinished, sinks
    from ckpt_events.participants.fastapi import instrument, telemetry
    from ckpt_events.testing import MemorySink

    page = " ".join((DOCS / "fastapi.md").read_text().split())
    assert "with `configure_sinks=` or `bus=` it is 1.0" in page
    assert "`sample_ratio=sinks.sample_ratio_from_env(os.environ)`" in page
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0")

    async def sampled(**options: object) -> bool:
        memory = MemorySink()
        app = FastAPI()
        if "configure_sinks" not in options:
            options["jsonl_path"] = tmp_path / f"{len(list(tmp_path.iterdir()))}.jsonl"
        else:
            options["configure_sinks"] = lambda bus: bus.subscribe(memory)
        instrument(app, kind="judge", instance="judge-0", **options)  # type: ignore[arg-type]
        async with app.router.lifespan_context(app):
            with telemetry(app).operation("commit", checkpoint_id="c1"):
                pass
        if "jsonl_path" in options:
            events = [event for _, event in sinks.read_events(options["jsonl_path"])]  # type: ignore[arg-type]
        else:
            events = memory.events
        (finished,) = [event for event in events if isinstance(event, OperationFinished)]
        return finished.sampled

    assert await sampled() is False  # the environment's ratio, 0
    assert await sampled(configure_sinks=True) is True  # 1.0, as the page now says
    assert await sampled(configure_sinks=True, sample_ratio=sinks.sample_ratio_from_env(os.environ)) is False


def test_fastapi_page_own_sink_gets_every_lifespans_operations(tmp_path: Path) -> None:
    """The FastAPI page's own-sink example prints its commit and logs it to judge.jsonl too; run
    twice in one process (a ``TestClient`` per test), each lifespan's bus has the sink again.
    No page said how to add a sink to an instrumented app (the README's ``bus.subscribe`` has no
    ``bus`` there; one subscribed to ``instrument(...).bus`` reached the first lifespan only)."""
    example = one_block("fastapi.md", "def lifespan(")
    result = run_python(example + "\nanyio.run(main)\n", tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["judge/judge-0 commit ok"] * 2
    logged = [json.loads(line)["type"] for line in (tmp_path / "judge.jsonl").read_text().splitlines()]
    assert logged.count("operation_finished") == 2
    readme = README.read_text()
    assert "docs/fastapi.md#your-own-sink-beside-the-configured-ones" in readme


@pytest.mark.collector
def test_the_rotel_command_starts_a_collector_as_pasted(tmp_path: Path) -> None:
    """The rotel line of docs/reading-a-trace.md, run by a shell as written (with this
    interpreter and a free port), starts rotel-agent listening ("rotel-agent" alone is not on
    PATH: it failed)."""
    from ckpt_events.benchmarks.rotel import agent_binary, agent_env, free_port

    if agent_binary() is None:
        pytest.skip("the rotel package is not installed")
    page = (DOCS / "reading-a-trace.md").read_text()
    (line,) = [line for line in page.splitlines() if "rotel-agent" in line and "start" in line]
    port = free_port()
    command = line.replace(".venv/bin/python", sys.executable).replace("127.0.0.1:4318", f"127.0.0.1:{port}")
    grpc = f" --otlp-grpc-endpoint 127.0.0.1:{free_port()}"  # the default 4317 may be taken here
    log = tmp_path / "rotel.out"
    with open(log, "wb") as out:
        agent = subprocess.Popen(
            ["bash", "-c", f"exec {command}{grpc}"],
            cwd=tmp_path,
            env=agent_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        deadline = time.monotonic() + 15
        while True:
            assert agent.poll() is None, log.read_text(errors="replace")
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, "rotel-agent did not listen within 15 s"
            time.sleep(0.05)
    finally:
        agent.terminate()
        agent.wait(10)


#: A decimal figure as the pages print it (``1.886``, ``3,057.0``), not a version or a path.
_DECIMAL = re.compile(r"(?<![\w.])\d[\d,]*\.\d+(?![\d.])")


def _benchmark_tables() -> dict[str, set[str]]:
    """Each section of docs/benchmarks.md, by anchor: every decimal figure its tables print."""
    sections: dict[str, set[str]] = {}
    figures: set[str] = set()
    for line in (DOCS / "benchmarks.md").read_text().splitlines():
        if line.startswith("## "):
            figures = sections.setdefault(slug(line[3:]), set())
        elif line.startswith("|"):
            figures.update(_DECIMAL.findall(line))
    return sections


def test_figures_quoted_from_a_benchmark_table_are_what_it_printed() -> None:
    """A paragraph of another page that links to a section of docs/benchmarks.md quotes only
    decimal figures that section's tables printed (the workers page gave 1.89x, 0.76x and 0.83x
    for the 1.886, 0.761 and 0.827 its table printed)."""
    tables = _benchmark_tables()
    checked = 0
    for page in PAGES:
        if page.name == "benchmarks.md":
            continue
        text = re.sub(r"^```.*?^```$", "", page.read_text(), flags=re.S | re.M)
        for paragraph in re.split(r"\n\s*\n|\n- ", text):  # paragraphs and list items
            targets = re.findall(r"\]\(benchmarks\.md#([\w-]+)\)", paragraph)
            if not targets:
                continue
            printed = set().union(*(tables[anchor] for anchor in targets))
            for figure in _DECIMAL.findall(paragraph):
                assert figure in printed, f"{name_of(page)}: {figure} is in no table of {targets}"
                checked += 1
    assert checked


#: The environment variables of our own and OpenTelemetry's, as the code spells them.
_VARIABLE = re.compile(r"(?:CKPT_EVENTS|OTEL)_[A-Z0-9_]*[A-Z0-9]")
_CONFIGURATION = DOCS / "configuration.md"


def _variables_in_code() -> dict[str, str]:
    """Every ``CKPT_EVENTS_*`` and ``OTEL_*`` name the code holds as a whole string (what it reads
    from, or passes to, an environment), with the first file that holds it."""
    found: dict[str, str] = {}
    files = {
        path.resolve()
        for top in ("ckpt_events", "sinks", "participants", "benchmarks")
        for path in (ROOT / top).rglob("*.py")
    }
    for path in sorted(files):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and _VARIABLE.fullmatch(node.value)
            ):
                found.setdefault(node.value, str(path.relative_to(ROOT)))
    return found


def test_every_variable_the_code_reads_is_on_the_configuration_page() -> None:
    """Each environment variable named in the code is in docs/configuration.md under its whole
    name (``CKPT_EVENTS_INFERENCE_TOKEN``, ``CKPT_EVENTS_CHROMIUM`` and ``CKPT_EVENTS_BENCH_ROTEL``
    were on no page; ``OTEL_EXPORTER_OTLP_TIMEOUT`` and ``OTEL_BSP_MAX_QUEUE_SIZE`` were there
    only as ``_TIMEOUT`` and ``_MAX_QUEUE_SIZE``, which a search for the name does not find)."""
    page = _CONFIGURATION.read_text()
    found = _variables_in_code()
    assert len(found) > 40, found
    missing = {name: where for name, where in found.items() if f"`{name}" not in page}
    assert not missing, f"read in the code, not in docs/configuration.md: {missing}"


def test_every_variable_on_the_configuration_page_is_read() -> None:
    """Each variable docs/configuration.md names is read by the code: by its name, or (a
    per-signal ``OTEL_EXPORTER_OTLP_TRACES_X``) as the generic one whose option the code
    reads per signal."""
    found = set(_variables_in_code())
    options = {
        node.value
        for node in ast.walk(ast.parse((ROOT / "sinks" / "otel" / "_env.py").read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }
    # Whole names only: ``OTEL_EXPORTER_OTLP_(METRICS_)TIMEOUT`` on the page is no name of its own.
    said = set(re.findall(rf"(?<!\w){_VARIABLE.pattern}(?![\w(])", _CONFIGURATION.read_text()))
    assert len(said) > 40, said
    for name in said:
        generic = re.sub(r"^OTEL_EXPORTER_OTLP_(?:TRACES|METRICS)_", "OTEL_EXPORTER_OTLP_", name)
        option = generic.removeprefix("OTEL_EXPORTER_OTLP_")
        assert name in found or generic in found or option in options, (
            f"docs/configuration.md: {name} is read nowhere"
        )


def test_the_configuration_pages_defaults_are_the_codes() -> None:
    """The defaults the configuration page states for the OpenTelemetry variables are those
    ``read_otel_env`` gives with them unset (the metric export interval's, 10,000 ms where
    OpenTelemetry's SDK says 60,000, was stated nowhere)."""
    from ckpt_events.sinks import read_otel_env

    page = " ".join(_CONFIGURATION.read_text().split())
    unset = read_otel_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    rows = {row.split(" | ")[0]: row for row in page.split(" | `") if " | " in row}
    interval = next(row for head, row in rows.items() if head.startswith("OTEL_METRIC_EXPORT_INTERVAL`"))
    assert f"default {unset.metric_interval_ms:,}" in interval
    prometheus = next(row for head, row in rows.items() if head.startswith("OTEL_EXPORTER_PROMETHEUS_HOST`"))
    assert f"default `{unset.prometheus_host}:{unset.prometheus_port}`" in prometheus
    limits = next(
        row for head, row in rows.items() if head.startswith("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT`")
    )
    assert f"(default {unset.attribute_limits.count})" in limits


def _benchmark_options() -> set[str]:
    """The options of every benchmark module's own command line (``python -m ...``)."""
    import contextlib
    import importlib
    import io

    options: set[str] = set()
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        if "argparse.ArgumentParser(" not in path.read_text():
            continue
        module = importlib.import_module(f"ckpt_events.benchmarks.{path.stem}")
        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
            module.main(["--help"])
        options.update(_OPTION.findall(out.getvalue()))
    return options


_OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
#: Options the pages give to programs other than ours, each with its program.
_OTHER_OPTIONS = {
    "--config-settings": "pip",
    "--python-executable": "mypy",
    "--dist": "pytest-xdist",
    "--preload": "gunicorn",
    "--graceful-timeout": "gunicorn",
    "--lifespan": "uvicorn",
    "--reload": "uvicorn",
    "--tool": "valgrind",
    "--cache-sim": "valgrind",
    "--enable-feature": "prometheus",
    "--otlp-http-endpoint": "rotel-agent",
    "--exporter": "rotel-agent",
    "--debug-log": "rotel-agent",
    "--debug-log-verbosity": "rotel-agent",
    "--check": "none: the command-line page's example of a refused abbreviation",
}


def _ckpt_events_options() -> dict[str, set[str]]:
    """Each ``ckpt-events`` command's options (``""``: the program's own)."""
    import argparse

    commands: dict[str, set[str]] = {"": set()}
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                commands[name] = {
                    option for a in sub._actions for option in a.option_strings if option.startswith("--")
                }
        else:
            commands[""].update(option for option in action.option_strings if option.startswith("--"))
    return commands


def test_every_option_a_page_names_exists() -> None:
    """Every ``--option`` in a page's prose or blocks is one of ``ckpt-events``', of a benchmark
    module's, or of another program the page runs (a renamed option left in a sentence was
    caught only in bash blocks)."""
    known = set().union(*_ckpt_events_options().values(), _benchmark_options(), _OTHER_OPTIONS)
    for page in PAGES:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            for option in _OPTION.findall(line):
                assert option in known, f"{name_of(page)}:{number}: no program here takes {option}"


def test_every_option_of_every_command_is_on_the_command_line_page() -> None:
    """docs/cli.md names each option of each ``ckpt-events`` command (``serve --inference-token-file``
    and ``--log-level``, ``replay --span-groups`` and ``--service-name`` were on no page)."""
    page = (DOCS / "cli.md").read_text()
    for command, options in _ckpt_events_options().items():
        for option in options - {"--help"}:
            assert re.search(re.escape(option) + r"(?![\w-])", page), f"ckpt-events {command} {option}"


def test_the_tls_recipes_headers_are_sent_as_the_configuration_page_says() -> None:
    """docs/configuration.md's TLS recipe: its header lines parse to what the page says (a value
    keeping its '=', percent-decoded; the traces' own variable replacing the generic one whole),
    and a malformed entry is one line naming the variable with every value redacted."""
    (recipe,) = [b.code for b in blocks(DOCS / "configuration.md", "text") if "x-honeycomb-team" in b.code]
    environ = dict(
        line.split("=", 1) for line in recipe.splitlines() if "HEADERS" in line or "ENDPOINT" in line
    )
    settings = read_otel_env(environ)
    assert settings.traces_otlp is not None and settings.metrics_otlp is not None
    assert settings.traces_otlp.headers == {"x-honeycomb-team": "YOUR_KEY", "x-honeycomb-dataset": "rollouts"}
    assert settings.metrics_otlp.headers == {"x-honeycomb-team": "YOUR_KEY"}
    said = {
        "x-honeycomb-team=abc=def==": "abc=def==",
        "Authorization=Basic%20dXNlcjpwYXNz": "Basic dXNlcjpwYXNz",
    }
    for entry, value in said.items():
        page = (DOCS / "configuration.md").read_text()
        assert f"`{entry}`" in page and f"`{value}`" in page
        parsed = read_otel_env({**environ, "OTEL_EXPORTER_OTLP_HEADERS": entry}).metrics_otlp
        assert parsed is not None and list(parsed.headers.values()) == [value]
    with pytest.raises(ConfigurationError) as refused:
        read_otel_env({**environ, "OTEL_EXPORTER_OTLP_HEADERS": "x-honeycomb-team:SECRET,b=SECRET2"})
    message = str(refused.value)
    assert message.startswith("OTEL_EXPORTER_OTLP_HEADERS=") and "\n" not in message
    assert "SECRET" not in message and "[REDACTED]" in message
