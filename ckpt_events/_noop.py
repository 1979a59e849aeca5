"""Shared do-nothing span handles, returned by ``Telemetry`` when no sink listens.

Every method is a plain method on a module-level singleton: no clock read, no id, no
dict, no event. ``step()`` and ``stage()`` still check their name, and ``set_attribute`` its
name and value, since what fails with a sink on should fail in a test run with telemetry off
too; the name check is a dict lookup (of the names checked so far) that allocates nothing.
"""

from __future__ import annotations

from types import TracebackType
from typing import ClassVar, Final, Self

from ckpt_events._controller_spans import _PREPARE, CollectionSpan, CoordinateSpan, StageSpan, _not_a_stage
from ckpt_events._events import AttributeValue
from ckpt_events._span_base import _bad_attribute, _bad_context, _bad_tracestate, _SpanBase
from ckpt_events._span_handles import OperationSpan, StepSpan
from ckpt_events._tracecontext import parse_traceparent
from ckpt_events._vocab import KIND_NAMES, STEP_NAMES, Kind, Operation, Phase, Step, kind_name, step_name

__all__ = [
    "NOOP_COLLECTION",
    "NOOP_COORDINATE",
    "NOOP_COORDINATES",
    "NOOP_OPERATION",
    "NOOP_STAGE",
    "NOOP_STEP",
]


class _Noop:
    """The parts every no-op handle shares: entering and leaving do nothing; never a parent."""

    __slots__ = ()
    _live: ClassVar[bool] = False

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None

    def traceparent(self) -> str | None:
        return None

    def tracestate(self) -> str | None:
        return None

    def with_tracestate(self, header: str | None) -> Self:
        if header is not None and not isinstance(header, str):  # as a live handle checks it
            _bad_tracestate(header)
        return self

    def set_attribute(self, name: str, value: AttributeValue) -> None:
        # Checked as a live handle checks it: an attribute that fails with a sink on fails off too.
        if not isinstance(name, str) or not isinstance(value, str | bool | int | float):
            _bad_attribute(name, value)


class _NoopSlots(_Noop):
    """The controller's no-op handles (slot classes): built with no identity and no clock."""

    __slots__ = ()

    def __init__(self) -> None:
        pass


class _NoopStep(_Noop, StepSpan, gc=False):
    def set(
        self,
        *,
        records: int | None = None,
        bytes: int | None = None,
        calls: int | None = None,
        cut_durable_prefix: int | None = None,
        cut_durable_failure: int | None = None,
    ) -> None:
        return None


class _NoopOperation(_Noop, OperationSpan, gc=False):
    def step(self, step: Step | str) -> StepSpan:
        try:  # inline, not a helper call: this is the whole cost of a disabled step
            if step in STEP_NAMES:
                return NOOP_STEP
        except TypeError:
            pass
        step_name(step)  # raises InvalidValueError or InvalidTypeError naming the rule
        return NOOP_STEP

    def set(
        self,
        *,
        records: int | None = None,
        bytes: int | None = None,
        phase: Phase | str | None = None,
        blockers: int | None = None,
        episodes: int | None = None,
        rollouts: int | None = None,
        received_ns: int | None = None,
        loop_lag_ms: float | None = None,
    ) -> None:
        return None


class _NoopStage(_NoopSlots, StageSpan):
    __slots__ = ()

    def set(self, *, participants: int | None = None) -> None:
        return None


class _NoopCoordinate(_NoopSlots, CoordinateSpan):
    __slots__ = ()

    def __init__(self, operation: Operation) -> None:
        self.operation = operation

    def stage(self, stage: Kind | str) -> StageSpan:
        if self.operation is not _PREPARE:  # as a live handle refuses it
            _not_a_stage(self.operation)
        try:
            if stage in KIND_NAMES:
                return NOOP_STAGE
        except TypeError:
            pass
        kind_name(stage)  # raises naming the rule
        return NOOP_STAGE

    def set(
        self,
        *,
        participants: int | None = None,
        prepared: bool | None = None,
        stopped_at: Kind | str | None = None,
        episodes: int | None = None,
        rollouts: int | None = None,
    ) -> None:
        return None


class _NoopCollection(_NoopSlots, CollectionSpan):
    __slots__ = ()

    def set(
        self,
        *,
        checkpoint_id: str | None = None,
        in_flight: int | None = None,
        stop: bool | None = None,
        published: bool | None = None,
        rows: int | None = None,
        restarts: int | None = None,
    ) -> None:
        return None


