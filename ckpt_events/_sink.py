"""What the bus delivers to: the ``Sink`` protocol, its optional members, and what the bus promises.

A sink is any object with ``handle(batch)``, sync or async. Four members are optional; each
has its own small protocol below, so a type checker sees them and the bus reads them once,
at subscribe time, with ``isinstance`` (never per event):

* ``interests`` (``WantsEvents``): the event classes the sink wants; default every event. A
  base class (``SpanEvent``) stands for its concrete subclasses. The bus only routes, and
  emit sites only build, what some sink wants.
* ``blocking`` (``BlockingSink``): ``True`` for a sync ``handle`` that may block on file or
  network I/O; it then runs in a worker thread instead of on the event loop.
* ``linger`` (``LingeringSink``): seconds to gather events before a batch is delivered
  (default 0, and 0.05 for blocking sinks); ``flush()`` and unsubscribing cut it short.
* ``aclose()`` (``ClosableSink``): awaited once, after the sink's last batch, when it is
  unsubscribed or the bus closes. The bus is the one owner of this call.

``BaseSink`` gives every optional member its default, for sinks that prefer to inherit.

What the bus guarantees a sink: batches arrive in emit order, one at a time (``handle`` is
never re-entered); each sink has its own bounded buffer, and when it is full the events for
that sink are dropped and counted (``bus.stats()``), never the emitter slowed; a sink that
raises is logged once and counted, and every other sink still gets every event.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

from ckpt_events._public_home import publish

__all__ = ["BaseSink", "BlockingSink", "ClosableSink", "LingeringSink", "Sink", "WantsEvents"]


@runtime_checkable
class Sink(Protocol):
    """Anything with ``handle(batch)``: a list of events, in emit order; sync or async."""

    def handle(self, batch: list[Any], /) -> object: ...


@runtime_checkable
class WantsEvents(Protocol):
    """A sink that names the event classes it wants (``None``: every event)."""

    # Read-only members (here and below): a plain attribute of a narrower type (``interests =
    # (Refused,)``, ``linger = 0.5``) satisfies a property, not a settable protocol attribute.
    @property
    def interests(self) -> Iterable[type[Any]] | type[Any] | None: ...


@runtime_checkable
class BlockingSink(Protocol):
    """A sink whose sync ``handle`` may block, so it runs in a worker thread when ``True``."""

    @property
    def blocking(self) -> bool: ...


@runtime_checkable
class LingeringSink(Protocol):
    """A sink that wants batches gathered for ``linger`` seconds (``None``: the default)."""

    @property
    def linger(self) -> float | None: ...


@runtime_checkable
class ClosableSink(Protocol):
    """A sink with resources to release after its last batch."""

    async def aclose(self) -> None: ...


class BaseSink:
    """A sink base with every optional member at its default: subclass and write ``handle``."""

    interests: Iterable[type[Any]] | type[Any] | None = None
    blocking: bool = False
    linger: float | None = None

    def handle(self, batch: list[Any], /) -> object:
        """Take one batch of events (override this)."""
        raise NotImplementedError

    async def aclose(self) -> None:
        """Release what the sink holds; the default holds nothing."""


# Pickles, reprs and tracebacks name the public module (_public_home.py says why).
publish("ckpt_events", BaseSink, BlockingSink, ClosableSink, LingeringSink, Sink, WantsEvents)
