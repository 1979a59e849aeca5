"""The ops pack: promtool accepts the rules and their unit tests pass. The command that writes it:
``tests/participants/cli/test_ops.py``."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from ckpt_events import Bus, Telemetry
from ckpt_events.participants.cli.main import main
from ckpt_events.participants.cli.ops import ops_file
from ckpt_events.sinks import configure
from ckpt_events.sinks._bus_metrics import OUTCOMES
from ckpt_events.sinks._metric_keys import _KEYS
from ckpt_events.sinks._prom_names import label_name, metric_name
from ckpt_events.sinks.prometheus import PrometheusSink, TotalsCollector, prometheus_names
from ckpt_events.vocab import InstrumentKind
from tests.sinks.otlp.test_metric_sink import _event_mix
from tests.sinks.prom_server import promtool_binary

#: The open-work instruments of the live view (name, unit, kind), translated like ours.
OPEN_WORK = (
    ("gym.checkpoint.open_operations", "{operation}", InstrumentKind.UP_DOWN_COUNTER),
    ("gym.checkpoint.oldest_open_s", "s", InstrumentKind.GAUGE),
    ("gym.checkpoint.last_published_ts", "s", InstrumentKind.GAUGE),
)


def _written(tmp_path: Path) -> Path:
    assert main(["ops", "--write", str(tmp_path / "pack")]) == 0
    return tmp_path / "pack"


def test_promtool_checks_the_rules(tmp_path: Path) -> None:
    """promtool check rules: 2 recording rules and 7 alerts, no errors."""
    result = subprocess.run(
        [promtool_binary(), "check", "rules", str(_written(tmp_path) / "rules.yml")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 10 rules found" in result.stdout


def test_promtool_unit_tests_fire_each_alert_and_stay_silent_on_healthy_series(tmp_path: Path) -> None:
    """promtool test rules passes, with a firing and a silent case for every alert."""
    pack = _written(tmp_path)
    result = subprocess.run(
        [promtool_binary(), "test", "rules", "rules_test.yml"],
        capture_output=True, text=True, timeout=60, check=False, cwd=pack,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    tests = (pack / "rules_test.yml").read_text()
    alerts = re.findall(r"- alert: (\w+)", (pack / "rules.yml").read_text())
    assert len(alerts) == 8
    for alert in alerts:
        assert f"alertname: {alert}\n        exp_alerts:\n          - exp_labels" in tests, alert
        assert re.search(rf"alertname: {alert}\n        exp_alerts: \[\]", tests), alert


def test_every_alert_says_what_happened_and_what_to_do() -> None:
    """Each alert has a one-line summary and a description, and its unit tests check both."""
    rules = ops_file("rules.yml")
    tests = ops_file("rules_test.yml")
    blocks = re.split(r"\n      - alert: ", rules)[1:]
    assert len(blocks) == 8
    for block in blocks:
        name = block.split("\n", 1)[0]
        assert re.search(r"\n          summary: \"[^\n]+\"\n", block), name
        assert "\n          description: >-\n" in block, name
        firing = re.findall(rf"alertname: {name}\n        exp_alerts:\n          - exp_labels", tests)
        assert firing, name
    assert tests.count("exp_labels") == tests.count("              summary: ") == tests.count("description: ")


#: The unit each dashboard query's values are in, by the metric it reads (Grafana's unit ids;
#: ``rps`` is Grafana's reads/s, not records/s).
DASHBOARD_UNITS = {
    "_milliseconds_bucket": "ms",
    "_milliseconds_count": "ops",
    "gym_checkpoint_records_total": "suffix: records/s",
    "gym_checkpoint_bytes_total": "Bps",
    "gym_checkpoint_events_total": "short",
    "gym_checkpoint_open_operations": "short",
    "gym_checkpoint_oldest_open_s_seconds": "s",
    "gym_checkpoint_last_published_ts_seconds": "s",
}
#: Metrics whose every series has a participant kind: their panels follow the $kind variable.
KIND_LABELLED = ("_milliseconds_", "records_total", "bytes_total", "open_operations", "oldest_open_s")


def test_every_dashboard_query_is_shown_in_its_metrics_unit_and_follows_the_kind_filter() -> None:
    """Each query's unit (its panel's, or an override for its refId) is its metric's unit:
    the oldest open operation's age was drawn as a bare number beside the open count, and
    records per second as Grafana's reads per second."""
    dashboard = json.loads(ops_file("dashboard.json"))
    checked = 0
    for panel in dashboard["panels"]:
        config = panel["fieldConfig"]
        overridden = {
            o["matcher"]["options"]: p["value"]
            for o in config["overrides"]
            if o["matcher"]["id"] == "byFrameRefID"
            for p in o["properties"]
            if p["id"] == "unit"
        }
        for target in panel["targets"]:
            unit = overridden.get(target["refId"], config["defaults"]["unit"])
            expected = [u for part, u in DASHBOARD_UNITS.items() if part in target["expr"]]
            assert expected == [unit], (panel["title"], target["expr"], unit)
            if any(part in target["expr"] for part in KIND_LABELLED):
                assert '{nemo_gym_checkpoint_participant_kind=~"$kind"}' in target["expr"], target["expr"]
            checked += 1
    assert checked == 11


