"""The README: every python example runs, its tables match the code, its test command is CI's."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ckpt_events import ErrorCode
from ckpt_events.participants.protocol import CONTROL_PREFIX
from tests.readme_names import names_table, readme_block

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.S)
_PARENT_TRACE = "0af7651916cd43dd8448eb211c80319c"


def _run(code: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter, in ``tmp_path``, without our or OTel's variables."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "CKPT_EVENTS_"))}
    clean["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
        env={**clean, **env},
    )


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_every_python_block_runs(index: int, tmp_path: Path) -> None:
    """Each ```python block of the README runs as written, in a fresh interpreter."""
    result = _run(BLOCKS[index], tmp_path)
    assert result.returncode == 0, result.stderr


def test_the_readme_has_its_examples() -> None:
    """The server-code, testing and custom-sink examples are all there to run."""
    assert len(BLOCKS) >= 3
    assert any("anyio.run(main)" in b and "with_tracestate" in b for b in BLOCKS)
    assert any("EventCapture" in b for b in BLOCKS)


def test_custom_sink_example_prints_its_alert(tmp_path: Path) -> None:
    """The custom-sink example prints its alert."""
    (block,) = [b for b in BLOCKS if "RefusalAlert" in b]
    result = _run(block, tmp_path)
    assert "ALERT resources/resources-0 refused a request: stale_attempt" in result.stdout


def test_server_example_joins_the_callers_trace_and_logs_hex_ids(tmp_path: Path) -> None:
    """With CKPT_EVENTS_JSONL set, the server example continues the incoming trace, passes its
    tracestate on, and logs the trace id as the caller's hex string."""
    (block,) = [b for b in BLOCKS if "with_tracestate" in b]
    result = _run(block, tmp_path, CKPT_EVENTS_JSONL=str(tmp_path / "run.jsonl"))
    assert result.returncode == 0, result.stderr
    assert (
        f"00-{_PARENT_TRACE}-" in result.stdout and "'tracestate': 'rojo=00f067aa0ba902b7'" in result.stdout
    )
    lines = [json.loads(line) for line in (tmp_path / "run.jsonl").read_text().splitlines()]
    assert {line["trace_id"] for line in lines if "trace_id" in line} == {_PARENT_TRACE}


def test_server_example_exits_fast_when_the_collector_is_down(tmp_path: Path) -> None:
    """With OTEL_EXPORTER_OTLP_ENDPOINT where nothing listens, the server example still runs and
    exits in a few seconds, saying once per signal that its export was refused (it took 20 s,
    then 8 s: the final export backed off for its whole close budget)."""
    import socket
    import time

    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    (block,) = [b for b in BLOCKS if "with_tracestate" in b]
    started = time.monotonic()
    result = _run(block, tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}")
    took = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert took < 4.0, f"the example took {took:.1f} s to exit"
    refusals = result.stderr.splitlines()
    assert len(refusals) == 2 and all("refused or unreachable" in line for line in refusals), refusals


@pytest.mark.collector
def test_the_rotel_command_starts_a_collector_as_pasted(tmp_path: Path) -> None:
    """The README's rotel line, run by a shell as written (with this interpreter and a free
    port), starts rotel-agent listening ("rotel-agent" alone is not on PATH: it failed)."""
    import socket
    import time

    from ckpt_events.benchmarks.rotel import agent_binary, agent_env, free_port

    if agent_binary() is None:
        pytest.skip("the rotel package is not installed")
    (line,) = [line for line in README.splitlines() if "rotel-agent" in line and "start" in line]
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


def test_names_table_matches_the_code() -> None:
    """The README's span/attribute/metric table is what tests/readme_names.py generates."""
    assert readme_block(README) == names_table(), "run: python -m tests.readme_names"


def test_error_codes_table_matches_the_protocol() -> None:
    """Every protocol error code is in the HTTP API section with its status."""
    for code in ErrorCode:
        assert f"| `{code.value}` | {code.http_status} |" in README, code


def test_http_api_lists_every_control_route() -> None:
    """Every control route of a participant app is in the README's route table."""
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
        assert f"| `{method} {path}` |" in README, (method, path)
    assert f"`{CONTROL_PREFIX}`" in README


async def test_what_the_readme_says_of_the_workload_apis_auth_holds() -> None:
    """The README says the /work routes take the bearer token (it said "no auth"), and a real app
    answers them 401 without it and 200 with it."""
    import httpx

    from ckpt_events.participants.server.app import create_app
    from tests.participants.helpers import AUTH, TOKEN, running

    assert "The workload API takes the same bearer token (missing or wrong: 401 `unauthorized`)" in README
    assert "no auth" not in README
    app = create_app("resources", instance="resources-0", token=TOKEN)
    async with running(app) as client:
        work = {"rollout_id": "r1", "attempt": 0, "steps": 2}
        bare = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")
        async with bare:
            denied = await bare.post("/work/start", json=work)
            assert (denied.status_code, denied.json()["error"]["code"]) == (401, "unauthorized")
            assert (await bare.get("/work/r1-a0")).status_code == 401
        assert (await client.post("/work/start", json=work, headers=AUTH)).status_code == 200


def test_ci_runs_exactly_the_readme_test_command() -> None:
    """.ci/run contains the README's test command verbatim."""
    commands = re.findall(r"```bash\n(.*?)\n```", README, flags=re.S)
    test_command = next(c for c in commands if "pytest" in c)
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_command in ci
