"""What set a checkpoint's end and what dominated a restore, from one trace's finished spans."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ckpt_events import Kind, Operation, Step, StepFinished, span_name, span_name_of
from participants.cli.report_model import finished_spans, who_of
from participants.cli.words import counted

__all__ = ["dominated", "slowest"]


def _who(e: Any) -> str:
    return "controller" if e.kind is Kind.CONTROLLER else who_of(e.kind, e.instance, e.worker)


def slowest(events: Sequence[Any], trace_id: int) -> str:
    """The participant and stage on the critical path (from the longest root, always the child
    that ends last), the same path ``report_model.trace_spans`` marks, without its details."""
    chosen = [e for e in finished_spans(events) if e.trace_id == trace_id]
    ids = {e.span_id for e in chosen}
    children: dict[int | None, list[Any]] = {}
    for e in chosen:
        children.setdefault(e.parent_span_id if e.parent_span_id in ids else None, []).append(e)
    path: list[Any] = []
    node = max(children.get(None, []), key=lambda e: e.end_ns - e.start_ns, default=None)
    while node is not None and len(path) <= len(chosen):
        path.append(node)
        node = max(children.get(node.span_id, []), key=lambda e: e.end_ns, default=None)
    participant = next((e for e in reversed(path) if e.kind is not Kind.CONTROLLER), None)
    parts = []
    if len(path) > 1:
        parts.append(f"{_short(path[1])} {(path[1].end_ns - path[1].start_ns) / 1e6:.1f} ms")
    if participant is not None:
        ms = (participant.end_ns - participant.start_ns) / 1e6
        parts.append(f"{_who(participant)} {_short(participant)} {ms:.1f} ms")
    return ", slowest ".join(parts) if parts else ""


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
    out = f"{top.step.value} on {_who(top)} {ms:.1f} ms dominated"
    if top.records is not None:
        out += f", {counted(top.records, 'record')}"
    if top.bytes is not None:
        rate = f" at {top.bytes / 1e6 / (ms / 1e3):.2f} MB/s" if ms > 0 else ""
        size = counted(top.bytes, "byte") if top.bytes < 100_000 else f"{top.bytes / 1e6:.1f} MB"
        out += f", {size}{rate}"
    return out
