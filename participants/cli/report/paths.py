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

A span of unknown duration (its process's clock went back during it) may have ended any time
before its parent did: when the walk reaches a span with such a child, the path from there is
unknown and said so, never walked through a participant that may not have held the root up.
Likewise the slowest operation is unknown when one of unknown duration could have been it.
A participant's operation that started and never finished (its process died, its log cut) has
no known length either: it may have held the root up, or been the slowest, so both are unknown.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Generic, Protocol, TypeVar

from ckpt_events import Event, OperationFinished, OperationStarted, StepFinished, StepStarted
from ckpt_events.participants.cli.report.events import (
    FinishedSpan,
    StartedSpan,
    duration_ns,
    what_of,
    who_of,
    who_wrote,
)
from ckpt_events.participants.cli.report.model import Span, finished_spans
from ckpt_events.participants.cli.words import counted, rate
from ckpt_events.vocab import Kind, Operation, Step, span_name, span_name_of

__all__ = [
    "Section",
    "SpanLike",
    "critical_path",
    "dominated",
    "dominant_step_ms",
    "is_restore_step",
    "on_critical_path",
    "path_line",
    "path_unknown_line",
    "restore_operations",
    "slowest_operation",
    "unknown_on_path",
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


S = TypeVar("S", bound=SpanLike)


@dataclass(frozen=True)
class Section(Generic[S]):
    """A stretch of the critical path: the time ``span`` itself held the root up, children
    aside."""

    span: S
    start_ns: int
    end_ns: int


def _unknown_duration(s: SpanLike) -> bool:
    """Whether a span's duration is unknown: an event's end is before its start
    (``events.duration_ns``); a ``Span`` (drawn as an instant) says so."""
    # Per span of every walk: two comparisons first, the class test only for a zero-length one.
    return s.end_ns < s.start_ns or (s.end_ns == s.start_ns and isinstance(s, Span) and not s.known)


def _tree(spans: Iterable[S]) -> tuple[S | None, dict[int | None, list[S]]]:
    """The longest root (``None`` without spans) and each span's children, by parent id."""
    chosen = list(spans)
    ids = {s.span_id for s in chosen}
    children: dict[int | None, list[S]] = {}
    for s in chosen:
        parent = s.parent_span_id if s.parent_span_id in ids and s.parent_span_id != s.span_id else None
        children.setdefault(parent, []).append(s)
    return max(children.get(None, []), key=lambda s: s.end_ns - s.start_ns, default=None), children


def _walk(spans: Iterable[S]) -> tuple[list[Section[S]], S | None]:
    """The critical path's sections, latest first, and the span of unknown duration where the
    walk had to stop (``None``: the path is whole)."""
    root, children = _tree(spans)
    if root is None:
        return [], None
    if _unknown_duration(root):
        return [], root
    # Each span's time cut to its parent's, top down; what falls outside is dropped. A child
    # of unknown duration that started before its parent ended may have ended any time until
    # the parent did: kept apart, it stops the walk where the walk reaches its parent.
    bounds: dict[int, tuple[int, int]] = {root.span_id: (root.start_ns, root.end_ns)}
    parent_of: dict[int, S] = {}
    kids: dict[int, list[S]] = {}
    unsure: dict[int, S] = {}
    todo = [root]
    while todo:
        node = todo.pop()
        lo, hi = bounds[node.span_id]
        inside = []
        for child in children.get(node.span_id, []):
            if child.span_id in bounds or child.start_ns >= hi:
                continue
            if _unknown_duration(child):
                unsure.setdefault(node.span_id, child)
                continue
            if child.end_ns <= lo:
                continue
            bounds[child.span_id] = (max(lo, child.start_ns), min(hi, child.end_ns))
            parent_of[child.span_id] = node
            inside.append(child)
        kids[node.span_id] = sorted(inside, key=lambda c: bounds[c.span_id][1], reverse=True)
        todo.extend(inside)
    out: list[Section[S]] = []
    entered = {root.span_id}
    next_kid: dict[int, int] = {}
    node, returning = root, None  # returning: the start of the child just walked back from
    for _ in range(2 * len(bounds) + 1):  # each span is entered once and left once
        if returning is None and (stop := unsure.get(node.span_id)) is not None:
            return out, stop
        lo, hi = bounds[node.span_id]
        top = hi if returning is None else returning
        # A sibling that ended the instant the next one started counts as before it (Jaeger
        # asks for strictly before, and would skip a stage ending exactly at the next's start).
        # ``top`` only falls at a node, so a child passed over (entered, or ending after it)
        # never is a candidate again: one index per node, where the children were scanned
        # from the first on every return (5,000 participants under one call: 8.3 s).
        siblings = kids[node.span_id]
        at = next_kid.get(node.span_id, 0)
        while at < len(siblings) and (
            bounds[siblings[at].span_id][1] > top or siblings[at].span_id in entered
        ):
            at += 1
        next_kid[node.span_id] = at
        last = siblings[at] if at < len(siblings) else None
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
    return out, None


def critical_path(spans: Iterable[S]) -> list[Section[S]]:
    """The critical path of the longest root among ``spans`` (one trace's), latest section first;
    ``[]`` without spans. The sections tile the root's time exactly, unless the walk met a span
    of unknown duration (``unknown_on_path``): then they stop where it did."""
    return _walk(spans)[0]


def unknown_on_path(spans: Iterable[S]) -> S | None:
    """The span of unknown duration that makes the critical path unknown from where the walk
    reached it (see the module docstring), or ``None``."""
    return _walk(spans)[1]


def on_critical_path(spans: Iterable[SpanLike]) -> set[int]:
    """Span ids of the root and of every span holding a section of its critical path, as far as
    it is known: where the walk stopped at a span of unknown duration, its parent (which the
    walk entered) is on it, the span itself is not known to be."""
    chosen = list(spans)
    root = _tree(chosen)[0]
    if root is None:
        return set()
    sections, stop = _walk(chosen)
    entered = set() if stop is None or stop.parent_span_id is None else {stop.parent_span_id}
    return {root.span_id} | {s.span.span_id for s in sections} | entered


def _ms(e: FinishedSpan) -> float:
    return float(e.end_ns - e.start_ns) / 1e6


def _short(e: FinishedSpan) -> str:
    return (span_name_of(e) or span_name(Operation.RENEW.value)).removeprefix("gym.checkpoint.")


def _operation(top: FinishedSpan, spans: Sequence[FinishedSpan]) -> str:
    """``environment/environment-0 commit 9.0 ms (write 7.4 ms)``: with its longest step."""
    said = f"{who_wrote(top)} {_short(top)} {_ms(top):.1f} ms"
    steps = [
        e
        for e in spans
        if isinstance(e, StepFinished) and e.parent_span_id == top.span_id and duration_ns(e) is not None
    ]
    if steps:
        step = max(steps, key=_ms)
        said += f" ({_short(step)} {_ms(step):.1f} ms)"
    return said


def _unknown(e: FinishedSpan) -> str:
    """``the clock of model/model-0 went back during its commit``."""
    return f"the clock of {who_wrote(e)} went back during its {_short(e)}"


def _participant_operations(spans: Sequence[FinishedSpan]) -> list[OperationFinished]:
    return [e for e in spans if isinstance(e, OperationFinished) and e.kind != Kind.CONTROLLER]


def _slowest(operations: Sequence[OperationFinished]) -> OperationFinished | None:
    if any(duration_ns(e) is None for e in operations):
        return None
    return max(operations, key=_ms, default=None)


def slowest_operation(spans: Sequence[FinishedSpan]) -> OperationFinished | None:
    """The longest participant operation among one trace's finished spans; ``None`` without one,
    or when one of unknown duration could have been the longest."""
    return _slowest(_participant_operations(spans))


def path_line(events: Sequence[Event], trace_id: int, unfinished: Iterable[StartedSpan] = ()) -> str:
    """The trace's critical path and its slowest operation in words, ``""`` without spans:
    ``critical path: coordinate.commit 30.0 ms, environment/environment-0 commit 28.0 ms
    (write 7.4 ms); slowest operation: model/model-0 prepare 80.0 ms (generation_cut 60.0 ms)``.

    The path is named by its longest stage (a child of the root) and its longest participant
    operation; when that operation is also the trace's slowest, the line says so instead of
    naming it twice. Where a span of unknown duration makes either unknown, the line says
    ``unknown`` and whose clock went back, or that the trace's parent ids loop. ``unfinished``,
    the trace's spans started and not finished by the root's end: a participant's operation among
    them makes both unknown (its length is not known); was: the next slowest named instead."""
    chosen = [e for e in finished_spans(events) if e.trace_id == trace_id]
    root = _tree(chosen)[0]
    if not chosen:
        return ""
    left = sorted(
        (s for s in unfinished if isinstance(s, OperationStarted) and s.kind != Kind.CONTROLLER),
        key=lambda s: s.start_ns,
    )
    if left:
        more = f" and {counted(len(left) - 1, 'more operation')}" if len(left) > 1 else ""
        return (
            f"critical path: unknown ({what_of(left[0])} on {who_wrote(left[0])}{more} never finished: "
            "how long it took is not known); slowest operation: unknown too"
        )
    if root is None:  # spans, each naming a parent among them: their parent ids loop
        return "critical path: unknown (the trace's parent ids loop: no span without a parent)"
    sections, stop = _walk(chosen)
    operations = _participant_operations(chosen)
    unsure = next((e for e in operations if duration_ns(e) is None), None)
    slowest = None if unsure is not None else _slowest(operations)
    if stop is not None:
        said = f"critical path: unknown ({_unknown(stop)})"
        if unsure is stop:
            return f"{said}; slowest operation: unknown too"
        if unsure is not None:
            return f"{said}; slowest operation: unknown ({_unknown(unsure)})"
        return said if slowest is None else f"{said}; slowest operation: {_operation(slowest, chosen)}"
    on_path = {id(s.span): s.span for s in sections}
    stages = [s for s in on_path.values() if s.parent_span_id == root.span_id and s is not root]
    on_path_operations = [
        s for s in on_path.values() if isinstance(s, OperationFinished) and s.kind != Kind.CONTROLLER
    ]
    parts = []
    if stages:
        stage = max(stages, key=_ms)
        parts.append(f"{_short(stage)} {_ms(stage):.1f} ms")
    top = max(on_path_operations, key=_ms, default=None)
    if top is not None:
        parts.append(_operation(top, chosen))
    said = "critical path: " + ", ".join(parts or [f"{_short(root)} {_ms(root):.1f} ms"])
    if unsure is not None:
        return f"{said}; slowest operation: unknown ({_unknown(unsure)})"
    if slowest is None:
        return said
    if slowest is top:
        return said + ", the slowest operation"
    return f"{said}; slowest operation: {_operation(slowest, chosen)}"


def path_unknown_line(events: Sequence[Event], trace_id: int) -> str:
    """``path_line`` for a trace where a participant answered outside the controller's call by
    stamps no one shift aligns (``clocks``): which call ended last is unknown, so the path is
    said unknown; the slowest operation, timed by each span's own clock, is still said."""
    chosen = [e for e in finished_spans(events) if e.trace_id == trace_id]
    said = (
        "critical path: unknown (a participant answered outside the controller's call: a clock no "
        "shift aligns)"
    )
    operations = _participant_operations(chosen)
    unsure = next((e for e in operations if duration_ns(e) is None), None)
    if unsure is not None:
        return f"{said}; slowest operation: unknown ({_unknown(unsure)})"
    slowest = _slowest(operations)
    return said if slowest is None else f"{said}; slowest operation: {_operation(slowest, chosen)}"


def restore_operations(spans: Iterable[Event]) -> set[int]:
    """The span ids of the restore operations among ``spans`` (started or finished)."""
    return {
        e.span_id
        for e in spans
        if isinstance(e, OperationStarted | OperationFinished) and e.operation == Operation.RESTORE
    }


def is_restore_step(step: StepStarted | StepFinished, restores: set[int]) -> bool:
    """A step a restore's time is weighed by: a read or an install, or any step of one of the
    ``restores`` (a user's own, ``download``: a restore that spent 15 of its 18 ms in it was
    said to have spent longest in its 1 ms ``install``)."""
    return step.step in (Step.READ, Step.INSTALL) or step.parent_span_id in restores


def _restore_steps(spans: Sequence[FinishedSpan]) -> list[StepFinished]:
    """A restore's steps (``is_restore_step``) of known duration."""
    restores = restore_operations(spans)
    return [
        e
        for e in spans
        if isinstance(e, StepFinished) and is_restore_step(e, restores) and duration_ns(e) is not None
    ]


def dominant_step_ms(spans: Sequence[FinishedSpan]) -> float | None:
    """How long a restore's longest step (read, install, a user's own) took, in ms (``None``: none)."""
    steps = _restore_steps(spans)
    if not steps:
        return None
    return max(_ms(e) for e in steps)


def reads_ms(spans: Sequence[FinishedSpan]) -> dict[str, float]:
    """A restore's longest read step of each participant (``model/model-4``), in ms: what a
    slowed read is compared with (the demo's ``slow-restore`` check), load slowing them all."""
    reads: dict[str, float] = {}
    for e in _restore_steps(spans):
        if e.step == Step.READ:
            who = who_of(e.kind, e.instance, None)
            reads[who] = max(reads.get(who, 0.0), _ms(e))
    return reads


#: A step "dominated" a restore when it took at least this share of the restore's time.
DOMINANT_SHARE: Final = 0.5


def dominated(spans: Sequence[FinishedSpan]) -> str:
    """The longest step of a restore (read, install, a user's own): which, on whom, its records and rate;
    said to have dominated only when it took ``DOMINANT_SHARE`` or more of the restore (the
    longest span among ``spans``, its root), else named as the longest, with its share: a 26 ms
    read of a 226 ms restore was said to dominate it, beside a critical path through another.
    Another participant's step that took that share too is named beside it (``so did ...``):
    two slow reads in parallel were said as one participant's, whose fix alone saves nothing."""
    steps = _restore_steps(spans)
    if not steps:
        return ""
    top = max(steps, key=_ms)
    ms = _ms(top)
    whole = max(_ms(e) for e in spans)
    if whole > 0 and ms / whole < DOMINANT_SHARE:
        out = f"longest {top.step}: on {who_wrote(top)} {ms:.1f} ms, {ms / whole:.0%} of the restore"
    else:
        out = f"{top.step} on {who_wrote(top)} {ms:.1f} ms dominated"
    if top.records is not None:
        out += f", {counted(top.records, 'record')}"
    if top.bytes is not None:
        speed = f" at {rate(top.bytes, ms / 1e3)}" if ms > 0 else ""
        size = counted(top.bytes, "byte") if top.bytes < 100_000 else f"{top.bytes / 1e6:.1f} MB"
        out += f", {size}{speed}"
    if whole > 0 and ms / whole >= DOMINANT_SHARE:
        out += _so_did(steps, top, whole)
    return out


#: Other participants' dominating steps named beside the longest one; the rest are counted.
_SO_DID: Final = 3


def _so_did(steps: Sequence[StepFinished], top: StepFinished, whole: float) -> str:
    """``; so did read on model/model-1 410.2 ms`` for each other participant (never ``top``'s
    own workers, whose steps run inside its own) whose longest step took ``DOMINANT_SHARE`` of
    the restore too, longest first."""
    longest: dict[tuple[str, str], StepFinished] = {}
    for e in steps:
        key = (str(e.kind), e.instance)
        if key == (str(top.kind), top.instance) or _ms(e) / whole < DOMINANT_SHARE:
            continue
        if key not in longest or _ms(e) > _ms(longest[key]):
            longest[key] = e
    others = sorted(longest.values(), key=_ms, reverse=True)
    said = [f"{e.step} on {who_of(e.kind, e.instance, None)} {_ms(e):.1f} ms" for e in others[:_SO_DID]]
    if len(others) > _SO_DID:
        said.append(f"{len(others) - _SO_DID:,} more")
    return f"; so did {', '.join(said)}" if said else ""
