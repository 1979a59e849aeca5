"""Live span handles that ``Telemetry`` returns while some sink listens.

Each handle is a context manager: entering reads the clocks (the wall clock for the start, the
monotonic one beside it) and emits a ``*Started`` event (if wanted); leaving reads the monotonic
clock again, keeps the span's duration (the end is the start plus it) and queues the handle
itself where its ``*Finished`` event is routed. Each sink's delivery task turns the handle into
that event (built once, shared by every sink), so the request path never builds an event. An exception leaving
the block records outcome ``error`` and the exception type, and propagates. Call ``set``
and ``set_attribute`` inside the block: a ``set_attribute`` after it has ended is ignored
(the attributes are frozen at the end, ``FrozenAttributes``), a ``set`` may or may not reach
the event. A handle ends once: entering or leaving it again does nothing. Leaving one never
entered raises ``SpanNotStartedError`` and emits nothing (it has no start; OpenTelemetry's SDK
raises on ``end()`` of a span not started too). The no-op twins in ``_noop.py`` are returned
when nobody listens.

One buffer on a bus may take the handles raw (``_Buffer.raw``: the export process's, which
encodes them itself, ``sinks/_export/wire.py``): it gets the handle in place of its
``*Started`` event as well (see ``RAW_SEQUENCE``), so a server whose sinks all run in that
process builds no event at all on the request path or in its delivery task.

This is the request path of an instrumented server, so it is written for speed: the
operation and step handles are msgspec structs built positionally in C, untracked by the
garbage collector (they hold no reference cycle: ids, clock reads, names and scalars; the
bus holds them only until delivery), and ``set`` checks each value inline.

What a handle keeps until its delivery costs as much as what it does: on a loaded server the
handles queued for a batch interval are out of the CPU's caches when their batch is freed, and
each object freed then is a cache miss. Measured with the ``server`` suite's request (three
spans) under load, a sink that does nothing with the handles cost the server +10.8 us a request
against +5.4 us for the same handles dropped at their end. So a handle keeps one int for its
timing once ended (``_mono_ns`` becomes the duration) and its end mark is its ``_wire`` itself.
"""

from __future__ import annotations

import itertools
import math
from time import monotonic_ns
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

import msgspec

from ckpt_events._errors import argument_error, shown
from ckpt_events._events import AttributeValue, OperationFinished, OperationStarted, StepFinished, StepStarted
from ckpt_events._frozen_attrs import ENDED, FrozenAttributes
from ckpt_events._logs import library_logger
from ckpt_events._public_home import publish
from ckpt_events._span_base import _INT64, _NOT_STARTED, _OK, _bad, _error_fields, _not_started, _SpanBase
from ckpt_events._vocab import STEP_NAMES, Operation, Outcome, Phase, Step, coerce, step_name
from ckpt_events._wallclock import CALIBRATION

if TYPE_CHECKING:
    from ckpt_events._telemetry import Telemetry
else:
    # msgspec resolves the ``_tel`` annotations when asked for a handle's signature, so
    # help(ckpt_events) and pydoc raised NameError; importing Telemetry here is a cycle.
    Telemetry = Any

__all__ = ["OperationSpan", "StepSpan"]

_PHASES: Final = {p.value: p for p in Phase}
logger: Final = library_logger("ckpt_events")


#: The classes whose instances are queued in place of their ``*Finished`` event (each
#: subscription's delivery task turns them into it with ``_finished()``), and those events.
QUEUED_HANDLES: Final[set[type]] = set()
QUEUED_EVENTS: Final = frozenset((OperationFinished, StepFinished))


