"""OpenTelemetry names as the Collector's Prometheus exporter writes them.

The rules of the OpenTelemetry-to-Prometheus compatibility spec, as the Collector applies them
with its default ``add_metric_suffixes: true`` (``pkg/translator/prometheus``, now
``prometheus/otlptranslator``): the name is split into tokens at every character outside
``[a-zA-Z0-9:]`` and joined with ``_``; the unit's Prometheus word (``ms`` ->
``milliseconds``, ``By`` -> ``bytes``, ``1`` -> nothing; ``{...}`` annotations dropped) is
appended unless it already is a token; a monotonic sum ends in ``total`` (moved to the end);
a gauge of unit ``1`` ends in ``ratio`` (an up-down counter is a Prometheus gauge too, but
keeps its name: the Collector adds ``ratio`` to gauges proper only). The unit word is
compared with whole tokens, so ``operation_duration_ms`` in ``ms`` becomes
``operation_duration_ms_milliseconds``: the Collector writes exactly that, and so do we, so one
dashboard serves both paths.
Label names: every character outside ``[a-zA-Z0-9_]`` becomes ``_``.
"""

from __future__ import annotations

import re
from typing import Final

from ckpt_events.vocab import InstrumentKind

__all__ = ["label_name", "metric_name", "prometheus_type", "unit_word"]

#: The Prometheus family type of each instrument kind: a sum that goes down is a gauge.
_TYPES: Final = {
    InstrumentKind.COUNTER: "counter",
    InstrumentKind.HISTOGRAM: "histogram",
    InstrumentKind.UP_DOWN_COUNTER: "gauge",
    InstrumentKind.GAUGE: "gauge",
}

#: The Collector's unit words (time, bytes, SI, misc); a unit not listed is kept as written.
_UNITS: Final = {
    "d": "days",
    "h": "hours",
    "min": "minutes",
    "s": "seconds",
    "ms": "milliseconds",
    "us": "microseconds",
    "ns": "nanoseconds",
    "By": "bytes",
    "KiBy": "kibibytes",
    "MiBy": "mebibytes",
    "GiBy": "gibibytes",
    "TiBy": "tibibytes",
    "KBy": "kilobytes",
    "MBy": "megabytes",
    "GBy": "gigabytes",
    "TBy": "terabytes",
    "m": "meters",
    "V": "volts",
    "A": "amperes",
    "J": "joules",
    "W": "watts",
    "g": "grams",
    "Cel": "celsius",
    "Hz": "hertz",
    "1": "",
    "%": "percent",
}
_PER_UNITS: Final = {
    "s": "second",
    "m": "minute",
    "h": "hour",
    "d": "day",
    "w": "week",
    "mo": "month",
    "y": "year",
}
_NAME_SPLIT: Final = re.compile(r"[^a-zA-Z0-9:]+")
_LABEL_BAD: Final = re.compile(r"[^a-zA-Z0-9_]")
_UNIT_BAD: Final = re.compile(r"[^a-zA-Z0-9]+")


def _clean(word: str) -> str:
    return "_".join(part for part in _UNIT_BAD.split(word) if part)


def unit_word(unit: str) -> tuple[str, str]:
    """(main word, ``per_`` word) of an OpenTelemetry unit: ``"By/s"`` -> ``("bytes", "per_second")``."""
    if "{" in unit:  # annotations such as {request} carry no unit
        unit = re.sub(r"\{[^}]*\}", "", unit)
    main, _, per = unit.strip().partition("/")
    main_word = _clean(_UNITS.get(main.strip(), main.strip()))
    per_word = ""
    if per.strip():
        per_word = _clean("per_" + _PER_UNITS.get(per.strip(), per.strip()))
    return main_word, per_word


def metric_name(name: str, unit: str, kind: InstrumentKind) -> str:
    """The Prometheus metric name of instrument ``name`` (the family name, before ``_bucket``)."""
    tokens = [token for token in _NAME_SPLIT.split(name) if token]
    main, per = unit_word(unit)
    if main and main not in tokens:
        tokens.append(main)
    if per and per not in tokens:
        tokens.append(per)
    if kind is InstrumentKind.COUNTER:
        tokens = [*(t for t in tokens if t != "total"), "total"]
    if kind is InstrumentKind.GAUGE and unit == "1":
        tokens = [*(t for t in tokens if t != "ratio"), "ratio"]
    joined = "_".join(tokens)
    return "_" + joined if joined[:1].isdigit() else joined


def prometheus_type(kind: InstrumentKind) -> str:
    """The Prometheus family type (``counter``, ``histogram``, ``gauge``) an instrument of ``kind``
    is written as."""
    return _TYPES[kind]


def label_name(attribute: str) -> str:
    """The Prometheus label of attribute ``attribute``: ``a.b-c`` -> ``a_b_c``."""
    label = _LABEL_BAD.sub("_", attribute)
    return "key_" + label if label[:1].isdigit() else label
