"""``--report X.perfetto.json``: Chrome Trace Event JSON from a real demo run's log, and ``--report``
refusing what it cannot write in one line before any work."""

from __future__ import annotations

import io
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from ckpt_events import (
    CollectionFinished,
    CoordinateFinished,
    GenerationCut,
    OperationFinished,
    PrepareNotReady,
    Refused,
)
from ckpt_events.participants.cli.demo.runner import DemoOptions, run_demo
from ckpt_events.participants.cli.main import main
from ckpt_events.participants.cli.report.model import finished_spans
from ckpt_events.participants.cli.report.perfetto import trace_events
from ckpt_events.sinks.jsonl import CorruptLine, read_events
from ckpt_events.vocab import CollectionAction, Disposition, ErrorCode, Kind, Operation

MS = 1_000_000


@pytest.mark.e2e
async def test_a_demo_runs_perfetto_trace_has_what_perfetto_needs(tmp_path: Path) -> None:
    """Every finished span is one complete event on its instance's track; every track is named; every
    flow starts on a controller call span and ends on a participant span with the same id."""
    log, trace = tmp_path / "demo.jsonl", tmp_path / "run.perfetto.json"
    options = DemoOptions(rollouts=5, steps=2, concurrency=4, jsonl=log, report=trace, workdir=tmp_path)
    out = io.StringIO()
    await run_demo(options, Console(file=out, width=170))
    assert "Chrome Trace Event JSON" in out.getvalue()
    events = [e for _, e in read_events(log) if not isinstance(e, CorruptLine)]
    rows = json.loads(trace.read_text())["traceEvents"]
    complete = [r for r in rows if r["ph"] == "X" and r["cat"] != "queued"]
    assert len(complete) == len(finished_spans(events)) > 0
    waits = _waits_match_their_operations(rows, complete)
    for r in complete:
        assert isinstance(r["ts"], float) and r["ts"] >= 0 and r["dur"] >= 0
        assert isinstance(r["pid"], int) and isinstance(r["tid"], int) and r["name"]
        assert "trace_id" in r["args"] and "duration_ms" in r["args"]
        assert abs(r["dur"] / 1e3 - r["args"]["duration_ms"]) < 0.01
    names = {r["pid"]: r["args"]["name"] for r in rows if r["ph"] == "M" and r["name"] == "process_name"}
    threads = {(r["pid"], r["tid"]) for r in rows if r["ph"] == "M" and r["name"] == "thread_name"}
    assert {(r["pid"], r["tid"]) for r in complete} <= threads and {p for p, _ in threads} <= set(names)
    spans = finished_spans(events)
    instances = {f"{e.kind}/{e.instance}" for e in spans if e.kind != Kind.CONTROLLER}
    assert set(names.values()) == {"controller"} | instances and len(instances) >= 3
    for r in complete:
        assert names[r["pid"]] == r["args"]["who"].rsplit("/w", 1)[0]
    starts = {r["id"]: r for r in rows if r["ph"] == "s"}
    ends = {r["id"]: r for r in rows if r["ph"] == "f"}
    assert starts and set(starts) == set(ends)
    assert len(starts) == sum(1 for r in rows if r["ph"] == "s")  # ids are unique

    def at(flow: dict[str, Any]) -> list[dict[str, Any]]:
        """The slices where ``flow`` is: a wait stands for its operation (the request arrived)."""
        place = (flow["pid"], flow["tid"], flow["ts"])
        return [
            waits.get(id(r), r) for r in rows if r["ph"] == "X" and (r["pid"], r["tid"], r["ts"]) == place
        ]

    for flow_id, start in starts.items():
        end = ends[flow_id]
        assert end["bp"] == "e" and start["ts"] <= end["ts"]
        (callee,) = at(end)
        assert names[callee["pid"]] != "controller" and names[start["pid"]] == "controller"
        callers = [r["args"]["span_id"] for r in at(start)]
        assert callee["args"]["parent_span_id"] in callers