#: Numbers for the bus's one raw buffer (``_Buffer.raw``, the export process's), which gets a
#: handle itself at ``__enter__`` in place of a ``*Started`` event and, at ``__exit__``, either
#: the handle again or an end mark. A handle queued there as its start takes the next number as
#: its ``_wire`` (0: no start queued there, not wanted or the buffer was full). The buffer's task
#: draws a number as it takes a batch (``_Buffer.consumed``, before the first ``popleft``). At
#: its end, a handle whose ``_wire`` is above that number has its start still in the buffer, so
#: its fields are read there after it ended: the end is queued as ``_wire`` itself, an int that
#: names that record (``sinks/_export/wire.py``). Else the handle goes again, all its fields
#: with it. Read across threads this still holds: a handle writes its duration before it reads
#: ``consumed``, the task writes ``consumed`` before it reads the batch, so at least one of them
#: sees the other's write (an end written twice, never an end lost). One sequence for every
#: buffer (``_Buffer.opened`` drawn as it was made): a span started before the raw buffer it
#: ends in existed goes whole, numbered 0, its end alone.
RAW_SEQUENCE: Final = itertools.count(1)


#: Whether a step of an operation never entered was said (once a process, by ``_unentered``).
_SAID_UNENTERED: Final[list[bool]] = []


def _unentered(operation: Operation, step: str) -> None:
    """Say once that a step was made of an operation not entered: ``op = tel.operation(...)``
    without ``with`` recorded its steps, children of a span that is never recorded, and nothing
    of its own (its ``set()`` lost), without a word."""
    _SAID_UNENTERED.append(True)
    logger.warning(
        "step %r made of a %s operation not entered (yet): one never entered records nothing "
        "(its set() is lost) and its steps have no parent in the trace; open it with "
        "`with tel.operation(...) as op:` before its steps (said once)",
        step,
        operation.value,
    )


class _Queued:
    """Marks a handle class queued in place of its event; it and its subclasses register."""

    __slots__ = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        QUEUED_HANDLES.add(cls)


