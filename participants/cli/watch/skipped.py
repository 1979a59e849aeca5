"""What ``watch``'s reads of a log skipped, counted in bounded memory and said in one note per
file: lines damaged, and events of types, or of known types with values, this version does not
know (a newer server's, in a fleet being upgraded: said as such, not as damage).
"""

from __future__ import annotations

from typing import Final

from ckpt_events.checks import shown

__all__ = ["count_type", "count_value", "skipped_note"]

#: The (field, value) pairs kept per file (a damaged or hostile file could hold a new one each
#: line); the others are counted under ``_OTHER_VALUES``, as is a value too long to be a word.
_VALUES_KEPT: Final = 64
_OTHER_VALUES: Final = ("", "")


def skipped_note(
    path: str, corrupt: int, types: dict[str | None, int], values: dict[tuple[str, str], int]
) -> str:
    """What a log's reads skipped: lines damaged, and events of types, or of known types with
    values, this version does not know (a newer server's, in a fleet being upgraded: said as
    such, not as damage)."""
    parts = []
    if corrupt:
        parts.append(f"{corrupt} corrupt line(s) skipped")
    if types:
        # Named with their counts, as ``report`` names them (was: a bare count of events).
        kinds = sorted(
            ((n, kind) for kind, n in types.items() if kind is not None), key=lambda t: (-t[0], t[1])
        )
        listed = ", ".join(f"{shown(kind)} {n:,}" for n, kind in kinds[:3])
        more = " and more" if len(kinds) > 3 or None in types else ""
        parts.append(
            f"{sum(types.values())} event(s) of a type this version does not know skipped "
            f"({listed or 'types not kept'}{more}; written by another version of ckpt-events?)"
        )
    if values:
        named = sorted(
            ((n, key) for key, n in values.items() if key != _OTHER_VALUES), key=lambda t: (-t[0], t[1])
        )
        listed = ", ".join(f"{shown(name)} {shown(value)} {n:,}" for n, (name, value) in named[:3])
        more = " and more" if len(named) > 3 or _OTHER_VALUES in values else ""
        parts.append(
            f"{sum(values.values())} event(s) with a value this version does not know skipped "
            f"({listed or 'values not kept'}{more}; written by another version of ckpt-events?)"
        )
    return f"{path}: {'; '.join(parts)}"


def count_type(types: dict[str | None, int], kind: str) -> None:
    """Count an event of type ``kind``; past ``_VALUES_KEPT`` types (or one too long to be a
    word), under ``None``."""
    key: str | None = kind
    if kind not in types and (len(types) >= _VALUES_KEPT or len(kind) > 64):
        key = None
    types[key] = types.get(key, 0) + 1


def count_value(values: dict[tuple[str, str], int], key: tuple[str, str]) -> None:
    if key not in values and (len(values) >= _VALUES_KEPT or len(key[1]) > 64):
        key = _OTHER_VALUES
    values[key] = values.get(key, 0) + 1
