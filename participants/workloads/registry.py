"""The participant kinds this package serves: one row per kind, and everything else derives from it.

A row names the kind's workload class, its default instance, whether it talks to the
inference worker, and its colour in the reports (a presentation detail, kept here so a kind
is one row). ``KINDS`` lists them in stage order (prepare order; resume runs the reverse):
the app factory, ``serve``, the local and process fleets, the demo, the benchmarks and the
report renderers read it, and a test checks that no other source lists kinds (but the order
rule, ``ckpt_events.participants.kinds``, which places a kind it does not name after the
others). A new reference kind is its workload module, one row here (and its member of
``ckpt_events.vocab.Kind``) and its tests; a user's own kind needs none of it.
Other registries (``KINDS.replacing(...)``, or ``KindRegistry(rows)``) can be passed to
``create_app``, ``local_fleet`` and the renderers instead, e.g. to try a workload in a test.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from ckpt_events import InvalidTypeError, InvalidValueError
from ckpt_events.participants.errors import shown
from ckpt_events.participants.workloads.agent import AgentWorkload
from ckpt_events.participants.workloads.base import Record, Workload
from ckpt_events.participants.workloads.environment import EnvironmentWorkload
from ckpt_events.participants.workloads.model import ModelWorkload
from ckpt_events.participants.workloads.resources import ResourcesWorkload
from ckpt_events.vocab import Kind, kind_name

__all__ = [
    "CONTROLLER_COLOUR",
    "KINDS",
    "OTHER_COLOURS",
    "KindRegistry",
    "KindRow",
    "check_registry",
    "colour_of",
    "other_colour",
]

#: The coordinator's bars in the reports (it reports as kind ``controller``, which has no row).
CONTROLLER_COLOUR: Final = "#a855f7"
#: The bars of a kind the registry has no row for (a user's own, read from their logs): one of
#: these by a hash of its name, so a kind has one colour in every table, waterfall and page of
#: every report. None is a row's, the controller's or an outcome's (a test keeps them apart).
#: Before, such a kind was drawn white and the legend listed only the registry's kinds.
OTHER_COLOURS: Final = ("#0d9488", "#db2777", "#4f46e5", "#65a30d", "#c2410c", "#0284c7")
#: What a ``Workload`` of the user's own defines: the base's raise ``NotImplementedError``.
_HOOKS: Final = ("initial_state", "work", "to_record", "from_record")


@dataclass(frozen=True, slots=True)
class KindRow:
    """One participant kind: what it runs, what its first instance is called, how it is drawn."""

    #: A ``Kind`` constant, or a kind of the user's own (``ckpt_events.vocab.NAME_RULE``).
    kind: str
    workload: type[Workload[Any, Any]]
    #: The instance name ``serve``, the fleets and the demo use when none is given.
    instance: str
    #: ``#rrggbb``: the kind's bars in the terminal and HTML reports.
    colour: str
    #: The workload takes ``inference_url``/``inference_token`` (the model's generation cut).
    uses_inference: bool = False

    def __post_init__(self) -> None:
        """Refuse, where the row is made, a row no server could serve as that kind. Each was
        served before: a ``controller`` row was refused only by discovery; a workload of
        another ``kind`` answered ``/status`` (so took its stage) as that kind while its spans
        said the row's; a workload missing a hook failed every work call or commit with a
        bare ``NotImplementedError``."""
        kind = kind_name(self.kind)
        if kind == Kind.CONTROLLER:
            raise InvalidValueError(
                "kind 'controller' is the coordinator's: name a participant kind otherwise (e.g. 'judge')"
            )
        workload: object = self.workload
        if not (isinstance(workload, type) and issubclass(workload, Workload)):
            raise InvalidTypeError(
                f"the {kind} row's workload must be a Workload class, not {shown(workload)}"
            )
        name = workload.__name__
        declared = getattr(workload, "kind", None)
        if declared is None:
            raise InvalidValueError(
                f"the {kind} row's workload {name} sets no kind: set kind = {kind!r} on it"
            )
        if declared != kind:
            raise InvalidValueError(
                f"the {kind} row's workload {name} serves kind {shown(str(declared))}: set kind = "
                f"{kind!r} on it, or name the row {shown(str(declared))}"
            )
        missing = [hook for hook in _HOOKS if getattr(workload, hook) is getattr(Workload, hook)]
        record_type = getattr(workload, "record_type", None)
        if not (isinstance(record_type, type) and issubclass(record_type, Record)):
            missing.append("record_type")
        if missing:
            raise InvalidValueError(
                f"the {kind} row's workload {name} does not define {', '.join(missing)}: a Workload "
                "defines initial_state, work, to_record and from_record, and sets record_type "
                "(a Record subclass)"
            )


class KindRegistry:
    """Rows by kind, in stage order; read-only once built."""

    __slots__ = ("_rows",)

    def __init__(self, rows: Iterable[KindRow]) -> None:
        self._rows: dict[str, KindRow] = {}
        for row in rows:
            if row.kind in self._rows:
                raise InvalidValueError(f"kind {shown(str(row.kind))} has two rows")
            self._rows[row.kind] = row

    def __iter__(self) -> Iterator[KindRow]:
        return iter(self._rows.values())

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, kind: object) -> bool:
        return kind in self._rows

    def __getitem__(self, kind: str) -> KindRow:
        """The row of ``kind`` (a ``Kind`` or its value); ``InvalidValueError`` if it has none."""
        name = kind_name(kind)
        row = self._rows.get(name)
        if row is None:
            # A user's own kind is a row of theirs: say how to add it (was: the known kinds only).
            fix = (
                "the coordinator's, not a participant's"
                if name == Kind.CONTROLLER
                else "a kind of your own is a row of yours: "
                f"kinds=KINDS.replacing(KindRow({name!r}, YourWorkload, ...))"
            )
            raise InvalidValueError(f"kind must be one of {', '.join(self.names)}, not {shown(kind)} ({fix})")
        return row

    @property
    def names(self) -> tuple[str, ...]:
        """The kinds' values, in stage order."""
        return tuple(str(kind) for kind in self._rows)

    def members(self) -> tuple[tuple[str, str], ...]:
        """``(kind, default instance)`` of every kind: one participant of each."""
        return tuple((str(row.kind), row.instance) for row in self)

    def colours(self) -> dict[str, str]:
        """Kind value -> colour, in stage order."""
        return {str(row.kind): row.colour for row in self}

    def palette(self) -> dict[str, str]:
        """Who -> colour as the reports draw it: the controller, then every kind in stage order."""
        return {Kind.CONTROLLER.value: CONTROLLER_COLOUR, **self.colours()}

    def palette_for(self, seen: Iterable[str]) -> dict[str, str]:
        """Who -> colour for the kinds in ``seen`` (a report's legend lists what its logs hold):
        the controller and each kind with a row, in that order, then the others by name, each in
        its ``OTHER_COLOURS`` colour."""
        seen = set(seen)
        known = {who: colour for who, colour in self.palette().items() if who in seen}
        return known | {kind: other_colour(kind) for kind in sorted(seen - known.keys())}

    def replacing(self, *rows: KindRow) -> KindRegistry:
        """A copy with ``rows`` in place of the rows of their kinds (appended if new)."""
        by_kind: dict[str, KindRow] = {**self._rows, **{row.kind: row for row in rows}}
        return KindRegistry(by_kind.values())