class StepSpan(_SpanBase, _Queued, msgspec.Struct, gc=False, array_like=True, tag="step"):
    """A step (``wait_ready``, ``export``, a user's ``upload``, ...) inside an operation span."""

    # Fields in the order Telemetry builds them (positional), then what __enter__,
    # __exit__ and set() fill in. Underscored: not part of the public API.
    _tel: Telemetry
    step: str
    checkpoint_id: str | None
    trace_id: int
    span_id: int
    parent_span_id: int | None
    sampled: bool
    _tracestate: str | None
    parent_remote: bool = False
    start_ns: int = _NOT_STARTED  # until entered: leaving before that raises
    # The monotonic clock at the start; once ended, the span's duration (the end is start_ns
    # plus it): one int kept per span until delivery, not two (see the module's note).
    _mono_ns: int = 0
    _attributes: dict[str, AttributeValue] | None = None
    _outcome: Outcome = _OK
    _error_type: str | None = None
    _error_message: str | None = None
    _records: int | None = None
    _bytes: int | None = None
    _calls: int | None = None
    _cut_prefix: int | None = None
    _cut_failure: int | None = None
    _event: StepFinished | None = None
    _wire: int = 0  # its start's number in the raw buffer, or 0: see RAW_SEQUENCE

    def __enter__(self) -> StepSpan:
        if self.start_ns != _NOT_STARTED:
            return self  # entered already, or ended: a handle is one span (no second start)
        tel = self._tel
        # _SpanBase._start inline, with the route Telemetry keeps (a call and a routing-table
        # lookup per span cost ~0.1 us more).
        if tel._calibrated:  # the default clocks: one monotonic read, on the process's offset
            mono_ns = monotonic_ns()
            anchor = self._mono_ns  # until started: its local parent's offset (anchor_of), or 0
            if anchor:
                start_ns = mono_ns + anchor
            else:
                start_ns = (
                    mono_ns + CALIBRATION.offset
                    if mono_ns < CALIBRATION.due
                    else CALIBRATION.recalibrate(mono_ns)
                )
        else:  # clocks the caller gave (clock=, monotonic=): each read as given
            start_ns = tel._clock()
            monotonic = tel._monotonic
            mono_ns = start_ns if monotonic is None else monotonic()
        if self.start_ns != _NOT_STARTED:
            return self  # another thread entered it during the calls above: see _SpanBase._start
        self.start_ns = start_ns
        self._mono_ns = mono_ns
        route = tel._step_started_route
        if route:
            event = StepStarted(  # positional, in field order (see _events.py)
                tel.kind,
                tel.instance,
                self.trace_id,
                self.span_id,
                start_ns,
                self.step,
                self.checkpoint_id,
                self.parent_span_id,
                self.parent_remote,
                self.sampled,
                tel.worker,
                self._tracestate,
            )
            for buffer in route:  # as Bus.emit offers an event
                if len(buffer) < buffer.capacity:
                    buffer.append(event)
                    if buffer.waiting:
                        tel.bus._wake(buffer)
                else:
                    buffer.dropped += 1
        raw = tel._step_started_raw
        if raw is not None and not self._wire:  # inline, as the route above (see RAW_SEQUENCE)
            if len(raw) < raw.capacity:
                self._wire = next(RAW_SEQUENCE)  # before the append: the task may take it at once
                raw.append(self)
                if raw.waiting:
                    tel.bus._wake(raw)
            else:
                raw.dropped += 1
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        attributes = self._attributes
        if attributes.__class__ is FrozenAttributes:
            return  # ended already: queued once, never a second event with this span id
        start_ns = self.start_ns
        if start_ns == _NOT_STARTED:
            _not_started(self, self.step)  # raises: a span from 1970 is no span
        if attributes:
            frozen = FrozenAttributes(attributes)
            if self._attributes is not attributes:
                return  # another thread ended it during the call above: see _SpanBase._seal
            self._attributes = frozen
        else:  # no call since the test above: no other thread ran (see _SpanBase._seal)
            self._attributes = ENDED
        tel = self._tel
        monotonic = tel._monotonic  # inline _SpanBase._end_time(): a call costs as much again
        if exc is not None:
            outcome, error_type, error_message = _error_fields(exc)
            self._outcome = outcome
            self._error_type = error_type
            self._error_message = error_message
        # Last: a consumer on another thread reading the duration finds the rest set.
        self._mono_ns = (tel._clock() if monotonic is None else monotonic()) - self._mono_ns
        for buffer in tel._step_route:  # as Bus.emit offers an event (inline: per span)
            if len(buffer) < buffer.capacity:
                buffer.append(self)
                if buffer.waiting:
                    tel.bus._wake(buffer)
            else:
                buffer.dropped += 1
        raw = tel._step_finished_raw
        if raw is not None:  # its end mark while its start waits there, else itself: RAW_SEQUENCE
            if len(raw) < raw.capacity:
                wire = self._wire
                if wire > raw.consumed:
                    raw.append(wire)  # the very int: nothing allocated, nothing more kept
                else:
                    if wire < raw.opened:  # started before this buffer was: its end alone
                        self._wire = 0
                    raw.append(self)
                if raw.waiting:
                    tel.bus._wake(raw)
            else:
                raw.dropped += 1

    def _started(self) -> StepStarted:
        """This step's start event, as ``__enter__`` builds it for the routes that take events."""
        tel = self._tel
        return step_started(self, tel.kind, tel.instance, tel.worker)

    def _finished(self) -> StepFinished:
        """This step's event (built on the first call, by a sink's delivery task)."""
        event = self._event
        if event is None:
            tel = self._tel
            event = self._event = step_finished(self, tel.kind, tel.instance, tel.worker)
        return event

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
            if type(records) is not int or not 0 <= records < _INT64:
                _bad("records", records)
            self._records = records
        if bytes is not None:
            if type(bytes) is not int or not 0 <= bytes < _INT64:
                _bad("bytes", bytes)
            self._bytes = bytes
        if calls is not None:
            if type(calls) is not int or not 0 <= calls < _INT64:
                _bad("calls", calls)
            self._calls = calls
        if cut_durable_prefix is not None:
            if type(cut_durable_prefix) is not int or not 0 <= cut_durable_prefix < _INT64:
                _bad("cut_durable_prefix", cut_durable_prefix)
            self._cut_prefix = cut_durable_prefix
        if cut_durable_failure is not None:
            if type(cut_durable_failure) is not int or not 0 <= cut_durable_failure < _INT64:
                _bad("cut_durable_failure", cut_durable_failure)
            self._cut_failure = cut_durable_failure


