"""Live span handles that ``Telemetry`` returns while some sink listens.

Each handle is a context manager: entering reads the clock and emits a ``*Started`` event
(if wanted); leaving emits the ``*Finished`` event with what ``set`` recorded. An exception
leaving the block records outcome ``error`` and the exception type, and propagates. The
no-op twins in ``_noop.py`` are returned when nobody listens.

This is the request path of an instrumented server, so it is written for speed: values
live in slots (no per-span dict), events are built positionally (the ``__exit__`` methods
spell each one out: a shared helper would cost a tuple per span), and ``set``
checks each value inline.
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, NoReturn, Self

from ckpt_events._errors import InvalidArgumentError
from ckpt_events._events import (
    AttributeValue,
    OperationFinished,
    OperationStarted,
    StepFinished,
    StepStarted,
)
from ckpt_events._tracecontext import format_traceparent, parse_tracestate
from ckpt_events._vocab import Operation, Outcome, Phase, Step, coerce

if TYPE_CHECKING:
    from ckpt_events._telemetry import Telemetry

__all__ = ["OperationSpan", "StepSpan"]

_MAX_MESSAGE: Final = 1024
_OK: Final = Outcome.OK
_STEPS: Final = {s.value: s for s in Step}
_PHASES: Final = {p.value: p for p in Phase}


def _bad(name: str, value: object) -> NoReturn:
    raise InvalidArgumentError(f"{name} must be an int >= 0, not {value!r}")


def _error_fields(exc: BaseException) -> tuple[Outcome, str | None, str | None]:
    cls = type(exc)
    name = cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    return Outcome.ERROR, name, str(exc)[:_MAX_MESSAGE]


class _Span:
    """Identity, timing and extra attributes shared by every live span handle."""

    __slots__ = (
        "_attributes",
        "_tel",
        "_tracestate",
        "checkpoint_id",
        "parent_remote",
        "parent_span_id",
        "sampled",
        "span_id",
        "start_ns",
        "trace_id",
    )

    def _identify(
        self,
        tel: Telemetry,
        checkpoint_id: str | None,
        trace_id: int,
        parent_span_id: int | None,
        parent_remote: bool,
        sampled: bool,
        tracestate: str | None = None,
    ) -> None:
        self._tel = tel
        self.checkpoint_id = checkpoint_id
        self.trace_id = trace_id
        # A zero span id is invalid in W3C; one in 2**64 draws, so retry rather than branch.
        self.span_id = tel._random(64) or tel._random(64) or 1
        self.parent_span_id = parent_span_id
        self.parent_remote = parent_remote
        self.sampled = sampled
        self._tracestate = tracestate
        self._attributes: dict[str, AttributeValue] | None = None

    def _start(self, started: type[Any], what: object) -> None:
        """Read the clock; emit ``started`` (a ``*Started`` event class) if a sink wants it."""
        tel = self._tel
        self.start_ns = tel._clock()
        if started in tel.bus._routes:
            tel.bus.emit(
                started(  # positional, in field order (see _events.py)
                    tel.kind,
                    tel.instance,
                    self.trace_id,
                    self.span_id,
                    self.start_ns,
                    what,
                    self.checkpoint_id,
                    self.parent_span_id,
                    self.parent_remote,
                    self.sampled,
                    tel.worker,
                )
            )

    def traceparent(self) -> str | None:
        """The W3C ``traceparent`` for an outgoing call made inside this span."""
        return format_traceparent(self.trace_id, self.span_id, self.sampled)

    def tracestate(self) -> str | None:
        """The W3C ``tracestate`` to send with ``traceparent()``: the one that came in with
        this trace's ``traceparent`` (see ``with_tracestate``), inherited by child spans."""
        return self._tracestate

    def with_tracestate(self, header: str | None) -> Self:
        """Keep the incoming ``tracestate`` ``header`` (validated by ``parse_tracestate``) if
        this span continues the ``traceparent`` it came with; returns this span::

            with tel.operation("prepare", traceparent=tp).with_tracestate(ts) as op: ...

        A span that does not continue a remote parent ignores it (W3C: a ``tracestate``
        goes only with its ``traceparent``); a child span keeps its parent's.
        """
        if self.parent_remote and header is not None:
            self._tracestate = parse_tracestate(header)
        return self

    def set_attribute(self, name: str, value: AttributeValue) -> None:
        """Attach an extra attribute; sinks apply the redaction rule to it."""
        if not isinstance(name, str) or not isinstance(value, str | bool | int | float):
            raise InvalidArgumentError(
                f"an attribute needs a str name and a str, bool, int or float value, not {name!r}={value!r}"
            )
        if self._attributes is None:
            self._attributes = {}
        self._attributes[name] = value


