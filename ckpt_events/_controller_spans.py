"""Live span handles of the controller: coordinate operations, prepare stages, collection.

Slot-based classes that build their ``*Finished`` event when they end (the controller is
not a request path that needs ``_span_handles.py``'s deferred events); kept apart so each
module reads in one sitting.
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Final, NoReturn

from ckpt_events._errors import InvalidValueError
from ckpt_events._events import (
    CollectionFinished,
    CollectionStarted,
    CoordinateFinished,
    CoordinateStarted,
    StageFinished,
    StageStarted,
)
from ckpt_events._frozen_attrs import FrozenAttributes
from ckpt_events._public_home import publish
from ckpt_events._span_base import (
    _INT64,
    _NOT_STARTED,
    _OK,
    _bad,
    _checked_id,
    _error_fields,
    _SpanBase,
    anchor_of,
)
from ckpt_events._vocab import KIND_NAMES, CollectionAction, Kind, Operation, kind_name

if TYPE_CHECKING:
    from ckpt_events._telemetry import Telemetry

__all__ = ["CollectionSpan", "CoordinateSpan", "StageSpan"]

#: The one operation with stages, read as a global: ``Operation.PREPARE`` is an attribute lookup on
#: the enum class, which allocated on the off path (a disabled ``coordinate().stage()`` must not).
_PREPARE: Final = Operation.PREPARE


class _Span(_SpanBase):
    """The slot layout of the controller's span handles (``_controller_spans.py``)."""

    __slots__ = (
        "_attributes",
        "_mono_ns",
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
        self._attributes = None
        self.start_ns = _NOT_STARTED  # until entered: leaving before that raises (_seal)
        self._mono_ns = 0  # until entered: the offset it starts on (anchor_of), 0: the process's


def _not_a_stage(operation: str) -> NoReturn:
    raise InvalidValueError(
        f"stage() nests under coordinate.prepare only (its span is coordinate.prepare.<kind>), "
        f"not coordinate.{operation}: call the participants of a {operation} under the coordinate "
        "span itself"
    )


class StageSpan(_Span):
    """One prepare stage of the controller (``gym.checkpoint.coordinate.prepare.<kind>``)."""

    __slots__ = ("_participants", "stage")

    def __init__(self, parent: CoordinateSpan, stage: str) -> None:
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
        self.start_ns = _NOT_STARTED  # until entered: leaving before that raises (_seal)
        self._mono_ns = anchor_of(parent)  # until entered: its coordinate's offset (see there)
        self.stage = stage
        self._participants: int | None = None

    def __enter__(self) -> StageSpan:
        if self._attributes.__class__ is FrozenAttributes:
            return self  # ended: a handle is one span
        self._start(StageStarted, self.stage)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self._seal(self.stage):
            return  # ended already: one event per span id
        tel = self._tel
        end_ns = self._end_time()
        if StageFinished in tel.bus._routes:
            if exc is None:
                outcome, error_type, error_message = _OK, None, None
            else:
                outcome, error_type, error_message = _error_fields(exc)
            tel.bus.emit(
                StageFinished(  # positional, in field order (see _events.py)
                    tel.kind,
                    tel.instance,
                    self.trace_id,
                    self.span_id,
                    self.start_ns,
                    end_ns,
                    self.stage,
                    self.checkpoint_id,
                    self.parent_span_id,
                    self.parent_remote,
                    self.sampled,
                    outcome,
                    error_type,
                    error_message,
                    self._attributes or None,
                    self._participants,
                    tel.worker,
                    self._tracestate,
                )
            )

    def set(self, *, participants: int | None = None) -> None:
        """Record how many participants this stage has."""
        if participants is not None:
            if type(participants) is not int or not 0 <= participants < _INT64:
                _bad("participants", participants)
            self._participants = participants


class CoordinateSpan(_Span):
    """The controller's ``gym.checkpoint.coordinate.<operation>``."""

    __slots__ = ("_episodes", "_participants", "_prepared", "_rollouts", "_stopped_at", "operation")
    _participants: int | None
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
        self._identify(tel, checkpoint_id, trace_id, parent_span_id, parent_remote, sampled, tracestate)
        self.operation = operation
        self._participants = None
        self._episodes = None
        self._rollouts = None
        self._prepared: bool | None = None
        self._stopped_at: str | None = None

    def __enter__(self) -> CoordinateSpan:
        if self._attributes.__class__ is FrozenAttributes:
            return self  # ended: a handle is one span
        self._start(CoordinateStarted, self.operation)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self._seal(self.operation):
            return  # ended already: one event per span id
        tel = self._tel
        end_ns = self._end_time()
        if CoordinateFinished in tel.bus._routes:
            if exc is None:
                outcome, error_type, error_message = _OK, None, None
            else:
                outcome, error_type, error_message = _error_fields(exc)
            tel.bus._emit_closing(  # what closes a trace's part: not held by a batch interval
                CoordinateFinished(  # positional, in field order (see _events.py)
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
                    self._attributes or None,
                    self._participants,
                    self._prepared,
                    self._stopped_at,
                    self._episodes,
                    self._rollouts,
                    tel.worker,
                    self._tracestate,
                    self._mono_ns,  # still the monotonic start: _end_time reads, never writes it
                )
            )

    def stage(self, stage: Kind | str) -> StageSpan:
        """A child span for one prepare stage: a participant kind (any valid name, as ``Telemetry``'s).
        Only a ``coordinate.prepare`` has stages (SPEC: ``coordinate.prepare.<kind>``, child of
        coordinate.prepare): a stage of a commit was written with no operation of its own, and
        the report named it ``coordinate.prepare.<kind>``."""
        if self.operation is not _PREPARE:
            _not_a_stage(self.operation)
        try:
            name = KIND_NAMES[stage]
        except (KeyError, TypeError):
            name = kind_name(stage)
        return StageSpan(self, name)

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
        if participants is not None:
            if type(participants) is not int or not 0 <= participants < _INT64:
                _bad("participants", participants)
            self._participants = participants
        if episodes is not None:
            self._episodes = (
                episodes if type(episodes) is int and episodes >= 0 else _bad("episodes", episodes)
            )
        if rollouts is not None:
            self._rollouts = (
                rollouts if type(rollouts) is int and rollouts >= 0 else _bad("rollouts", rollouts)
            )
        if prepared is not None:
            self._prepared = bool(prepared)
        if stopped_at is not None:
            self._stopped_at = kind_name(stopped_at)


class CollectionSpan(_Span):
    """Rollout collection's ``gym.checkpoint.collection.checkpoint`` or ``.restore``."""

    __slots__ = ("_in_flight", "_published", "_restarts", "_rows", "_stop", "action")
    _in_flight: int | None
    _rows: int | None
    _restarts: int | None

    def __init__(
        self,
        tel: Telemetry,
        action: CollectionAction,
        checkpoint_id: str | None,
        trace_id: int,
        parent_span_id: int | None,
        parent_remote: bool,
        sampled: bool,
        tracestate: str | None = None,
    ) -> None:
        self._identify(tel, checkpoint_id, trace_id, parent_span_id, parent_remote, sampled, tracestate)
        self.action: CollectionAction = action
        self._in_flight = None
        self._rows = None
        self._restarts = None
        self._stop: bool | None = None
        self._published: bool | None = None

    def __enter__(self) -> CollectionSpan:
        if self._attributes.__class__ is FrozenAttributes:
            return self  # ended: a handle is one span
        self._start(CollectionStarted, self.action)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self._seal(self.action):
            return  # ended already: one event per span id
        tel = self._tel
        end_ns = self._end_time()
        if CollectionFinished in tel.bus._routes:
            if exc is None:
                outcome, error_type, error_message = _OK, None, None
            else:
                outcome, error_type, error_message = _error_fields(exc)
            tel.bus._emit_closing(  # what closes a trace's part: not held by a batch interval
                CollectionFinished(  # positional, in field order (see _events.py)
                    tel.kind,
                    tel.instance,
                    self.trace_id,
                    self.span_id,
                    self.start_ns,
                    end_ns,
                    self.action,
                    self.checkpoint_id,
                    self.parent_span_id,
                    self.parent_remote,
                    self.sampled,
                    outcome,
                    error_type,
                    error_message,
                    self._attributes or None,
                    self._in_flight,
                    self._stop,
                    self._published,
                    self._rows,
                    self._restarts,
                    tel.worker,
                    self._tracestate,
                )
            )

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
            self.checkpoint_id = _checked_id(checkpoint_id)
        if in_flight is not None:
            self._in_flight = (
                in_flight if type(in_flight) is int and in_flight >= 0 else _bad("in_flight", in_flight)
            )
        if rows is not None:
            if type(rows) is not int or not 0 <= rows < _INT64:
                _bad("rows", rows)
            self._rows = rows
        if restarts is not None:
            self._restarts = (
                restarts if type(restarts) is int and restarts >= 0 else _bad("restarts", restarts)
            )
        if stop is not None:
            self._stop = bool(stop)
        if published is not None:
            self._published = bool(published)


# Pickles, reprs and tracebacks name the public module (_public_home.py says why).
publish("ckpt_events", CollectionSpan, CoordinateSpan, StageSpan)
