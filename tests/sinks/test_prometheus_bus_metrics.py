"""What each sink lost, on the Prometheus page an operator scrapes.

Drops, failed batches and abandoned events were counted in ``Bus.stats()`` only: the page said
nothing, so metrics that had lost events looked like a quiet fleet.
"""

from __future__ import annotations

import subprocess
import threading
from typing import Any

import anyio
import anyio.to_thread
import httpx
from prometheus_client.parser import text_string_to_metric_families

from ckpt_events import Bus, Telemetry, sinks
from ckpt_events._bus import RETIRED_ROWS
from ckpt_events.sinks._bus_metrics import OUTCOMES
from tests.sinks.prom_server import promtool_binary

PROMETHEUS_ON = {
    "OTEL_METRICS_EXPORTER": "prometheus",
    "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
    "OTEL_EXPORTER_PROMETHEUS_PORT": "0",
}


class Failing:
    def handle(self, batch: list[Any]) -> None:
        raise ValueError("boom")


class Keeping:
    def __init__(self) -> None:
        self.events: list[Any] = []

    def handle(self, batch: list[Any]) -> None:
        self.events.extend(batch)


def _scrape(url: str) -> str:
    reply = httpx.get(url, timeout=10)
    assert reply.status_code == 200
    return reply.text


def _sink_events(page: str) -> dict[tuple[str, str], float]:
    (family,) = [f for f in text_string_to_metric_families(page) if f.name == "ckpt_events_sink_events"]
    return {(s.labels["sink"], s.labels["outcome"]): s.value for s in family.samples}


async def test_the_page_says_what_each_sink_delivered_dropped_and_failed() -> None:
    async with Bus() as bus:
        configured = sinks.configure(bus, environ=PROMETHEUS_ON)
        bus.subscribe(Failing(), name="failing", buffer_size=2)
        tel = Telemetry(bus, kind="judge", instance="judge-0")
        for _ in range(5):
            with tel.operation("commit", checkpoint_id="c1"):
                pass
        await bus.flush()
        assert configured.prometheus is not None
        page = await anyio.to_thread.run_sync(_scrape, configured.prometheus.url)
        stats = {row.name: row for row in bus.stats().sinks}
        await configured.aclose()
    seen = _sink_events(page)
    for name in ("failing", "prometheus"):
        for outcome in OUTCOMES:
            assert seen[(name, outcome)] == getattr(stats[name], outcome), (name, outcome)
    assert seen[("failing", "dropped")] > 0 and seen[("failing", "failed")] > 0
    assert seen[("prometheus", "delivered")] == 10 and seen[("prometheus", "dropped")] == 0
    assert "ckpt_events_sink_pending_events{" in page
    assert "ckpt_events_bus_dropped_after_close_total 0.0" in page
    checked = subprocess.run(
        [promtool_binary(), "check", "metrics"],
        input=page, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    problems = [line for line in (checked.stdout + checked.stderr).splitlines() if "ckpt_events_" in line]
    assert checked.returncode in (0, 3) and not problems, problems  # 3: the documented _ms names' warnings


async def test_a_name_given_again_is_one_series_holding_both_subscriptions_counts() -> None:
    """A subscription finished and its name given again: ``Bus.stats()`` keeps both rows, and a
    page must hold each label set once (Prometheus keeps one of duplicate samples)."""
    async with Bus() as bus:
        configured = sinks.configure(bus, environ=PROMETHEUS_ON)
        tel = Telemetry(bus, kind="judge", instance="judge-0")
        first = bus.subscribe(Keeping(), name="again")
        with tel.operation("commit", checkpoint_id="c1"):
            pass
        await first.aclose()
        bus.subscribe(Keeping(), name="again")
        for _ in range(2):
            with tel.operation("commit", checkpoint_id="c2"):
                pass
        await bus.flush()
        assert configured.prometheus is not None
        page = await anyio.to_thread.run_sync(_scrape, configured.prometheus.url)
        await configured.aclose()
    again = [line for line in page.splitlines() if 'sink="again"' in line and '"delivered"' in line]
    assert len(again) == 1, again
    assert _sink_events(page)[("again", "delivered")] == 6  # 2 events, then 4


async def test_scrapes_while_sinks_come_and_go_are_all_answered() -> None:
    """The scrape thread reads the subscriptions while the bus's loop changes them."""
    async with Bus() as bus:
        configured = sinks.configure(bus, environ=PROMETHEUS_ON)
        assert configured.prometheus is not None
        url = configured.prometheus.url
        done = threading.Event()
        pages: list[str] = []

        def scrape_until_done() -> None:
            for _ in range(1_000):
                if done.is_set():
                    break
                pages.append(_scrape(url))

        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.to_thread.run_sync, scrape_until_done)
            with anyio.fail_after(60):
                churned = 0
                # Sinks come and go until 20 scrapes were answered meanwhile (on a loaded machine
                # the scrape thread may start after a fixed number of rounds were over).
                while len(pages) < 20:
                    sub = bus.subscribe(Keeping(), name=f"churn-{churned}")
                    await anyio.sleep(0.001)  # not a bare checkpoint: a loop spinning on those
                    sub.close()  # held the GIL from the scrape threads (4.7 s a scrape)
                    churned += 1
            done.set()
        await configured.aclose()
    assert (
        len(pages) >= 20 and churned >= 20 and all("ckpt_events_sink_events_total" in page for page in pages)
    )


def _drops(page: str) -> dict[str, float]:
    return {sink: value for (sink, outcome), value in _sink_events(page).items() if outcome == "dropped"}


async def test_finished_subscriptions_summed_away_are_never_a_new_loss_on_the_page() -> None:
    """Past ``RETIRED_ROWS`` finished subscriptions ``Bus.stats()`` sums the oldest: no loss
    counter on the page may rise or fall for that. An old loss moved into the
    ``(earlier subscriptions)`` series rose there (``CheckpointTelemetryLost`` paged "lost 16
    events in 10 minutes" for drops long past); a name's series losing a row fell, a counter
    reset to Prometheus, whose ``increase()`` then counts every loss the name still holds."""
    async with Bus() as bus:
        configured = sinks.configure(bus, environ=PROMETHEUS_ON)
        assert configured.prometheus is not None
        tel = Telemetry(bus, kind="judge", instance="judge-0")

        async def churn(label: str) -> None:
            for n in range(RETIRED_ROWS + 10):  # the default names repeat, as a per-client sink's do
                sub = bus.subscribe(Keeping(), name="client" if n % 2 else f"{label}-{n}")
                await sub.aclose()

        await churn("warm")  # the summed row exists before the losses
        for name in ("lossy", "client", "client"):
            sub = bus.subscribe(Keeping(), name=name, buffer_size=4)
            for _ in range(20):
                tel.refused("unauthorized")
            await sub.aclose()
        before = _drops(await anyio.to_thread.run_sync(_scrape, configured.prometheus.url))
        await churn("later")  # no event is emitted: nothing more is lost
        after = _drops(await anyio.to_thread.run_sync(_scrape, configured.prometheus.url))
        await configured.aclose()
    assert before["lossy"] == 16 and before["client"] == 32
    # Each series as it was (a new subscription's at 0), or gone: its subscriptions summed away.
    assert {sink: value for sink, value in after.items() if value != before.get(sink, 0)} == {}
