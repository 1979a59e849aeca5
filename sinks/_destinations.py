"""Where a ``configure()`` of a bus exports to, held while its ``Configured`` is open.

A second ``configure()`` of one bus to a place the first still exports to subscribed a second
set of sinks there: every span went twice (the same ids, so a backend showed each twice or
kept either), every counter and histogram point was recorded twice (the collector's sums
doubled), and two writers appended to one JSON-lines file. That happens when a server's own
lifespan calls ``configure()`` on the bus that ``instrument()`` configures already. So each
place is claimed for the bus until the ``Configured`` that exports there is closed; a second
claim is refused in one line. Two configures of one bus to different places (two logs, two
collectors) and two buses to one place (their events are not the same) stay allowed.
A ``tracer_provider=`` or ``meter_provider=`` of the user's is a place too (the object itself):
configured twice with one, every span reached its processors twice and every metric was
counted twice (1 commit of 3 records: 2 spans, ``records_total`` 6).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Mapping
from typing import Any, Final

from ckpt_events import Bus, ConfigurationError
from ckpt_events.sinks.otel._env import OtelSettings

__all__ = ["check_free", "claim", "destinations", "provider_places", "release"]

#: Per bus: each place exported to, and the open ``Configured`` that exports there.
_CLAIMED: Final[weakref.WeakKeyDictionary[Bus, dict[str, object]]] = weakref.WeakKeyDictionary()


def destinations(
    settings: OtelSettings, jsonl_path: Any, env: Mapping[str, str], env_jsonl: str
) -> list[str]:
    """The places ``configure()`` with ``settings`` and ``jsonl_path`` (else ``env[env_jsonl]``)
    exports to, each as it is named in the refusal: the JSON-lines file (its real path, so a
    relative and an absolute name of one file are one place) and each OTLP endpoint."""
    places: list[str] = []
    path = jsonl_path if jsonl_path is not None else (env.get(env_jsonl) or "").strip() or None
    if path is not None:
        try:
            where = os.path.realpath(os.fspath(path))
        except (TypeError, ValueError, OSError):  # not a path (a NUL byte): configure() says so after
            where = repr(path)
        places.append(f"JSON lines to {where}")
    if not settings.sdk_disabled:
        if "otlp" in settings.traces and settings.traces_otlp is not None:
            places.append(f"OTLP spans to {settings.traces_otlp.endpoint}")
        if "otlp" in settings.metrics and settings.metrics_otlp is not None:
            places.append(f"OTLP metrics to {settings.metrics_otlp.endpoint}")
    return places


def provider_places(tracer_provider: object, meter_provider: object) -> list[str]:
    """The places a user's ``tracer_provider`` and ``meter_provider`` are: each object itself
    (named by its type and id, unique while the ``Configured`` holding it is open)."""
    places: list[str] = []
    if tracer_provider is not None:
        places.append(f"spans to your {type(tracer_provider).__name__} at 0x{id(tracer_provider):x}")
    if meter_provider is not None:
        places.append(f"metrics to your {type(meter_provider).__name__} at 0x{id(meter_provider):x}")
    return places


def check_free(bus: Bus, places: list[str]) -> None:
    """``ConfigurationError`` if an open ``configure()`` of ``bus`` exports to one of ``places``."""
    claimed = _CLAIMED.get(bus)
    if not claimed:
        return
    for place in places:
        if place in claimed:
            raise ConfigurationError(
                f"this bus already exports {place} (an earlier configure() of it, still open): a "
                f"second would send every span and metric there twice; keep one, or close the "
                f"first (await configured.aclose()) before configuring again"
            )


def claim(bus: Bus, places: list[str], owner: object) -> None:
    """Hold ``places`` for ``bus`` until ``release(bus, owner)``."""
    if places:
        claimed = _CLAIMED.setdefault(bus, {})
        for place in places:
            claimed[place] = owner


def release(bus: Bus, owner: object) -> None:
    """Give up what ``owner`` claimed on ``bus`` (its ``Configured`` closed)."""
    claimed = _CLAIMED.get(bus)
    if claimed:
        for place in [place for place, held in claimed.items() if held is owner]:
            del claimed[place]