#: The flat-key tag of each family's labels (``_metric_keys``); events_total: per event.
FAMILY_TAGS = {
    "gym_checkpoint_operation_duration_ms_milliseconds": "duration",
    "gym_checkpoint_loop_lag_ms_milliseconds": "loop_lag",
    "gym_checkpoint_records_total": "volume",
    "gym_checkpoint_bytes_total": "volume",
    "gym_checkpoint_open_operations": "open",
    "gym_checkpoint_oldest_open_s_seconds": "open",
}


#: A target label beside job and instance, as a scrape config may add: targets that share a job
#: and instance (``instance`` relabelled to the host) differ by it.
TARGET_LABELS = ("port",)
#: Our meter's scope, on every series of OpenTelemetry's PrometheusMetricReader
#: (``configure(meter_provider=...)``); its ``otel_scope_schema_url`` is "", which Prometheus drops.
SCOPE_LABELS = ("otel_scope_name", "otel_scope_version")


def test_the_unit_tests_input_series_are_shaped_like_a_scrape() -> None:
    """Each input series of rules_test.yml is a series our endpoint writes, with exactly its
    labels (an event's own) plus the target's job and instance (and a ``port`` where targets
    share those, which its target's ``up`` carries too), or the target's ``up``; a series may
    carry our meter's scope as OpenTelemetry's PrometheusMetricReader writes it."""
    series = re.findall(r"- series: '(\w+)\{([^}]*)\}'", ops_file("rules_test.yml"))
    assert len(series) > 50
    targets = {
        tuple(sorted(re.findall(r'(\w+)="([^"]*)"', labels))) for name, labels in series if name == "up"
    }
    for name, labels in series:
        got = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        assert {"job", "instance"} <= set(got), (name, got)
        scope = {k: got.pop(k) for k in SCOPE_LABELS if k in got}
        if scope:  # as OpenTelemetry's PrometheusMetricReader writes our meter's scope
            assert name != "up" and set(scope) == set(SCOPE_LABELS), (name, scope)
            assert scope["otel_scope_name"] == "ckpt_events", (name, scope)
        target = {k: v for k, v in got.items() if k in {"job", "instance", *TARGET_LABELS}}
        if set(target) != {"job", "instance"}:
            assert tuple(sorted(target.items())) in targets, (name, got)  # a target that is scraped
        own = set(got) - set(target)
        if name == "up":
            assert not own
            continue
        family = name.removesuffix("_bucket")
        expected = set()
        if family == "gym_checkpoint_events_total":
            expected = {
                "nemo_gym_checkpoint_event",
                *map(label_name, _KEYS[got["nemo_gym_checkpoint_event"]]),
            }
        elif family == "ckpt_events_sink_events_total":  # the bus's own counters (_bus_metrics)
            expected = {"sink", "outcome"}
            assert got["outcome"] in OUTCOMES, got
        elif family in FAMILY_TAGS:
            expected = set(map(label_name, _KEYS[FAMILY_TAGS[family]])) | (
                {"le"} if name.endswith("_bucket") else set()
            )
        else:
            assert name == "gym_checkpoint_last_published_ts_seconds", name
        assert own == expected, (name, got)
        if "le" in got:
            assert got["le"] == "+Inf" or str(int(float(got["le"]))) == got["le"]  # Go's "5", never "5.0"


