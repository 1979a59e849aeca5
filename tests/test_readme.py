"""The README, the front page: short, an install line and a FastAPI example on the first screen,
every example doing what the text around it says, its extras table and test command true.

What holds for every page (examples run, commands parse, links resolve) is tests/test_docs.py.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path

from tests.readme_pages import README, ROOT, blocks, run_python

TEXT = README.read_text()
LINES = TEXT.splitlines()
PYTHON = [block.code for block in blocks(README, "python")]
BASH = [block.code for block in blocks(README, "bash")]
FIRST_SCREEN = 60
_PARENT_TRACE = "0af7651916cd43dd8448eb211c80319c"


def _one(marker: str) -> str:
    (block,) = [code for code in PYTHON if marker in code]
    return block


def _line_of(needle: str) -> int:
    """The 1-based number of the README's first line holding ``needle``."""
    return next(number for number, line in enumerate(LINES, 1) if needle in line)


def test_the_readme_is_a_front_page() -> None:
    """At most 300 lines; the install line and the FastAPI example (its first code) open it."""
    assert len(LINES) <= 300, len(LINES)
    assert _line_of("pip install 'ckpt-events[otel]'") < FIRST_SCREEN
    first_python = _line_of("```python")
    assert "from fastapi import" in LINES[first_python]
    closing = next(n for n in range(first_python + 1, len(LINES) + 1) if LINES[n - 1] == "```")
    assert closing <= FIRST_SCREEN, f"the FastAPI example ends on line {closing}"


def test_the_readme_has_its_examples() -> None:
    """FastAPI, the library, a custom sink and an OpenTelemetry setup, in that order."""
    markers = ["participants.fastapi import", "JsonLinesSink(", "def handle(", "tracer_provider=provider"]
    positions = [TEXT.index(marker) for marker in markers]
    assert positions == sorted(positions)
    assert len(PYTHON) == len(markers)


