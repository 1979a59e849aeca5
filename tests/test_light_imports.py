"""What the light entry points import: a library thousands import must not load an HTTP stack, an
exporter or asyncio's transports when its telemetry is off.

Each case runs in a fresh interpreter (what an earlier test imported would hide a regression),
with no ``OTEL_*`` or ``CKPT_EVENTS_*`` variable set, and names the modules it must not load.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Every optional extra's packages: none is needed with nothing configured.
EXTRAS = ("opentelemetry", "fastapi", "starlette", "httpx", "uvicorn", "prometheus_client", "rich")
#: An HTTP client or server of the standard library (email comes with both), and the installed
#: packages' metadata (the context-bridge lookup, for otel_context=True only).
HTTP = ("http.client", "http.server", "email", "importlib.metadata")
#: asyncio with its transports (ssl, socket, subprocess): on trio, and before a loop runs, unused.
ASYNCIO = ("asyncio", "anyio._backends._asyncio")
#: TLS: the core has no use for it (the sinks' settings check TLS files with it: not watched there).
TLS = ("ssl",)
#: Our own export machinery: loaded when an OTLP sink is made, not to read that none is asked for.
OTLP = ("ckpt_events.sinks.otlp._http", "ckpt_events.sinks.otlp._span_encoder")

#: What only other commands use: the benchmarks, the report and the watch, the JSON-lines reader
#: (the watch's follower built its wire decoders at import), the controller. The command line
#: builds every command's parser on each start, ``serve`` and ``--help`` too.
OTHER_COMMANDS = (
    "ckpt_events.benchmarks.bench_app",
    "ckpt_events.benchmarks.load",
    "ckpt_events.benchmarks.report",
    "ckpt_events.benchmarks.rotel",
    "ckpt_events.participants.cli.report.logs",
    "ckpt_events.participants.cli.watch.backlog",
    "ckpt_events.participants.cli.watch.follow",
    "ckpt_events.participants.cli.watch.layout",
    "ckpt_events.participants.cli.watch.skipped",
    "ckpt_events.participants.cli.watch.sources",
    "ckpt_events.participants.cli.watch.view",
    "ckpt_events.participants.controller",
    "ckpt_events.sinks.jsonl",
)

#: Runs argv[1] and prints, as JSON, the modules it loaded that argv[2] (comma-separated) names,
#: each with everything below it.
PROGRAM = """
import json, sys

before = set(sys.modules)
exec(sys.argv[1])
watched = tuple(sys.argv[2].split(","))
loaded = sorted(
    m for m in set(sys.modules) - before if any(m == w or m.startswith(w + ".") for w in watched)
)
print(json.dumps(loaded))
"""

CONFIGURE_NOTHING = """
import anyio

from ckpt_events import Bus
from ckpt_events.sinks import configure


async def main() -> None:
    async with Bus() as bus, configure(bus) as configured:
        assert not configured.subscriptions, configured.subscriptions


anyio.run(main, backend="trio")
"""

TELEMETRY_OFF = """
from ckpt_events import Bus, Telemetry

tel = Telemetry(Bus(), kind="resources", instance="resources-0")
with tel.operation("commit", checkpoint_id="c1") as op:
    with op.step("write"):
        op.set(records=12)
