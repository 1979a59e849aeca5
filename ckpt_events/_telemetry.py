"""``Telemetry``: the emitter server code holds, one per participant (or controller).

When no sink wants what a method would produce, the method returns a shared no-op handle
(or returns at once) after one attribute check: nothing is read, built or allocated. The
flags it checks are plain attributes, recomputed by the bus on subscribe and unsubscribe.
"""

from __future__ import annotations

from collections.abc import Callable
from time import monotonic_ns, time_ns
from typing import TYPE_CHECKING, Final, NoReturn, SupportsIndex

from ckpt_events._bus import Bus
from ckpt_events._context_bridge import BridgedOperationSpan, ContextBridge, bridge_failed, takes_tracestate
from ckpt_events._controller_spans import CollectionSpan, CoordinateSpan
from ckpt_events._errors import (
    InvalidTypeError,
    InvalidValueError,
    argument_error,
    check_int,
    not_copyable,
    shown,
)
from ckpt_events._events import (
    CollectionFinished,
    CollectionStarted,
    CoordinateFinished,
    CoordinateStarted,
    GenerationCut,
    LeaseExpired,
    OperationFinished,
    OperationStarted,
    PrepareNotReady,
    Refused,
    StageFinished,
    StageStarted,
    StepFinished,
    StepStarted,
)
from ckpt_events._noop import NOOP_COLLECTION, NOOP_COORDINATES, NOOP_OPERATION, passed_on, passed_step
from ckpt_events._public_home import publish
from ckpt_events._span_base import _NOT_STARTED, _bad_context, _checked_id, _SpanBase, anchor_of
from ckpt_events._span_handles import OperationSpan, StepSpan
from ckpt_events._tracecontext import _getrandbits, new_trace_id, parse_traceparent, parse_tracestate
from ckpt_events._vocab import (
    SAFE_NAME,
    STEP_NAMES,
    CollectionAction,
    Disposition,
    ErrorCode,
    Kind,
    Operation,
    Phase,
    Step,
    check_name,
    coerce,
    kind_name,
    step_name,
)
from ckpt_events._wallclock import wall_ns

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

    from ckpt_events._subscription import _Buffer

__all__ = ["Telemetry"]

_OPERATIONS: Final = frozenset(o.value for o in Operation)
_OPERATION_MEMBERS: Final = {o.value: o for o in Operation}
_CODES: Final = frozenset(c.value for c in ErrorCode)
_PHASES: Final = frozenset(p.value for p in Phase)
_DISPOSITIONS: Final = frozenset(d.value for d in Disposition)
_MAX_RATIO_BOUND: Final = 1 << 64
#: Entry-point group of context bridges; ``otel_context=True`` loads the one named ``opentelemetry``.
BRIDGE_GROUP: Final = "ckpt_events.context_bridges"


#: The entry points of the context bridges found so far, by name. Reading the installed
#: packages' metadata took 5.4 ms a lookup: a Telemetry made per request with
#: ``otel_context=True`` cost that per request (4 us without). ``load()`` of a found entry point
#: is an import already done (~10 us), so it stays per Telemetry, and its error with it.
_BRIDGE_ENTRIES: Final[dict[str, tuple[EntryPoint, ...]]] = {}
#: What ``_load_bridge`` checked of each bridge factory an entry point gave (its instances are a
#: ``ContextBridge``; their ``attach`` takes ``tracestate``): the protocol's ``isinstance`` and
#: ``inspect.signature`` took ~50 us more per Telemetry.
_BRIDGE_CHECKS: Final[dict[object, tuple[bool, bool]]] = {}


def _bridge_entries(name: str) -> tuple[EntryPoint, ...]:
    """The entry points named ``name`` in ``BRIDGE_GROUP``, looked up once while any is found."""
    found = _BRIDGE_ENTRIES.get(name)
    if found is None:
        # Here, not at the top: importlib.metadata (with email, zipfile, csv) took ~10 ms of
        # `from ckpt_events import Telemetry`'s 110, and only otel_context=True reads it.
        from importlib.metadata import entry_points

        found = tuple(entry_points(group=BRIDGE_GROUP, name=name))
        if found:  # none found: looked up again, so a bridge installed later is still seen
            _BRIDGE_ENTRIES[name] = found
    return found