class OperationSpan(_SpanBase, _Queued, msgspec.Struct, gc=False, array_like=True, tag="operation"):
    """A participant's operation (``gym.checkpoint.<operation>``)."""

    _tel: Telemetry
    operation: Operation
    checkpoint_id: str | None
    trace_id: int
    span_id: int
    parent_span_id: int | None
    parent_remote: bool
    sampled: bool
    _tracestate: str | None = None
    start_ns: int = _NOT_STARTED  # until entered: leaving before that raises
    # The monotonic clock at the start; once ended, the span's duration (the end is start_ns
    # plus it): one int kept per span until delivery, not two (see the module's note).
    _mono_ns: int = 0
    _attributes: dict[str, AttributeValue] | None = None
    _outcome: Outcome = _OK
    _error_type: str | None = None
    _error_message: str | None = None
    _phase: Phase | None = None
    _blockers: int | None = None
    _records: int | None = None
    _bytes: int | None = None
    _episodes: int | None = None
    _rollouts: int | None = None
    _received_ns: int | None = None
    _loop_lag_ms: float | None = None
    _event: OperationFinished | None = None
    _wire: int = 0  # its start's number in the raw buffer, or 0: see RAW_SEQUENCE

    def __enter__(self) -> OperationSpan:
        if self.start_ns != _NOT_STARTED:
            return self  # entered already, or ended: a handle is one span (no second start)
        tel = self._tel
        # _SpanBase._start inline, as StepSpan.__enter__.
        if tel._calibrated:  # the default clocks: one monotonic read, on the process's offset
            mono_ns = monotonic_ns()
            anchor = self._mono_ns  # until started: its local parent's offset (anchor_of), or 0
            if anchor:
                start_ns = mono_ns + anchor
            else:
                start_ns = (
                    mono_ns + CALIBRATION.offset
                    if mono_ns < CALIBRATION.due
                    else CALIBRATION.recalibrate(mono_ns)
                )
        else:  # clocks the caller gave (clock=, monotonic=): each read as given
            start_ns = tel._clock()
            monotonic = tel._monotonic
            mono_ns = start_ns if monotonic is None else monotonic()
        if self.start_ns != _NOT_STARTED:
            return self  # another thread entered it during the calls above: see _SpanBase._start
        self.start_ns = start_ns
        self._mono_ns = mono_ns
        route = tel._operation_started_route
        if route:
            event = OperationStarted(  # positional, in field order (see _events.py)
                tel.kind,
                tel.instance,
                self.trace_id,
                self.span_id,
                start_ns,
                self.operation,
                self.checkpoint_id,
                self.parent_span_id,
                self.parent_remote,
                self.sampled,
                tel.worker,
                self._tracestate,
            )
            for buffer in route:  # as Bus.emit offers an event
                if len(buffer) < buffer.capacity:
                    buffer.append(event)
                    if buffer.waiting:
                        tel.bus._wake(buffer)
                else:
                    buffer.dropped += 1
        raw = tel._operation_started_raw
        if raw is not None and not self._wire:  # inline, as the route above (see RAW_SEQUENCE)
            if len(raw) < raw.capacity:
                self._wire = next(RAW_SEQUENCE)  # before the append: the task may take it at once
                raw.append(self)
                if raw.waiting:
                    tel.bus._wake(raw)
            else:
                raw.dropped += 1
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        attributes = self._attributes
        if attributes.__class__ is FrozenAttributes:
            return  # ended already: queued once, never a second event with this span id
        start_ns = self.start_ns
        if start_ns == _NOT_STARTED:
            _not_started(self, self.operation)  # raises: a span from 1970 is no span
        if attributes:
            frozen = FrozenAttributes(attributes)
            if self._attributes is not attributes:
                return  # another thread ended it during the call above: see _SpanBase._seal
            self._attributes = frozen
        else:  # no call since the test above: no other thread ran (see _SpanBase._seal)
            self._attributes = ENDED
        tel = self._tel
        monotonic = tel._monotonic  # inline _SpanBase._end_time(): a call costs as much again
        if exc is not None:
            outcome, error_type, error_message = _error_fields(exc)
            self._outcome = outcome
            self._error_type = error_type
            self._error_message = error_message
        # Last: a consumer on another thread reading the duration finds the rest set.
        self._mono_ns = (tel._clock() if monotonic is None else monotonic()) - self._mono_ns
        for buffer in tel._operation_route:  # as Bus.emit offers an event (inline: per span)
            if len(buffer) < buffer.capacity:
                buffer.append(self)
                if buffer.waiting:
                    tel.bus._wake(buffer)
                elif buffer.paused:  # a finished operation does not wait out a batch interval
                    tel.bus._prompt(buffer)
            else:
                buffer.dropped += 1
        raw = tel._operation_finished_raw
        if raw is not None:  # as a step's, above
            if len(raw) < raw.capacity:
                wire = self._wire
                if wire > raw.consumed:
                    raw.append(wire)  # the very int: nothing allocated, nothing more kept
                else:
                    if wire < raw.opened:  # started before this buffer was: its end alone
                        self._wire = 0
                    raw.append(self)
                if raw.waiting:
                    tel.bus._wake(raw)
                elif raw.paused:
                    tel.bus._prompt(raw)
            else:
                raw.dropped += 1

    def _started(self) -> OperationStarted:
        """This operation's start event, as ``__enter__`` builds it for the routes that take events."""
        tel = self._tel
        return operation_started(self, tel.kind, tel.instance, tel.worker)

    def _finished(self) -> OperationFinished:
        """This operation's event (built on the first call, by a sink's delivery task)."""
        event = self._event
        if event is None:
            tel = self._tel
            event = self._event = operation_finished(self, tel.kind, tel.instance, tel.worker)
        return event

    def step(self, step: Step | str) -> StepSpan:
        """A child span for one step of this operation: a ``Step`` or any name of
        ``ckpt_events.vocab.NAME_RULE``'s shape (else ``InvalidValueError``/``InvalidTypeError``)."""
        tel = self._tel
        if not tel._step_on:
            return tel._no_step(step, self)
        try:
            name = STEP_NAMES[step]
        except (KeyError, TypeError):
            name = step_name(step)  # raises naming the rule
        # anchor_of(self) inline (a call per step costs ~0.06 us): the offset this operation
        # started on, so a step begun after a wall-clock step is stamped inside it.
        start = self.start_ns
        mono = self._mono_ns  # read before the test below: an ending span writes its duration last
        anchor = (
            start - mono
            if tel._calibrated
            and start != _NOT_STARTED
            and self._attributes.__class__ is not FrozenAttributes
            else 0
        )
        if start < 0 and not _SAID_UNENTERED:  # never entered (_NOT_STARTED): said once
            _unentered(self.operation, name)
        return StepSpan(  # positional, in field order
            tel,
            name,
            self.checkpoint_id,
            self.trace_id,
            tel._random(64) or tel._random(64) or 1,  # a zero span id is invalid in W3C
            self.span_id,
            self.sampled,
            self._tracestate,
            False,
            _NOT_STARTED,
            anchor,
        )

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
            if type(records) is not int or not 0 <= records < _INT64:
                _bad("records", records)
            self._records = records
        if bytes is not None:
            if type(bytes) is not int or not 0 <= bytes < _INT64:
                _bad("bytes", bytes)
            self._bytes = bytes
        if blockers is not None:
            if type(blockers) is not int or not 0 <= blockers < _INT64:
                _bad("blockers", blockers)
            self._blockers = blockers
        if episodes is not None:
            if type(episodes) is not int or not 0 <= episodes < _INT64:
                _bad("episodes", episodes)
            self._episodes = episodes
        if rollouts is not None:
            if type(rollouts) is not int or not 0 <= rollouts < _INT64:
                _bad("rollouts", rollouts)
            self._rollouts = rollouts
        if phase is not None:
            self._phase = _PHASES.get(phase) or coerce(Phase, phase)
        if received_ns is not None:
            if type(received_ns) is not int or not 0 <= received_ns < _INT64:
                _bad("received_ns", received_ns)
            self._received_ns = received_ns
        if loop_lag_ms is not None:
            if type(loop_lag_ms) not in (int, float) or not 0 <= loop_lag_ms < math.inf:
                raise argument_error(
                    f"loop_lag_ms must be a finite number >= 0, not {shown(loop_lag_ms)}",
                    loop_lag_ms,
                    (int, float),
                )
            self._loop_lag_ms = float(loop_lag_ms)


