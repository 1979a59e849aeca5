"""Which coordinator operation a worker's share belongs to, so the share joins its trace.

The control plane opens its operation span (``gym.checkpoint.commit``, ...) deep inside
``ControlPlane``; the pool, which sends the frames, only sees the workload calls made under
it. ``WorkerControlPlane._operation`` enters each span and notes it (``noted``) in a context
variable of the request's task; the pool reads it (``current_share``) and puts the
operation's ``traceparent`` and checkpoint id on the frames, so each worker's share is a
child span of the coordinator's operation. When the main process has no sink (its span is a
no-op), the incoming ``traceparent`` is forwarded instead: the shares still join the
controller's trace.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from typing import Final

from ckpt_events import OperationSpan, format_traceparent
from ckpt_events.participants.fastapi import Incoming

__all__ = ["Share", "current_share", "noted"]


class Share:
    """The coordinator operation a frame belongs to: its checkpoint id and trace context."""

    __slots__ = ("checkpoint_id", "incoming", "span")

    def __init__(self, span: OperationSpan, checkpoint_id: str | None, incoming: str | None) -> None:
        self.span = span
        self.checkpoint_id = checkpoint_id
        self.incoming = incoming

    def traceparent(self) -> str | None:
        """The operation span's ``traceparent``, else (no sink here) the caller's."""
        return self.span.traceparent() or self.incoming


_CURRENT: Final[ContextVar[Share | None]] = ContextVar("ckpt_events_worker_share", default=None)


def current_share() -> Share | None:
    """The operation the calling task is inside, if it was opened through ``noted``."""
    return _CURRENT.get()


@contextmanager
def noted(
    operation: AbstractContextManager[OperationSpan], checkpoint_id: str | None, trace: Incoming
) -> Iterator[OperationSpan]:
    """Enter ``operation`` (for ``checkpoint_id``, called with ``trace``) and note it as the
    calling task's share until it ends."""
    incoming = None if trace.parent is None else format_traceparent(*trace.parent)
    with operation as span:
        # Set in the request's own task: each HTTP call runs in its own, so nothing leaks across.
        token = _CURRENT.set(Share(span, checkpoint_id, incoming))
        try:
            yield span
        finally:
            _CURRENT.reset(token)