def _load_bridge(name: str) -> tuple[ContextBridge, bool]:
    """The bridge the entry point ``name`` gives, and whether its ``attach`` takes ``tracestate``."""
    # Found by entry point, so the core imports no tracing library and no sink package.
    for entry in _bridge_entries(name):
        try:
            loaded = entry.load()
        except ImportError as exc:  # our own entry point, on an install without the otel extra
            raise InvalidValueError(
                f"otel_context=True needs the {name!r} context bridge, which could not be imported "
                f"({exc}): install ckpt-events[otel], or pass a ContextBridge"
            ) from None
        bridge = loaded()
        checks = _BRIDGE_CHECKS.get(loaded)
        if checks is None:
            is_bridge = isinstance(bridge, ContextBridge)
            checks = _BRIDGE_CHECKS[loaded] = (is_bridge, is_bridge and takes_tracestate(bridge))
        if checks[0]:
            return bridge, checks[1]
    raise InvalidValueError(
        f"otel_context=True needs the {name!r} context bridge (install ckpt-events[otel]), "
        f"or pass a ContextBridge"
    )


def _raw_in(route: tuple[_Buffer, ...]) -> _Buffer | None:
    """The raw buffer of ``route`` (the bus has at most one), if it holds it."""
    return next((buffer for buffer in route if buffer.raw), None)


def _cooked(route: tuple[_Buffer, ...], raw: _Buffer | None) -> tuple[_Buffer, ...]:
    """``route`` without its ``raw`` buffer (``_raw_in``): the buffers that take events."""
    return route if raw is None else tuple(buffer for buffer in route if buffer is not raw)


def _inherited(parent: _SpanBase | None) -> str | None:
    """A new span's tracestate before ``with_tracestate``: its live local parent's, or the one a
    passed-on parent (``_noop.passed_on``) hands on, if any."""
    if parent is not None and isinstance(parent, _SpanBase) and (parent._live or parent._passes_on):
        return parent._tracestate
    return None


