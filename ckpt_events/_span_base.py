"""What every span handle answers, live or no-op (``_SpanBase``), and the helpers the live ones share.

A handle's trace context (``traceparent()``, ``tracestate()``, ``with_tracestate()``) and its
extra attributes: ``set_attribute`` until the span ends, when ``_seal`` freezes them
(``FrozenAttributes``) and later calls are ignored.
"""

from __future__ import annotations

import re
from time import monotonic_ns
from typing import TYPE_CHECKING, Any, ClassVar, Final, NoReturn, Self, SupportsIndex

from ckpt_events._errors import InvalidTypeError, SpanNotStartedError, argument_error, not_copyable, shown
from ckpt_events._events import AttributeValue
from ckpt_events._frozen_attrs import ENDED, FrozenAttributes
from ckpt_events._tracecontext import format_traceparent, parse_tracestate
from ckpt_events._vocab import Outcome
from ckpt_events._wallclock import CALIBRATION

if TYPE_CHECKING:
    from ckpt_events._telemetry import Telemetry
else:
    # The handles are msgspec Structs, whose signature resolves every annotation (the
    # subclasses' ``_tel`` too): without a runtime name help(ckpt_events) raised NameError.
    Telemetry = Any

__all__ = [
    "_INT64",
    "_NOT_STARTED",
    "_OK",
    "_SpanBase",
    "_bad",
    "_bad_attribute",
    "_bad_context",
    "_bad_tracestate",
    "_checked_id",
    "_error_fields",
    "_not_started",
    "anchor_of",
]

_MAX_MESSAGE: Final = 1024
#: A URL's authority that the cut at ``_MAX_MESSAGE`` left without its end: the ``@`` by which the
#: redaction rule knows a user and password may lie past the cut, so what the cut left is dropped.
_CUT_AUTHORITY: Final = re.compile(r"://[^/?#\s]*\Z")
_OK: Final = Outcome.OK
#: How anyio's cancellation of a scope begins its message; what follows it (the scope's address,
#: the cancelling task's repr with its file paths) is left out of a span's error message.
_ANYIO_CANCEL: Final = "Cancelled via cancel scope"
#: The members of an exception group named in a span's error message, and walked to count the rest.
_MOST_MEMBERS: Final = 8
_MOST_WALKED: Final = 1000


#: A live handle's ``start_ns`` until it is entered: no clock of ours reads before 1970 (a
#: ``TickingClock`` refuses a negative start), so it cannot be a start.
_NOT_STARTED: Final = -1


def anchor_of(parent: object) -> int:
    """The offset (wall clock minus monotonic, ns) a child of ``parent`` starts on, kept in the
    child's ``_mono_ns`` until it starts: the one ``parent`` started on, while it is a live local
    span on the default clocks; 0 (none: the process's offset) otherwise. Was: the process's
    offset, read again after a wall-clock step, so a step an hour back stamped a step begun
    after it an hour before its own operation, and the report made that a 3,600,000 ms
    checkpoint. As OpenTelemetry Java's ``AnchoredClock``: one trace's local spans, one clock."""
    if not isinstance(parent, _SpanBase) or not parent._live or not parent._tel._calibrated:
        return 0
    start = parent.start_ns
    mono = parent._mono_ns  # read before the test below: an ending span writes its duration last
    if start == _NOT_STARTED or parent._attributes.__class__ is FrozenAttributes:
        return 0
    return start - mono


#: Counts and times are int64 where they go (OTLP, Prometheus, the reports' arrays).
_INT64: Final = 1 << 63


def _bad(name: str, value: object) -> NoReturn:
    raise argument_error(f"{name} must be an int in [0, 2**63), not {shown(value)}", value, int)


def _not_started(handle: object, name: object) -> NoReturn:
    """Raise ``SpanNotStartedError`` for ``handle`` (left without being entered): ending it would
    emit a span that started at ``_NOT_STARTED``, in 1970."""
    raise SpanNotStartedError(type(handle).__name__, str(name))


#: What makes each handle, for ``async with`` refused (by class name: the no-op and bridged
#: handles are subclasses of these).
_MADE_BY: Final = {
    "OperationSpan": "tel.operation(...) (or operation(request, ...))",
    "StepSpan": "op.step(...)",
    "StageSpan": "coordinate.stage(...)",
    "CoordinateSpan": "tel.coordinate(...)",
    "CollectionSpan": "tel.collection(...)",
}


def _not_async(handle: object) -> NoReturn:
    """``InvalidTypeError`` for ``async with handle``: it was Python's "'_NoopOperation' object
    does not support the asynchronous context manager protocol", naming an internal class."""
    made_by = next((_MADE_BY[c.__name__] for c in type(handle).__mro__ if c.__name__ in _MADE_BY), "a span")
    raise InvalidTypeError(
        f"{made_by} is entered with `with`, not `async with`: its handle never awaits, so `with` "
        "serves an async def too"
    )


def _bad_attribute(name: object, value: object) -> NoReturn:
    raise InvalidTypeError(
        f"an attribute needs a str name and a str, bool, int or float value, not {shown(name)}={shown(value)}"
    )


