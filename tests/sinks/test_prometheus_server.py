"""A real Prometheus scrapes a small in-process fleet after a checkpoint with a lease expiry and a
refusal: documented names and labels, histograms agreeing with the events, exemplars holding
trace ids the JSON lines hold, every ops-pack expression valid, the lease alert firing on a
process's first expiry."""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from ckpt_events import Bus, OperationFinished, Refused
from ckpt_events.participants import create_app
from ckpt_events.participants.cli.ops import ops_file
from ckpt_events.sinks import JsonLinesSink, read_events
from ckpt_events.sinks._metric_keys import _KEYS
from ckpt_events.sinks._prom_names import label_name
from ckpt_events.sinks.prometheus import PrometheusEndpoint, PrometheusSink, prometheus_names
from tests.participants.helpers import ROOT, TOKEN, control, running, status, wait_until
from tests.sinks.prom_server import prometheus_binary, running_prometheus

pytestmark = pytest.mark.slow
DURATION = "gym_checkpoint_operation_duration_ms_milliseconds"


@asynccontextmanager
async def participant(
    kind: str, tmp_path: Path, **options: Any
) -> AsyncIterator[tuple[Any, PrometheusSink, str]]:
    """A participant app with its own bus, scrape endpoint and JSON-lines log."""
    log = tmp_path / f"{kind}.jsonl"
    async with Bus() as bus:
        sink = PrometheusSink()
        bus.subscribe(sink)
        bus.subscribe(JsonLinesSink(log))
        endpoint = PrometheusEndpoint(sink, "127.0.0.1", 0, bus=bus)
        try:
            app = create_app(
                kind, instance=f"{kind}-0", token=TOKEN, checkpoint_root=ROOT, bus=bus, **options
            )
            async with running(app) as client:
                yield client, sink, f"127.0.0.1:{endpoint.port}"
            await bus.flush()
        finally:
            endpoint.close()


async def _checkpoint(client: Any, checkpoint_dir: Path, checkpoint_id: str) -> None:
    reply = await client.post(
        "/work/start", json={"rollout_id": f"r-{checkpoint_id}", "attempt": 0, "steps": 3}
    )
    assert reply.status_code == 200, reply.text
    assert (await control(client, "prepare", checkpoint_id)).status_code == 200
    committed = await control(client, "commit", checkpoint_id, checkpoint_dir=str(checkpoint_dir))
    assert committed.status_code == 200, committed.text
    assert (await control(client, "resume", checkpoint_id)).status_code == 200


async def _lease_expiry(client: Any, checkpoint_id: str) -> None:
    reply = await control(client, "prepare", checkpoint_id, seconds=0.2)
    assert reply.status_code == 200, reply.text

    async def idle() -> bool:
        return bool((await status(client))["phase"] == "idle")

    await wait_until(idle, timeout=5)


def _events(log: Path) -> list[Any]:
    return [event for _, event in read_events(log)]


def _executable(expr: str) -> str:
    """A dashboard expression with Grafana's variables filled in."""
    return expr.replace("$__rate_interval", "1m").replace("$kind", ".*")