def test_report_refuses_what_it_cannot_write_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unknown extension, none, or a folder: one line naming the path and the formats, exit 2,
    nothing written (report never reads its log; demo never starts)."""
    log = tmp_path / "log.jsonl"
    log.write_bytes(
        b'{"type":"operation_finished","kind":"model","instance":"m0","trace_id":1,"span_id":2,'
        b'"start_ns":1000000,"end_ns":5000000,"operation":"commit","records":3}\n'
    )
    (tmp_path / "folder").mkdir()
    for bad in ("r.pdf", "r.txt", "report", "r.json", "folder"):
        for argv in (["report", str(log)], ["demo", "--rollouts", "1"]):
            assert main([*argv, "--report", str(tmp_path / bad)]) == 2, (argv, bad)
            captured = capsys.readouterr()
            err = captured.err.strip()
            assert len(err.splitlines()) == 1 and "Traceback" not in err and bad in err, (argv, err)
            assert ".perfetto.json" in err and captured.out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "log.jsonl"]
    assert main(["report", str(log), "--report", str(tmp_path / "R.Perfetto.JSON")]) == 0
    rows = json.loads((tmp_path / "R.Perfetto.JSON").read_text())["traceEvents"]
    assert [r["ph"] for r in rows if r["ph"] != "M"] == ["X"]


def _unwritable_folder(tmp_path: Path) -> Path:
    """A folder that exists and cannot be written: read-only for a user, ``/proc`` for root
    (whom modes do not stop)."""
    if os.geteuid() != 0:
        folder = tmp_path / "read-only"
        folder.mkdir(mode=0o500)
        return folder
    if not Path("/proc/self").is_dir():
        pytest.skip("running as root without /proc: no folder root cannot write")
    return Path("/proc")


def test_report_and_jsonl_paths_that_cannot_be_written_are_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A --report or --jsonl in a folder we may not write is one line and exit 2 before the work
    (the demo ran whole, then ended in a PermissionError traceback)."""
    log = tmp_path / "log.jsonl"
    log.write_bytes(
        b'{"type":"operation_finished","kind":"model","instance":"m0","trace_id":1,"span_id":2,'
        b'"start_ns":1000000,"end_ns":5000000,"operation":"commit","records":3}\n'
    )
    bad = _unwritable_folder(tmp_path) / "ckpt-events-report.html"
    workdir = tmp_path / "work"
    for argv in (
        ["report", str(log), "--report", str(bad)],
        ["demo", "--rollouts", "1", "--workdir", str(workdir), "--report", str(bad)],
    ):
        assert main(argv) == 2, argv
        captured = capsys.readouterr()
        (line,) = captured.err.splitlines()
        assert line.startswith(f"ckpt-events {argv[0]}: error: cannot write {str(bad)!r}: "), line
        assert captured.out == ""
    with pytest.raises(SystemExit) as info:
        main(
            ["demo", "--rollouts", "1", "--workdir", str(workdir), "--jsonl", str(bad.with_suffix(".jsonl"))]
        )
    assert info.value.code == 2
    assert f"cannot write {str(bad.with_suffix('.jsonl'))!r}" in capsys.readouterr().err
    assert not workdir.exists()  # the demo never started


def _waits_match_their_operations(
    rows: list[dict[str, Any]], spans: list[dict[str, Any]]
) -> dict[int, dict[str, Any]]:
    """Each wait (``cat: "queued"``) ends where its operation (by span id) begins, on its
    process, as long as the log's ``received_ns`` to ``start_ns``: the operation by ``id()`` of
    the wait's row."""
    by_id = {(r["args"]["trace_id"], r["args"].get("span_id")): r for r in spans}
    out: dict[int, dict[str, Any]] = {}
    for wait in (r for r in rows if r["ph"] == "X" and r["cat"] == "queued"):
        op = by_id[(wait["args"]["trace_id"], wait["args"]["operation_span_id"])]
        assert wait["pid"] == op["pid"] and wait["dur"] > 0
        assert wait["dur"] == (op["args"]["start_ns"] - op["args"]["received_ns"]) / 1e3
        assert wait["ts"] + wait["dur"] == pytest.approx(op["ts"], abs=1e-3)
        out[id(wait)] = op
    return out


def _nested(rows: list[dict[str, Any]]) -> None:
    """On every thread, complete events nest (Perfetto's JSON importer mis-nests the rest)."""
    threads: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for r in rows:
        if r["ph"] == "X":
            threads.setdefault((r["pid"], r["tid"]), []).append(r)
    for slices in threads.values():
        open_ends: list[float] = []
        for r in sorted(slices, key=lambda r: (r["ts"], -r["dur"])):
            while open_ends and open_ends[-1] <= r["ts"] + 1e-3:
                open_ends.pop()
            assert not open_ends or r["ts"] + r["dur"] <= open_ends[-1] + 1e-3, r
            open_ends.append(r["ts"] + r["dur"])


