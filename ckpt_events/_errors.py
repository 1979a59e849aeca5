"""Exceptions raised by ckpt_events.

The tree, all in one place::

    CkptEventsError                 root: catch this to catch everything we raise
    ├── UnknownNameError            a name outside a closed vocabulary (also a ValueError)
    ├── InvalidArgumentError        a bad argument; raised as one of its two children:
    │   ├── InvalidValueError       the right type, a wrong value: out of range, empty, unsafe
    │   │                           (also a ValueError)
    │   └── InvalidTypeError        the wrong type of object (also a TypeError)
    ├── ConfigurationError          a bad setting or environment variable (also a ValueError)
    └── SpanNotStartedError         a live span handle left (``__exit__``) without being entered
                                    (also a RuntimeError, as OpenTelemetry's ``end()`` of a
                                    span not started)

The bus itself never raises into an emitting caller; these come from constructors and
validation at the public API. This is the core's part of the tree; ``ckpt_events.participants.errors``
draws the whole project's (the core, the sinks and the participants) in its docstring.
"""

from __future__ import annotations

import copyreg
import math
import os
import reprlib
from collections.abc import Iterable
from typing import Any, Final, NoReturn

from ckpt_events._public_home import publish

__all__ = [
    "CkptEventsError",
    "ConfigurationError",
    "InvalidArgumentError",
    "InvalidTypeError",
    "InvalidValueError",
    "SpanNotStartedError",
    "UnknownNameError",
    "not_copyable",
]