def test_promtool_unit_tests_fail_when_a_threshold_is_wrong(tmp_path: Path) -> None:
    """The unit tests can fail: raising the refusal threshold past the series makes promtool say so."""
    pack = _written(tmp_path)
    rules = pack / "rules.yml"
    rules.write_text(rules.read_text().replace("> 0.1", "> 10"))
    result = subprocess.run(
        [promtool_binary(), "test", "rules", "rules_test.yml"],
        capture_output=True, text=True, timeout=60, check=False, cwd=pack,
    )  # fmt: skip
    assert result.returncode != 0 and "CheckpointRefusalsHigh" in result.stdout + result.stderr


def test_every_metric_in_the_pack_has_a_documented_name() -> None:
    """Each metric the rules and dashboard read is ours (or an open-work gauge) by its Prometheus name."""
    families = {row[3] for row in prometheus_names()}
    families |= {metric_name(name, unit, kind) for name, unit, kind in OPEN_WORK}
    series = {f for f in families} | {f + s for f in families for s in ("_bucket", "_sum", "_count")}
    text = ops_file("rules.yml") + ops_file("dashboard.json")
    used = set(re.findall(r"\bgym_checkpoint_[a-z_]+", text))
    assert used and used <= series, used - series
    # The bus's own counters, as the endpoint writes them (a real scrape: _bus_metrics).
    used = set(re.findall(r"\bckpt_events_[a-z_]+_total\b", text))
    assert used == {"ckpt_events_sink_events_total"}, used
    dashboard = json.loads(ops_file("dashboard.json"))
    assert any(t.get("exemplar") for p in dashboard["panels"] for t in p["targets"])
    assert "exemplarTraceIdDestinations" in ops_file("grafana-datasource.yml")


async def test_the_first_event_alerts_match_up_on_what_opentelemetrys_prometheus_reader_writes() -> None:
    """With ``configure(meter_provider=...)`` scraped through OpenTelemetry's PrometheusMetricReader,
    the families are our endpoint's, and every label it adds beside ours is one the first-event
    alerts ignore when matching `up`: it adds the meter's scope (``otel_scope_name``...), which
    `up` lacks, and a process's first lease expiry or not-ready prepare never fired."""
    pytest.importorskip("opentelemetry.exporter.prometheus", reason="needs opentelemetry-exporter-prometheus")
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider
    from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    reader = PrometheusMetricReader()  # registers itself in prometheus-client's REGISTRY
    provider = MeterProvider(metric_readers=[reader])
    ours = PrometheusSink()
    try:
        async with Bus() as bus:
            bus.subscribe(ours, name="prometheus")
            async with configure(bus, meter_provider=provider, environ={}):
                await _event_mix(bus)
                model = Telemetry(bus, kind="model", instance="model-0")
                with model.operation("prepare", checkpoint_id="c9"):  # open: the open-work gauges
                    await bus.flush()
                    sdk_page = generate_latest(REGISTRY).decode()
                    registry = CollectorRegistry(auto_describe=False)
                    registry.register(TotalsCollector(ours))
                    our_page = generate_latest(registry).decode()
    finally:
        provider.shutdown()  # unregisters the reader

    def samples(page: str) -> dict[str, list[dict[str, str]]]:
        found: dict[str, list[dict[str, str]]] = {}
        for family in text_string_to_metric_families(page):
            for sample in family.samples:
                if sample.name.startswith("gym_checkpoint_"):
                    found.setdefault(sample.name, []).append(sample.labels)
        return found

    sdk, mine = samples(sdk_page), samples(our_page)
    assert "gym_checkpoint_events_total" in sdk and "gym_checkpoint_oldest_open_s_seconds" in sdk
    assert sdk.keys() == mine.keys()
    ours_labels = {k for ls in mine.values() for labels in ls for k in labels}
    added = {
        k for ls in sdk.values() for labels in ls for k, v in labels.items() if v and k not in ours_labels
    }
    ignored = [
        set(map(str.strip, m.split(","))) for m in re.findall(r"ignoring \(([^)]*)\)", ops_file("rules.yml"))
    ]
    assert len(ignored) == 2
    for labels in ignored:
        assert added <= labels, added - labels
