"""Chrome Trace Event JSON (what ui.perfetto.dev and chrome://tracing open) of a whole run.

Every finished span of every trace (each checkpoint, each restore, and any other) is a complete
event (``ph: "X"``, ``ts`` and ``dur`` in microseconds from the run's first instant) with its
fields and attributes as ``args``. One process per participant instance (``pid``; the controller
is pid 1), named by ``process_name`` metadata events (``ph: "M"``). Within a process, slices
of one thread must nest (Perfetto's JSON importer mis-nests the rest), so each worker's spans
are laid out on as few threads as nest them: ``main`` (``w<i>`` for worker ``i`` of a
multi-worker participant), then ``main 2``, ``main 3``... for spans that overlap without
nesting, each named by a ``thread_name`` event. A flow arrow (``ph: "s"`` on the controller's
call, ``ph: "f"`` with ``bp: "e"`` on the participant's operation, one shared ``id``) joins each
controller call span to the operation it caused. A participant's operation whose request waited in
its server before the operation began (``received_ns`` known and before its start, its duration
known) has the wait as a complete event of its own (``cat: "queued"``, named ``queued: <operation>``)
from the arrival to the start, on the operation's thread when nothing else of that thread begins
or ends within the wait, else on the first of its worker's threads where nothing does (a thread
``main 3``... of its own when none is free); an unknown arrival draws nothing, never a zero-length
slice. The flow arrow of a call lands on the wait (the request's arrival: ``bp: "e"`` binds it to
the slice that encloses it there), else on the operation. Each counted event (refusals by code, lease
expiries by phase, not-ready prepares and their blockers, cut generations by disposition,
stalls by operation) is a counter (``ph: "C"``) on its participant's process, its running
totals as ``args``. The file is strict JSON: a value JSON cannot hold (an attribute of NaN or
infinity) is written as the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ckpt_events import Event, GenerationCut, LeaseExpired, PrepareNotReady, Refused, Stalled
from ckpt_events.participants.cli.report.events import PointEvent, who_of
from ckpt_events.participants.cli.report.model import Span, finished_spans, trace_spans, waited
from ckpt_events.vocab import CountedEvent, Kind

__all__ = ["trace_events", "write_perfetto"]

_CONTROLLER_PID = 1
#: The counted events (``events.PointEvent``): each is a counter.
_POINTS = (LeaseExpired, PrepareNotReady, Refused, GenerationCut, Stalled)


def _track(s: Span) -> tuple[str, int | None]:
    """``kind/instance`` and the worker index (``None`` for a single-process participant).
    Taken from the span's worker, never parsed out of ``who``: an instance named ``x/w3`` (a
    log's instance is any text) was worker 3 of ``x``, and worker 0 of it a process of its own."""
    suffix = f"/w{s.worker}"
    if s.worker is None or not s.who.endswith(suffix):
        return s.who, None
    return s.who.removesuffix(suffix), s.worker


def _all_spans(events: Sequence[Event]) -> list[tuple[int, Span]]:
    """Every finished span with its trace id, traces in order of their first span."""
    # Grouped in one pass: each trace's spans were found by a pass over every event of the run
    # (213,000 lines of 3,000 checkpoints took 224 s, the rest of the report 5 s).
    traces: dict[int, list[Event]] = {}
    for e in finished_spans(events):
        traces.setdefault(e.trace_id, []).append(e)
    return [(trace, s) for trace, mine in traces.items() for s in trace_spans(mine, trace)]


def _lanes(spans: list[Span]) -> list[int]:
    """A lane per span (same order) such that the spans of one lane nest: first fit."""
    order = sorted(range(len(spans)), key=lambda i: (spans[i].start_ns, -spans[i].end_ns))
    open_ends: list[list[int]] = []  # per lane, the ends of its enclosing slices, innermost last
    out = [0] * len(spans)
    for i in order:
        s = spans[i]
        for lane, ends in enumerate(open_ends):
            while ends and ends[-1] <= s.start_ns:
                ends.pop()
            if not ends or s.end_ns <= ends[-1]:
                ends.append(s.end_ns)
                out[i] = lane
                break
        else:
            out[i] = len(open_ends)
            open_ends.append([s.end_ns])
    return out


