"""``configure()`` in an install without the extra its settings need: one ``ConfigurationError``
naming the install, in both modes; what needs no extra still runs.

Each case runs in interpreters (its own and the export process's) where a meta-path finder,
loaded by ``sitecustomize``, refuses the packages an extra brings, as the import system does
when no finder has them. Before, an OTLP endpoint or
``OTEL_TRACES_EXPORTER=console`` without the SDK was a bare ``ModuleNotFoundError`` from deep
inside (with ``export_process=True``, the child's traceback on stderr), and
``OTEL_METRICS_EXPORTER=prometheus`` with the prometheus extra alone needed the SDK too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.not_installed import run_without

ROOT = Path(__file__).resolve().parents[2]

#: Configures from argv[1] (a JSON environment; ``export_process`` in argv[2]), emits one
#: operation, scrapes the Prometheus endpoint if one is up, and prints what happened as JSON.
PROGRAM = """
import json, sys, urllib.request

import anyio
from ckpt_events import Bus, ConfigurationError, Telemetry
from ckpt_events.sinks import configure

async def main():
    async with Bus() as bus:
        try:
            configured = configure(
                bus, environ=json.loads(sys.argv[1]), export_process=sys.argv[2] == "export_process"
            )
        except ConfigurationError as exc:
            return {"error": str(exc)}
        try:
            tel = Telemetry(bus, kind="environment", instance="e0")
            with tel.operation("commit", checkpoint_id="c1"):
                pass
            await bus.flush()
            scraped = ""
            if configured.prometheus is not None:
                url = configured.prometheus.url
                scraped = await anyio.to_thread.run_sync(
                    lambda: urllib.request.urlopen(url, timeout=10).read().decode()
                )
            sinks = sorted(s.name for s in configured.subscriptions)
            return {"sinks": sinks, "scraped": scraped}
        finally:
            await configured.aclose()

print(json.dumps(anyio.run(main)))
"""

OTLP = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
CONSOLE = {"OTEL_TRACES_EXPORTER": "console"}
PROMETHEUS = {
    "OTEL_METRICS_EXPORTER": "prometheus",
    "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
    "OTEL_EXPORTER_PROMETHEUS_PORT": "0",
}
NEEDS_OTEL = "needs OpenTelemetry's SDK, which is not installed: pip install 'ckpt-events[otel]'"


def _configure_without(
    tmp_path: Path, blocked: str, environ: dict[str, str], mode: str = "in_process"
) -> tuple[dict[str, object], str]:
    done = run_without(tmp_path, blocked, [PROGRAM, json.dumps(environ), mode])
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


@pytest.mark.parametrize("mode", ["in_process", "export_process"])
@pytest.mark.parametrize(
    ("blocked", "environ", "asked"),
    [
        ("opentelemetry", OTLP, "traces to otlp and metrics to otlp"),
        # The server extra's FastAPI brings OpenTelemetry's API, not its SDK.
        ("opentelemetry.sdk", OTLP, "traces to otlp and metrics to otlp"),
        ("opentelemetry", CONSOLE, "traces to console"),
        ("opentelemetry", {"OTEL_METRICS_EXPORTER": "console"}, "metrics to console"),
    ],
    ids=["otlp", "otlp-api-alone", "console-traces", "console-metrics"],
)
def test_an_export_without_the_sdk_names_the_otel_extra(
    tmp_path: Path, blocked: str, environ: dict[str, str], asked: str, mode: str
) -> None:
    """One ConfigurationError naming what asked for the SDK and the install, before anything is
    built: in the export process's mode too, so no child starts to fail with a traceback."""
    result, stderr = _configure_without(tmp_path, blocked, environ, mode)
    assert result == {"error": f"exporting {asked} {NEEDS_OTEL}"}
    assert stderr == ""


@pytest.mark.parametrize("mode", ["in_process", "export_process"])
def test_prometheus_without_prometheus_client_names_its_extra(tmp_path: Path, mode: str) -> None:
    """Said by the endpoint before (the export process relays it); now checked first, in both modes."""
    result, stderr = _configure_without(tmp_path, "prometheus_client", PROMETHEUS, mode)
    said = "OTEL_METRICS_EXPORTER=prometheus needs prometheus-client: pip install 'ckpt-events[prometheus]'"
    assert result == {"error": said}
    assert stderr == ""


def test_prometheus_needs_no_opentelemetry(tmp_path: Path) -> None:
    """The scrape endpoint is our own aggregation: with the prometheus extra alone (no
    OpenTelemetry at all), it is up and serves the operation emitted."""
    result, stderr = _configure_without(tmp_path, "opentelemetry", PROMETHEUS)
    assert result["sinks"] == ["prometheus"], result
    scraped = str(result["scraped"])
    assert 'nemo_gym_checkpoint_operation="commit"' in scraped, scraped
    assert stderr == ""


def test_json_lines_need_no_extra(tmp_path: Path) -> None:
    """JSON lines alone, with neither OpenTelemetry nor prometheus-client."""
    environ = {"CKPT_EVENTS_JSONL": str(tmp_path / "e.jsonl")}
    result, stderr = _configure_without(tmp_path, "opentelemetry,prometheus_client", environ)
    assert result == {"sinks": ["jsonl"], "scraped": ""}
    lines = (tmp_path / "e.jsonl").read_text().splitlines()
    assert len(lines) >= 2 and stderr == ""