class _PassedStep(_NoopStep, gc=False):
    """A step of a ``_PassedOperation``: records nothing, hands the incoming trace on."""

    _passes_on: ClassVar[bool] = True
    traceparent = _SpanBase.traceparent
    tracestate = _SpanBase.tracestate


class _PassedOperation(_NoopOperation, gc=False):
    """What ``Telemetry.operation`` returns with no sink listening and a valid incoming
    ``traceparent``: it records nothing, but ``traceparent()`` (and ``tracestate()``, once kept
    by ``with_tracestate``) hand the caller's trace on, so a call this server makes joins the
    trace it was called in, as OpenTelemetry's non-recording spans do; a server with telemetry
    off in the middle of a chain started a new trace for everything after it. Given as
    ``parent=`` to a live span (another Telemetry's), that span continues the caller's trace."""

    _passes_on: ClassVar[bool] = True
    # Its steps' one handle, made at the first step(): they record nothing and hand on the
    # same trace, so one per operation does (a handle per step cost ~170 ns of 360).
    _step: StepSpan | None = None
    traceparent = _SpanBase.traceparent
    tracestate = _SpanBase.tracestate

    def with_tracestate(self, header: str | None) -> Self:
        _SpanBase.with_tracestate(self, header)
        self._step = None  # a later step hands on the new tracestate; one made already keeps its own
        return self

    def step(self, step: Step | str) -> StepSpan:
        NOOP_OPERATION.step(step)  # the name checked as a disabled step checks it
        handle = self._step
        if handle is None:
            self._step = handle = _PassedStep(
                None,  # type: ignore[arg-type]
                Step.EXPORT,
                None,
                self.trace_id,
                self.span_id,
                None,
                self.sampled,
                self._tracestate,
            )
        return handle


def passed_step(operation: _SpanBase) -> StepSpan:
    """A step of the live ``operation`` when no sink wants steps: it records nothing and hands
    the operation's trace on, so a call made inside it joins that trace. The shared
    ``NOOP_STEP`` it replaces had no trace: a server whose sinks took operations only (a
    metrics sink, the README's ``PrintOperations``) cut the trace at every call from a step."""
    return _PassedStep(
        None,  # type: ignore[arg-type]
        Step.EXPORT,
        None,
        operation.trace_id,
        operation.span_id,
        None,
        operation.sampled,
        operation._tracestate,
    )


def passed_on(traceparent: str | None, parent: object = None) -> OperationSpan:
    """The no-op operation for an incoming ``traceparent`` or a ``parent`` span: one that hands
    on the parent's trace if it carries one (a live span, or a passed-on one), else the header's
    when it parses, else ``NOOP_OPERATION`` (a malformed header is ignored, as with telemetry on).
    As a live child would be, it is a child of ``parent`` over ``traceparent``."""
    _bad_context(traceparent, parent)  # raises on a wrong type, as with telemetry on
    if isinstance(parent, _SpanBase) and (parent._live or parent._passes_on):
        # A local parent: the child continues its trace; a tracestate given later is ignored
        # (parent_remote False), as by a live child.
        return _PassedOperation(
            None,  # type: ignore[arg-type]
            Operation.COMMIT,
            None,
            parent.trace_id,
            parent.span_id,
            None,
            False,
            parent.sampled,
            parent._tracestate,
        )
    remote = parse_traceparent(traceparent)
    if remote is None:
        return NOOP_OPERATION
    return _PassedOperation(
        None,  # type: ignore[arg-type]
        Operation.COMMIT,
        None,
        remote.trace_id,
        remote.span_id,
        None,
        True,
        remote.sampled,
    )


# The struct twins need their fields filled; no method of theirs reads them.
NOOP_STEP: Final[StepSpan] = _NoopStep(None, Step.EXPORT, None, 0, 0, None, False, None)  # type: ignore[arg-type]
NOOP_OPERATION: Final[OperationSpan] = _NoopOperation(None, Operation.COMMIT, None, 0, 0, None, False, False)  # type: ignore[arg-type]
NOOP_STAGE: Final[StageSpan] = _NoopStage()
#: One per operation: only a prepare's has stages, off as on.
NOOP_COORDINATES: Final[dict[Operation, CoordinateSpan]] = {op: _NoopCoordinate(op) for op in Operation}
NOOP_COORDINATE: Final[CoordinateSpan] = NOOP_COORDINATES[Operation.PREPARE]
NOOP_COLLECTION: Final[CollectionSpan] = _NoopCollection()