# A handle's events, from its fields: also from the export process's records of handles
# (``sinks/_export/wire.py``), which carry the same fields under the same names. Positional, in
# the events' field order (see _events.py).


def step_started(span: Any, kind: str, instance: str, worker: int | None) -> StepStarted:
    """The ``StepStarted`` of ``span`` (a ``StepSpan``, or its record) of that participant."""
    return StepStarted(
        kind,
        instance,
        span.trace_id,
        span.span_id,
        span.start_ns,
        span.step,
        span.checkpoint_id,
        span.parent_span_id,
        span.parent_remote,
        span.sampled,
        worker,
        span._tracestate,
    )


def step_finished(span: Any, kind: str, instance: str, worker: int | None) -> StepFinished:
    """The ``StepFinished`` of ``span`` (a ``StepSpan``, or its record) of that participant."""
    return StepFinished(
        kind,
        instance,
        span.trace_id,
        span.span_id,
        span.start_ns,
        span.start_ns + span._mono_ns,  # ended: _mono_ns is its duration
        span.step,
        span.checkpoint_id,
        span.parent_span_id,
        span.parent_remote,
        span.sampled,
        span._outcome,
        span._error_type,
        span._error_message,
        span._attributes or None,
        span._records,
        span._bytes,
        span._calls,
        span._cut_prefix,
        span._cut_failure,
        worker,
        span._tracestate,
    )


