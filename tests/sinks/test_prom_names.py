"""The OpenTelemetry-to-Prometheus name translation, as the Collector's Prometheus exporter does it."""

from __future__ import annotations

import pytest

from ckpt_events.sinks._prom_names import label_name, metric_name, prometheus_type, unit_word
from ckpt_events.sinks.prometheus import prometheus_names
from ckpt_events.vocab import INSTRUMENTS, OPEN_WORK_INSTRUMENTS, InstrumentKind


@pytest.mark.parametrize(
    ("name", "unit", "kind", "expected"),
    [
        # The Collector compares the unit word with whole tokens: "ms" is not "milliseconds".
        (
            "gym.checkpoint.operation_duration_ms",
            "ms",
            "histogram",
            "gym_checkpoint_operation_duration_ms_milliseconds",
        ),
        ("gym.checkpoint.loop_lag_ms", "ms", "histogram", "gym_checkpoint_loop_lag_ms_milliseconds"),
        # ... and never doubles a word that is one already.
        ("http.server.duration.milliseconds", "ms", "histogram", "http_server_duration_milliseconds"),
        ("gym.checkpoint.bytes_total", "By", "counter", "gym_checkpoint_bytes_total"),
        ("gym.checkpoint.records_total", "1", "counter", "gym_checkpoint_records_total"),
        ("requests", "1", "counter", "requests_total"),
        ("total.requests", "1", "counter", "requests_total"),  # "total" moves to the end
        ("cpu.utilization", "1", "gauge", "cpu_utilization_ratio"),  # _ratio: gauges of unit 1 only
        ("gym.checkpoint.open_operations", "{operation}", "gauge", "gym_checkpoint_open_operations"),
        ("gym.checkpoint.oldest_open_s", "s", "gauge", "gym_checkpoint_oldest_open_s_seconds"),
        ("throughput", "By/s", "gauge", "throughput_bytes_per_second"),
        ("2xx.count", "1", "counter", "_2xx_count_total"),
        ("a..b__c", "", "gauge", "a_b_c"),
    ],
)
def test_metric_names_follow_the_collector(name: str, unit: str, kind: str, expected: str) -> None:
    """Dots and runs of other characters become one underscore; unit word, _total, _ratio as the Collector."""
    assert metric_name(name, unit, InstrumentKind(kind)) == expected


def test_unit_words() -> None:
    """Known units map to their Prometheus words, annotations vanish, unknown ones stay as written."""
    assert unit_word("ms") == ("milliseconds", "")
    assert unit_word("{call}") == ("", "")
    assert unit_word("1") == ("", "")
    assert unit_word("By/s") == ("bytes", "per_second")
    assert unit_word("furlong") == ("furlong", "")


def test_label_names() -> None:
    """Every character outside [a-zA-Z0-9_] becomes an underscore; a leading digit gets key_."""
    assert label_name("nemo.gym.checkpoint.participant_kind") == "nemo_gym_checkpoint_participant_kind"
    assert label_name("outcome") == "outcome"
    assert label_name("1st.try") == "key_1st_try"


def test_our_instruments_have_the_documented_names() -> None:
    """The eight instruments, by their Prometheus family names (the README's table)."""
    assert [row[3] for row in prometheus_names()] == [
        "gym_checkpoint_operation_duration_ms_milliseconds",
        "gym_checkpoint_loop_lag_ms_milliseconds",
        "gym_checkpoint_records_total",
        "gym_checkpoint_bytes_total",
        "gym_checkpoint_events_total",
        "gym_checkpoint_open_operations",
        "gym_checkpoint_oldest_open_s_seconds",
        "gym_checkpoint_last_published_ts_seconds",
    ]


def test_each_instrument_kind_has_its_prometheus_type() -> None:
    """Every core instrument kind maps to a family type; a sum that goes down is a gauge."""
    assert {kind: prometheus_type(kind) for kind in InstrumentKind} == {
        InstrumentKind.COUNTER: "counter",
        InstrumentKind.HISTOGRAM: "histogram",
        InstrumentKind.UP_DOWN_COUNTER: "gauge",
        InstrumentKind.GAUGE: "gauge",
    }
    assert {row[0]: row[2] for row in prometheus_names()} == {
        i.name: prometheus_type(i.kind) for i in (*INSTRUMENTS, *OPEN_WORK_INSTRUMENTS)
    }


def test_an_up_down_counter_of_unit_one_gets_no_ratio() -> None:
    """_ratio is for gauges proper, as the Collector writes it; a unit-1 up-down counter keeps its name."""
    assert metric_name("queue.depth", "1", InstrumentKind.UP_DOWN_COUNTER) == "queue_depth"
    assert metric_name("queue.depth", "1", InstrumentKind.GAUGE) == "queue_depth_ratio"
