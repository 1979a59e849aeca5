"""``--report X.perfetto.json`` draws the time a request waited in a participant before its
operation began (``received_ns`` to start) as a ``queued`` slice: the terminal and HTML reports
shaded it, the Perfetto file drew only the spans, so a restore held minutes by a slow middleware
looked as if it began at once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckpt_events import CoordinateFinished, OperationFinished, StepFinished
from ckpt_events.participants.cli.main import main
from ckpt_events.participants.cli.report.perfetto import trace_events
from ckpt_events.sinks import read_events
from ckpt_events.vocab import Kind, Operation
from tests.participants.cli.report.own_server import CALLER
from tests.participants.cli.report.test_own_server_queued import _HELD, _serve
from tests.participants.cli.report.test_perfetto import _nested, _strict_json

MS = 1_000_000


@pytest.mark.parametrize("headers", [{}, {"traceparent": CALLER}], ids=["root", "caller-not-in-logs"])
def test_a_request_held_by_a_slow_middleware_shows_its_wait_in_the_perfetto_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], headers: dict[str, str]
) -> None:
    """A real FastAPI app, its restore held 100 ms by a middleware: the file drew the restore
    and its step only, starting at 0, as if the request never waited. It now holds a
    ``queued: restore`` slice from the arrival to the restore's start, exactly the log's figures,
    on the restore's own thread, and every span as before."""
    log, trace = tmp_path / "events.jsonl", tmp_path / "run.perfetto.json"
    anyio.run(_serve, log, headers)
    (restore,) = [e for _, e in read_events(log) if isinstance(e, OperationFinished)]
    assert restore.received_ns is not None and restore.start_ns - restore.received_ns >= _HELD * 1e9
    assert main(["report", str(log), "--report", str(trace)]) == 0
    assert "2 spans of the whole run" in capsys.readouterr().out
    rows = _strict_json(trace.read_text())["traceEvents"]
    complete = [r for r in rows if r["ph"] == "X"]
    (wait,) = [r for r in complete if r["cat"] == "queued"]
    (op,) = [r for r in complete if r["name"] == "restore"]
    assert [r["name"] for r in complete if r["cat"] != "queued"] == ["restore", "read"]
    # The arrival is the run's first instant; the wait ends where the restore begins.
    assert wait["name"] == "queued: restore" and wait["ts"] == 0.0
    assert wait["dur"] == (restore.start_ns - restore.received_ns) / 1e3
    assert op["ts"] == (restore.start_ns - restore.received_ns) / 1e3
    assert (wait["pid"], wait["tid"]) == (op["pid"], op["tid"])
    assert wait["args"]["received_ns"] == restore.received_ns
    assert wait["args"]["start_ns"] == restore.start_ns
    assert wait["args"]["operation_span_id"] == op["args"]["span_id"]
    assert wait["args"]["queued_ms"] == round((restore.start_ns - restore.received_ns) / 1e6, 3)
    _nested(rows)


def _called(received_ns: int | None, start: int = 20 * MS, end: int = 30 * MS) -> list[Any]:
    """A controller's prepare (span 2) calling a model's prepare (span 4) begun at ``start``."""
    return [
        CoordinateFinished(Kind.CONTROLLER, "c", 1, 2, 0, 40 * MS, Operation.PREPARE, "k", None),
        OperationFinished(
            Kind.MODEL, "m", 1, 4, start, end, Operation.PREPARE, "k", 2, received_ns=received_ns
        ),
    ]


def test_the_call_arrow_lands_where_the_request_arrived() -> None:
    """The flow from the controller's call landed on the operation's start, 15 ms after its
    request arrived; it now lands on the wait (``bp: "e"``: bound to the slice enclosing it)."""
    rows = trace_events(_called(5 * MS))
    (wait,) = [r for r in rows if r.get("cat") == "queued"]
    assert (wait["ts"], wait["dur"]) == (5_000.0, 15_000.0)
    (start,) = [r for r in rows if r["ph"] == "s"]
    (end,) = [r for r in rows if r["ph"] == "f"]
    assert start["ts"] == 0.0 and end["bp"] == "e"
    assert (end["ts"], end["pid"], end["tid"]) == (wait["ts"], wait["pid"], wait["tid"])