class StepSpan(_Span):
    """A step (``wait_ready``, ``export``, ...) inside an operation span."""

    __slots__ = ("_bytes", "_calls", "_cut_failure", "_cut_prefix", "_records", "step")
    _records: int | None
    _bytes: int | None
    _calls: int | None
    _cut_prefix: int | None
    _cut_failure: int | None

    def __init__(self, parent: OperationSpan, step: Step) -> None:
        # Identity inline, not through _identify(): this runs once per span on the request path.
        self._tel = parent._tel
        self.checkpoint_id = parent.checkpoint_id
        self.trace_id = parent.trace_id
        self.span_id = self._tel._random(64) or self._tel._random(64) or 1
        self.parent_span_id = parent.span_id
        self.parent_remote = False
        self.sampled = parent.sampled
        self._tracestate = parent._tracestate
        self._attributes = None
        self.step = step
        self._records = self._bytes = self._calls = self._cut_prefix = self._cut_failure = None

    def __enter__(self) -> StepSpan:
        if self._tel._step_started_on:
            self._start(StepStarted, self.step)  # reads the clock
        else:
            self.start_ns = self._tel._clock()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        tel = self._tel
        end_ns = tel._clock()
        if tel._step_finished_on:
            if exc is None:
                outcome, error_type, error_message = _OK, None, None
            else:
                outcome, error_type, error_message = _error_fields(exc)
            tel.bus.emit(
                StepFinished(  # positional, in field order (see _events.py)
                    tel.kind,
                    tel.instance,
                    self.trace_id,
                    self.span_id,
                    self.start_ns,
                    end_ns,
                    self.step,
                    self.checkpoint_id,
                    self.parent_span_id,
                    self.parent_remote,
                    self.sampled,
                    outcome,
                    error_type,
                    error_message,
                    self._attributes,
                    self._records,
                    self._bytes,
                    self._calls,
                    self._cut_prefix,
                    self._cut_failure,
                    tel.worker,
                )
            )

    def set(
        self,
        *,
        records: int | None = None,
        bytes: int | None = None,
        calls: int | None = None,
        cut_durable_prefix: int | None = None,
        cut_durable_failure: int | None = None,
    ) -> None:
        """Record the step's attributes; ``None`` leaves a value as it was."""
        if records is not None:
            if type(records) is not int or records < 0:
                _bad("records", records)
            self._records = records
        if bytes is not None:
            if type(bytes) is not int or bytes < 0:
                _bad("bytes", bytes)
            self._bytes = bytes
        if calls is not None:
            if type(calls) is not int or calls < 0:
                _bad("calls", calls)
            self._calls = calls
        if cut_durable_prefix is not None:
            if type(cut_durable_prefix) is not int or cut_durable_prefix < 0:
                _bad("cut_durable_prefix", cut_durable_prefix)
            self._cut_prefix = cut_durable_prefix
        if cut_durable_failure is not None:
            ok = type(cut_durable_failure) is int and cut_durable_failure >= 0
            self._cut_failure = (
                cut_durable_failure if ok else _bad("cut_durable_failure", cut_durable_failure)
            )