def check_registry(kinds: object) -> KindRegistry:
    """``kinds`` as given to ``create_app(kinds=...)``: a ``KindRegistry``, else ``InvalidTypeError``
    naming what to pass (a list or a dict failed as a bare ``TypeError`` at the first lookup)."""
    if not isinstance(kinds, KindRegistry):
        raise InvalidTypeError(
            f"kinds must be a KindRegistry (KINDS.replacing(row), or KindRegistry(rows)), not {shown(kinds)}"
        )
    return kinds


def other_colour(kind: str) -> str:
    """The colour of ``kind``, one the registry has no row for: the same in every report."""
    return OTHER_COLOURS[zlib.crc32(kind.encode("utf-8", "replace")) % len(OTHER_COLOURS)]


def colour_of(who: str, palette: Mapping[str, str]) -> str:
    """The colour of ``who`` (``kind/instance`` or a kind): its kind's in ``palette``, else
    ``other_colour``'s. The terminal and the HTML page draw with it."""
    kind = who.split("/", 1)[0]
    return palette.get(kind) or other_colour(kind)


KINDS: Final = KindRegistry(
    (
        KindRow(Kind.ENVIRONMENT, EnvironmentWorkload, instance="environment-0", colour="#16a34a"),
        KindRow(Kind.MODEL, ModelWorkload, instance="model-0", colour="#2563eb", uses_inference=True),
        KindRow(Kind.AGENT, AgentWorkload, instance="agent-0", colour="#0891b2"),
        KindRow(Kind.RESOURCES, ResourcesWorkload, instance="resources-0", colour="#ca8a04"),
    )
)