def test_overlapping_spans_get_their_own_thread_and_counted_events_are_counters() -> None:
    """A renew overlapping the commit on the controller, two checkpoints' traces: every span is
    a slice on a named thread where slices nest, and refusals, cuts and not-ready prepares are
    counters with running totals on their participant's process."""
    events: list[Any] = []
    for trace, at in ((1, 0), (2, 1000)):
        events += [
            CollectionFinished(
                Kind.CONTROLLER, "c", trace, 1, at * MS, (at + 135) * MS, CollectionAction.CHECKPOINT, "k"
            ),
            CoordinateFinished(
                Kind.CONTROLLER, "c", trace, 2, (at + 100) * MS, (at + 130) * MS, Operation.COMMIT, "k", 1
            ),
            CoordinateFinished(
                Kind.CONTROLLER, "c", trace, 3, (at + 95) * MS, (at + 120) * MS, Operation.RENEW, "k", 1
            ),
            OperationFinished(
                Kind.MODEL, "model-0", trace, 4, (at + 101) * MS, (at + 129) * MS, Operation.COMMIT, "k", 2
            ),
            OperationFinished(
                Kind.MODEL, "model-0", trace, 5, (at + 96) * MS, (at + 119) * MS, Operation.RENEW, "k", 3
            ),
        ]
    events += [
        Refused(Kind.MODEL, "model-0", 10 * MS, ErrorCode.STALE_ATTEMPT),
        Refused(Kind.MODEL, "model-0", 20 * MS, ErrorCode.STALE_ATTEMPT),
        GenerationCut(Kind.MODEL, "model-0", 30 * MS, Disposition.DURABLE_PREFIX, 3),
        PrepareNotReady(Kind.ENVIRONMENT, "environment-0", 40 * MS, 2),
    ]
    rows = trace_events(events)
    complete = [r for r in rows if r["ph"] == "X"]
    assert len(complete) == len(finished_spans(events)) == 10
    _nested(rows)
    names = {(r["pid"], r["tid"]): r["args"]["name"] for r in rows if r["name"] == "thread_name"}
    assert {(r["pid"], r["tid"]) for r in complete} <= set(names)
    assert sorted(set(names.values())) == ["main", "main 2"]
    processes = {r["args"]["name"]: r["pid"] for r in rows if r["name"] == "process_name"}
    counters = [(r["name"], r["pid"], r["args"]) for r in rows if r["ph"] == "C"]
    model, environment = processes["model/model-0"], processes["environment/environment-0"]
    assert counters == [
        ("refused", model, {"stale_attempt": 1}),
        ("refused", model, {"stale_attempt": 2}),
        ("generation_cut", model, {"durable_prefix": 3}),
        ("prepare_not_ready", environment, {"prepares": 1, "blockers": 2}),
    ]
    assert all(r["ts"] >= 0 for r in rows if "ts" in r)


def _traces(count: int) -> list[Any]:
    """``count`` one-checkpoint traces, one after another: a collection, a commit, an operation."""
    events: list[Any] = []
    for trace in range(1, count + 1):
        at = trace * 1000
        events += [
            CollectionFinished(
                Kind.CONTROLLER, "c", trace, 1, at * MS, (at + 135) * MS, CollectionAction.CHECKPOINT, "k"
            ),
            CoordinateFinished(
                Kind.CONTROLLER, "c", trace, 2, (at + 100) * MS, (at + 130) * MS, Operation.COMMIT, "k", 1
            ),
            OperationFinished(
                Kind.MODEL, "model-0", trace, 4, (at + 101) * MS, (at + 129) * MS, Operation.COMMIT, "k", 2
            ),
        ]
    return events


def test_a_run_of_many_traces_is_laid_out_in_time_linear_in_its_events() -> None:
    """Each trace's spans were found by a pass over every event of the run: 213,000 lines of
    3,000 checkpoints took 224 s (the rest of the report 5 s). Eight times the traces take about
    eight times as long (best of three, against a quadratic 64)."""
    import time

    def best(events: list[Any]) -> float:
        times = []
        for _ in range(3):
            start = time.perf_counter()
            rows = trace_events(events)
            times.append(time.perf_counter() - start)
        assert sum(r["ph"] == "X" for r in rows) == len(events)
        return min(times)

    small, large = best(_traces(150)), best(_traces(1200))
    assert large < 24 * small, (small, large)


