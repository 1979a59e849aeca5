"""What the control plane needs of a workload, and nothing more.

``ControlledWorkload`` is what every control plane drives: admission, readiness, fencing,
stop and retire. ``CheckpointableWorkload`` adds the records a single-process plane moves
itself (``export``; ``check_record`` then ``install``). ``Workload`` (in ``base``) implements
both for every kind; a multi-worker server's pool is only a ``ControlledWorkload``: its
workers write and read their own records. ``S`` is the kind's episode state: the control
plane never looks inside it, it only carries the states ``check_record`` returns to
``install``, so a restore checks every record before it installs any.

A restore installs all or nothing: it calls ``install`` inside ``with installing():``, and a
workload whose ``install`` raises part way (or is cancelled) must be, once ``installing()``
has let the error through, exactly as it was before: no episode of the restore in
``episodes``, every ``fence`` mark as it was. ``Workload`` (``base``) does it for its own
``install`` and for any override of it (it copies its episodes and uses
``RetiredAttempts.undone_on_error()``); a workload of your own that is not a ``Workload``
must do the same in its ``installing()``, or a failed restore leaves a participant that is
no longer fresh and refuses the retry.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar, runtime_checkable

from ckpt_events import OperationSpan
from ckpt_events.participants.protocol import EpisodeId, PrepareReport, RetireReply
from ckpt_events.participants.workloads.base import Record
from ckpt_events.participants.workloads.fence import RetiredAttempts

__all__ = ["CheckpointableWorkload", "ControlledWorkload"]

S = TypeVar("S")


class ControlledWorkload(Protocol):
    """The members of a workload every checkpoint state machine uses (``server.control``)."""

    @property
    def kind(self) -> str: ...

    @property
    def record_type(self) -> type[Record]:
        """The record class a commit writes and a restore decodes."""
        ...

    @property
    def episodes(self) -> Mapping[str, object]:
        """The live episodes by capture key (the control plane only counts them)."""
        ...

    @property
    def fence(self) -> RetiredAttempts: ...

    @property
    def admission_open(self) -> bool: ...

    @property
    def served(self) -> bool:
        """Whether any work was admitted (a restore needs a fresh participant)."""
        ...

    def close_admission(self) -> None: ...

    def open_admission(self) -> None: ...

    async def on_admission_closed(
        self, op: OperationSpan, checkpoint_id: str, deadline_ts: float
    ) -> None: ...

    def report(self) -> PrepareReport: ...

    async def wait_changed(self, timeout: float) -> None: ...

    def stop(self, keys: Iterable[str]) -> None: ...

    def commit_extras(self, keys: Sequence[str]) -> dict[str, Any]: ...

    async def retire(self, episode_ids: Iterable[EpisodeId]) -> RetireReply:
        """Mark and free ``episode_ids``; the reply counts the capture keys (each once) and
        names the first ``MAX_RETIRED_KEYS_SHOWN`` of them in sorted order."""
        ...


@runtime_checkable
class CheckpointableWorkload(ControlledWorkload, Protocol[S]):
    """A workload whose records the control plane exports, checks and installs itself."""

    async def export(self, scope: Iterable[EpisodeId] | None) -> Sequence[Record]: ...

    def check_record(self, record: Record) -> S:
        """The state to install from ``record``; raises ``InvalidCheckpointError`` if it does not check."""
        ...

    def installing(self) -> AbstractContextManager[None]:
        """The block ``install`` is called in: when it raises, everything the install put in
        (episodes, fence marks) is taken out before the error goes on (see the module)."""
        ...

    async def install(self, records: Sequence[Record], states: Sequence[S]) -> list[str]:
        """Install each record as attempt + 1 and fence the attempt it came from; the capture
        keys installed. Called inside ``installing()``; raising installs nothing."""
        ...
