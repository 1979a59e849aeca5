"""What the bus and its emitters use of each other beyond ``Bus.emit``, named in one place.

The emitter's hot path (``Telemetry`` and its span handles) does inline what ``Bus.emit``
does, to save a call per span: it reads the bus's routing table, appends to a sink's buffer
while there is room (else counts a drop there), and asks the bus to wake a delivery task
that sleeps. The bus in turn tells every registered emitter when interests change, on the
event loop's thread, so the emitter recomputes its flags and routes once per subscribe and
never per emit. Both sides are private; these Protocols are the whole of what they share.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from ckpt_events._bus import Bus
    from ckpt_events._events import Event
    from ckpt_events._subscription import _Buffer
    from ckpt_events._telemetry import Telemetry

__all__ = ["EventBuffer", "InterestListener", "RoutingBus"]


class EventBuffer(Protocol):
    """A sink's bounded FIFO as an emitter sees it: its room, its wake flag and its drop count."""

    capacity: int
    #: True while the sink's delivery task sleeps: the emitter that fills it calls ``_wake``.
    waiting: bool
    dropped: int

    def __len__(self) -> int: ...

    def append(self, event: object, /) -> None: ...


B = TypeVar("B", bound=EventBuffer)


class RoutingBus(Protocol[B]):
    """What an emitter may use of the bus: its routing table, ``_wake``, and registering itself."""

    @property
    def _routes(self) -> Mapping[type, tuple[B, ...]]:
        """Event class to the buffers of the sinks that want it; replaced whole, never mutated."""

    def _wake(self, buffer: B, /) -> None: ...

    def _add_listener(self, listener: InterestListener, /) -> None: ...

    def wants(self, event_type: type[Event], /) -> bool: ...

    def emit(self, event: Event, /) -> None: ...


class InterestListener(Protocol):
    """An emitter the bus tells, on the event loop's thread, that its routing table changed."""

    def _interest_changed(self) -> None: ...


if TYPE_CHECKING:
    # The type checker holds both sides to the contract (these run nowhere).

    def _bus_keeps_it(bus: Bus) -> RoutingBus[_Buffer]:
        return bus

    def _buffers_keep_it(buffer: _Buffer) -> EventBuffer:
        return buffer

    def _telemetry_listens(tel: Telemetry) -> InterestListener:
        return tel
