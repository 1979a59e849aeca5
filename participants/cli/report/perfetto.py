"""Chrome Trace Event JSON (what ui.perfetto.dev and chrome://tracing open) from the report's spans.

One process track per participant instance (``pid``; the controller is pid 1), one thread per
worker of a multi-worker participant (``tid``: 0 for a single-process participant, ``1 + i``
for worker ``w<i>``), named by ``process_name`` / ``thread_name`` metadata events (``ph: "M"``).
Every finished span of every trace is a complete event (``ph: "X"``, ``ts`` and ``dur`` in
microseconds from the first span's start) with its fields and attributes as ``args``. A flow
arrow (``ph: "s"`` on the controller's call, ``ph: "f"`` with ``bp: "e"`` on the participant's
operation, one shared ``id``) joins each controller call span to the operation it caused.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ckpt_events import Event
from ckpt_events.participants.cli.report.model import Span, finished_spans, trace_spans

__all__ = ["trace_events", "write_perfetto"]

_CONTROLLER_PID = 1


def _track(who: str) -> tuple[str, int | None]:
    """``kind/instance`` and the worker index (``None`` for a single-process participant)."""
    base, _, worker = who.rpartition("/w")
    if base and worker.isdigit() and base.count("/") == 1:
        return base, int(worker)
    return who, None


def _all_spans(events: Sequence[Event]) -> list[tuple[int, Span]]:
    """Every finished span with its trace id, traces in order of their first span."""
    order: dict[int, None] = {}
    for e in finished_spans(events):
        order.setdefault(e.trace_id, None)
    return [(trace, s) for trace in order for s in trace_spans(events, trace)]


def trace_events(events: Iterable[Event]) -> list[dict[str, Any]]:
    """The trace events, metadata first: ``[]`` when no span finished."""
    spans = _all_spans(list(events))
    if not spans:
        return []
    origin = min(s.start_ns for _, s in spans)
    pids: dict[str, int] = {"controller": _CONTROLLER_PID}
    threads: set[tuple[int, int, str]] = set()
    out: list[dict[str, Any]] = []
    placed: dict[tuple[int, int], dict[str, Any]] = {}
    for trace, s in spans:
        process, worker = _track(s.who)
        pid = pids.setdefault(process, len(pids) + 1)
        tid = 0 if worker is None else 1 + worker
        threads.add((pid, tid, "main" if worker is None else f"w{worker}"))
        event = {
            "name": s.short,
            "cat": "controller" if not s.participant else "participant",
            "ph": "X",
            "ts": (s.start_ns - origin) / 1e3,
            "dur": max(0.0, (s.end_ns - s.start_ns) / 1e3),
            "pid": pid,
            "tid": tid,
            "args": {"who": s.who, **s.details},
        }
        out.append(event)
        placed[(trace, s.span_id)] = event
    flows: list[dict[str, Any]] = []
    for trace, s in spans:
        parent = placed.get((trace, s.parent_span_id or -1))
        if not s.participant or parent is None or parent["cat"] != "controller":
            continue
        child = placed[(trace, s.span_id)]
        flow_id = len(flows) // 2 + 1
        common = {"name": f"{parent['name']} -> {child['name']}", "cat": "call", "id": flow_id}
        flows.append({**common, "ph": "s", "ts": parent["ts"], "pid": parent["pid"], "tid": parent["tid"]})
        flows.append(
            {**common, "ph": "f", "bp": "e", "ts": child["ts"], "pid": child["pid"], "tid": child["tid"]}
        )
    metadata: list[dict[str, Any]] = []
    for process, pid in pids.items():
        for name, args in (("process_name", {"name": process}), ("process_sort_index", {"sort_index": pid})):
            metadata.append({"name": name, "ph": "M", "pid": pid, "tid": 0, "args": args})
    for pid, tid, name in sorted(threads):
        metadata.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}})
    return metadata + out + flows


def write_perfetto(path: Path, events: Sequence[Event]) -> int:
    """Write ``{"traceEvents": [...], "displayTimeUnit": "ms"}``; the number of complete events."""
    rows = trace_events(events)
    path.write_text(json.dumps({"traceEvents": rows, "displayTimeUnit": "ms"}, default=str))
    return sum(1 for r in rows if r["ph"] == "X")