def _checked_id(checkpoint_id: object) -> str:
    """``checkpoint_id`` if it is a ``str`` (a subclass too), else ``InvalidTypeError``: an int
    id was accepted, written, and then every line holding it failed to read back."""
    if isinstance(checkpoint_id, str):
        return checkpoint_id
    raise InvalidTypeError(f"checkpoint_id must be a str or None, not {shown(checkpoint_id)}")


def _bad_context(traceparent: object, parent: object) -> None:
    """Raise ``InvalidTypeError`` unless ``traceparent`` is a ``str`` or ``None`` and ``parent`` a
    span handle or ``None``: a raw ASGI header (``bytes``) or a header passed as ``parent=`` was
    taken as no parent, and the trace was cut without a word. A malformed ``str`` is still ignored."""
    if traceparent is not None and not isinstance(traceparent, str):
        raise InvalidTypeError(
            f"traceparent must be a str or None, not {shown(traceparent)}: decode a raw header "
            f"first (value.decode('latin-1'))"
        )
    if parent is not None and not isinstance(parent, _SpanBase):
        raise InvalidTypeError(
            f"parent must be a span handle (from Telemetry.operation, .step, .coordinate, "
            f".collection) or None, not {shown(parent)}: pass a header as traceparent="
        )


def _bad_tracestate(header: object) -> NoReturn:
    raise InvalidTypeError(
        f"tracestate must be a str or None, not {shown(header)}: decode a raw header first "
        f"(value.decode('latin-1'))"
    )


def _error_fields(exc: BaseException) -> tuple[Outcome, str | None, str | None]:
    name = _type_name(exc)
    message = _exited(exc) if isinstance(exc, SystemExit) else _said(exc)
    if isinstance(exc, BaseExceptionGroup):
        # An error in an anyio task group leaves as a group ("unhandled errors in a TaskGroup
        # (1 sub-exception)"): its members are the cause, or the span names none.
        message = f"{message}: {_members(exc)}"
    if len(message) > _MAX_MESSAGE:
        message = message[:_MAX_MESSAGE]
        cut = _CUT_AUTHORITY.search(message)
        if cut is not None:
            message = message[: cut.start() + 3]
    return Outcome.ERROR, name, message


def _exited(exc: SystemExit) -> str:
    """What a ``SystemExit`` leaving a span says. Still outcome ``error``: the operation did not
    finish its work, whatever the exit. But its message was the bare code (``SystemExit: 0``, a
    ``SystemExit(None)`` an empty one), read in a report as the cause of a failure; a clean exit
    or an exit status says so. A message of the exit's own (``sys.exit("usage: ...")``) stays."""
    code = exc.code
    if code is None or (code.__class__ in (int, bool) and code == 0):
        return "a clean exit (status 0) ended it before it finished"
    if code.__class__ in (int, bool):
        return f"an exit with status {int(code)} ended it before it finished"
    return _said(exc)


def _type_name(exc: BaseException) -> str:
    cls = type(exc)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _said(exc: BaseException) -> str:
    """``str(exc)``, a plain ``str`` whatever it is, and anyio's cancellation without addresses."""
    try:
        message = str(exc)
    except Exception:  # the app's exception must leave the block as it was, whatever its __str__ does
        message = f"<{_type_name(exc)}: str() of it raised>"
    if message.__class__ is not str:  # a str subclass whose methods may be anything: a plain copy
        message = str.__str__(message)
    if message.startswith(_ANYIO_CANCEL):
        # anyio's cancellation names its scope by address and the task by its repr: 300 characters
        # of memory addresses and the host's paths in every exported span of a client that left.
        message = _ANYIO_CANCEL
    return message


def _members(group: BaseExceptionGroup[BaseException]) -> str:
    """The exceptions ``group`` holds, nested groups' too, depth first: ``OSError: disk full;
    KeyError: 'k'``, at most ``_MOST_MEMBERS`` named and the rest counted (walking at most
    ``_MOST_WALKED`` of them: a group of a million is not read through on the way out)."""
    shown: list[str] = []
    left = 0
    walked = 0
    todo: list[BaseException] = list(reversed(group.exceptions))
    while todo and walked < _MOST_WALKED:
        one = todo.pop()
        walked += 1
        if isinstance(one, BaseExceptionGroup):
            todo.extend(reversed(one.exceptions))
        elif len(shown) < _MOST_MEMBERS:
            said = _said(one)
            shown.append(f"{_type_name(one)}: {said}" if said else _type_name(one))
        else:
            left += 1
    if todo:
        shown.append("and more")  # more than were walked: not counted
    elif left:
        shown.append(f"and {left} more")
    return "; ".join(shown)