@pytest.mark.slow
async def test_report_of_a_stall_run_exports_every_span_of_every_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``demo --checkpoints 3 --fault stall --jsonl``, then ``report LOG --report X.perfetto.json``:
    every finished span of the log (three checkpoints and a restore), not the aborted one's
    only (it held 10 of 112), on nesting threads, with the not-ready prepare as a counter."""
    log, trace = tmp_path / "run.jsonl", tmp_path / "run.perfetto.json"
    options = DemoOptions(
        rollouts=40, concurrency=4, checkpoints=3, fault="stall", jsonl=log, workdir=tmp_path
    )
    await run_demo(options, Console(file=io.StringIO(), width=170))
    events = [e for _, e in read_events(log) if not isinstance(e, CorruptLine)]
    spans = finished_spans(events)
    capsys.readouterr()
    assert main(["report", str(log), "--report", str(trace)]) == 0
    assert f"{len(spans)} spans of the whole run" in capsys.readouterr().out
    rows = json.loads(trace.read_text())["traceEvents"]
    complete = [r for r in rows if r["ph"] == "X" and r["cat"] != "queued"]
    assert len(complete) == len(spans)
    waits = _waits_match_their_operations(rows, complete)
    waited = [
        e for e in spans if isinstance(e, OperationFinished) and (e.received_ns or e.start_ns) < e.start_ns
    ]
    assert len(waits) == len(waited) > 0
    assert len({r["args"]["trace_id"] for r in complete}) == len({e.trace_id for e in spans}) >= 4
    _nested(rows)
    assert any(r["ph"] == "C" and r["name"] == "prepare_not_ready" for r in rows)


def _strict_json(text: str) -> Any:
    """``text`` parsed as JSON is written (RFC 8259): no bare NaN or Infinity, which Python's
    parser takes and a browser's refuses."""

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_a_nan_or_infinite_attribute_from_a_collectors_file_leaves_the_trace_strict_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A span attribute of NaN (a loss) went through a collector's file as ``"NaN"`` and came
    back out bare, ``"loss": NaN``: not JSON, so the whole trace failed to open. Each such value
    is now written as its name, and the trace is strict JSON."""
    from tests.participants.cli.report.test_otlp_input import _export_as_collector_file

    at = 1_796_400_000 * 10**9
    attributes = {"loss": math.nan, "gain": math.inf, "floor": -math.inf, "lr": 0.5}
    events = [
        CollectionFinished(Kind.CONTROLLER, "c", 7, 1, at, at + 135 * MS, CollectionAction.CHECKPOINT, "k"),
        CoordinateFinished(Kind.CONTROLLER, "c", 7, 2, at + MS, at + 130 * MS, Operation.COMMIT, "k", 1),
        OperationFinished(
            Kind.MODEL, "m", 7, 4, at + 2 * MS, at + 9 * MS, Operation.COMMIT, "k", 2, attributes=attributes
        ),
    ]
    collected, trace = tmp_path / "collector.json", tmp_path / "run.perfetto.json"
    assert _export_as_collector_file(events, collected) >= 1
    assert main(["report", str(collected), "--report", str(trace)]) == 0
    assert "3 spans of the whole run" in capsys.readouterr().out
    rows = _strict_json(trace.read_text())["traceEvents"]
    (commit,) = [r["args"] for r in rows if r["ph"] == "X" and r["args"].get("kind") == "model"]
    values = [commit[name] for name in attributes]
    assert values == ["NaN", "Infinity", "-Infinity", 0.5]


def test_each_instance_is_its_own_process_whatever_its_name_and_each_worker_its_own_thread() -> None:
    """A log's instance is any text. The process and worker were parsed out of ``who``: the
    spans of an instance named ``x/w3`` were drawn as worker 3 of instance ``x``, and worker 0
    of ``y/w3`` as a process named ``model/y/w3/w0`` with one ``main`` thread."""
    events = [
        OperationFinished(Kind.MODEL, "x", 1, 1, 0, 10 * MS, Operation.COMMIT, "k", worker=3),
        OperationFinished(Kind.MODEL, "x/w3", 1, 2, 0, 10 * MS, Operation.COMMIT, "k"),
        OperationFinished(Kind.MODEL, "y/w3", 1, 3, 0, 10 * MS, Operation.COMMIT, "k", worker=0),
        Refused(Kind.MODEL, "x/w3", 5 * MS, ErrorCode.STALE_ATTEMPT),
    ]
    rows = trace_events(events)
    processes = {r["pid"]: r["args"]["name"] for r in rows if r["name"] == "process_name"}
    threads = {(r["pid"], r["tid"]): r["args"]["name"] for r in rows if r["name"] == "thread_name"}
    drawn = {
        (r["args"]["instance"], processes[r["pid"]], threads[(r["pid"], r["tid"])])
        for r in rows
        if r["ph"] == "X"
    }
    assert drawn == {
        ("x", "model/x", "w3"),
        ("x/w3", "model/x/w3", "main"),
        ("y/w3", "model/y/w3", "w0"),
    }
    (counter,) = [r for r in rows if r["ph"] == "C"]
    assert processes[counter["pid"]] == "model/x/w3"
