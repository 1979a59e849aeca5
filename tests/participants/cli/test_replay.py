"""``ckpt-events replay``: where it exports (the flag, else OpenTelemetry's variables, never a
doubled signal path) and what it says about a file that is not a log."""

from __future__ import annotations

import contextlib
import http.server
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ckpt_events.participants.cli.main import main
from tests.http_servers import serving
from tests.participants.cli.otlp_receiver import otlp_receiver

SPAN = (
    b'{"type":"coordinate_finished","kind":"controller","instance":"coordination","trace_id":1,'
    b'"span_id":2,"start_ns":1000000,"end_ns":5000000,"operation":"commit"}\n'
)


@pytest.fixture(autouse=True)
def no_ambient_otel(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)


@pytest.fixture
def log(tmp_path: Path) -> Path:
    path = tmp_path / "run.jsonl"
    path.write_bytes(SPAN)
    return path


@pytest.mark.parametrize("suffix", ["", "/", "/v1/traces", "/v1/traces/"])
def test_a_base_or_a_full_traces_url_posts_to_v1_traces_once(
    log: Path, capsys: pytest.CaptureFixture[str], suffix: str
) -> None:
    """--otlp-endpoint takes the base or the whole /v1/traces URL; spans go to /v1/traces, never
    /v1/traces/v1/traces (where a full URL went before)."""
    with otlp_receiver() as received:
        assert main(["replay", str(log), "--otlp-endpoint", received.url + suffix]) == 0
    # Metrics go beside them, to /v1/metrics (never /v1/traces/v1/metrics).
    assert received.paths.count("/v1/traces") == 1 and set(received.paths) == {"/v1/traces", "/v1/metrics"}
    out = capsys.readouterr().out
    assert out == f"replayed 1 event: 1 span exported to {received.url}/v1/traces\n"


def test_without_the_flag_the_opentelemetry_endpoint_variables_say_where(
    log: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No flag: $OTEL_EXPORTER_OTLP_ENDPOINT is a base (/v1/traces appended); the per-signal
    $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is used as is; neither: one line naming both ways."""
    with otlp_receiver() as received:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", received.url)
        assert main(["replay", str(log)]) == 0
        monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", received.url + "/custom/traces")
        assert main(["replay", str(log)]) == 0
    assert [p for p in received.paths if "traces" in p] == ["/v1/traces", "/custom/traces"]
    capsys.readouterr()
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    assert main(["replay", str(log)]) == 2
    assert capsys.readouterr().err == (
        "ckpt-events replay: error: no collector to replay to: pass --otlp-endpoint URL or set "
        "$OTEL_EXPORTER_OTLP_ENDPOINT\n"
    )


@pytest.mark.parametrize("endpoint", ["127.0.0.1:4318", "localhost:4318/v1/traces", "ftp://127.0.0.1:1"])
def test_an_endpoint_without_an_http_scheme_is_refused_as_demo_refuses_it(
    log: Path, capsys: pytest.CaptureFixture[str], endpoint: str
) -> None:
    """replay and demo share one check: no scheme is "not an http(s) URL", never "nothing
    answers" (what replay said, after trying to connect)."""
    for command in (["replay", str(log)], ["demo"]):
        with pytest.raises(SystemExit) as info:
            main([*command, "--otlp-endpoint", endpoint])
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert err == (
            f"ckpt-events {command[0]}: error: argument --otlp-endpoint: {endpoint!r} is not an "
            "http(s) URL, e.g. http://127.0.0.1:4318\n"
        )


def test_a_file_that_is_no_log_or_empty_fails_with_the_collector_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A non-log or an empty file exits 2 saying it holds no events (it exited 0 after "replayed
    0 events"), and nothing is sent."""
    readme = tmp_path / "README.md"
    readme.write_text("# a title\n\n" + "prose, not events\n" * 500)
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    with otlp_receiver() as received:
        for path in (readme, empty):
            assert main(["replay", str(path), "--otlp-endpoint", received.url]) == 2
            err = capsys.readouterr().err.splitlines()
            assert err[-1] == f"ckpt-events replay: error: {path} holds no checkpoint events (1 file read)"
            assert len(err) <= 2, err
    assert received.paths == []


def test_replay_to_an_unreachable_collector_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """replay to a port where nothing listens exits non-zero naming the endpoint."""
    from ckpt_events.participants.cli.fleet import free_port

    log = tmp_path / "log.jsonl"
    log.write_bytes(
        b'{"type":"coordinate_finished","kind":"controller","instance":"coordination","trace_id":1,'
        b'"span_id":2,"start_ns":1000000,"end_ns":5000000,"operation":"commit"}\n'
    )
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["replay", str(log), "--otlp-endpoint", url]) == 2
    err = capsys.readouterr().err
    assert url in err and "collector" in err and len(err.strip().splitlines()) == 1


@contextlib.contextmanager
def _answering(status: int, body: bytes = b"") -> Iterator[str]:
    """A plain HTTP server on 127.0.0.1 answering every POST with ``status`` and ``body`` (JSON);
    yields its base URL."""

    class Answers(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("content-length", "0")))
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    with serving(Answers) as server:
        yield f"http://127.0.0.1:{server.server_port}"


