"""What the coordinator works with and hands back: members, episode ids, results, errors."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import urlsplit

import msgspec

from ckpt_events import InvalidValueError
from ckpt_events.participants.errors import CheckpointNotPrepared, CoordinationError, shown
from ckpt_events.participants.kinds import stage_index
from ckpt_events.participants.protocol import EpisodeId, PrepareReply

__all__ = [
    "FAILURES_ATTRIBUTE",
    "CheckpointNotPrepared",
    "CoordinationError",
    "Member",
    "MemberFailure",
    "PrepareResult",
    "check_url",
    "failures_value",
    "read_failures",
]

#: The span attribute on which the coordinator records whose calls failed and how (a JSON list
#: of ``MemberFailure``), on each stage or coordinate span that had failures. The controller
#: knows which checkpoint a refused call was for; the participant does not always (a refusal
#: before the body is read, a wrong token, names no checkpoint), and never reads an
#: unauthenticated request's claim.
FAILURES_ATTRIBUTE: Final = "ckpt_events.failures"
#: Members recorded on one span at most (a fleet of 64 refusing at once stays one small value).
MAX_FAILURES_RECORDED: Final = 16
_MAX_SAID: Final = 512


class Member(msgspec.Struct, frozen=True, order=True):
    """One discovered participant: its config ``name``, ``kind``, ``instance`` and base ``url``."""

    name: str
    #: A participant kind (a ``Kind`` constant's or a user's own, ``ckpt_events.participants.kinds``
    #: gives its place).
    kind: str
    instance: str
    url: str

    def sort_key(self) -> tuple[int, str, str]:
        return stage_index(self.kind), self.kind, self.name


class MemberFailure(msgspec.Struct, frozen=True):
    """One member's failed call as the coordinator received it: ``said`` is what went wrong, in
    words (``refused: unauthorized (401): missing or wrong bearer token``, ``unreachable at
    URL: ...``, ``committed 3 episodes, not the 4 asked for ...``)."""

    kind: str
    instance: str
    said: str


def check_url(url: str) -> str:
    """``url`` if it can be a participant's base URL: http(s), a host and a port in 0-65535,
    else ``InvalidValueError`` (httpx took a port past 65535 or not a number, and the first
    call raised ``OverflowError`` or ``InvalidURL`` out of the fan-out, naming no member)."""
    parsed = urlsplit(url)
    try:
        parsed.port  # noqa: B018  # raises on a port that is not one
    except ValueError:
        raise InvalidValueError(f"participant URL {shown(url)} has no valid port (0-65535)") from None
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise InvalidValueError(
            f"participant URL {shown(url)} is not an http(s) URL, e.g. http://127.0.0.1:8000"
        )
    return url


_failures_decoder: Final = msgspec.json.Decoder(list[MemberFailure])


def failures_value(members: Iterable[Member], failures: Mapping[str, str]) -> str:
    """``FAILURES_ATTRIBUTE``'s value for ``failures`` (member name -> what went wrong) among
    ``members``: the first ``MAX_FAILURES_RECORDED`` in name order."""
    by_name = {m.name: m for m in members}
    recorded = [
        MemberFailure(
            by_name[name].kind if name in by_name else "?",
            by_name[name].instance if name in by_name else name,
            said[:_MAX_SAID],
        )
        for name, said in sorted(failures.items())[:MAX_FAILURES_RECORDED]
    ]
    return msgspec.json.encode(recorded).decode()


def read_failures(value: object) -> list[MemberFailure]:
    """The failures a span recorded under ``FAILURES_ATTRIBUTE`` (``[]`` if ``value`` is not one)."""
    if not isinstance(value, str):
        return []
    try:
        return _failures_decoder.decode(value)
    except msgspec.DecodeError:
        return []


@dataclass(frozen=True)
class PrepareResult:
    """The outcome of a staged prepare: every reply so far, and where it stopped."""

    checkpoint_id: str
    prepared: bool
    stopped_at: str | None = None
    replies: dict[str, PrepareReply] = field(default_factory=dict)

    def blockers(self) -> dict[str, list[str]]:
        """Member name to the blockers it reported (only members that reported some)."""
        return {name: list(r.report.blockers) for name, r in self.replies.items() if r.report.blockers}

    def blocker_count(self) -> int:
        """The full number of blockers over every member (replies cap the list at 100)."""
        return sum(r.report.blocker_count for r in self.replies.values())

    def restarts(self) -> set[str]:
        """The union of every reply's ``report.restarts`` (capture keys)."""
        return {key for r in self.replies.values() for key in r.report.restarts}

    def continued(self, episodes: Iterable[EpisodeId]) -> list[EpisodeId]:
        """``episodes`` without the restarts: what a commit may continue."""
        restarts = self.restarts()
        return [e for e in episodes if e.capture_key not in restarts]