@pytest.mark.parametrize(
    ("received_ns", "end"),
    [(None, 30 * MS), (20 * MS, 30 * MS), (25 * MS, 30 * MS), (5 * MS, 10 * MS)],
    ids=["arrival-unknown", "no-wait", "arrival-after-start", "clock-went-back"],
)
def test_no_known_wait_draws_nothing(received_ns: int | None, end: int) -> None:
    """An unknown arrival, one at the start or after it, or an operation of unknown duration
    (its clock went back: ended before it began) draws no wait, never a zero-length one, and
    the arrow lands on the operation as before."""
    rows = trace_events(_called(received_ns, end=end))
    assert [r["cat"] for r in rows if r["ph"] == "X"] == ["controller", "participant"]
    (op,) = [r for r in rows if r.get("cat") == "participant"]
    (arrow,) = [r for r in rows if r["ph"] == "f"]
    assert (arrow["ts"], arrow["tid"]) == (op["ts"], op["tid"])


_interval = st.tuples(st.integers(0, 60), st.integers(0, 30), st.integers(0, 30))


@settings(max_examples=120, deadline=None)
@given(
    st.lists(
        st.tuples(_interval, st.sampled_from([None, 0, 1]), st.booleans(), st.integers(0, 12)),
        min_size=1,
        max_size=14,
    )
)
def test_every_threads_slices_nest_with_the_waits_and_every_span_keeps_its_thread(
    operations: list[tuple[tuple[int, int, int], int | None, bool, int]],
) -> None:
    """Random operations of one participant (some on two workers), overlapping, with steps and
    waits: on every thread the slices nest, each wait is a slice from its arrival to its
    operation's start, shares its operation's thread unless a slice of it begins or ends within
    the wait, and every span sits where it sits with no wait in the file."""
    events: list[Any] = []
    for n, ((wait, start, length), worker, stepped, step) in enumerate(operations):
        span = 10 + 2 * n
        begin = (start + wait) * MS
        received = start * MS if wait else None
        end = begin + length * MS
        op = OperationFinished(
            Kind.MODEL, "m", 1, span, begin, end, Operation.COMMIT, "k", received_ns=received, worker=worker
        )
        events.append(op)
        if stepped and step <= length:
            events.append(
                StepFinished(Kind.MODEL, "m", 1, span + 1, begin, begin + step * MS, "write", "k", span)
            )
    rows = trace_events(events)
    _nested(rows)
    _strict_json(json.dumps(rows))
    spans = [r for r in rows if r["ph"] == "X" and r["cat"] != "queued"]
    without = [r for r in trace_events([_unknown_arrival(e) for e in events]) if r["ph"] == "X"]
    # The same slices on the same threads; the times from an origin that an arrival may precede.
    assert _placed(spans) == _placed(without)
    waits = {r["args"]["operation_span_id"]: r for r in rows if r.get("cat") == "queued"}
    expected = {e.span_id for e in events if isinstance(e, OperationFinished) and e.received_ns is not None}
    assert {int(k, 16) for k in waits} == expected
    for key, wait in waits.items():
        (op,) = [r for r in spans if r["args"]["span_id"] == key]
        assert wait["ts"] + wait["dur"] == pytest.approx(op["ts"]) and wait["dur"] > 0
        assert wait["pid"] == op["pid"]
        inside = [
            r
            for r in [*spans, *waits.values()]
            if (r["pid"], r["tid"]) == (op["pid"], op["tid"])
            and any(wait["ts"] < t < op["ts"] for t in (r["ts"], r["ts"] + r["dur"]))
        ]
        assert inside or wait["tid"] == op["tid"], (wait, op)


def _placed(slices: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Each slice's span, thread, duration and start after the first slice's start."""
    first = slices[0]["ts"]
    return [(r["args"]["span_id"], r["pid"], r["tid"], r["dur"], round(r["ts"] - first, 3)) for r in slices]


def _unknown_arrival(e: Any) -> Any:
    """``e`` with its arrival unknown (an operation's), else ``e``."""
    return msgspec.structs.replace(e, received_ns=None) if isinstance(e, OperationFinished) else e
