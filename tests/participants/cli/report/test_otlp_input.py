"""A collector's OTLP JSON file (the ``file`` exporter's format: one ExportTraceServiceRequest per
line) read into the same overview as the JSON-lines log of the same run; bad spans one line each."""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from ckpt_events.participants.cli.main import main
from ckpt_events.participants.cli.report.logs import LogProblems, merged_events
from ckpt_events.participants.cli.report.overview import overview
from ckpt_events.sinks.otel import OtlpSpanSink
from ckpt_events.sinks.otlp import read_otlp
from tests.participants.cli.report.test_run_report import _write


def _export_as_collector_file(events: list[Any], out: Path) -> int:
    """Our own http/json export path to a real HTTP receiver on 127.0.0.1; each request body
    written as one line, as the collector's file exporter does."""
    bodies: list[bytes] = []

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            bodies.append(self.rfile.read(int(self.headers["content-length"])))
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        sink = OtlpSpanSink(
            f"http://127.0.0.1:{server.server_port}", protocol="http/json", linger=0.01, max_export_batch=16
        )
        wanted = [e for e in events if isinstance(e, sink.interests)]  # what a bus would hand it
        for start in range(0, len(wanted), 10):
            sink.handle(wanted[start : start + 10])
        sink.shutdown()
        assert sink.stats().export_failures == 0
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    out.write_bytes(b"".join(json.dumps(json.loads(b)).encode() + b"\n" for b in bodies))
    return len(bodies)


def _rows(path: Path) -> list[tuple[Any, ...]]:
    run = overview(merged_events([path], LogProblems()))
    return [(r.what, r.checkpoint_id, r.outcome, r.ms, r.critical_path, r.paused_ms) for r in run.rows]


async def test_otlp_file_gives_the_overview_of_the_json_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], aborted_run: list[Any]
) -> None:
    events = aborted_run
    jsonl, otlp = tmp_path / "run.jsonl", tmp_path / "collector.json"
    _write(jsonl, events)
    assert _export_as_collector_file(events, otlp) > 2
    expected = _rows(jsonl)
    assert [r[2] for r in expected] == ["published", "published", "aborted", "aborted"]
    assert _rows(otlp) == expected
    assert main(["report", str(otlp)]) == 0
    out = capsys.readouterr()
    assert "run overview" in out.out and out.err == ""


async def test_bad_otlp_spans_one_line_each(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], aborted_run: list[Any]
) -> None:
    events = aborted_run
    otlp = tmp_path / "collector.json"
    _export_as_collector_file(events, otlp)
    requests = [json.loads(line) for line in otlp.read_text().splitlines()]
    spans = [s for r in requests for rs in r["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    step = next(s for s in spans if s["name"] == "gym.checkpoint.write")
    orphan = dict(step, spanId="ab" * 8, parentSpanId="cd" * 8)
    backwards = dict(spans[0], spanId="ef" * 8, endTimeUnixNano="1", startTimeUnixNano="2")
    short = dict(spans[0], spanId="abc")
    bad = {"resourceSpans": [{"scopeSpans": [{"spans": [spans[1], orphan, backwards, short]}]}]}
    with otlp.open("a") as f:
        f.write(json.dumps(bad) + "\n" + "{not json\n")
    assert main(["report", str(otlp)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 5 and "Traceback" not in "\n".join(err)
    n = len(requests) + 1
    assert err[0] == f"{otlp}:{n}: span {spans[1]['spanId']} seen twice; skipped"
    assert err[1] == f"{otlp}:{n}: span efefefefefefefef skipped: its end is before its start"
    assert err[2] == f"{otlp}:{n}: span abc skipped: trace id must be 32 hex digits and span id 16"
    assert err[3].startswith(f"{otlp}:{n + 1}: not an OTLP JSON trace request")
    assert err[4] == f"{otlp}:{n}: step span abababababababab: its parent operation never came; skipped"


async def test_otlp_spans_with_a_field_of_the_wrong_type_or_a_time_out_of_range_are_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], aborted_run: list[Any]
) -> None:
    """A span whose ``records`` attribute is a string ended the report in msgspec's ValidationError
    traceback; a span ending in year 3e9 (1e26 ns) or starting before 1970 was read, and the run
    line said "0.0% of the logs' 99999998203659312.0 s". Each is one line, skipped, as the JSON
    lines reader skips a time outside [0, 2**63)."""
    otlp = tmp_path / "collector.json"
    _export_as_collector_file(aborted_run, otlp)
    requests = [json.loads(line) for line in otlp.read_text().splitlines()]
    spans = [s for r in requests for rs in r["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    write = next(s for s in spans if s["name"] == "gym.checkpoint.write")
    operation = next(s for s in spans if s["spanId"] == write["parentSpanId"])
    records = {"key": "nemo.gym.checkpoint.records", "value": {"stringValue": "many"}}
    typed = dict(operation, spanId="ab" * 8, attributes=[*operation.get("attributes", []), records])
    late = dict(spans[0], spanId="cd" * 8, endTimeUnixNano="99999999999999999999999999")
    early = dict(spans[0], spanId="ef" * 8, startTimeUnixNano="-5")
    step = dict(write, spanId="12" * 8, parentSpanId="ab" * 8)  # waits for the bad operation
    bad = {"resourceSpans": [{"scopeSpans": [{"spans": [step, typed, late, early]}]}]}
    # A user's attribute that is an array or a key-value list (valid OTLP) costs nothing: kept
    # as its JSON text (it skipped the span: an event's attribute is a bool, int, float or str).
    listed = {"arrayValue": {"values": [{"intValue": "1"}, {"stringValue": "a"}]}}
    nested = {"kvlistValue": {"values": [{"key": "k", "value": {"boolValue": True}}]}}
    users = [{"key": "user.list", "value": listed}, {"key": "user.map", "value": nested}]
    kept = dict(spans[0], spanId="34" * 8, attributes=[*spans[0].get("attributes", []), *users])
    good = {"resourceSpans": [{"scopeSpans": [{"spans": [kept]}]}]}
    with otlp.open("a") as f:
        f.write(json.dumps(bad) + "\n" + json.dumps(good) + "\n")
    (event,) = [e for _, e in read_otlp(otlp, lambda line: None) if e.span_id == 0x34343434_34343434]
    assert event.attributes is not None
    assert json.loads(event.attributes["user.list"]) == listed
    assert json.loads(event.attributes["user.map"]) == nested
    assert main(["report", str(otlp)]) == 0
    captured = capsys.readouterr()
    err = captured.err.splitlines()
    n = len(requests) + 1
    assert err[0].startswith(f"{otlp}:{n}: span abababababababab skipped: ") and "records" in err[0]
    assert err[1].startswith(f"{otlp}:{n}: span cdcdcdcdcdcdcdcd skipped: ") and "2**63" in err[1]
    assert err[2].startswith(f"{otlp}:{n}: span efefefefefefefef skipped: ") and "2**63" in err[2]
    assert err[3] == f"{otlp}:{n}: step span 1212121212121212: its parent operation never came; skipped"
    assert len(err) == 4
    assert "of the logs' 9999" not in captured.out
