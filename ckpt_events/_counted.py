"""The counted (point) events of ``Telemetry``: refusals, expired leases, prepares not
ready and generation cuts. One attribute check when no sink wants them, as for spans."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from ckpt_events._errors import argument_error
from ckpt_events._events import GenerationCut, LeaseExpired, PrepareNotReady, Refused
from ckpt_events._vocab import Disposition, ErrorCode, Kind, Phase, check_name, coerce

if TYPE_CHECKING:
    from ckpt_events._bus import Bus

__all__ = ["CountedEvents"]

_CODES: Final = frozenset(c.value for c in ErrorCode)
_PHASES: Final = frozenset(p.value for p in Phase)
_DISPOSITIONS: Final = frozenset(d.value for d in Disposition)


class CountedEvents:
    """``Telemetry``'s point events (a mixin: ``Telemetry`` holds the fields and flags)."""

    __slots__ = ()
    bus: Bus
    kind: Kind
    instance: str
    worker: int | None
    _clock: Callable[[], int]
    _refused_on: bool
    _lease_on: bool
    _not_ready_on: bool
    _cut_on: bool

    def refused(self, code: ErrorCode | str, *, checkpoint_id: str | None = None) -> None:
        """Count a request refused with protocol error ``code``."""
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
        if not self._not_ready_on:
            return
        if isinstance(blockers, bool) or not isinstance(blockers, int) or blockers < 0:
            raise argument_error(f"blockers must be an int >= 0, not {blockers!r}", blockers, int)
        self.bus.emit(
            PrepareNotReady(
                self.kind, self.instance, self._clock(), blockers, checkpoint_id, self.worker
            )  # positional, in field order
        )

    def generation_cut(
        self, disposition: Disposition | str, calls: int, *, checkpoint_id: str | None = None
    ) -> None:
        """Count ``calls`` in-flight generations that a cut round ended with ``disposition``."""
        if not self._cut_on:
            check_name(_DISPOSITIONS, disposition, Disposition)
            return
        if isinstance(calls, bool) or not isinstance(calls, int) or calls < 0:
            raise argument_error(f"calls must be an int >= 0, not {calls!r}", calls, int)
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
