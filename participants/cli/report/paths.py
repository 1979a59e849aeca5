"""What set a checkpoint's end, and what took longest, from one trace's finished spans.

Two words, one meaning each:

- the **critical path** is the chain of work the root waited for, walked as Jaeger's UI walks it:
  from the root, step into the child that ended last; under that span do the same; when a span
  has no child left, go back to its parent and step into the child that ended last by the time
  the span just left started (a sibling that overlapped it did not hold the root up), until
  the root's start. A child that ends after its parent is cut at its parent's end, one that
  starts after its parent ended is dropped (jaeger-ui's ``sanitizeOverFlowingChildren``);
- the **slowest** operation is the longest participant operation of the trace, on the path or
  not.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ckpt_events import OperationFinished, StepFinished
from ckpt_events.participants.cli.report.model import finished_spans, who_of
from ckpt_events.participants.cli.words import counted, rate
from ckpt_events.vocab import Kind, Operation, Step, span_name, span_name_of

__all__ = [
    "Section",
    "SpanLike",
    "critical_path",
    "dominated",
    "dominant_step_ms",
    "on_critical_path",
    "path_line",
    "slowest_operation",
]


class SpanLike(Protocol):
    """What the walk reads of a span: a finished event and the report's ``Span`` both have it."""

    @property
    def span_id(self) -> int: ...
    @property
    def parent_span_id(self) -> int | None: ...
    @property
    def start_ns(self) -> int: ...
    @property
    def end_ns(self) -> int: ...


@dataclass(frozen=True)
class Section:
    """A stretch of the critical path: the time ``span`` itself held the root up, children
    aside."""

    span: Any
    start_ns: int
    end_ns: int


def _tree(spans: Iterable[SpanLike]) -> tuple[Any, dict[int | None, list[SpanLike]]]:
    """The longest root (``None`` without spans) and each span's children, by parent id."""
    chosen = list(spans)
    ids = {s.span_id for s in chosen}
    children: dict[int | None, list[SpanLike]] = {}
    for s in chosen:
        parent = s.parent_span_id if s.parent_span_id in ids and s.parent_span_id != s.span_id else None
        children.setdefault(parent, []).append(s)
    return max(children.get(None, []), key=lambda s: s.end_ns - s.start_ns, default=None), children


def critical_path(spans: Iterable[SpanLike]) -> list[Section]:
    """The critical path of the longest root among ``spans`` (one trace's), latest section first;
    ``[]`` without spans. The sections tile the root's time exactly."""
    root, children = _tree(spans)
    if root is None:
        return []
    # Each span's time cut to its parent's, top down; what falls outside is dropped.
    bounds: dict[int, tuple[int, int]] = {root.span_id: (root.start_ns, root.end_ns)}
    parent_of: dict[int, SpanLike] = {}
    kids: dict[int, list[SpanLike]] = {}
    todo = [root]
    while todo:
        node = todo.pop()
        lo, hi = bounds[node.span_id]
        inside = []
        for child in children.get(node.span_id, []):
            if child.span_id in bounds or child.start_ns >= hi or child.end_ns <= lo:
                continue
            bounds[child.span_id] = (max(lo, child.start_ns), min(hi, child.end_ns))
            parent_of[child.span_id] = node
            inside.append(child)
        kids[node.span_id] = sorted(inside, key=lambda c: bounds[c.span_id][1], reverse=True)
        todo.extend(inside)
    out: list[Section] = []
    entered = {root.span_id}
    node, returning = root, None  # returning: the start of the child just walked back from
    for _ in range(2 * len(bounds) + 1):  # each span is entered once and left once
        lo, hi = bounds[node.span_id]
        top = hi if returning is None else returning
        # A sibling that ended the instant the next one started counts as before it (Jaeger
        # asks for strictly before, and would skip a stage ending exactly at the next's start).
        candidates = [
            c for c in kids[node.span_id] if bounds[c.span_id][1] <= top and c.span_id not in entered
        ]
        last = candidates[0] if candidates else None
        if last is not None:
            entered.add(last.span_id)
            if bounds[last.span_id][1] < top:
                out.append(Section(node, bounds[last.span_id][1], top))
            node, returning = last, None
            continue
        if lo < top:
            out.append(Section(node, lo, top))
        if node is root:
            break
        node, returning = parent_of[node.span_id], lo
    return out


