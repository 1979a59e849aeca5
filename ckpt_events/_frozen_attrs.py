"""``FrozenAttributes``: a finished span's extra attributes, which no one can change.

One event object is shared by every sink, so a sink that changed ``event.attributes`` would
change them under its neighbours, and a ``set_attribute()`` after the block would rewrite an
event already delivered. A ``dict`` subclass (msgspec encodes it as the ``dict`` it is) whose
mutators raise ``TypeError``: read it as a dict, copy it (``dict(attributes)``) to change it.
"""

from __future__ import annotations

from typing import Any, Final, NoReturn

__all__ = ["ENDED", "FrozenAttributes"]


class FrozenAttributes(dict[str, Any]):
    """A read-only ``dict`` of attribute values."""

    __slots__ = ()

    def _refuse(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError("a finished span's attributes cannot be changed; copy them with dict()")

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self) -> tuple[type[FrozenAttributes], tuple[dict[str, Any]]]:
        return FrozenAttributes, (dict(self),)

    def __copy__(self) -> FrozenAttributes:
        return self  # immutable: a copy is itself

    def __deepcopy__(self, memo: dict[int, object]) -> FrozenAttributes:
        return self


#: The attributes of a span that ended without any (its event carries ``None`` for them).
ENDED: Final = FrozenAttributes()