def test_fastapi_quickstart_serves_the_curl_and_logs_it(tmp_path: Path) -> None:
    """The quickstart app, sent the README's own curl request through its lifespan, answers it
    and writes the commit and its upload step to events.jsonl, in the caller's trace."""
    (tmp_path / "app.py").write_text(_one("participants.fastapi import"))
    (curl,) = [line for code in BASH for line in code.splitlines() if line.startswith("curl ")]
    words = shlex.split(curl)
    path = "/" + words[2].split("/", 1)[1]
    body = json.loads(words[words.index("-d") + 1])
    driver = f"""
import anyio, httpx
from app import app

async def main():
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://judge") as client:
            headers = {{"traceparent": "00-{_PARENT_TRACE}-b7ad6b7169203331-01"}}
            reply = await client.post({path!r}, json={body!r}, headers=headers)
            print(reply.status_code, reply.json())

anyio.run(main)
"""
    result = run_python(driver, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["200", "{'records':", f"{len(body['rows'])}}}"], result.stdout
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    finished = {event["type"]: event for event in events if event["type"].endswith("_finished")}
    operation, step = finished["operation_finished"], finished["step_finished"]
    assert (operation["kind"], operation["operation"]) == ("judge", "commit")
    assert (operation["checkpoint_id"], operation["records"]) == (body["checkpoint_id"], len(body["rows"]))
    assert operation["received_ns"] is not None
    assert (step["step"], step["parent_span_id"]) == ("upload", operation["span_id"])
    assert {event["trace_id"] for event in events} == {_PARENT_TRACE}


def test_fastapi_quickstart_prints_its_spans_with_the_console_exporter(tmp_path: Path) -> None:
    """The quickstart's shortest path to a span with no collector, as the README says it:
    ``OTEL_TRACES_EXPORTER=console`` prints the commit and its upload span on stdout."""
    assert "start uvicorn with `OTEL_TRACES_EXPORTER=console` and each span is printed" in " ".join(
        TEXT.split()
    )
    (tmp_path / "app.py").write_text(_one("participants.fastapi import"))
    (curl,) = [line for code in BASH for line in code.splitlines() if line.startswith("curl ")]
    words = shlex.split(curl)
    path = "/" + words[2].split("/", 1)[1]
    body = json.loads(words[words.index("-d") + 1])
    driver = f"""
import anyio, httpx
from app import app

async def main():
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://judge") as client:
            assert (await client.post({path!r}, json={body!r})).status_code == 200

anyio.run(main)
"""
    result = run_python(driver, tmp_path, OTEL_TRACES_EXPORTER="console")
    assert result.returncode == 0, result.stderr
    names = re.findall(r'^    "name": "([^"]+)",$', result.stdout, flags=re.M)
    assert sorted(names) == ["gym.checkpoint.commit", "gym.checkpoint.upload"], result.stdout


def test_library_quickstart_reads_its_log_back(tmp_path: Path) -> None:
    """The library example writes its events and reads them back as the typed events."""
    result = run_python(_one("JsonLinesSink("), tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        "OperationStarted",
        "StepStarted",
        "StepFinished",
        "OperationFinished",
        "Refused",
    ]


def test_custom_sink_prints_each_operation(tmp_path: Path) -> None:
    """The README's sink, subscribed as the text says, prints every finished operation."""
    driver = (
        _one("def handle(")
        + """
import anyio
from ckpt_events import Bus, Telemetry

async def main():
    async with Bus() as bus:
        bus.subscribe(PrintOperations())
        tel = Telemetry(bus, kind="resources", instance="resources-0")
        with tel.operation("commit", checkpoint_id="c1"):
            pass
        try:
            with tel.operation("restore", checkpoint_id="c1"):
                raise OSError("disk")
        except OSError:
            pass

anyio.run(main)
"""
    )
    assert "bus.subscribe(PrintOperations())" in TEXT
    result = run_python(driver, tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.rsplit(" ", 2)[0] for line in lines] == [
        "resources/resources-0 commit ok",
        "resources/resources-0 restore error",
    ]


def test_opentelemetry_example_nests_under_the_callers_span(tmp_path: Path) -> None:
    """Our commit span goes through the user's provider, in the trace of the user's span."""
    result = run_python(_one("tracer_provider=provider"), tmp_path)
    assert result.returncode == 0, result.stderr
    spans = dict(line.split() for line in result.stdout.splitlines())
    assert set(spans) == {"handle-request", "gym.checkpoint.commit"}
    assert len(set(spans.values())) == 1


def test_extras_table_is_pyproject(tmp_path: Path) -> None:
    """Each row of the extras table lists exactly what pyproject.toml's extra installs."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(requirements: list[str]) -> set[str]:
        found = set()
        for requirement in requirements:
            match = re.match(r"ckpt-events\[(.+)\]", requirement)
            if match:
                found |= {f"[{extra}]" for extra in match.group(1).split(",")}
            else:
                found.add(re.split(r"[<>=\[; ]", requirement, maxsplit=1)[0])
        return found

    expected = {"`ckpt-events`": names(project["dependencies"])}
    expected |= {f"`[{extra}]`": names(reqs) for extra, reqs in project["optional-dependencies"].items()}
    rows = {}
    for line in LINES:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) == 3 and cells[0] in expected:
            listed = set()
            for item in cells[1].split(", "):
                match = re.fullmatch(r"`\[(.+)\]`", item)
                listed |= {f"[{e}]" for e in match.group(1).split(",")} if match else {item}
            rows[cells[0]] = listed
    assert rows == expected


def test_the_otel_extra_holds_only_what_the_library_imports() -> None:
    """Each package of the ``[otel]`` extra is imported by the library (``ckpt_events``,
    ``sinks``), as its row's why says: ``[otel]`` carried opentelemetry-exporter-otlp-proto-http
    (and protobuf, requests...) for "OTLP/HTTP export", which is our own encoder and sender;
    only ``bench`` imports that exporter."""
    import ast

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    imported: set[str] = set()
    for folder in ("ckpt_events", "sinks"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    imported |= {alias.name for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    imported.add(node.module)
    for requirement in project["optional-dependencies"]["otel"]:
        name = re.split(r"[<>=\[; ]", requirement, maxsplit=1)[0]
        module = name.replace("-", ".")  # opentelemetry-sdk -> opentelemetry.sdk
        assert any(m == module or m.startswith(module + ".") for m in imported), f"[otel] {name}: unused"


def test_ci_runs_exactly_the_readme_test_command() -> None:
    """.ci/run contains the README's test command verbatim."""
    test_command = next(code.strip() for code in BASH if "pytest" in code)
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_command in ci