def test_replay_to_a_server_that_answers_404_says_so_in_one_line(
    log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A server that answers 404 (the wrong path or port): three lines, two of them the sinks'
    own warnings, and the last asked "is a collector listening there?" of a server that was.
    One line now, with the status and what to check."""
    with _answering(404) as url:
        assert main(["replay", str(log), "--otlp-endpoint", url]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"ckpt-events replay: error: 1 span could not be exported to {url}/v1/traces: it answered 404 "
        "(1 failed export); is that a collector's OTLP/HTTP base URL (e.g. http://127.0.0.1:4318)?"
    ], err


def test_replay_to_a_server_that_refuses_with_a_reason_or_redirects_says_it_in_one_line(
    log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 400 with the collector's Status says its reason, and a 308 (an http endpoint moved to
    https, say) asks about the URL: it said "see the collector's own log" of a redirect."""
    with _answering(400, b'{"code":3,"message":"invalid trace id"}') as url:
        assert main(["replay", str(log), "--otlp-endpoint", url]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.endswith(
        "it answered 400: 'invalid trace id' (1 failed export); is that a collector's OTLP/HTTP "
        "base URL (e.g. http://127.0.0.1:4318)?"
    ), line
    with _answering(308) as url:
        assert main(["replay", str(log), "--otlp-endpoint", url]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.endswith(
        "it answered 308 (1 failed export); is that a collector's OTLP/HTTP base URL (e.g. http://127.0.0.1:4318)?"
    ), line


def test_spans_rejected_in_a_200_are_an_error(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A 200 whose partial success rejects the span: replay said "replayed 1 event: 0 spans
    exported" and exited 0 (the sink's warning is quieted); now one line saying what the
    collector said, exit 2."""
    body = b'{"partialSuccess":{"rejectedSpans":"1","errorMessage":"span too old"}}'
    with _answering(200, body) as url:
        assert main(["replay", str(log), "--otlp-endpoint", url]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"ckpt-events replay: error: 1 of 1 span could not be exported to {url}/v1/traces: it "
        "rejected 1 span: 'span too old'; see the collector's own log"
    ], err


def test_a_rotated_file_alone_says_its_open_spans_were_cut_and_exports_none_as_left_open(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``replay env.jsonl.1`` alone (a real rotation; its commit ends in ``env.jsonl``): the commit
    was exported as "left open by a stopped process" (ERROR, truncated); now one line says it was
    cut and why, and nothing is exported as left open. With the newer file, nothing is cut."""
    import anyio

    from tests.sinks.jsonl.test_open_spans import write_a_rotation_with_a_commit_across_it

    log = tmp_path / "env.jsonl"
    anyio.run(write_a_rotation_with_a_commit_across_it, log)
    with otlp_receiver() as received:
        assert main(["replay", str(tmp_path / "env.jsonl.1"), "--otlp-endpoint", received.url]) == 0
        out = capsys.readouterr().out
        assert "left open" not in out, out
        assert (
            "1 span open at the end of env.jsonl.1 not exported: a rotated file whose newer file "
            "(env.jsonl) was not given, so where they end is not known (replay the files together "
            "to export them)\n"
        ) in out, out
        assert main(["replay", str(tmp_path), "--otlp-endpoint", received.url]) == 0
        out = capsys.readouterr().out
        assert "left open" not in out and "not exported" not in out, out


def test_dateext_rotations_are_known_and_grouped_with_their_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """logrotate's ``dateext`` (``delaycompress``: the older rotation gzipped): replayed alone, the
    newest rotation's open commit is cut (it was exported as "left open by a stopped process",
    a failure it never had), the newer file named without a made-up date; replayed with the other
    files, the commit ends in ``env.jsonl`` and nothing is cut or left open. Beside them, a log
    whose name only ends like a date (``other.jsonl-2026-notes``) is replayed as a log of its own."""
    import gzip

    import anyio

    from tests.sinks.jsonl.test_open_spans import write_a_rotation_with_a_commit_across_it

    log = tmp_path / "env.jsonl"
    anyio.run(write_a_rotation_with_a_commit_across_it, log)
    newest = (tmp_path / "env.jsonl.1").rename(tmp_path / "env.jsonl-20261203")
    older = tmp_path / "env.jsonl-20261202.gz"  # the first lines of the log, compressed a rotation ago
    older.write_bytes(gzip.compress(b"".join(newest.read_bytes().splitlines(keepends=True)[:2])))
    with otlp_receiver() as received:
        assert main(["replay", str(newest), "--otlp-endpoint", received.url]) == 0
        out = capsys.readouterr().out
        assert "left open" not in out, out
        assert (
            "1 span open at the end of env.jsonl-20261203 not exported: a rotated file whose newer "
            "file (a later rotation, or env.jsonl) was not given"
        ) in out, out
        assert main(["replay", str(tmp_path), "--otlp-endpoint", received.url]) == 0
        out = capsys.readouterr().out
        assert "left open" not in out and "not exported" not in out, out
        other = tmp_path / "other.jsonl-2026-notes"
        other.write_bytes(newest.read_bytes())
        assert main(["replay", str(other), "--otlp-endpoint", received.url]) == 0
        out = capsys.readouterr().out
        assert "1 span left open by a stopped process" in out and "not exported" not in out, out


def test_a_gzipped_rotated_file_is_read_and_known_as_rotated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``env.jsonl.1.gz`` (logrotate's ``compress``) replays as ``env.jsonl.1`` does: read (it was
    "not a ckpt-events JSON-lines log" and nothing replayed), its open commit cut rather than
    exported as left open, and with the newer file, nothing cut."""
    import gzip

    import anyio

    from tests.sinks.jsonl.test_open_spans import write_a_rotation_with_a_commit_across_it

    log = tmp_path / "env.jsonl"
    anyio.run(write_a_rotation_with_a_commit_across_it, log)
    rotated = tmp_path / "env.jsonl.1"
    (tmp_path / "env.jsonl.1.gz").write_bytes(gzip.compress(rotated.read_bytes()))
    with otlp_receiver() as received:
        assert main(["replay", str(rotated), "--otlp-endpoint", received.url]) == 0
        plain = capsys.readouterr().out
        rotated.unlink()
        assert main(["replay", str(tmp_path / "env.jsonl.1.gz"), "--otlp-endpoint", received.url]) == 0
        out = capsys.readouterr().out
        assert out.splitlines()[0] == plain.splitlines()[0], out
        assert "left open" not in out, out
        assert "1 span open at the end of env.jsonl.1.gz not exported" in out, out
        assert "(env.jsonl) was not given" in out, out
        assert main(["replay", str(tmp_path), "--otlp-endpoint", received.url]) == 0
        out = capsys.readouterr().out
        assert "left open" not in out and "not exported" not in out, out


def test_a_sink_that_raises_is_one_line_and_a_failure(
    log: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A span sink whose ``handle`` raises (the fault put in by hand; the collector is real): the
    bus's traceback was printed, then "replayed 1 event: 0 spans exported" and exit status 0;
    now one line naming the sink, what it raised and on how many events, exit 2."""
    from ckpt_events.sinks.otel import OtlpSpanSink

    def refuses(self: OtlpSpanSink, batch: list[object]) -> None:
        raise ValueError("cannot take\nthis batch")

    monkeypatch.setattr(OtlpSpanSink, "handle", refuses)
    with otlp_receiver() as received:
        assert main(["replay", str(log), "--otlp-endpoint", received.url]) == 2
    captured = capsys.readouterr()
    assert (captured.out, captured.err.splitlines()) == (
        "",
        [
            "ckpt-events replay: error: sink 'otel-spans' raised on 1 event of 1 replayed to it "
            "(ValueError: cannot take this batch): those may not have been exported"
        ],
    )


def test_a_sink_that_fails_to_close_is_one_line_and_a_failure(
    log: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A span sink whose ``aclose`` raises after its own close: one line from its
    ``close_error`` in the bus's stats, no traceback, exit 2."""
    from ckpt_events.sinks.otel import OtlpSpanSink

    closes = OtlpSpanSink.aclose

    async def closes_then_raises(self: OtlpSpanSink) -> None:
        await closes(self)
        raise OSError("flush to disk failed")

    monkeypatch.setattr(OtlpSpanSink, "aclose", closes_then_raises)
    with otlp_receiver() as received:
        assert main(["replay", str(log), "--otlp-endpoint", received.url]) == 2
    captured = capsys.readouterr()
    assert (captured.out, captured.err.splitlines()) == (
        "",
        [
            "ckpt-events replay: error: sink 'otel-spans' failed to close (OSError: flush to disk "
            "failed), so what it held may not have been exported"
        ],
    )


def test_a_log_read_faster_than_the_collector_takes_it_loses_no_span(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """60,000 finished spans, read far faster than a collector on 127.0.0.1 takes them: the
    span sink's queue (8,192) overflowed and 49,248 were dropped, said as "see the collector's own
    log" though it accepted every export. Each batch read now waits until the
    sink handed its spans over: all 60,000 exported."""
    count = 60_000
    line = (
        '{{"type":"coordinate_finished","kind":"controller","instance":"coordination","trace_id":{t},'
        '"span_id":{s},"start_ns":{a},"end_ns":{b},"operation":"commit"}}\n'
    )
    log = tmp_path / "long.jsonl"
    log.write_text(
        "".join(line.format(t=i + 1, s=i + 1, a=1_000_000 + i, b=5_000_000 + i) for i in range(count))
    )
    with otlp_receiver() as received:
        status = main(["replay", str(log), "--otlp-endpoint", received.url])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert f"replayed 60,000 events: 60,000 spans exported to {received.url}/v1/traces" in captured.out


def test_spans_the_queue_dropped_are_not_put_on_the_collector(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queue of one span (``OTEL_BSP_MAX_QUEUE_SIZE=1``) drops spans in this process: the
    error says so, not "see the collector's own log" (which accepted every export)."""
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "1")
    log = tmp_path / "two.jsonl"
    log.write_bytes(SPAN + SPAN.replace(b'"span_id":2', b'"span_id":3'))
    with otlp_receiver() as received:
        status = main(["replay", str(log), "--otlp-endpoint", received.url])
    (line,) = capsys.readouterr().err.splitlines()
    assert status != 0
    assert line.endswith(
        "1 of 2 spans could not be exported to "
        f"{received.url}/v1/traces: they were dropped here, before export (the collector accepted "
        "every export)"
    ), line


def test_the_export_process_variable_does_not_empty_the_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``CKPT_EVENTS_EXPORT_PROCESS=true`` in the environment: replay reads no ``CKPT_EVENTS_*``
    variable, so its sinks stay in process and the summary counts the spans that went out (in an
    export process it has no span sink to count: "0 spans exported" of spans exported)."""
    monkeypatch.setenv("CKPT_EVENTS_EXPORT_PROCESS", "true")
    log = tmp_path / "two.jsonl"
    log.write_bytes(SPAN + SPAN.replace(b'"span_id":2', b'"span_id":3'))
    with otlp_receiver() as received:
        status = main(["replay", str(log), "--otlp-endpoint", received.url])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert f"replayed 2 events: 2 spans exported to {received.url}/v1/traces" in captured.out
    assert "/v1/traces" in received.paths  # the two spans went out, as said


def test_a_collector_that_never_answers_is_waited_for_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listener that takes connections and never answers (export timeout 0.5 s): each 4,096
    events read waited the whole timeout for the span sink's flush, 40,000 events 5.7 s (at the
    default 10 s, 20,000 events 51 s), for the same one-line error. The first flush that does not
    end in time is the last waited for: about 1.6 s."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "500")
    line = (
        '{{"type":"coordinate_finished","kind":"controller","instance":"coordination","trace_id":{t},'
        '"span_id":{s},"start_ns":{a},"end_ns":{b},"operation":"commit"}}\n'
    )
    log = tmp_path / "long.jsonl"
    log.write_text(
        "".join(line.format(t=i + 1, s=i + 1, a=1_000_000 + i, b=5_000_000 + i) for i in range(40_000))
    )
    with socket.create_server(("127.0.0.1", 0)) as silent:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        status = main(["replay", str(log), "--otlp-endpoint", url])
        took = time.monotonic() - started
    (said,) = capsys.readouterr().err.splitlines()
    assert status == 2
    assert "40,000 spans could not be exported" in said and "got no answer" in said, said
    assert took < 3.5, took


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("OTEL_SDK_DISABLED", "true", "OTEL_SDK_DISABLED turns every export off; unset it for this command"),
        (
            "OTEL_TRACES_EXPORTER",
            "none",
            "OTEL_TRACES_EXPORTER='none' leaves out otlp; unset it for this command, or set it to otlp",
        ),
    ],
)
def test_a_variable_that_turns_traces_off_is_named_not_the_flag_given(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    variable: str,
    value: str,
    said: str,
) -> None:
    """``--otlp-endpoint`` given, traces turned off in the environment: the error said "pass
    --otlp-endpoint URL", the flag given; it names the variable, and nothing is sent."""
    monkeypatch.setenv(variable, value)
    log = tmp_path / "one.jsonl"
    log.write_bytes(SPAN)
    with otlp_receiver() as received:
        status = main(["replay", str(log), "--otlp-endpoint", received.url])
    (line,) = capsys.readouterr().err.splitlines()
    assert status == 2
    assert line == f"ckpt-events replay: error: no collector to replay to: {said}", line
    assert received.paths == []