class Telemetry:
    """Emits the checkpoint events of one participant (``kind``, ``instance``) onto ``bus``.

    ``kind`` is any name of ``ckpt_events.vocab.NAME_RULE``'s shape (``"judge"``), or a
    ``Kind`` constant; ``.kind`` holds the ``Kind`` member for a constant, else the ``str``.

    ``bus=None`` gives a Telemetry that is always off. ``sample_ratio`` is the share of
    traces *started here* that are sampled; a trace continued from an incoming
    ``traceparent`` keeps the caller's decision. ``enabled`` is true while any sink wants
    any event this Telemetry makes; guard costly attribute building with ``if tel.enabled:``.
    ``otel_context`` (``True`` for OpenTelemetry, or any ``ContextBridge``): a live operation's
    parent is the current OpenTelemetry span if there is one (else ``traceparent``), and the
    operation is the current span while open. It is consulted only when a sink listens.
    ``worker``: the index of this process among a multi-worker participant's workers; every
    event it emits carries it (``None``, the default, for a single-process participant).
    ``ids`` (``ids(bits)``: a random non-zero int of ``bits`` bits, 64 or 128) and ``clock``
    (nanoseconds since the epoch) replace ``random.getrandbits`` and ``time.time_ns`` for
    this Telemetry's live spans and events, e.g. with ``ckpt_events.testing``'s
    ``SequentialIds`` and ``TickingClock`` for deterministic tests; ``clock`` reads it back.

    A span's ``start_ns`` is read from the wall clock and its duration from a monotonic clock
    (``time.monotonic_ns``, or ``monotonic``) read beside it: ``end_ns`` is ``start_ns`` plus that
    duration, so a wall-clock step while a span runs (NTP, a resumed VM) leaves its duration
    true. A ``clock`` given without a ``monotonic`` times the spans too (as a ``TickingClock``
    does: every reading one step later).
    """

    __slots__ = (
        "__weakref__",
        "_bridge",
        "_bridge_state",
        "_calibrated",
        "_clock",
        "_collection_on",
        "_coordinate_on",
        "_cut_on",
        "_identity",
        "_lease_on",
        "_monotonic",
        "_not_ready_on",
        "_operation_finished_on",
        "_operation_finished_raw",
        "_operation_on",
        "_operation_route",
        "_operation_started_on",
        "_operation_started_raw",
        "_operation_started_route",
        "_random",
        "_ratio_bound",
        "_refused_on",
        "_sample_all",
        "_step_finished_on",
        "_step_finished_raw",
        "_step_on",
        "_step_route",
        "_step_started_on",
        "_step_started_raw",
        "_step_started_route",
        "bus",
        "enabled",
        "instance",
        "kind",
        "worker",
    )

    def __init__(
        self,
        bus: Bus | None,
        *,
        kind: Kind | str,
        instance: str,
        sample_ratio: float = 1.0,
        otel_context: bool | ContextBridge = False,
        worker: int | None = None,
        ids: Callable[[int], int] | None = None,
        clock: Callable[[], int] | None = None,
        monotonic: Callable[[], int] | None = None,
    ) -> None:
        if bus is not None and not isinstance(bus, Bus):
            raise InvalidTypeError(f"bus must be a ckpt_events.Bus or None, not {shown(bus)}")
        self.kind: str = kind_name(kind)
        if not isinstance(instance, str) or SAFE_NAME.fullmatch(instance) is None:
            raise argument_error(
                f"instance must be 1-128 characters of [A-Za-z0-9._-] starting with a letter "
                f"or digit, not {shown(instance)}",
                instance,
                str,
            )
        self.instance = instance
        if worker is not None and (type(worker) is not int or worker < 0):
            raise argument_error(f"worker must be None or an int >= 0, not {shown(worker)}", worker, int)
        self.worker = worker
        # What the export process's wire carries for this Telemetry beside each raw span handle.
        self._identity = (self.kind, instance, worker)
        if (
            isinstance(sample_ratio, bool)
            or not isinstance(sample_ratio, int | float)
            or not 0.0 <= sample_ratio <= 1.0
        ):
            raise argument_error(
                f"sample_ratio must be in [0, 1], not {shown(sample_ratio)}", sample_ratio, (int, float)
            )
        self._ratio_bound = int(sample_ratio * _MAX_RATIO_BOUND)
        self._sample_all = sample_ratio == 1.0  # a new root skips the bound's test (~30 ns)
        if otel_context is True:
            bridge, takes_state = _load_bridge("opentelemetry")
            self._bridge: ContextBridge | None = bridge
            self._bridge_state = takes_state
        elif otel_context is False:
            self._bridge = None
            self._bridge_state = False
        elif isinstance(otel_context, ContextBridge):
            self._bridge = otel_context
            self._bridge_state = takes_tracestate(otel_context)
        else:
            raise InvalidTypeError(
                f"otel_context must be a bool or a ContextBridge, not {shown(otel_context)}"
            )
        if any(f is not None and not callable(f) for f in (ids, clock, monotonic)):
            raise InvalidTypeError(
                f"ids, clock and monotonic must be callables or None, not {shown(ids)}, "
                f"{shown(clock)}, {shown(monotonic)}"
            )
        self._random: Callable[[int], int] = _getrandbits if ids is None else ids
        self._clock: Callable[[], int] = wall_ns if clock is None and monotonic is None else clock or time_ns
        # None: the injected clock alone times spans too (a TickingClock stays deterministic).
        self._monotonic: Callable[[], int] | None = (
            monotonic if monotonic is not None else monotonic_ns if clock is None else None
        )
        # The default clocks: a span's start is one monotonic read on the process's wall-clock
        # offset (``_wallclock``), so its stamps keep the order of what they stamp.
        self._calibrated = clock is None and monotonic is None
        self.bus = bus if bus is not None else Bus()
        self._interest_changed()
        if bus is not None:
            bus._add_listener(self)

    @property
    def clock(self) -> Callable[[], int]:
        """The wall clock this Telemetry stamps with (``clock=``, else ``time.time_ns`` read
        through the monotonic clock, ``_wallclock.wall_ns``): what stamps an event of its
        elsewhere (a request's arrival) reads, to agree with its spans."""
        return self._clock

    def _interest_changed(self) -> None:
        """Recompute the on/off flags from the bus's routing table (the bus calls this)."""
        wants = self.bus.wants
        # Where a finished operation or step handle is queued (its event's route; () for none).
        # (the raw buffer, the export process's, apart: it may get an end mark instead).
        operation_finished = self.bus._routes.get(OperationFinished, ())
        self._operation_finished_raw = _raw_in(operation_finished)
        self._operation_route = _cooked(operation_finished, self._operation_finished_raw)
        step_finished = self.bus._routes.get(StepFinished, ())
        self._step_finished_raw = _raw_in(step_finished)
        self._step_route = _cooked(step_finished, self._step_finished_raw)
        # Where a span's *Started event goes, read by the request-path handles as they enter;
        # the raw buffer (the export process's) gets the handle itself instead.
        operation_started = self.bus._routes.get(OperationStarted, ())
        self._operation_started_raw = _raw_in(operation_started)
        self._operation_started_route = _cooked(operation_started, self._operation_started_raw)
        step_started = self.bus._routes.get(StepStarted, ())
        self._step_started_raw = _raw_in(step_started)
        self._step_started_route = _cooked(step_started, self._step_started_raw)
        # One flag per event type the live handles read on every span (an attribute read,
        # not a routing-table lookup); steps off (say, metrics only) means no step handles.
        self._operation_started_on = wants(OperationStarted)
        self._operation_finished_on = wants(OperationFinished)
        self._step_started_on = wants(StepStarted)
        self._step_finished_on = wants(StepFinished)
        self._step_on = self._step_started_on or self._step_finished_on
        self._operation_on = self._operation_started_on or self._operation_finished_on or self._step_on
        self._coordinate_on = any(
            wants(t) for t in (CoordinateStarted, CoordinateFinished, StageStarted, StageFinished)
        )
        self._collection_on = wants(CollectionStarted) or wants(CollectionFinished)
        self._refused_on = wants(Refused)
        self._lease_on = wants(LeaseExpired)
        self._not_ready_on = wants(PrepareNotReady)
        self._cut_on = wants(GenerationCut)
        self.enabled = (
            self._operation_on
            or self._coordinate_on
            or self._collection_on
            or self._refused_on
            or self._lease_on
            or self._not_ready_on
            or self._cut_on
        )

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:
        # A copy.copy() was not among the bus's listeners: it kept the flags of the moment it was
        # made, so it emitted nothing once a sink subscribed (or kept feeding one that left).
        not_copyable(
            self,
            "it emits onto the Bus of the process that made it, whose subscriptions it follows; "
            "create a Telemetry in each process (Telemetry(bus, kind=..., instance=...))",
        )

    def __repr__(self) -> str:
        return f"Telemetry(kind={str(self.kind)!r}, instance={self.instance!r}, enabled={self.enabled})"

    # -- spans -----------------------------------------------------------------------------

    @staticmethod
    def _no_step(step: Step | str, operation: _SpanBase) -> StepSpan:
        """The step of the live ``operation`` whose steps no sink wants: records nothing, hands
        the operation's trace on (``passed_step``)."""
        try:
            if step in STEP_NAMES:
                return passed_step(operation)
        except TypeError:
            pass
        step_name(step)  # raises InvalidValueError or InvalidTypeError naming the rule
        return passed_step(operation)

    def _context(
        self, traceparent: str | None, parent: _SpanBase | None
    ) -> tuple[int, int | None, bool, bool]:
        """(trace id, parent span id, parent is remote, sampled) for a new span."""
        if traceparent is None and parent is None:  # a new root: the common case, kept short
            trace_id = self._random(128) or new_trace_id()
            return trace_id, None, False, (trace_id & 0xFFFF_FFFF_FFFF_FFFF) < self._ratio_bound
        _bad_context(traceparent, parent)  # raises on a wrong type
        if parent is not None and isinstance(parent, _SpanBase):
            if parent._live:
                return parent.trace_id, parent.span_id, False, parent.sampled
            if parent._passes_on:  # a no-op handle handing a caller's trace on: that caller's
                # span is the remote parent (was: a new trace, cut where telemetry was off)
                return parent.trace_id, parent.span_id, True, parent.sampled
        remote = parse_traceparent(traceparent) if traceparent is not None else None
        if remote is not None:
            return remote.trace_id, remote.span_id, True, remote.sampled
        trace_id = self._random(128) or new_trace_id()
        return trace_id, None, False, (trace_id & 0xFFFF_FFFF_FFFF_FFFF) < self._ratio_bound

    def operation(
        self,
        operation: Operation | str,
        *,
        checkpoint_id: str | None = None,
        traceparent: str | None = None,
        parent: _SpanBase | None = None,
    ) -> OperationSpan:
        """A span for ``operation`` on this participant (``gym.checkpoint.<operation>``).

        ``traceparent`` is the incoming header of the control call (malformed: ignored, a
        new trace starts; not a ``str``: ``InvalidTypeError``); ``parent`` a span in this
        process. Use with ``with``; the ``tracestate`` that came with ``traceparent`` is kept
        by ``.with_tracestate(header)``.
        """
        if checkpoint_id is not None and checkpoint_id.__class__ is not str:  # on or off alike
            checkpoint_id = _checked_id(checkpoint_id)
        if not self._operation_on:
            try:  # inline, not a helper call: this is the whole cost of a disabled site
                if operation in _OPERATIONS:
                    if traceparent is None and parent is None:
                        return NOOP_OPERATION
                    # A caller's trace (or a parent span's) is handed on by ``traceparent()``,
                    # recorded or not (was: a parent's dropped, the trace cut at the child).
                    return passed_on(traceparent, parent)
            except TypeError:
                pass
            coerce(Operation, operation)  # raises UnknownNameError naming the valid values
        try:
            member = _OPERATION_MEMBERS[operation]
        except (KeyError, TypeError):
            member = coerce(Operation, operation)
        bridge = self._bridge
        if bridge is not None:
            return self._bridged(bridge, member, checkpoint_id, traceparent, parent)
        random = self._random
        if traceparent is None and parent is None:  # a new root: the common case, inline
            trace_id = random(128) or new_trace_id()
            return OperationSpan(  # positional, in field order
                self,
                member,
                checkpoint_id,
                trace_id,
                random(64) or random(64) or 1,  # a zero span id is invalid in W3C
                None,
                False,
                self._sample_all or (trace_id & 0xFFFF_FFFF_FFFF_FFFF) < self._ratio_bound,
            )
        trace_id, parent_id, remote, sampled = self._context(traceparent, parent)
        return OperationSpan(
            self,
            member,
            checkpoint_id,
            trace_id,
            random(64) or random(64) or 1,
            parent_id,
            remote,
            sampled,
            _inherited(parent),
            _NOT_STARTED,
            anchor_of(parent) if self._calibrated else 0,  # stamped inside a local parent
        )

    def _bridged(
        self,
        bridge: ContextBridge,
        member: Operation,
        checkpoint_id: str | None,
        traceparent: str | None,
        parent: _SpanBase | None,
    ) -> OperationSpan:
        if traceparent is not None or parent is not None:  # a bridge's parent skips _context
            _bad_context(traceparent, parent)
        try:
            current = bridge.current_parent() if parent is None else None
        except Exception:  # a bridge of the user's: the operation goes on without its parent
            bridge_failed("current_parent", bridge)
            current = None
        parent_id: int | None
        state: str | None = None
        if current is not None:
            trace_id, parent_id, remote, sampled = current[0], current[1], False, current[2]
            if len(current) > 3:  # (..., remote, tracestate): a span extracted from a request
                remote = bool(current[3])
                raw = current[4] if len(current) > 4 else None
                state = parse_tracestate(raw) if isinstance(raw, str) else None
        else:
            trace_id, parent_id, remote, sampled = self._context(traceparent, parent)
            state = _inherited(parent)
        span_id = self._random(64) or self._random(64) or 1
        return BridgedOperationSpan(
            self,
            member,
            checkpoint_id,
            trace_id,
            span_id,
            parent_id,
            remote,
            sampled,
            state,
            _bridge=bridge,
            _bridge_state=self._bridge_state,
        )

    def coordinate(
        self,
        operation: Operation | str,
        *,
        checkpoint_id: str | None = None,
        traceparent: str | None = None,
        parent: _SpanBase | None = None,
    ) -> CoordinateSpan:
        """A controller span ``gym.checkpoint.coordinate.<operation>``; ``.stage(kind)`` nests."""
        if checkpoint_id is not None and checkpoint_id.__class__ is not str:  # on or off alike
            checkpoint_id = _checked_id(checkpoint_id)
        if not self._coordinate_on:
            check_name(_OPERATIONS, operation, Operation)
            if traceparent is not None or parent is not None:  # on or off alike
                _bad_context(traceparent, parent)
            return NOOP_COORDINATES[operation]  # type: ignore[index]  # a name is its member's key (a StrEnum)
        trace_id, parent_id, remote, sampled = self._context(traceparent, parent)
        span = CoordinateSpan(
            self,
            coerce(Operation, operation),
            checkpoint_id,
            trace_id,
            parent_id,
            remote,
            sampled,
            _inherited(parent),
        )
        if parent is not None and self._calibrated:
            span._mono_ns = anchor_of(parent)  # stamped inside its local parent
        return span

    def collection(
        self,
        action: str,
        *,
        checkpoint_id: str | None = None,
        traceparent: str | None = None,
        parent: _SpanBase | None = None,
    ) -> CollectionSpan:
        """Rollout collection's span: ``action`` is ``"checkpoint"``, ``"restore"`` or ``"publish"``."""
        if checkpoint_id is not None and checkpoint_id.__class__ is not str:  # on or off alike
            checkpoint_id = _checked_id(checkpoint_id)
        member = coerce(CollectionAction, action)
        if not self._collection_on:
            if traceparent is not None or parent is not None:  # on or off alike
                _bad_context(traceparent, parent)
            return NOOP_COLLECTION
        trace_id, parent_id, remote, sampled = self._context(traceparent, parent)
        span = CollectionSpan(
            self,
            member,
            checkpoint_id,
            trace_id,
            parent_id,
            remote,
            sampled,
            _inherited(parent),
        )
        if parent is not None and self._calibrated:
            span._mono_ns = anchor_of(parent)  # stamped inside its local parent
        return span

    # -- counted events: one attribute check when no sink wants them, as for spans ----------

    def refused(self, code: ErrorCode | str, *, checkpoint_id: str | None = None) -> None:
        """Count a request refused with protocol error ``code``."""
        if checkpoint_id is not None and checkpoint_id.__class__ is not str:  # on or off alike
            checkpoint_id = _checked_id(checkpoint_id)
        if not self._refused_on:
            check_name(_CODES, code, ErrorCode)
            return
        self.bus.emit(
            Refused(
                self.kind, self.instance, self._clock(), coerce(ErrorCode, code), checkpoint_id, self.worker
            )  # positional, in field order
        )

    def lease_expired(self, phase: Phase | str, *, checkpoint_id: str | None = None) -> None:
        """Count a lease that ran out in ``phase`` (the participant resumed on its own)."""
        if checkpoint_id is not None and checkpoint_id.__class__ is not str:  # on or off alike
            checkpoint_id = _checked_id(checkpoint_id)
        if not self._lease_on:
            check_name(_PHASES, phase, Phase)
            return
        self.bus.emit(
            LeaseExpired(
                self.kind, self.instance, self._clock(), coerce(Phase, phase), checkpoint_id, self.worker
            )  # positional, in field order
        )

    def prepare_not_ready(self, blockers: int, *, checkpoint_id: str | None = None) -> None:
        """Count a prepare that reached its deadline with ``blockers`` still blocking."""
        if checkpoint_id is not None and checkpoint_id.__class__ is not str:  # on or off alike
            checkpoint_id = _checked_id(checkpoint_id)
        if blockers.__class__ is not int or blockers < 0:  # on or off alike; no message built when valid
            check_int(blockers, f"blockers must be an int >= 0, not {shown(blockers)}")
        if not self._not_ready_on:
            return
        self.bus.emit(
            PrepareNotReady(
                self.kind, self.instance, self._clock(), blockers, checkpoint_id, self.worker
            )  # positional, in field order
        )

    def generation_cut(
        self, disposition: Disposition | str, calls: int, *, checkpoint_id: str | None = None
    ) -> None:
        """Count ``calls`` in-flight generations that a cut round ended with ``disposition``."""
        if checkpoint_id is not None and checkpoint_id.__class__ is not str:  # on or off alike
            checkpoint_id = _checked_id(checkpoint_id)
        if calls.__class__ is not int or calls < 0:  # on or off alike; no message built when valid
            check_int(calls, f"calls must be an int >= 0, not {shown(calls)}")
        if not self._cut_on:
            check_name(_DISPOSITIONS, disposition, Disposition)
            return
        self.bus.emit(
            GenerationCut(
                self.kind,
                self.instance,
                self._clock(),
                coerce(Disposition, disposition),
                calls,
                checkpoint_id,
                self.worker,
            )  # positional, in field order
        )


# Pickles, reprs and tracebacks name the public module (_public_home.py says why).
publish("ckpt_events", Telemetry)