async def test_prometheus_scrapes_the_fleet_under_the_documented_names(tmp_path: Path) -> None:
    """Names, labels, histogram agreement, exemplars, every ops-pack expression, and the lease alert."""
    prometheus_binary()
    (tmp_path / "ckpt").mkdir()
    rules = tmp_path / "rules.yml"
    rules.write_text(ops_file("rules.yml"))
    async with AsyncExitStack() as stack:
        resources, _, res_target = await stack.enter_async_context(
            participant("resources", tmp_path, lease_grace_seconds=0.1)
        )
        env, _, env_target = await stack.enter_async_context(participant("environment", tmp_path))
        for client in (resources, env):
            await _checkpoint(client, tmp_path / "ckpt", "c1")
        refused = await control(env, "commit", "c-none", checkpoint_dir=str(tmp_path / "ckpt"))
        assert refused.status_code == 409, refused.text
        with running_prometheus(tmp_path, [res_target, env_target], [rules]) as prom:
            # Waited for off this loop: the buses drain on it, into the sinks being scraped.
            await anyio.to_thread.run_sync(
                lambda: prom.wait_for(
                    "up", check=lambda r: len(r) == 2 and all(s["value"][1] == "1" for s in r)
                )
            )
            await anyio.to_thread.run_sync(
                lambda: prom.wait_for(f"{DURATION}_count", check=lambda r: len(r) >= 2)
            )
            # The process's first expiry, once its target has been scraped: the counter's series
            # is first scraped at 1, which increase() alone never saw (the alert stayed silent).
            await _lease_expiry(resources, "c2")
            lease = 'gym_checkpoint_events_total{nemo_gym_checkpoint_event="lease_expired"}'
            await anyio.to_thread.run_sync(
                lambda: prom.wait_for(lease, check=lambda r: r and float(r[0]["value"][1]) == 1.0)
            )
            # Both commits scraped.
            commits = f'sum({DURATION}_count{{nemo_gym_checkpoint_operation="commit",outcome="ok"}})'
            await anyio.to_thread.run_sync(
                lambda: prom.wait_for(commits, check=lambda r: r and float(r[0]["value"][1]) == 2.0)
            )
            events = _events(tmp_path / "resources.jsonl") + _events(tmp_path / "environment.jsonl")
            _check_names_and_labels(prom)
            _check_histogram_agrees(prom, events)
            _check_exemplars(prom, events)
            _check_pack_expressions(prom)
            _check_lease_alert(prom)


def _check_names_and_labels(prom: Any) -> None:
    documented = {
        "histogram": {
            DURATION: _KEYS["duration"],
            "gym_checkpoint_loop_lag_ms_milliseconds": _KEYS["loop_lag"],
        },
        "counter": {
            "gym_checkpoint_records_total": _KEYS["volume"],
            "gym_checkpoint_bytes_total": _KEYS["volume"],
        },
        "gauge": {
            "gym_checkpoint_open_operations": _KEYS["open"],
            "gym_checkpoint_oldest_open_s_seconds": _KEYS["open"],
            "gym_checkpoint_last_published_ts_seconds": (),
        },
    }
    #: Only a controller publishes: this fleet of participants has no such series.
    controller_only = {"gym_checkpoint_last_published_ts_seconds"}
    for _, _, kind, family in prometheus_names():
        names = [family + "_bucket", family + "_sum", family + "_count"] if kind == "histogram" else [family]
        for name in names:
            series = prom.api("series", **{"match[]": name})
            if name in controller_only:
                assert not series, series
                continue
            assert series, f"no series {name}"
            for labels in series:
                got = set(labels) - {"__name__", "job", "instance", "le"}
                if family in documented.get(kind, {}):
                    assert got == {label_name(a) for a in documented[kind][family]}, (name, labels)
                else:  # events_total: the event tag plus that event's own attributes
                    tag = labels["nemo_gym_checkpoint_event"]
                    assert got == {"nemo_gym_checkpoint_event", *(label_name(a) for a in _KEYS[tag])}, labels
            if name.endswith("_bucket"):
                assert {s["le"] for s in series} >= {"0", "5", "10000", "+Inf"}


def _check_histogram_agrees(prom: Any, events: list[Any]) -> None:
    commits = [
        (e.end_ns - e.start_ns) / 1e6
        for e in events
        if isinstance(e, OperationFinished) and e.operation == "commit" and e.outcome == "ok"
    ]
    selector = '{nemo_gym_checkpoint_operation="commit",outcome="ok"}'
    count = prom.query(f"sum({DURATION}_count{selector})")
    total = prom.query(f"sum({DURATION}_sum{selector})")
    inf = prom.query(
        f'sum({DURATION}_bucket{{nemo_gym_checkpoint_operation="commit",outcome="ok",le="+Inf"}})'
    )
    assert float(count[0]["value"][1]) == len(commits) == 2
    assert float(inf[0]["value"][1]) == len(commits)
    assert float(total[0]["value"][1]) == pytest.approx(sum(commits))
    for le in ("5", "100", "1000"):
        got = prom.query(
            f'sum({DURATION}_bucket{{nemo_gym_checkpoint_operation="commit",outcome="ok",le="{le}"}})'
        )
        assert float(got[0]["value"][1]) == sum(1 for c in commits if c <= float(le))
    refusals = [e for e in events if isinstance(e, Refused)]
    counted = prom.query(
        'sum by (nemo_gym_checkpoint_code) (gym_checkpoint_events_total{nemo_gym_checkpoint_event="refused"})'
    )
    assert {s["metric"]["nemo_gym_checkpoint_code"]: float(s["value"][1]) for s in counted} == {
        code: float(sum(1 for e in refusals if e.code == code)) for code in {e.code for e in refusals}
    }
    assert refusals