class CkptEventsError(Exception):
    """Root of every exception that ckpt_events raises on purpose.

    Every one pickles and copies whole (type, message, attributes), so it crosses a process
    boundary (a ``ProcessPoolExecutor`` worker's raise) as it was raised."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt without calling __init__ again: the default, ``type(self)(*self.args)``, passed
        # the message alone to an __init__ that takes its own arguments (UnknownNameError's
        # what, name, valid): pickle.loads raised TypeError, and a worker's pool broke.
        # ``copyreg.__newobj__`` is ``cls.__new__(cls, *args)``, which pickle writes as its NEWOBJ
        # opcode: the pickle names the public class only (a private rebuilder of ours named
        # ``ckpt_events._errors._rebuilt`` in every pickled error, a path we may move).
        newobj = copyreg.__newobj__  # type: ignore[attr-defined]  # in copyreg, not in its stubs
        return (newobj, (type(self), *self.args), self.__dict__ or None)


def _rebuilt(cls: type[CkptEventsError], args: tuple[object, ...]) -> CkptEventsError:
    """``cls`` with ``args`` and no ``__init__`` call: what the errors pickled by 0.3.0 name, kept
    so that those pickles still load."""
    return cls.__new__(cls, *args)


class UnknownNameError(CkptEventsError, ValueError):
    """A name is not a member of its closed vocabulary; the message lists the valid names."""

    def __init__(self, what: str, name: object, valid: Iterable[str]) -> None:
        self.what = what
        self.name = name
        self.valid = tuple(valid)
        super().__init__(f"unknown {what} {shown(name)}; valid values: {', '.join(self.valid)}")


class InvalidArgumentError(CkptEventsError):
    """An argument is wrong; the message says what to pass. Catch this for both children."""


class InvalidValueError(InvalidArgumentError, ValueError):
    """An argument has the right type but a wrong value (out of range, empty, unsafe)."""


class InvalidTypeError(InvalidArgumentError, TypeError):
    """An argument is the wrong type of object."""


def argument_error(message: str, value: object, expected: type | tuple[type, ...]) -> InvalidArgumentError:
    """The child a failed combined check ("an int >= 0") means: ``InvalidValueError`` when ``value``
    is of the ``expected`` type (so its value is what is wrong), else ``InvalidTypeError``.

    A ``bool`` never counts as a number here, as in every check of ours.
    """
    right_type = isinstance(value, expected) and not isinstance(value, bool)
    return InvalidValueError(message) if right_type else InvalidTypeError(message)


def not_copyable(value: object, why: str) -> NoReturn:
    """``InvalidTypeError`` (a ``TypeError``, as CPython's "cannot pickle" is) saying that
    ``value``, bound to this process (a bus, its emitter, a live span), is neither pickled nor
    copied, ``why``, and what to do instead. Called from its ``__reduce_ex__``, which pickle,
    ``copy.copy`` and ``copy.deepcopy`` all ask."""
    # Named by its public class: a no-op handle (``_NoopOperation``) is said as an OperationSpan.
    name = next(cls.__name__ for cls in type(value).__mro__ if not cls.__name__.startswith("_"))
    raise InvalidTypeError(f"cannot pickle or copy {name!r} object: {why}")


def check_int(value: object, message: str, *, minimum: int = 0) -> int:
    """``value`` when it is an int of at least ``minimum``; else ``InvalidTypeError`` (not an
    int: a ``bool`` never counts) or ``InvalidValueError`` (too small), either with ``message``.
    The one check of an int argument in the library."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidTypeError(message)
    if value < minimum:
        raise InvalidValueError(message)
    return value


def check_number(
    value: object, message: str, *, low: float = 0.0, high: float = math.inf, low_open: bool = False
) -> float:
    """``value`` as a float when it is a real number in ``[low, high]`` (``(low, high]`` with
    ``low_open``); else ``InvalidTypeError`` (not a number: a ``bool`` never counts) or
    ``InvalidValueError`` (out of range, NaN), either with ``message``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidTypeError(message)
    if not (low < value <= high if low_open else low <= value <= high):
        raise InvalidValueError(message)
    try:
        return float(value)
    except OverflowError:  # an int past a float's range (10**400) is under an infinite high
        raise InvalidValueError(message) from None


def check_file_name(path: str | os.PathLike[str], where: str) -> None:
    """``InvalidValueError`` naming ``where`` when the OS cannot be given ``path``: a NUL byte
    in it, or a lone surrogate (no file name encodes one). ``open()`` said either as a bare
    ``ValueError`` or ``UnicodeEncodeError`` naming no argument."""
    name = os.fspath(path)
    try:
        encoded = os.fsencode(name)
    except UnicodeError:
        raise InvalidValueError(
            f"{where} {shown(name)} cannot be encoded as a file name (a lone surrogate); "
            "use a path of valid characters"
        ) from None
    if b"\0" in encoded:
        raise InvalidValueError(f"{where} {shown(name)} has a NUL byte; a file path cannot hold one")


#: About the longest a value quoted by ``shown`` is: a bad argument may be megabytes of text.
SHOWN_CHARS: Final = 120
# A long one is said by its start and its end (a path's file name).
_HEAD: Final = 80
_TAIL: Final = _HEAD - SHOWN_CHARS


def _short_repr() -> reprlib.Repr:
    # A container shows its first few items, a nested one its shape; an object's own repr is
    # cut. (Set attribute by attribute: ``Repr`` takes no arguments before Python 3.12.)
    cut = reprlib.Repr()
    cut.maxlevel = 2
    for limit in ("maxtuple", "maxlist", "maxarray", "maxdict", "maxset", "maxfrozenset", "maxdeque"):
        setattr(cut, limit, 4)
    cut.maxlong = cut.maxother = SHOWN_CHARS + 3  # a bytes of SHOWN_CHARS, b and quotes, whole
    cut.maxstring = SHOWN_CHARS + 2  # with its quotes: a str ``shown`` keeps whole stays whole
    return cut


_REPR: Final = _short_repr()


def _cut(start: str | bytes, end: str | bytes, size: int, unit: str) -> str:
    head = repr(start)
    tail = repr(end)
    cut = f"{head[:-1]}...{tail[tail.index(head[-1]) + 1 :]}" if head[-1] == tail[-1] else f"{head}..."
    if len(cut) > 2 * SHOWN_CHARS:  # escapes (\x00 is 4 characters, \U0001f600 10)
        cut = f"{head[:SHOWN_CHARS]}..."
    return f"{cut} ({size:,} {unit})"


def shown(value: object) -> str:
    """``repr(value)`` bounded for an error message or a log line: whole when short, else its
    start, ``...``, its end and its size (``'xxxx...x.txt' (10,000,000 characters)``); a container's first
    items, an int too long to print as its bits. Every error that quotes a caller's value quotes
    it through this, so a 10 MB bad argument is said in at most ~250 characters. Never raises."""
    # The plain type's length, slicing and repr: a subclass's own may be anything.
    if isinstance(value, str) and str.__len__(value) > SHOWN_CHARS:
        return _cut(
            str.__getitem__(value, slice(_HEAD)),
            str.__getitem__(value, slice(_TAIL, None)),
            str.__len__(value),
            "characters",
        )
    if isinstance(value, bytes | bytearray):
        size = bytes.__len__(value) if isinstance(value, bytes) else bytearray.__len__(value)
        if size > SHOWN_CHARS:
            view = memoryview(value)  # a bytearray's cut said as bytes
            return _cut(bytes(view[:_HEAD]), bytes(view[_TAIL:]), size, "bytes")
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4 * SHOWN_CHARS:
        # repr() of an int past 4,300 digits raises (sys.set_int_max_str_digits): say its size
        return f"<an int of {value.bit_length():,} bits>"
    try:
        said = _REPR.repr(value)
    except Exception:  # its own __repr__ raised; we are already saying what is wrong with it
        return f"<a {type(value).__name__} whose repr() raised>"
    if len(said) > SHOWN_CHARS + 40:  # a container of long items: reprlib cuts each, not all
        return f"{said[:SHOWN_CHARS]}..."
    return said


class ConfigurationError(CkptEventsError, ValueError):
    """A configuration value (argument or environment variable) is invalid."""


class SpanNotStartedError(CkptEventsError, RuntimeError):
    """A live span handle was left (``__exit__``) without being entered (``__enter__``): it
    has no start, so no span is emitted, and the handle stays as it was (a ``with`` block
    still works). A programming error, raised as OpenTelemetry's SDK raises on ``end()`` of a
    span never started; the no-op handles (nothing listening) keep no state and never raise."""

    def __init__(self, handle: str, name: str) -> None:
        self.handle = handle
        self.name = name
        super().__init__(
            f"{handle} {shown(name)} was left (__exit__) without being entered: use it as a "
            f"`with` block (no span was emitted)"
        )


# Pickles, reprs and tracebacks name the public module (_public_home.py says why).
publish(
    "ckpt_events",
    CkptEventsError,
    ConfigurationError,
    InvalidArgumentError,
    InvalidTypeError,
    InvalidValueError,
    SpanNotStartedError,
    UnknownNameError,
)
publish("ckpt_events.checks", check_int, check_number, shown)