def operation_started(span: Any, kind: str, instance: str, worker: int | None) -> OperationStarted:
    """The ``OperationStarted`` of ``span`` (an ``OperationSpan``, or its record)."""
    return OperationStarted(
        kind,
        instance,
        span.trace_id,
        span.span_id,
        span.start_ns,
        span.operation,
        span.checkpoint_id,
        span.parent_span_id,
        span.parent_remote,
        span.sampled,
        worker,
        span._tracestate,
    )


def operation_finished(span: Any, kind: str, instance: str, worker: int | None) -> OperationFinished:
    """The ``OperationFinished`` of ``span`` (an ``OperationSpan``, or its record)."""
    return OperationFinished(
        kind,
        instance,
        span.trace_id,
        span.span_id,
        span.start_ns,
        span.start_ns + span._mono_ns,  # ended: _mono_ns is its duration
        span.operation,
        span.checkpoint_id,
        span.parent_span_id,
        span.parent_remote,
        span.sampled,
        span._outcome,
        span._error_type,
        span._error_message,
        span._attributes or None,
        span._phase,
        span._blockers,
        span._records,
        span._bytes,
        span._episodes,
        span._rollouts,
        span._received_ns,
        span._loop_lag_ms,
        worker,
        span._tracestate,
    )


# Pickles, reprs and tracebacks name the public module (_public_home.py says why).
publish("ckpt_events", OperationSpan, StepSpan)
