"""A public name whose extra is not installed: a ``ModuleNotFoundError`` (so ``except
ImportError`` still holds) that names the install, not a bare "No module named 'starlette'".

Each import runs in an interpreter where a meta-path finder refuses the packages an extra
brings, as the import system does when no finder has them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.not_installed import run_without

ROOT = Path(__file__).resolve().parents[1]

#: Runs argv[1] and prints the ModuleNotFoundError it raised: its type, ``name`` and message.
PROGRAM = """
import sys

try:
    exec(sys.argv[1])
except ModuleNotFoundError as exc:
    print(type(exc).__name__, exc.name, str(exc), sep="|")
"""


def _import_without(tmp_path: Path, blocked: str, statement: str) -> str:
    done = run_without(tmp_path, blocked, [PROGRAM, statement])
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize(
    ("blocked", "statement", "said"),
    [
        (
            "starlette,fastapi",
            "from ckpt_events.participants.fastapi import instrument",
            "ModuleNotFoundError|starlette|ckpt_events.participants.fastapi needs 'starlette' "
            "(FastAPI), which is not installed: pip install 'ckpt-events[server]'",
        ),
        (
            "fastapi,starlette,httpx",
            "from ckpt_events.participants import create_app",
            "ModuleNotFoundError|fastapi|ckpt_events.participants.create_app needs 'fastapi', which is not "
            "installed: pip install 'ckpt-events[server]'",
        ),
        (
            "httpx",
            "from ckpt_events.participants import Coordinator",
            "ModuleNotFoundError|httpx|ckpt_events.participants.Coordinator needs 'httpx', which is not "
            "installed: pip install 'ckpt-events[server]'",
        ),
        (
            "opentelemetry",
            "from ckpt_events.sinks.otel_bridge import OtelContextBridge",
            "ModuleNotFoundError|opentelemetry|ckpt_events.sinks.otel_bridge needs 'opentelemetry', which "
            "is not installed: pip install 'ckpt-events[otel]'",
        ),
        (
            "opentelemetry",
            "from ckpt_events.sinks.otel import SpanSink",
            "ModuleNotFoundError|opentelemetry|ckpt_events.sinks.otel.SpanSink needs 'opentelemetry', which "
            "is not installed: pip install 'ckpt-events[otel]'",
        ),
        (
            # The server extra's FastAPI brings OpenTelemetry's API alone: SpanSink needs the SDK.
            "opentelemetry.sdk",
            "from ckpt_events.sinks.otel import SpanSink",
            "ModuleNotFoundError|opentelemetry.sdk|ckpt_events.sinks.otel.SpanSink needs 'opentelemetry', "
            "which is not installed: pip install 'ckpt-events[otel]'",
        ),
    ],
    ids=["fastapi-integration", "create_app", "Coordinator", "otel_bridge", "SpanSink", "SpanSink-api-alone"],
)
def test_a_name_without_its_extra_names_the_install(
    tmp_path: Path, blocked: str, statement: str, said: str
) -> None:
    assert _import_without(tmp_path, blocked, statement) == said


def test_what_needs_no_extra_still_imports(tmp_path: Path) -> None:
    """The OTLP sinks and JSON lines need no extra; a module of ours that is missing is not
    taken for an extra's (its own error stands)."""
    everything = "opentelemetry,starlette,fastapi,httpx,uvicorn,prometheus_client,rich"
    statement = "from ckpt_events.sinks.otel import OtlpSpanSink\nfrom ckpt_events.sinks import JsonLinesSink"
    assert _import_without(tmp_path, everything, statement) == ""
    ours = _import_without(
        tmp_path, "ckpt_events.sinks.otel._span_sink", "from ckpt_events.sinks.otel import SpanSink"
    )
    module = "ckpt_events.sinks.otel._span_sink"
    assert ours == f"ModuleNotFoundError|{module}|No module named {module!r}"