tel.refused("stale_attempt")
"""


def _loaded(statement: str, watched: tuple[str, ...]) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "CKPT_EVENTS_"))}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, statement, ",".join(watched)],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    loaded: list[str] = json.loads(done.stdout)
    return loaded


@pytest.mark.parametrize(
    ("statement", "watched"),
    [
        # The package itself is a table of lazy names: not even the bus's anyio and msgspec.
        ("import ckpt_events", ("anyio", "msgspec", *EXTRAS, *HTTP, *ASYNCIO, *TLS)),
        ("from ckpt_events import Bus, Telemetry", (*EXTRAS, *HTTP, *ASYNCIO, *TLS)),
        (TELEMETRY_OFF, (*EXTRAS, *HTTP, *ASYNCIO, *TLS)),
        (
            "from ckpt_events.sinks import configure, JsonLinesSink",
            (*EXTRAS, *HTTP, *ASYNCIO, *OTLP),
        ),
        # configure() with nothing set: the off path of every server, on trio so that asyncio
        # being loaded would be ours.
        (CONFIGURE_NOTHING, (*EXTRAS, *HTTP, *ASYNCIO, *OTLP)),
        # The user's app brings FastAPI (and with it starlette, email, http.client); the
        # integration adds no exporter and no sink until its lifespan configures them.
        (
            "from ckpt_events.participants.fastapi import instrument, operation",
            (
                "opentelemetry",
                "httpx",
                "uvicorn",
                "prometheus_client",
                "rich",
                "http.server",
                "importlib.metadata",
                "ckpt_events.sinks._configure",
                "ckpt_events.sinks._configured",
                *OTLP,
            ),
        ),
        # The parser every ``ckpt-events`` start builds (``--help``, and each server the demo
        # and a fleet start): no other command's machinery, no version lookup (importlib.metadata
        # searched the installed distributions for a ``--version`` nobody asked for).
        (
            "from ckpt_events.participants.cli.main import build_parser; build_parser()",
            (*EXTRAS, "http.client", "ssl", *HTTP, "ckpt_events.sinks", *OTHER_COMMANDS),
        ),
    ],
    ids=[
        "ckpt_events",
        "Bus-Telemetry",
        "telemetry-off",
        "sinks-configure",
        "configure-nothing",
        "fastapi",
        "cli-parser",
    ],
)
def test_a_light_entry_point_loads_nothing_heavy(statement: str, watched: tuple[str, ...]) -> None:
    """The entry point loads none of the modules it is watched for."""
    assert _loaded(statement, watched) == []


def test_the_watch_sees_a_heavy_import() -> None:
    """The check itself: a statement that does load a watched module is reported, with its
    submodules (a watch that saw nothing would pass every case above)."""
    assert "http.client" in _loaded("import http.client", ("http.client",))
    assert "email.parser" in _loaded("import http.client", ("email",))


def _serve_imports(tmp_path: Path) -> set[str]:
    """Every module a ``ckpt-events serve environment`` process imported by the time its port
    accepts (``-X importtime`` names each on stderr); the process is stopped before returning."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "CKPT_EVENTS_"))}
    env["PYTHONPATH"] = str(ROOT)
    # A pydantic plugin installed beside us (logfire's brings rich and OpenTelemetry's SDK) is
    # loaded by FastAPI's first model, whatever we import: the environment's, not ours.
    env["PYDANTIC_DISABLE_PLUGINS"] = "__all__"
    (token := tmp_path / "token").write_text("t" * 32)
    stderr = tmp_path / "stderr"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        with stderr.open("wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-X", "importtime", "-m", "ckpt_events.participants.cli", "serve"]
                + ["environment", "--fd", str(sock.fileno()), "--token-file", str(token)]
                + ["--checkpoint-root", str(tmp_path / "checkpoints")],
                stdout=subprocess.DEVNULL,
                stderr=err,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=tmp_path,
                pass_fds=(sock.fileno(),),
            )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, stderr.read_text()[-2000:]
            assert time.monotonic() < deadline, "serve did not listen within 60 s"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.02)
    finally:
        proc.terminate()
        proc.wait(30)
    lines = stderr.read_text().splitlines()
    return {line.split("|")[-1].strip() for line in lines if line.startswith("import time:")}


def test_a_serve_process_loads_no_other_command(tmp_path: Path) -> None:
    """A participant server imports FastAPI and uvicorn, but not what only the other commands,
    an exporter or a scraper use (the benchmarks, the watch and its JSON-lines reader were
    imported by every server of a fleet: 644 modules to listening, 632 without them)."""
    loaded = _serve_imports(tmp_path)
    assert {"fastapi", "uvicorn", "ckpt_events.participants.server.app"} <= loaded  # the watch sees
    # One worker (the default): nothing of the worker processes' launcher either.
    worker = "ckpt_events.participants.cli.worker_process"
    watched = (*OTHER_COMMANDS, worker, "rich", "prometheus_client", "opentelemetry.sdk", *OTLP)
    assert sorted(m for m in loaded if any(m == w or m.startswith(w + ".") for w in watched)) == []
