"""An app instrumented by us and by Pydantic Logfire (``logfire.instrument_fastapi``): one trace
per request, our spans children of logfire's request span, through logfire's own pipeline.

Each case runs in a fresh interpreter: ``logfire.configure()`` sets the process's global
providers, which a test must not leave behind. Skipped where logfire is not installed."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("logfire") is None, reason="logfire is not installed (pip install logfire)"
)

#: The app, served in process through httpx's ASGI transport; prints the spans logfire's
#: pipeline exported, one JSON object per line. Its argument says which of logfire.configure()
#: and instrument(..., tracer_provider=trace.get_tracer_provider()) comes first at import, or
#: that the app's own lifespan calls logfire.shutdown() at shutdown.
_APP = textwrap.dedent(
    """
    import json, sys
    from contextlib import asynccontextmanager

    import anyio, httpx, logfire
    from fastapi import FastAPI, Request
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from ckpt_events.participants.fastapi import instrument, operation

    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()

    def configure_logfire():
        logfire.configure(
            send_to_logfire=False,
            console=False,
            service_name="judge-svc",
            additional_span_processors=[SimpleSpanProcessor(exporter)],
            metrics=logfire.MetricsOptions(additional_readers=[reader]),
        )

    @asynccontextmanager
    async def lifespan(app):
        yield
        if sys.argv[1] == "shutdown-in-lifespan":
            logfire.shutdown()

    if sys.argv[1] != "ours-first":
        configure_logfire()
    app = FastAPI(lifespan=lifespan)
    instrument(
        app,
        kind="judge",
        instance="judge-0",
        otel_context=True,
        tracer_provider=trace.get_tracer_provider(),
        meter_provider=metrics.get_meter_provider(),
        environ={},
    )
    if sys.argv[1] == "ours-first":
        configure_logfire()
    logfire.instrument_fastapi(app)

    @app.post("/commit")
    async def commit(request: Request) -> dict[str, int]:
        with operation(request, "commit", checkpoint_id="c1") as op:
            with op.step("upload"), logfire.span("app.work"):
                pass
        return {}

    async def main() -> None:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://judge") as client:
                for _ in range(3):
                    assert (await client.post("/commit")).status_code == 200

    anyio.run(main)
    for span in exporter.get_finished_spans():
        parent = span.parent.span_id if span.parent is not None else None
        print(json.dumps({
            "name": span.name, "trace": span.context.trace_id, "id": span.context.span_id,
            "parent": parent, "service": span.resource.attributes.get("service.name"),
            "ended": span.end_time is not None,
        }))
    data = reader.get_metrics_data()
    names = {m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    print(json.dumps({"metrics": sorted(names)}))
    """
)


@pytest.mark.parametrize("order", ["logfire-first", "ours-first", "shutdown-in-lifespan"])
def test_our_spans_nest_under_logfire_s_request_span_in_its_pipeline(order: str, tmp_path: Path) -> None:
    """``tracer_provider=trace.get_tracer_provider()`` (logfire's proxy, or OpenTelemetry's
    proxy taken before ``logfire.configure()``) hands our spans to logfire's processors: three
    requests, three traces of four spans each (logfire's SERVER span, our commit under it, its
    upload step, the app's logfire span under the commit), none twice, with logfire's resource;
    our metrics reach logfire's readers. Both proxies were refused: the app did not start.
    With ``logfire.shutdown()`` in the app's own lifespan, every span still reaches it (the
    span sink's last second of spans was lost there, uncounted behind logfire's processors)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "CKPT_EVENTS_", "LOGFIRE_"))}
    env["PYTHONPATH"] = str(ROOT)
    script = tmp_path / "app.py"  # a file: logfire reads its callers' source, warning under -c
    script.write_text(_APP)
    result = subprocess.run(
        [sys.executable, "-W", "error", str(script), order],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    *rows, last = [json.loads(line) for line in result.stdout.splitlines()]
    assert {"gym.checkpoint.operation_duration_ms", "http.server.duration"} <= set(last["metrics"])
    assert len(rows) == 12 and len({row["id"] for row in rows}) == 12
    assert all(row["ended"] and row["service"] == "judge-svc" for row in rows)
    by_id = {row["id"]: row for row in rows}
    servers = [row for row in rows if row["parent"] is None]
    assert [row["name"] for row in servers] == ["POST /commit"] * 3
    for server in servers:
        tree = [row for row in rows if row["trace"] == server["trace"]]
        assert len(tree) == 4
        names = {row["name"]: row for row in tree}
        assert set(names) == {"POST /commit", "gym.checkpoint.commit", "gym.checkpoint.upload", "app.work"}
        assert names["gym.checkpoint.commit"]["parent"] == server["id"]
        assert names["gym.checkpoint.upload"]["parent"] == names["gym.checkpoint.commit"]["id"]
        # The step is not the current span (the operation is): the app's span nests there.
        assert by_id[names["app.work"]["parent"]]["name"] == "gym.checkpoint.commit"
