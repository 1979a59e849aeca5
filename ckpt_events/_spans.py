"""Live span handles that ``Telemetry`` returns while some sink listens.

Each handle is a context manager: entering reads the clock, makes ids and emits a
``*Started`` event (if wanted); leaving emits the ``*Finished`` event with what ``set``
recorded. An exception leaving the block records outcome ``error`` and the exception
type, and propagates. The no-op twins in ``_noop.py`` are returned when nobody listens.
"""

from __future__ import annotations

from time import time_ns
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

from ckpt_events._errors import InvalidArgumentError
from ckpt_events._events import (
    AttributeValue,
    CollectionAction,
    CollectionFinished,
    CollectionStarted,
    CoordinateFinished,
    CoordinateStarted,
    OperationFinished,
    OperationStarted,
    StageFinished,
    StageStarted,
    StepFinished,
    StepStarted,
)
from ckpt_events._tracecontext import format_traceparent, new_span_id
from ckpt_events._vocab import Kind, Operation, Outcome, Phase, Step, coerce

if TYPE_CHECKING:
    from ckpt_events._telemetry import Telemetry

__all__ = ["CollectionSpan", "CoordinateSpan", "OperationSpan", "StageSpan", "StepSpan"]

_MAX_MESSAGE: Final = 1024


class _Span:
    """Identity, timing and extra attributes shared by every live span handle."""

    __slots__ = (
        "_attributes",
        "_error_message",
        "_error_type",
        "_outcome",
        "_tel",
        "checkpoint_id",
        "parent_remote",
        "parent_span_id",
        "sampled",
        "span_id",
        "start_ns",
        "trace_id",
    )

    def __init__(
        self,
        tel: Telemetry,
        checkpoint_id: str | None,
        trace_id: int,
        parent_span_id: int | None,
        parent_remote: bool,
        sampled: bool,
    ) -> None:
        self._tel = tel
        self.checkpoint_id = checkpoint_id
        self.trace_id = trace_id
        self.span_id = new_span_id()
        self.parent_span_id = parent_span_id
        self.parent_remote = parent_remote
        self.sampled = sampled
        self.start_ns = 0
        self._attributes: dict[str, AttributeValue] | None = None
        self._outcome = Outcome.OK
        self._error_type: str | None = None
        self._error_message: str | None = None

    def traceparent(self) -> str | None:
        """The W3C ``traceparent`` for an outgoing call made inside this span."""
        return format_traceparent(self.trace_id, self.span_id, self.sampled)

    def set_attribute(self, name: str, value: AttributeValue) -> None:
        """Attach an extra attribute; sinks apply the redaction rule to it."""
        if not isinstance(name, str) or not isinstance(value, str | bool | int | float):
            raise InvalidArgumentError(
                f"an attribute needs a str name and a str, bool, int or float value, not {name!r}={value!r}"
            )
        if self._attributes is None:
            self._attributes = {}
        self._attributes[name] = value

    def _common(self) -> dict[str, Any]:
        tel = self._tel
        return {
            "kind": tel.kind,
            "instance": tel.instance,
            "checkpoint_id": self.checkpoint_id,
            "trace_id": self.trace_id,
            "span_id": self.span_id,
            "parent_span_id": self.parent_span_id,
            "parent_remote": self.parent_remote,
            "sampled": self.sampled,
            "start_ns": self.start_ns,
        }

    def _finish(self, exc: BaseException | None) -> dict[str, Any]:
        fields = self._common()
        fields["end_ns"] = time_ns()
        fields["attributes"] = self._attributes
        if exc is not None:
            fields["outcome"] = Outcome.ERROR
            fields["error_type"] = _qualified_name(type(exc))
            fields["error_message"] = str(exc)[:_MAX_MESSAGE]
        return fields

    def _start(self) -> None:
        self.start_ns = time_ns()

    def _child_ids(self) -> tuple[int, int, bool]:
        return self.trace_id, self.span_id, self.sampled


def _qualified_name(cls: type) -> str:
    module = cls.__module__
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"


class StepSpan(_Span):
    """A step (``wait_ready``, ``export``, ...) inside an operation span."""

    __slots__ = ("_fields", "step")

    def __init__(self, parent: OperationSpan, step: Step) -> None:
        super().__init__(
            parent._tel, parent.checkpoint_id, parent.trace_id, parent.span_id, False, parent.sampled
        )
        self.step = step
        self._fields: dict[str, Any] = {}

    def __enter__(self) -> StepSpan:
        self._start()
        if StepStarted in self._tel.bus._routes:
            self._tel.bus.emit(StepStarted(step=self.step, **self._common()))
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if StepFinished in self._tel.bus._routes:
            self._tel.bus.emit(StepFinished(step=self.step, **self._fields, **self._finish(exc)))

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
        _put_ints(
            self._fields,
            records=records,
            bytes=bytes,
            calls=calls,
            cut_durable_prefix=cut_durable_prefix,
            cut_durable_failure=cut_durable_failure,
        )