def on_critical_path(spans: Iterable[SpanLike]) -> set[int]:
    """Span ids of the root and of every span holding a section of its critical path."""
    chosen = list(spans)
    root = _tree(chosen)[0]
    return set() if root is None else {root.span_id} | {s.span.span_id for s in critical_path(chosen)}


def _ms(e: Any) -> float:
    return float(e.end_ns - e.start_ns) / 1e6


def _who(e: Any) -> str:
    return "controller" if e.kind == Kind.CONTROLLER else who_of(e.kind, e.instance, e.worker)


def _short(e: Any) -> str:
    return (span_name_of(e) or span_name(Operation.RENEW.value)).removeprefix("gym.checkpoint.")


def _operation(top: Any, spans: Sequence[Any]) -> str:
    """``environment/environment-0 commit 9.0 ms (write 7.4 ms)``: with its longest step."""
    said = f"{_who(top)} {_short(top)} {_ms(top):.1f} ms"
    steps = [e for e in spans if isinstance(e, StepFinished) and e.parent_span_id == top.span_id]
    if steps:
        step = max(steps, key=_ms)
        said += f" ({_short(step)} {_ms(step):.1f} ms)"
    return said


def slowest_operation(spans: Sequence[Any]) -> Any | None:
    """The longest participant operation among one trace's finished spans, or ``None``."""
    operations = [e for e in spans if isinstance(e, OperationFinished) and e.kind != Kind.CONTROLLER]
    return max(operations, key=_ms, default=None)


def path_line(events: Sequence[Any], trace_id: int) -> str:
    """The trace's critical path and its slowest operation in words, ``""`` without spans:
    ``critical path: coordinate.commit 30.0 ms, environment/environment-0 commit 28.0 ms
    (write 7.4 ms); slowest operation: model/model-0 prepare 80.0 ms (generation_cut 60.0 ms)``.

    The path is named by its longest stage (a child of the root) and its longest participant
    operation; when that operation is also the trace's slowest, the line says so instead of
    naming it twice."""
    chosen = [e for e in finished_spans(events) if e.trace_id == trace_id]
    root = _tree(chosen)[0]
    if root is None:
        return ""
    sections = critical_path(chosen)
    on_path = {id(s.span): s.span for s in sections}
    stages = [s for s in on_path.values() if s.parent_span_id == root.span_id and s is not root]
    operations = [
        s for s in on_path.values() if isinstance(s, OperationFinished) and s.kind != Kind.CONTROLLER
    ]
    parts = []
    if stages:
        stage = max(stages, key=_ms)
        parts.append(f"{_short(stage)} {_ms(stage):.1f} ms")
    top = max(operations, key=_ms, default=None)
    if top is not None:
        parts.append(_operation(top, chosen))
    said = "critical path: " + ", ".join(parts or [f"{_short(root)} {_ms(root):.1f} ms"])
    slowest = slowest_operation(chosen)
    if slowest is None:
        return said
    if slowest is top:
        return said + ", the slowest operation"
    return f"{said}; slowest operation: {_operation(slowest, chosen)}"


def dominant_step_ms(spans: Sequence[Any]) -> float | None:
    """How long a restore's longest read or install step took, in ms (``None``: no such step)."""
    steps = [e for e in spans if isinstance(e, StepFinished) and e.step in (Step.READ, Step.INSTALL)]
    if not steps:
        return None
    return max(_ms(e) for e in steps)


def dominated(spans: Sequence[Any]) -> str:
    """The longest read or install step of a restore: which, on whom, its records and rate."""
    steps = [e for e in spans if isinstance(e, StepFinished) and e.step in (Step.READ, Step.INSTALL)]
    if not steps:
        return ""
    top = max(steps, key=_ms)
    ms = _ms(top)
    out = f"{top.step} on {_who(top)} {ms:.1f} ms dominated"
    if top.records is not None:
        out += f", {counted(top.records, 'record')}"
    if top.bytes is not None:
        speed = f" at {rate(top.bytes, ms / 1e3)}" if ms > 0 else ""
        size = counted(top.bytes, "byte") if top.bytes < 100_000 else f"{top.bytes / 1e6:.1f} MB"
        out += f", {size}{speed}"
    return out