class OperationSpan(_Span):
    """A participant's operation (``gym.checkpoint.<operation>``)."""

    __slots__ = (
        "_blockers",
        "_bytes",
        "_episodes",
        "_loop_lag_ms",
        "_phase",
        "_received_ns",
        "_records",
        "_rollouts",
        "operation",
    )
    _records: int | None
    _bytes: int | None
    _blockers: int | None
    _episodes: int | None
    _rollouts: int | None

    def __init__(
        self,
        tel: Telemetry,
        operation: Operation,
        checkpoint_id: str | None,
        trace_id: int,
        parent_span_id: int | None,
        parent_remote: bool,
        sampled: bool,
        tracestate: str | None = None,
    ) -> None:
        # Identity inline, not through _identify(): this runs once per span on the request path.
        self._tel = tel
        self.checkpoint_id = checkpoint_id
        self.trace_id = trace_id
        self.span_id = tel._random(64) or tel._random(64) or 1
        self.parent_span_id = parent_span_id
        self.parent_remote = parent_remote
        self.sampled = sampled
        self._tracestate = tracestate
        self._attributes = None
        self.operation = operation
        self._records = self._bytes = self._blockers = self._episodes = self._rollouts = None
        self._phase: Phase | None = None
        self._received_ns: int | None = None
        self._loop_lag_ms: float | None = None

    def __enter__(self) -> OperationSpan:
        if self._tel._operation_started_on:
            self._start(OperationStarted, self.operation)  # reads the clock
        else:
            self.start_ns = self._tel._clock()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        tel = self._tel
        end_ns = tel._clock()
        if tel._operation_finished_on:
            if exc is None:
                outcome, error_type, error_message = _OK, None, None
            else:
                outcome, error_type, error_message = _error_fields(exc)
            tel.bus.emit(
                OperationFinished(  # positional, in field order (see _events.py)
                    tel.kind,
                    tel.instance,
                    self.trace_id,
                    self.span_id,
                    self.start_ns,
                    end_ns,
                    self.operation,
                    self.checkpoint_id,
                    self.parent_span_id,
                    self.parent_remote,
                    self.sampled,
                    outcome,
                    error_type,
                    error_message,
                    self._attributes,
                    self._phase,
                    self._blockers,
                    self._records,
                    self._bytes,
                    self._episodes,
                    self._rollouts,
                    self._received_ns,
                    self._loop_lag_ms,
                    tel.worker,
                )
            )

    def step(self, step: Step | str) -> StepSpan:
        """A child span for one step of this operation."""
        if not self._tel._step_on:
            return self._tel._no_step(step)
        try:
            member = _STEPS[step]
        except (KeyError, TypeError):
            member = coerce(Step, step)  # raises UnknownNameError naming the valid steps
        return StepSpan(self, member)

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
        """Record the operation's attributes; ``None`` leaves a value as it was."""
        if records is not None:
            if type(records) is not int or records < 0:
                _bad("records", records)
            self._records = records
        if bytes is not None:
            if type(bytes) is not int or bytes < 0:
                _bad("bytes", bytes)
            self._bytes = bytes
        if blockers is not None:
            self._blockers = (
                blockers if type(blockers) is int and blockers >= 0 else _bad("blockers", blockers)
            )
        if episodes is not None:
            self._episodes = (
                episodes if type(episodes) is int and episodes >= 0 else _bad("episodes", episodes)
            )
        if rollouts is not None:
            self._rollouts = (
                rollouts if type(rollouts) is int and rollouts >= 0 else _bad("rollouts", rollouts)
            )
        if phase is not None:
            self._phase = _PHASES.get(phase) or coerce(Phase, phase)
        if received_ns is not None:
            if type(received_ns) is not int or received_ns < 0:
                _bad("received_ns", received_ns)
            self._received_ns = received_ns
        if loop_lag_ms is not None:
            if type(loop_lag_ms) not in (int, float) or not loop_lag_ms >= 0:
                raise InvalidArgumentError(f"loop_lag_ms must be a number >= 0, not {loop_lag_ms!r}")
            self._loop_lag_ms = float(loop_lag_ms)
