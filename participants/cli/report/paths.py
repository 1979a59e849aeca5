"""What set a checkpoint's end and what dominated a restore, from one trace's finished spans."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ckpt_events import StepFinished
from ckpt_events.participants.cli.report.model import finished_spans, who_of
from ckpt_events.participants.cli.words import counted
from ckpt_events.vocab import Kind, Operation, Step, span_name, span_name_of

__all__ = ["dominated", "slowest"]


def _who(e: Any) -> str:
    return "controller" if e.kind == Kind.CONTROLLER else who_of(e.kind, e.instance, e.worker)


def slowest(events: Sequence[Any], trace_id: int) -> str:
    """The longest stage on the critical path of the trace's longest root, and the longest
    participant operation on it (with its longest step there): ``collection.publish 72.4 ms,
    slowest environment/environment-0 commit 9.0 ms (write 7.4 ms)``.

    The critical path is the chain of spans that set the root's end: under each span, its
    child that ends last, then the child that ended last before that one started, and so
    on back to the span's start; and the same under each of them. (The waterfall marks the
    chain of last-ending children only; this walks back through the earlier stages too, so a
    long publish before a short resume is named.)"""
    chosen = [e for e in finished_spans(events) if e.trace_id == trace_id]
    ids = {e.span_id for e in chosen}
    children: dict[int | None, list[Any]] = {}
    for e in chosen:
        parent = e.parent_span_id if e.parent_span_id in ids and e.parent_span_id != e.span_id else None
        children.setdefault(parent, []).append(e)
    root = max(children.get(None, []), key=lambda e: e.end_ns - e.start_ns, default=None)
    if root is None:
        return ""
    seen: set[int] = {root.span_id}

    def chain(node: Any) -> list[Any]:
        """``node``'s children on its critical path, last first."""
        kids = [k for k in children.get(node.span_id, []) if k.span_id not in seen]
        out: list[Any] = []
        bound = node.end_ns
        while kids:
            last = max((k for k in kids if k.end_ns <= bound), key=lambda k: k.end_ns, default=None)
            if last is None:
                break
            out.append(last)
            seen.add(last.span_id)
            bound = last.start_ns
            kids = [k for k in kids if k is not last and k.end_ns <= bound]
        return out

    stages = chain(root)
    critical: list[Any] = []
    todo = list(stages)
    while todo:  # each span is taken once (``seen``)
        span = todo.pop()
        critical.append(span)
        todo.extend(chain(span))
    parts = []
    if stages:
        stage = max(stages, key=lambda e: e.end_ns - e.start_ns)
        parts.append(f"{_short(stage)} {(stage.end_ns - stage.start_ns) / 1e6:.1f} ms")
    operations = [e for e in critical if e.kind != Kind.CONTROLLER and not isinstance(e, StepFinished)]
    if operations:
        top = max(operations, key=lambda e: e.end_ns - e.start_ns)
        said = f"{_who(top)} {_short(top)} {(top.end_ns - top.start_ns) / 1e6:.1f} ms"
        steps = [e for e in critical if isinstance(e, StepFinished) and e.parent_span_id == top.span_id]
        if steps:
            step = max(steps, key=lambda e: e.end_ns - e.start_ns)
            said += f" ({_short(step)} {(step.end_ns - step.start_ns) / 1e6:.1f} ms)"
        parts.append(said)
    return ", slowest ".join(parts)


def _short(e: Any) -> str:
    return (span_name_of(e) or span_name(Operation.RENEW.value)).removeprefix("gym.checkpoint.")


def dominant_step_ms(spans: Sequence[Any]) -> float | None:
    """How long a restore's longest read or install step took, in ms (``None``: no such step)."""
    steps = [e for e in spans if isinstance(e, StepFinished) and e.step in (Step.READ, Step.INSTALL)]
    if not steps:
        return None
    return max((e.end_ns - e.start_ns) / 1e6 for e in steps)


def dominated(spans: Sequence[Any]) -> str:
    """The longest read or install step of a restore: which, on whom, its records and MB/s."""
    steps = [e for e in spans if isinstance(e, StepFinished) and e.step in (Step.READ, Step.INSTALL)]
    if not steps:
        return ""
    top = max(steps, key=lambda e: e.end_ns - e.start_ns)
    ms = (top.end_ns - top.start_ns) / 1e6
    out = f"{top.step} on {_who(top)} {ms:.1f} ms dominated"
    if top.records is not None:
        out += f", {counted(top.records, 'record')}"
    if top.bytes is not None:
        rate = f" at {top.bytes / 1e6 / (ms / 1e3):.2f} MB/s" if ms > 0 else ""
        size = counted(top.bytes, "byte") if top.bytes < 100_000 else f"{top.bytes / 1e6:.1f} MB"
        out += f", {size}{rate}"
    return out