def _check_exemplars(prom: Any, events: list[Any]) -> None:
    now = time.time()
    data = prom.api("query_exemplars", query=f"{DURATION}_bucket", start=now - 600, end=now + 60)
    exemplars = [ex for series in data for ex in series["exemplars"]]
    assert exemplars
    logged = {(f"{e.trace_id:032x}", f"{e.span_id:016x}") for e in events if isinstance(e, OperationFinished)}
    for ex in exemplars:
        assert (ex["labels"]["trace_id"], ex["labels"]["span_id"]) in logged, ex


def _check_pack_expressions(prom: Any) -> None:
    expressions = rule_expressions(ops_file("rules.yml"))
    assert len(expressions) == 10  # 2 recording rules, 8 alerts
    for expr in expressions:
        prom.query(expr)  # status "success" is asserted by api()
    # The bus's own counters reach Prometheus, every outcome of every sink from the start.
    outcomes = {s["metric"]["outcome"] for s in prom.query("ckpt_events_sink_events_total")}
    assert outcomes == {"delivered", "dropped", "failed", "abandoned"}, outcomes
    assert all(prom.query(expr) for expr in expressions[:2])  # the recording rules: p50, p95
    # Every panel has data on this fleet (a misspelt metric or label reads nothing, not an
    # error), but the last publish: only a controller publishes.
    dashboard = json.loads(ops_file("dashboard.json"))
    for expr in (_executable(t["expr"]) for p in dashboard["panels"] for t in p["targets"]):
        if "last_published" in expr:
            assert not prom.query(expr), expr
        else:  # a rate needs two samples of a series: the lease counter's may be a second old
            prom.wait_for(expr, timeout=10)
    label_query = re.search(r"label_values\((\w+), (\w+)\)", json.dumps(dashboard["templating"]))
    assert label_query is not None
    assert set(prom.api(f"label/{label_query.group(2)}/values")) >= {"resources", "environment"}


def rule_expressions(text: str) -> list[str]:
    """Every ``expr:`` of a rules file: inline, or a folded ``>-`` block (no YAML parser here)."""
    lines = text.splitlines()
    found = []
    for index, line in enumerate(lines):
        key, sep, rest = line.strip().partition("expr:")
        if key or not sep:
            continue
        if rest.strip() != ">-":
            found.append(rest.strip())
            continue
        indent = len(line) - len(line.lstrip()) + 2
        block = []
        for following in lines[index + 1 :]:
            if len(following) - len(following.lstrip()) < indent or not following.strip():
                break
            block.append(following.strip())
        found.append(" ".join(block))
    return found


def _check_lease_alert(prom: Any) -> None:
    def firing() -> list[dict[str, Any]]:
        groups = prom.api("rules", type="alert")["groups"]
        return [
            alert
            for group in groups
            for rule in group["rules"]
            if rule["name"] == "CheckpointLeaseExpired"
            for alert in rule["alerts"]
            if alert["state"] == "firing"
        ]

    for _ in range(120):  # bounded: 30 s
        alerts = firing()
        if alerts:
            break
        time.sleep(0.25)
    assert alerts
    assert alerts[0]["labels"]["nemo_gym_checkpoint_participant_kind"] == "resources"