class OperationSpan(_Span):
    """A participant's operation (``gym.checkpoint.<operation>``)."""

    __slots__ = ("_fields", "operation")

    def __init__(
        self,
        tel: Telemetry,
        operation: Operation,
        checkpoint_id: str | None,
        trace_id: int,
        parent_span_id: int | None,
        parent_remote: bool,
        sampled: bool,
    ) -> None:
        super().__init__(tel, checkpoint_id, trace_id, parent_span_id, parent_remote, sampled)
        self.operation = operation
        self._fields: dict[str, Any] = {}

    def __enter__(self) -> OperationSpan:
        self._start()
        if OperationStarted in self._tel.bus._routes:
            self._tel.bus.emit(OperationStarted(operation=self.operation, **self._common()))
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if OperationFinished in self._tel.bus._routes:
            self._tel.bus.emit(
                OperationFinished(operation=self.operation, **self._fields, **self._finish(exc))
            )

    def step(self, step: Step | str) -> StepSpan:
        """A child span for one step of this operation."""
        return StepSpan(self, coerce(Step, step))

    def set(
        self,
        *,
        records: int | None = None,
        bytes: int | None = None,
        phase: Phase | str | None = None,
        blockers: int | None = None,
        episodes: int | None = None,
        rollouts: int | None = None,
    ) -> None:
        """Record the operation's attributes; ``None`` leaves a value as it was."""
        _put_ints(
            self._fields,
            records=records,
            bytes=bytes,
            blockers=blockers,
            episodes=episodes,
            rollouts=rollouts,
        )
        if phase is not None:
            self._fields["phase"] = coerce(Phase, phase)


class StageSpan(_Span):
    """One prepare stage of the controller (``gym.checkpoint.coordinate.prepare.<kind>``)."""

    __slots__ = ("_participants", "stage")

    def __init__(self, parent: CoordinateSpan, stage: Kind) -> None:
        super().__init__(
            parent._tel, parent.checkpoint_id, parent.trace_id, parent.span_id, False, parent.sampled
        )
        self.stage = stage
        self._participants: int | None = None

    def __enter__(self) -> StageSpan:
        self._start()
        if StageStarted in self._tel.bus._routes:
            self._tel.bus.emit(StageStarted(stage=self.stage, **self._common()))
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if StageFinished in self._tel.bus._routes:
            self._tel.bus.emit(
                StageFinished(stage=self.stage, participants=self._participants, **self._finish(exc))
            )

    def set(self, *, participants: int | None = None) -> None:
        """Record how many participants this stage has."""
        if participants is not None:
            self._participants = _int("participants", participants)


class CoordinateSpan(_Span):
    """The controller's ``gym.checkpoint.coordinate.<operation>``."""

    __slots__ = ("_fields", "operation")

    def __init__(
        self,
        tel: Telemetry,
        operation: Operation,
        checkpoint_id: str | None,
        trace_id: int,
        parent_span_id: int | None,
        parent_remote: bool,
        sampled: bool,
    ) -> None:
        super().__init__(tel, checkpoint_id, trace_id, parent_span_id, parent_remote, sampled)
        self.operation = operation
        self._fields: dict[str, Any] = {}

    def __enter__(self) -> CoordinateSpan:
        self._start()
        if CoordinateStarted in self._tel.bus._routes:
            self._tel.bus.emit(CoordinateStarted(operation=self.operation, **self._common()))
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if CoordinateFinished in self._tel.bus._routes:
            self._tel.bus.emit(
                CoordinateFinished(operation=self.operation, **self._fields, **self._finish(exc))
            )

    def stage(self, stage: Kind | str) -> StageSpan:
        """A child span for one prepare stage (a participant kind)."""
        return StageSpan(self, coerce(Kind, stage))

    def set(
        self,
        *,
        participants: int | None = None,
        prepared: bool | None = None,
        stopped_at: Kind | str | None = None,
        episodes: int | None = None,
        rollouts: int | None = None,
    ) -> None:
        """Record the coordinate operation's attributes; ``None`` leaves a value as it was."""
        _put_ints(self._fields, participants=participants, episodes=episodes, rollouts=rollouts)
        if prepared is not None:
            self._fields["prepared"] = bool(prepared)
        if stopped_at is not None:
            self._fields["stopped_at"] = coerce(Kind, stopped_at)


class CollectionSpan(_Span):
    """Rollout collection's ``gym.checkpoint.collection.checkpoint`` or ``.restore``."""

    __slots__ = ("_fields", "action")

    def __init__(
        self,
        tel: Telemetry,
        action: CollectionAction,
        checkpoint_id: str | None,
        trace_id: int,
        parent_span_id: int | None,
        parent_remote: bool,
        sampled: bool,
    ) -> None:
        super().__init__(tel, checkpoint_id, trace_id, parent_span_id, parent_remote, sampled)
        self.action: CollectionAction = action
        self._fields: dict[str, Any] = {}

    def __enter__(self) -> CollectionSpan:
        self._start()
        if CollectionStarted in self._tel.bus._routes:
            self._tel.bus.emit(CollectionStarted(action=self.action, **self._common()))
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if CollectionFinished in self._tel.bus._routes:
            self._tel.bus.emit(CollectionFinished(action=self.action, **self._fields, **self._finish(exc)))

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
        """Record the collection span's attributes; ``None`` leaves a value as it was."""
        if checkpoint_id is not None:
            self.checkpoint_id = checkpoint_id
        _put_ints(self._fields, in_flight=in_flight, rows=rows, restarts=restarts)
        if stop is not None:
            self._fields["stop"] = bool(stop)
        if published is not None:
            self._fields["published"] = bool(published)


def _int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgumentError(f"{name} must be an int >= 0, not {value!r}")
    return value


def _put_ints(fields: dict[str, Any], **values: int | None) -> None:
    for name, value in values.items():
        if value is not None:
            fields[name] = _int(name, value)
