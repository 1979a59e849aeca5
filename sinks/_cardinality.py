"""Metric cardinality: each instrument keeps at most ``limit`` attribute sets, the rest one series.

OpenTelemetry's metric SDK rule (the specification's "Cardinality limits", enforced by
opentelemetry-sdk from 1.45.2, default 2,000 per instrument): the first ``limit`` distinct
attribute sets an instrument sees keep their own series; a measurement whose set was first seen
after that is folded into one overflow series whose only attribute is
``otel.metric.overflow=true`` (``_metric_keys.OVERFLOW_KEY``). Totals stay right; a query by
attribute undercounts from then on. Kinds are the user's open words (steps are on no metric)
and an event's fields are not checked by ``bus.emit``, so without the limit a loop of new names grew memory
and the scrape page without bound (200,000 refusal codes: a 21.6 MB page and +162 MiB).

``Overflow`` holds one owner's limit, counts the measurements each instrument folded into its
overflow series, and logs one warning per instrument, the first time. ``AttributeSets`` applies
it where attributes go to an SDK (``MetricSink``) instead of into our own totals.
``InvalidMeasurements`` is the other thing every metric owner keeps beside its limit: what it
refused to record, as the SDK refuses it (a negative amount, a non-finite value).
"""

from __future__ import annotations

from typing import Any, Final

from ckpt_events._errors import check_int, shown
from ckpt_events._logs import library_logger
from ckpt_events.sinks._metric_keys import OVERFLOW_ATTRIBUTE, OVERFLOW_KEY, attributes_of

__all__ = [
    "DEFAULT_CARDINALITY_LIMIT",
    "OVERFLOW_ATTRIBUTES",
    "AttributeSets",
    "InvalidMeasurements",
    "Overflow",
    "check_cardinality_limit",
]

logger: Final = library_logger("ckpt_events.sinks.metrics")

#: Attribute sets per instrument, OpenTelemetry's default (the SDK's and the specification's).
DEFAULT_CARDINALITY_LIMIT: Final = 2_000
#: The overflow series' attributes (``OVERFLOW_KEY``'s): the SDK's own set, so an SDK that caps
#: too puts its overflow and ours in one series.
OVERFLOW_ATTRIBUTES: Final = attributes_of(OVERFLOW_KEY)


def check_cardinality_limit(value: object, name: str = "cardinality_limit") -> int:
    """``value`` when it is an int >= 1; otherwise the error naming ``name``."""
    return check_int(
        value, f"{name} must be a whole number of attribute sets >= 1, not {shown(value)}", minimum=1
    )


class Overflow:
    """One owner's cardinality limit, and what its instruments folded into their overflow series.

    ``by_instrument`` maps an instrument's name to the measurements recorded in its overflow
    series (a few entries: one per instrument that reached the limit); ``measurements`` is
    their sum. Not locked: its owner calls it under the lock it folds events under.
    """

    __slots__ = ("by_instrument", "limit", "owner")

    def __init__(self, limit: int = DEFAULT_CARDINALITY_LIMIT, *, owner: str = "metrics") -> None:
        self.limit = check_cardinality_limit(limit)
        self.owner = owner
        self.by_instrument: dict[str, int] = {}

    def fold(self, instrument: str) -> None:
        """Count one measurement of ``instrument`` folded into its overflow series; the first
        one of each instrument is logged (a warning), the rest only counted."""
        count = self.by_instrument.get(instrument)
        if count is None:
            count = 0
            logger.warning(
                "%s: %s reached its cardinality limit of %d attribute sets; measurements with a new "
                "set are recorded under %s=true from now on (a participant kind made of an instance "
                "or an id, or hand-built events' codes? steps are on no metric; else raise "
                "cardinality_limit)",
                self.owner,
                instrument,
                self.limit,
                OVERFLOW_ATTRIBUTE,
            )
        self.by_instrument[instrument] = count + 1

    @property
    def measurements(self) -> int:
        """Measurements folded into an overflow series so far, over every instrument."""
        return sum(self.by_instrument.values())


class InvalidMeasurements:
    """Measurements an owner refused, as OpenTelemetry's SDK refuses them: a negative counter
    amount, a negative or non-finite histogram value (an event built by hand, or replayed:
    ``bus.emit`` checks no field). ``by_instrument`` counts them; the first is logged (a
    warning). Not locked, as ``Overflow``."""

    __slots__ = ("by_instrument", "owner")

    def __init__(self, owner: str = "metrics") -> None:
        self.owner = owner
        self.by_instrument: dict[str, int] = {}

    def refuse(self, instrument: str, value: float) -> None:
        """Count one refused measurement of ``instrument``; the first one is logged."""
        if not self.by_instrument:
            logger.warning(
                "%s: %s refused the value %r (a counter takes no negative amount, a histogram only "
                "finite values >= 0); such measurements are counted, not recorded, and not logged again",
                self.owner,
                instrument,
                value,
            )
        self.by_instrument[instrument] = self.by_instrument.get(instrument, 0) + 1

    @property
    def measurements(self) -> int:
        """Measurements refused so far, over every instrument."""
        return sum(self.by_instrument.values())


class AttributeSets:
    """One instrument's attribute mappings by flat key: at most ``overflow.limit``, then the
    overflow set, for a sink that hands attributes to an SDK rather than keeping totals.

    Read ``kept.get(key) or sets.attributes(key)``: a kept key costs one lookup; a new or an
    overflowing one takes the call, which counts the overflow (one recording).
    """

    __slots__ = ("instrument", "kept", "overflow")

    def __init__(self, instrument: str, overflow: Overflow) -> None:
        self.instrument = instrument
        self.overflow = overflow
        self.kept: dict[tuple[Any, ...], dict[str, str | bool]] = {}

    def attributes(self, key: tuple[Any, ...]) -> dict[str, str | bool]:
        """The mapping of ``key``, kept if there is room; else the overflow set (counted)."""
        attributes = self.kept.get(key)
        if attributes is None:
            if len(self.kept) < self.overflow.limit:
                attributes = self.kept[key] = attributes_of(key)
            else:
                self.overflow.fold(self.instrument)
                attributes = OVERFLOW_ATTRIBUTES
        return attributes