class _SpanBase:
    """What every span handle answers, live or no-op: its trace context and extra attributes.

    A mixin without fields: the live handles hold ``_tel``, ``trace_id``, ``span_id``,
    ``sampled``, ``parent_remote``, ``_tracestate``, ``_attributes``, ``start_ns`` (wall clock)
    and ``_mono_ns`` (the monotonic clock read beside it, which times the span).
    """

    __slots__ = ()
    #: False on the no-op twins: they are never a local parent.
    _live: ClassVar[bool] = True
    #: True on the no-op handles that hand a caller's trace on (``_noop.passed_on``): a span
    #: given one as its parent continues that trace, the caller's span its remote parent.
    _passes_on: ClassVar[bool] = False
    _tel: Telemetry
    trace_id: int
    span_id: int
    parent_span_id: int | None
    parent_remote: bool
    sampled: bool
    checkpoint_id: str | None
    start_ns: int
    _mono_ns: int
    _tracestate: str | None
    _attributes: dict[str, AttributeValue] | None

    if not TYPE_CHECKING:  # at run time only: a type checker flags `async with` on a handle still

        def __aenter__(self) -> NoReturn:
            _not_async(self)

        def __aexit__(self, *exc_info: object) -> None:  # looked up before __aenter__ is called
            return None

    def _seal(self, name: object) -> bool:
        """End this span: freeze its attributes. ``False`` if it had ended already;
        ``SpanNotStartedError`` (and the handle left as it was) if it was never entered."""
        attributes = self._attributes
        if attributes.__class__ is FrozenAttributes:
            return False
        if self.start_ns == _NOT_STARTED:
            _not_started(self, name)
        frozen = FrozenAttributes(attributes) if attributes else ENDED
        # Tested again after the call that builds ``frozen``, with no call between the test and
        # the store, where the interpreter never switches threads: two threads leaving one
        # handle at once both found it live across that call, and it ended twice (two events
        # with one span id). The one that stores first ends it; the other returns.
        if self._attributes is not attributes:
            return False
        self._attributes = frozen  # type: ignore[misc]  # a field of the struct subclasses
        return True

    def _start(self, started: type[Any], what: object) -> None:
        """Read the clocks; emit ``started`` (a ``*Started`` event class) if a sink wants it.
        Once per handle: entered again (inside its own block, or by another thread at once) it
        emitted a second ``*Started`` with its span id and moved its start."""
        if self.start_ns != _NOT_STARTED:
            return
        tel = self._tel
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
        # Tested again after the clocks' calls, with no call between the test and the stores
        # (where the interpreter never switches threads), as ``_seal`` does: one thread starts it.
        if self.start_ns != _NOT_STARTED:
            return
        self.start_ns = start_ns  # type: ignore[misc]  # a field of the struct subclasses
        self._mono_ns = mono_ns  # type: ignore[misc]  # as start_ns
        route = tel.bus._routes.get(started)
        if route is None:
            return
        event = started(  # positional, in field order (see _events.py)
            tel.kind,
            tel.instance,
            self.trace_id,
            self.span_id,
            start_ns,
            what,
            self.checkpoint_id,
            self.parent_span_id,
            self.parent_remote,
            self.sampled,
            tel.worker,
            self._tracestate,
        )
        for buffer in route:  # as Bus.emit offers an event (inline: per span, one lookup)
            if len(buffer) < buffer.capacity:
                buffer.append(event)
                if buffer.waiting:
                    tel.bus._wake(buffer)
            else:
                buffer.dropped += 1

    def _end_time(self) -> int:
        """This span's end: its wall-clock start plus its duration on the monotonic clock, so a
        wall-clock step while it ran (NTP, a VM resumed) cannot make it negative or inflated."""
        tel = self._tel
        monotonic = tel._monotonic
        if monotonic is None:  # an injected clock alone (TickingClock): it times durations too
            return tel._clock()
        return self.start_ns + (monotonic() - self._mono_ns)

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:
        # A copy.copy was a second handle of the same span (entered, two spans with one span id);
        # pickled, its Telemetry's weakref said the error. The no-op handles refuse alike: code that
        # pickles one fails in a test with no sink, not first in production.
        not_copyable(
            self,
            "a span handle ends once, in the process that made it; to continue its trace "
            "elsewhere, send its traceparent() (and tracestate())",
        )

    def __copy__(self) -> NoReturn:
        # msgspec's Struct has a __copy__ of its own, which copy.copy asks before __reduce_ex__.
        self.__reduce_ex__(4)

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
        if header is not None and not isinstance(header, str):  # on or off alike (_Noop too)
            _bad_tracestate(header)
        if self.parent_remote and header is not None:
            self._tracestate = parse_tracestate(header)  # type: ignore[misc]  # a field of the struct subclasses
        return self

    def set_attribute(self, name: str, value: AttributeValue) -> None:
        """Attach an extra attribute; sinks apply the redaction rule to it. Ignored once the
        span has ended (its event, perhaps delivered already, is final)."""
        if not isinstance(name, str) or not isinstance(value, str | bool | int | float):
            _bad_attribute(name, value)
        if self._attributes.__class__ is FrozenAttributes:
            return
        if self._attributes is None:
            self._attributes = {}  # type: ignore[misc]  # a field of the struct subclasses
        self._attributes[name] = value
