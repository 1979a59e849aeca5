"""Discovery: which of the configured servers are checkpoint participants, and of what kind."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

import anyio

from ckpt_events import InvalidArgumentError
from ckpt_events.participants.controller.client import ControlClient, ParticipantCallError
from ckpt_events.participants.controller.types import CoordinationError, Member, check_url
from ckpt_events.participants.errors import shown
from ckpt_events.vocab import Kind, kind_name

__all__ = ["DISCOVER_TIMEOUT", "DISCOVER_TRIES", "discover_members"]

DISCOVER_TRIES: Final = 3
DISCOVER_TIMEOUT: Final = 60.0
Failures = dict[str, str]


async def discover_members(
    servers: Mapping[str, str] | Iterable[str],
    control: ControlClient,
    *,
    tries: int = DISCOVER_TRIES,
    timeout: float = DISCOVER_TIMEOUT,
    retry_delay: float = 0.5,
) -> list[Member]:
    """Probe ``GET /status`` on every server; returns the participants, sorted by (stage, name).

    A 404 means "not a participant". Any other failure is retried up to ``tries`` times,
    then raises ``CoordinationError("discover", ...)``; so do two servers that answer as one
    participant (kind and instance) or would be one member (name), and a fleet without a model.
    A URL that cannot be a participant's (``check_url``) is ``InvalidValueError``, before any call.
    """
    named = dict(servers) if isinstance(servers, Mapping) else {url: url for url in servers}
    for url in named.values():
        check_url(url)
    found: dict[str, Member] = {}  # by its name in ``servers``
    failures: Failures = {}

    async def probe(name: str, url: str) -> None:
        last = "no attempt"
        for attempt in range(tries):
            try:
                status = await control.status(url, timeout=timeout)
            except ParticipantCallError as exc:
                if exc.status == 404:
                    return
                last = str(exc)
                if attempt + 1 < tries:
                    await anyio.sleep(retry_delay)
                continue
            try:
                kind = kind_name(status.kind)
            except InvalidArgumentError as exc:
                failures[name] = f"status reply is not a participant's: {exc}"
                return
            instance = status.instance
            if kind == Kind.CONTROLLER:
                failures[name] = "a controller is not a participant"
                return
            label = instance if name == url else name
            found[name] = Member(name=label, kind=kind, instance=instance, url=url)
            return
        failures[name] = last

    async with anyio.create_task_group() as tg:
        for name, url in named.items():
            tg.start_soon(probe, name, url)
    failures.update(_twins(found))
    if failures:
        raise CoordinationError("discover", failures)
    if not any(m.kind == Kind.MODEL for m in found.values()):
        raise CoordinationError("discover", {"model": "no model participant was found"})
    return sorted(found.values(), key=Member.sort_key)


def _twins(found: Mapping[str, Member]) -> Failures:
    """The servers (by name in ``servers``) that clash with another, the first in name order
    kept: one kind and instance (their commits would write one checkpoint directory), or one
    member name (their replies would be taken for each other's)."""
    first_as: dict[tuple[str, str], str] = {}
    first_named: dict[str, str] = {}
    clashes: Failures = {}
    for name, member in sorted(found.items()):
        twin = first_as.setdefault((member.kind, member.instance), name)
        if twin != name:
            clashes[name] = (
                f"answers as {member.kind}/{member.instance}, as {twin} does: two servers would "
                "write one checkpoint directory (give each its own --instance)"
            )
        elif (twin := first_named.setdefault(member.name, name)) != name:
            clashes[name] = (
                f"would be member {shown(member.name)}, as {twin} is: give each server its own "
                "--instance, or name each (a mapping of names to URLs)"
            )
    return clashes