def _waits(spans: list[tuple[int, Span]]) -> dict[int, tuple[int, int]]:
    """(arrival, start) by index into ``spans`` of each participant's operation that waited in its
    server before it began. Its arrival unknown (``received_ns`` absent), not before its start, or
    its duration unknown (its process's clock went back): no wait, never a zero-length one."""
    return {index: wait for index, (_, s) in enumerate(spans) if s.known and (wait := waited(s)) is not None}


def _json_value(value: Any) -> Any:
    """``value``, or its name for a float JSON cannot hold. ``json.dumps`` wrote NaN and Infinity
    bare, which JSON has no place for: a strict parser (the browser's, behind chrome://tracing)
    refused the whole file over one attribute, one a collector's file carries as ``"NaN"``."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


def _counted(e: Event) -> list[tuple[str, str, int]]:
    """(counter, series, increment) of a counted event; ``[]`` for any other event."""
    match e:
        case Refused(code=code):
            return [(CountedEvent.REFUSED.value, str(code), 1)]
        case LeaseExpired(phase=phase):
            return [(CountedEvent.LEASE_EXPIRED.value, str(phase), 1)]
        case PrepareNotReady(blockers=blockers):
            return [
                (CountedEvent.PREPARE_NOT_READY.value, "prepares", 1),
                (CountedEvent.PREPARE_NOT_READY.value, "blockers", blockers),
            ]
        case GenerationCut(disposition=disposition, calls=calls):
            return [(CountedEvent.GENERATION_CUT.value, str(disposition), calls)]
        case Stalled(operation=operation):
            return [(CountedEvent.STALLED.value, str(operation), 1)]
        case _:
            return []


def trace_events(events: Iterable[Event]) -> list[dict[str, Any]]:
    """The trace events, metadata first: ``[]`` when no span finished and nothing was counted."""
    events = list(events)
    spans = _all_spans(events)
    counted: list[tuple[PointEvent, list[tuple[str, str, int]]]] = [
        (e, c) for e in events if isinstance(e, _POINTS) and (c := _counted(e))
    ]
    waits = _waits(spans)
    instants = [s.start_ns for _, s in spans] + [e.time_ns for e, _ in counted]
    instants += [arrived for arrived, _ in waits.values()]
    if not instants:
        return []
    origin = min(instants)
    pids: dict[str, int] = {"controller": _CONTROLLER_PID}
    tids, wait_tids, threads = _threads(spans, waits, pids)
    out, placed = _complete_events(spans, origin, pids, tids)
    queued = _queued_events(spans, waits, origin, placed, wait_tids)
    flows = _flows(spans, placed, queued)
    # After the spans: a process that only counted gets the next pid.
    counters = _counters(counted, origin, pids)
    return _metadata(pids, threads) + out + list(queued.values()) + flows + counters


def _threads(
    spans: list[tuple[int, Span]], waits: Mapping[int, tuple[int, int]], pids: dict[str, int]
) -> tuple[dict[int, int], dict[int, int], list[tuple[int, int, str]]]:
    """Each span's tid (by its index in ``spans``), each wait's tid (by its operation's index) and
    every thread (pid, tid, name): each worker's spans on as few lanes as nest them, then each
    wait on a lane where it nests (``_lane_of_wait``). Gives each span's process a pid in ``pids``.
    The waits are laid out after the spans and a lane of waits alone takes a tid after every
    thread of its process: every span keeps the thread it has without them."""
    by_track: dict[tuple[int, int | None], list[int]] = {}  # (pid, worker) -> indexes into spans
    for index, (_, s) in enumerate(spans):
        process, worker = _track(s)
        by_track.setdefault((pids.setdefault(process, len(pids) + 1), worker), []).append(index)
    tids: dict[int, int] = {}  # index into spans -> tid
    threads: list[tuple[int, int, str]] = []
    next_tid: dict[int, int] = {}
    # (pid, base name, tid of each lane, endpoints of each lane's slices, indexes of its waits)
    tracks: list[tuple[int, str, list[int], list[list[int]], list[int]]] = []
    for (pid, worker), indexes in sorted(by_track.items(), key=lambda kv: (kv[0][0], kv[0][1] or -1)):
        base = "main" if worker is None else f"w{worker}"
        lanes = _lanes([spans[i][1] for i in indexes])
        first = next_tid.get(pid, 0)
        next_tid[pid] = first + max(lanes) + 1
        threads += [(pid, first + n, base if n == 0 else f"{base} {n + 1}") for n in range(max(lanes) + 1)]
        points: list[list[int]] = [[] for _ in range(max(lanes) + 1)]
        for i, lane in zip(indexes, lanes, strict=True):
            tids[i] = first + lane
            points[lane] += (spans[i][1].start_ns, spans[i][1].end_ns)
        for lane_points in points:
            lane_points.sort()
        track_tids = [first + n for n in range(max(lanes) + 1)]
        tracks.append((pid, base, track_tids, points, [i for i in indexes if i in waits]))
    wait_tids: dict[int, int] = {}  # index of the operation in spans -> its wait's tid
    for pid, base, track_tids, points, waiting in tracks:
        for i in waiting:
            lane = _lane_of_wait(waits[i], track_tids.index(tids[i]), points)
            if lane == len(points):
                points.append([])
                track_tids.append(next_tid[pid])
                threads.append((pid, next_tid[pid], f"{base} {lane + 1}"))
                next_tid[pid] += 1
            bisect.insort(points[lane], waits[i][0])
            bisect.insort(points[lane], waits[i][1])
            wait_tids[i] = track_tids[lane]
    return tids, wait_tids, threads


def _lane_of_wait(wait: tuple[int, int], own: int, points: list[list[int]]) -> int:
    """The lane for a wait (arrival, start): its operation's lane (``own``) when no slice of it
    begins or ends strictly within the wait, else the first such lane, else a new one
    (``len(points)``). Every slice of such a lane is then apart from the wait or encloses it, so
    the lane still nests; its operation begins where it ends. Two searches per lane tried."""
    arrived, started = wait
    candidates: list[int] = [own, *range(len(points))]
    for lane in candidates:
        endpoints = points[lane]
        if bisect.bisect_right(endpoints, arrived) == bisect.bisect_left(endpoints, started):
            return lane
    return len(points)


def _complete_events(
    spans: list[tuple[int, Span]], origin: int, pids: Mapping[str, int], tids: Mapping[int, int]
) -> tuple[list[dict[str, Any]], dict[tuple[int, int], dict[str, Any]]]:
    """One complete event (``ph: "X"``) per span, in order, and each by (trace id, span id)."""
    out: list[dict[str, Any]] = []
    placed: dict[tuple[int, int], dict[str, Any]] = {}
    for index, (trace, s) in enumerate(spans):
        event = {
            "name": s.short,
            "cat": "controller" if not s.participant else "participant",
            "ph": "X",
            "ts": (s.start_ns - origin) / 1e3,
            "dur": max(0.0, (s.end_ns - s.start_ns) / 1e3),
            "pid": pids[_track(s)[0]],
            "tid": tids[index],
            "args": {"who": s.who, **{k: _json_value(v) for k, v in s.details.items()}},
        }
        out.append(event)
        placed[(trace, s.span_id)] = event
    return out, placed


def _queued_events(
    spans: list[tuple[int, Span]],
    waits: Mapping[int, tuple[int, int]],
    origin: int,
    placed: Mapping[tuple[int, int], dict[str, Any]],
    wait_tids: Mapping[int, int],
) -> dict[tuple[int, int], dict[str, Any]]:
    """A complete event (``cat: "queued"``) per wait, in its operation's order, by the operation's
    (trace id, span id): from the request's arrival to the operation's start, by that process's
    clock, on the operation's process."""
    out: dict[tuple[int, int], dict[str, Any]] = {}
    for index, (arrived, started) in waits.items():
        trace, s = spans[index]
        operation = placed[(trace, s.span_id)]
        out[(trace, s.span_id)] = {
            "name": f"queued: {s.short}",
            "cat": "queued",
            "ph": "X",
            "ts": (arrived - origin) / 1e3,
            "dur": (started - arrived) / 1e3,
            "pid": operation["pid"],
            "tid": wait_tids[index],
            "args": {
                "who": s.who,
                "trace_id": operation["args"].get("trace_id"),
                "operation_span_id": operation["args"].get("span_id"),
                "received_ns": arrived,
                "start_ns": started,
                "queued_ms": round((started - arrived) / 1e6, 3),
            },
        }
    return out


def _flows(
    spans: list[tuple[int, Span]],
    placed: Mapping[tuple[int, int], dict[str, Any]],
    queued: Mapping[tuple[int, int], dict[str, Any]],
) -> list[dict[str, Any]]:
    """A flow arrow (``s`` then ``f``) from each controller call to the operation it caused: to
    its wait when it waited, where the request arrived (the arrow is the request's transit)."""
    flows: list[dict[str, Any]] = []
    for trace, s in spans:
        parent = placed.get((trace, s.parent_span_id or -1))
        if not s.participant or parent is None or parent["cat"] != "controller":
            continue
        child = placed[(trace, s.span_id)]
        lands = queued.get((trace, s.span_id), child)
        flow_id = len(flows) // 2 + 1
        common = {"name": f"{parent['name']} -> {child['name']}", "cat": "call", "id": flow_id}
        flows.append({**common, "ph": "s", "ts": parent["ts"], "pid": parent["pid"], "tid": parent["tid"]})
        flows.append(
            {**common, "ph": "f", "bp": "e", "ts": lands["ts"], "pid": lands["pid"], "tid": lands["tid"]}
        )
    return flows


def _counters(
    counted: list[tuple[PointEvent, list[tuple[str, str, int]]]], origin: int, pids: dict[str, int]
) -> list[dict[str, Any]]:
    """A counter event (``ph: "C"``) per counted event and counter, its running totals as args, in
    time order; a process not yet in ``pids`` gets the next pid."""
    counters: list[dict[str, Any]] = []
    totals: dict[tuple[int, str], dict[str, int]] = {}
    for e, increments in sorted(counted, key=lambda ec: ec[0].time_ns):
        who = "controller" if e.kind == Kind.CONTROLLER else who_of(e.kind, e.instance, None)
        pid = pids.setdefault(who, len(pids) + 1)
        for name, series, increment in increments:
            running = totals.setdefault((pid, name), {})
            running[series] = running.get(series, 0) + increment
        ts = (e.time_ns - origin) / 1e3
        for name in dict.fromkeys(name for name, _, _ in increments):
            running_totals = dict(totals[(pid, name)])
            counters.append({"name": name, "ph": "C", "ts": ts, "pid": pid, "tid": 0, "args": running_totals})
    return counters


def _metadata(pids: Mapping[str, int], threads: list[tuple[int, int, str]]) -> list[dict[str, Any]]:
    """The processes' names and sort order, then the threads' names (``ph: "M"``)."""
    metadata: list[dict[str, Any]] = []
    for process, pid in pids.items():
        for name, args in (("process_name", {"name": process}), ("process_sort_index", {"sort_index": pid})):
            metadata.append({"name": name, "ph": "M", "pid": pid, "tid": 0, "args": args})
    for pid, tid, name in threads:
        metadata.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}})
    return metadata


def write_perfetto(path: Path, events: Sequence[Event]) -> int:
    """Write ``{"traceEvents": [...], "displayTimeUnit": "ms"}``; the number of spans written (the
    complete events other than waits)."""
    rows = trace_events(events)
    path.write_text(json.dumps({"traceEvents": rows, "displayTimeUnit": "ms"}, default=str))
    return sum(1 for r in rows if r["ph"] == "X" and r["cat"] != "queued")
