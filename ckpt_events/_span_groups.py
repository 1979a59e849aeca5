"""Span groups: named switches for families of spans, shared by every sink.

A spec string such as ``"default,checkpoint"`` is comma-separated, case-insensitive and
whitespace-trimmed, and mixes presets and groups. ``checkpoint`` is opt-in: the coarse
``default`` preset leaves it out on purpose.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from ckpt_events._errors import InvalidTypeError, UnknownNameError, shown
from ckpt_events._public_home import publish

__all__ = ["SPAN_GROUPS", "SPAN_GROUP_PRESETS", "resolve_span_groups"]

#: Every group we know. Only ``checkpoint`` produces spans in this package; the others keep
#: spec strings written for the original system valid.
SPAN_GROUPS: Final = frozenset(
    {"job", "server", "http_client", "rollout", "verify", "agent", "model_call", "sandbox", "checkpoint"}
)
_SPINE: Final = frozenset({"server", "http_client", "rollout"})
SPAN_GROUP_PRESETS: Final[dict[str, frozenset[str]]] = {
    "default": frozenset({"job"}) | _SPINE,
    "per_rollout": frozenset({"verify", "agent", "model_call"}) | _SPINE,
    "all": SPAN_GROUPS,
}


def resolve_span_groups(spec: str | Iterable[str] | None) -> frozenset[str]:
    """Resolve a spec (``"default,checkpoint"``, or a list of names) into a set of groups.

    Empty entries are skipped; ``None`` or ``""`` gives no groups. An unknown name raises
    ``UnknownNameError`` listing every valid preset and group.
    """
    if spec is None:
        return frozenset()
    if isinstance(spec, str):
        names: Iterable[object] = spec.split(",")
    elif isinstance(spec, Iterable):
        names = spec
    else:
        raise InvalidTypeError(
            f"span groups must be a comma-separated string or a list of names, not {shown(spec)}"
        )
    groups: set[str] = set()
    for raw in names:
        if not isinstance(raw, str):
            raise InvalidTypeError(f"span group names must be strings, not {shown(raw)}")
        name = raw.strip().lower()
        if not name:
            continue
        if name in SPAN_GROUP_PRESETS:
            groups |= SPAN_GROUP_PRESETS[name]
        elif name in SPAN_GROUPS:
            groups.add(name)
        else:
            valid = sorted(SPAN_GROUP_PRESETS) + sorted(SPAN_GROUPS)
            raise UnknownNameError("span group", raw.strip(), valid)
    return frozenset(groups)


# Pickles, reprs and tracebacks name the public module (_public_home.py says why).
publish("ckpt_events.vocab", resolve_span_groups)
