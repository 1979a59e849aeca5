"""A participant's lease, and what an abort takes back: ``Lease``, ``lease_advice``, ``withdraw_linked``.

It owns the lease of the active checkpoint (``deadline_ts + lease_grace_seconds``, extended by
prepare, renew, commit and restore, never moved back), kept on the monotonic clock so a wall
clock stepped after it was given does not move its end; the signal that wakes whoever waits on
it (the plane's watcher, a waiting prepare); the wording of a refusal past its end; and the
withdraw edge: a manifest a commit linked just before its checkpoint was aborted is taken back.

The phase machine (``control.py``) decides when: it checks the lease under its lock and aborts
a checkpoint that outlived it.
"""

from __future__ import annotations

import datetime
import functools
import time
from collections.abc import Callable

import anyio
import anyio.to_thread

from ckpt_events.participants.server.store import WriteResult, withdraw
from ckpt_events.participants.server.store_files import Beneath

__all__ = ["Lease", "lease_advice", "on_monotonic", "withdraw_linked"]


def on_monotonic(deadline_ts: float) -> float:
    """``deadline_ts`` (a Unix time, as the protocol carries it) on the monotonic clock, as far
    away as it is now: a wall-clock step after this (NTP, a VM resumed) does not move it."""
    return time.monotonic() + (deadline_ts - time.time())


class Lease:
    """The lease of a participant's active checkpoint: none while idle."""

    def __init__(self, grace_seconds: float) -> None:
        self.grace_seconds = grace_seconds
        #: When the lease runs out (a Unix time, as ``/status`` and ``renew`` answer it).
        self.expires_at: float | None = None
        #: When the lease runs out on the monotonic clock (``expires_at`` as it was when
        #: given). Was: ``time.time() >= lease_expires_at``, so a wall clock stepped an hour
        #: forward aborted a prepared checkpoint with 605 s of its lease left, within a second.
        self.ends: float | None = None
        #: Set (and replaced) whenever the lease is extended or ended.
        self.changed = anyio.Event()

    def extend(self, deadline_ts: float) -> None:
        """Extend the lease to ``deadline_ts`` plus the grace (never shorten it), and say so."""
        expires = deadline_ts + self.grace_seconds
        if self.expires_at is None or expires > self.expires_at:
            self.expires_at = expires
            self.ends = on_monotonic(expires)
        self.wake()

    def clear(self) -> None:
        """No lease (the checkpoint was resumed or aborted); ``wake`` says so."""
        self.expires_at = None
        self.ends = None

    def wake(self) -> None:
        """Wake whoever waits on ``changed``."""
        self.changed.set()
        self.changed = anyio.Event()

    def ended(self) -> bool:
        """Whether a lease was given and has run out (on the monotonic clock)."""
        return self.ends is not None and time.monotonic() >= self.ends

    def advice(self) -> Callable[[], str]:
        """``lease_advice`` for this lease as it stands, measured when called."""
        return functools.partial(lease_advice, self.expires_at, self.ends, self.grace_seconds)


def lease_advice(expires_at: float | None, ends: float | None, grace: float) -> str:
    """Why a prepare or commit that outlived its lease is refused, and the fix, measured now: the lease
    (``deadline_ts + lease_grace_seconds``) ended at a time and this long ago."""
    when = "?" if expires_at is None else _utc(expires_at)
    ago = "" if ends is None else f", {max(time.monotonic() - ends, 0.0):.3g} s before this answer"
    return (
        f"the lease ended at {when} (deadline_ts + lease_grace_seconds {grace:g} s){ago}, and this "
        "participant aborted the checkpoint on its own (nobody resumed it); give the checkpoint a "
        "later deadline_ts or the participant a longer lease_grace_seconds, or renew the lease "
        "while a prepare or commit runs"
    )


def _utc(ts: float) -> str:
    """``ts`` (Unix seconds) as ``2026-12-05 00:45:37.334 UTC``."""
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


async def withdraw_linked(directory: Beneath, result: WriteResult) -> str:
    """Take back the manifest a commit linked just before it was aborted (the lease ran out,
    or a resume came, between the link and the answer): the commit is refused, so no restore
    may take it. What to add to the refusal: that it was withdrawn, or that it stays."""
    with anyio.CancelScope(shield=True):  # a refusal with the manifest left behind is a lie
        why = await anyio.to_thread.run_sync(withdraw, directory, result.manifest)
    if why is None:
        return ", its manifest withdrawn (linked just before: no restore can take it)"
    return (
        f", its manifest STILL PUBLISHED at {result.path} (withdrawing it failed: {why}; remove "
        "it, or never restore this checkpoint)"
    )
