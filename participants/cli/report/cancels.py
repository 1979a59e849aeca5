"""A cancelled span told apart from a failed one, in one place for every renderer.

A server that stops with a request in flight (uvicorn's graceful-shutdown deadline, a forced
exit) cancels the request's task: its operation and steps end in outcome ``error`` with
``CancelledError`` (asyncio, concurrent.futures) or trio's ``Cancelled`` as their error type.
That is not the handler's failure, and the report does not know why the task was cancelled
beyond the message the span recorded: a cancelled span is said ``cancelled`` (``⊘``), counted
apart from the errors (``✗``), and its message quoted, never a cause made up.
"""

from __future__ import annotations

from typing import Final

__all__ = ["CANCELLED_MARK", "FAILED_MARK", "ended", "is_cancelled", "mark"]

#: How a failed span is marked, after its name.
FAILED_MARK: Final = "✗"
#: How a cancelled span is marked instead.
CANCELLED_MARK: Final = "⊘"
#: The last names of the exception types a cancelled task ends with.
_CANCELLED: Final = frozenset({"CancelledError", "Cancelled"})


def is_cancelled(error_type: str | None) -> bool:
    """Whether a span that ended with ``error_type`` (dotted, or its last name) was cancelled."""
    return error_type is not None and error_type.rsplit(".", 1)[-1] in _CANCELLED


def mark(error_type: str | None) -> str:
    """``⊘`` for a cancelled span's ``error_type``, ``✗`` for any other failure."""
    return CANCELLED_MARK if is_cancelled(error_type) else FAILED_MARK


def ended(error_type: str | None) -> str:
    """``cancelled`` or ``failed``: how a span that ended with ``error_type`` ended, in words."""
    return "cancelled" if is_cancelled(error_type) else "failed"
