"""End to end: configure() exports spans and metrics over OTLP/HTTP to a real collector.

The collector is ``rotel-agent`` from the ``rotel`` package, started on free loopback ports
with a blackhole exporter and its debug log on stdout, where the test finds what it received.
"""

from __future__ import annotations

import os
import subprocess
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from ckpt_events import Bus, Telemetry
from ckpt_events.benchmarks.load import listening, stop_process
from ckpt_events.benchmarks.rotel import agent_binary, agent_command, agent_env, free_ports
from ckpt_events.sinks import JsonLinesSink, configure
from ckpt_events.sinks.otel import OtlpSpanSink

pytestmark = pytest.mark.collector

_STARTUP_SECONDS = 15.0
_RECEIVE_SECONDS = 15.0


def _wait_listening(port: int, proc: subprocess.Popen[bytes], out: Path) -> None:
    """Return once the collector listens; skip the test if it cannot start here (it exited)."""
    started = listening(proc, port, _STARTUP_SECONDS)
    if started is False:
        tail = out.read_text(errors="replace").strip()[-300:] if out.exists() else ""
        pytest.skip(f"rotel-agent cannot start here (exit status {proc.returncode}): {tail}")
    if started is None:
        raise TimeoutError(f"rotel-agent did not listen on 127.0.0.1:{port} within {_STARTUP_SECONDS} s")


def _start(binary: Path, tmp_path: Path, out: Path) -> tuple[str, subprocess.Popen[bytes]]:
    """Start ``binary`` as the collector; returns its OTLP/HTTP base URL and its process."""
    http_port, grpc_port = free_ports(2)
    with open(out, "wb") as sink:
        proc = subprocess.Popen(
            agent_command(binary, http_port, grpc_port, tmp_path, debug=True),
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=agent_env(),
        )
    try:
        _wait_listening(http_port, proc, out)
    except BaseException:
        stop_process(proc)
        raise
    return f"http://127.0.0.1:{http_port}", proc


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A running collector: (OTLP/HTTP base URL, file receiving its stdout)."""
    binary = agent_binary()
    if binary is None:
        pytest.skip("the rotel-agent binary (package rotel) is not installed")
    out = tmp_path / "collector.out"
    url, proc = _start(binary, tmp_path, out)
    try:
        yield url, out
    finally:
        stop_process(proc)


def test_collector_gets_the_interpreter_library_directory() -> None:
    """rotel-agent is launched with sysconfig's LIBDIR first on LD_LIBRARY_PATH."""
    libdir = sysconfig.get_config_var("LIBDIR")
    assert libdir and agent_env()["LD_LIBRARY_PATH"].split(os.pathsep)[0] == libdir


def test_a_collector_that_cannot_start_skips_with_its_reason(tmp_path: Path) -> None:
    """A collector binary that exits at once (a missing libpython) skips the test, naming why."""
    binary = tmp_path / "rotel-agent"
    binary.write_text(
        "#!/bin/sh\necho 'error while loading shared libraries: libpython3.13.so.1.0' >&2\nexit 127\n"
    )
    binary.chmod(0o755)
    with pytest.raises(pytest.skip.Exception, match=r"exit status 127.*libpython3\.13"):
        _start(binary, tmp_path, tmp_path / "collector.out")


def _wait_for(out: Path, needles: list[str], seconds: float = _RECEIVE_SECONDS) -> str:
    """The collector's output once it holds every needle, a needle given k times at least k times."""
    wanted = {n: needles.count(n) for n in needles}
    deadline = time.monotonic() + seconds
    text = ""
    for _ in range(1000):
        text = out.read_text(errors="replace")
        if all(text.count(n) >= k for n, k in wanted.items()) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return text


def test_a_needle_given_twice_waits_for_its_second_export(tmp_path: Path) -> None:
    """One export printed: a wait for two keeps waiting to its deadline; two printed return at once."""
    out = tmp_path / "collector.out"
    out.write_text("-> Name: gym.checkpoint.oldest_open_s\n")
    started = time.monotonic()
    _wait_for(out, ["gym.checkpoint.oldest_open_s"] * 2, seconds=0.3)
    assert time.monotonic() - started >= 0.3
    out.write_text("-> Name: gym.checkpoint.oldest_open_s\n" * 2)
    started = time.monotonic()
    _wait_for(out, ["gym.checkpoint.oldest_open_s"] * 2, seconds=5)
    assert time.monotonic() - started < 1


@pytest.mark.parametrize("protocol", ["http/protobuf", "http/json"])
async def test_spans_and_metrics_reach_a_real_collector(collector: tuple[str, Path], protocol: str) -> None:
    """One checkpoint's spans (one trace) and the metric names arrive at the collector."""
    endpoint, out = collector
    environ = {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": protocol}
    async with Bus() as bus:
        async with configure(
            bus, otlp_endpoint=endpoint, service_name="ckpt-events-test", environ=environ
        ) as configured:
            assert isinstance(configured.span_sink, OtlpSpanSink)
            ctl = Telemetry(bus, kind="controller", instance="coordination")
            resources = Telemetry(bus, kind="resources", instance="resources-0")
            with ctl.coordinate("commit", checkpoint_id="c-otlp") as co:
                header = co.traceparent()
                with resources.operation("commit", checkpoint_id="c-otlp", traceparent=header) as op:
                    with op.step("write") as step:
                        step.set(records=3, bytes=300)
                    op.set(records=3, bytes=300)
                co.set(participants=1, episodes=3)
            resources.refused("admission_closed", checkpoint_id="c-otlp")
            trace_hex = f"{co.trace_id:032x}"
        assert configured.span_sink is not None
        stats = configured.span_sink.stats()
        assert (stats.exported, stats.dropped) == (3, 0)
    needles = [
        "gym.checkpoint.coordinate.commit",
        "gym.checkpoint.commit",
        "gym.checkpoint.write",
        "ckpt-events-test",
        trace_hex,
        "gym.checkpoint.operation_duration_ms",
        "gym.checkpoint.events_total",
    ]
    text = _wait_for(out, needles)
    missing = [n for n in needles if n not in text]
    assert not missing, f"collector output lacks {missing}:\n{text[-3000:]}"


def test_replay_exports_a_logged_trace_to_a_collector(collector: tuple[str, Path], tmp_path: Path) -> None:
    """`ckpt-events replay` reads a hex-id JSON-lines log and the collector gets the same trace."""
    from ckpt_events.participants.cli.main import main

    endpoint, out = collector
    log = tmp_path / "run.jsonl"
    trace_hex, parent_hex = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"

    async def record() -> None:
        async with Bus() as bus:
            bus.subscribe(JsonLinesSink(log))
            tel = Telemetry(bus, kind="resources", instance="resources-0")
            header = f"00-{trace_hex}-{parent_hex}-01"
            with tel.operation("commit", checkpoint_id="c-replay", traceparent=header) as op:
                op.set(records=2)

    anyio.run(record)
    assert f'"trace_id":"{trace_hex}"' in log.read_text()
    assert main(["replay", str(log), "--otlp-endpoint", endpoint, "--service-name", "ckpt-replay"]) == 0
    needles = ["gym.checkpoint.commit", "ckpt-replay", trace_hex, parent_hex]
    text = _wait_for(out, needles)
    missing = [n for n in needles if n not in text]
    assert not missing, f"collector output lacks {missing}:\n{text[-3000:]}"


@pytest.mark.parametrize("protocol", ["http/protobuf", "http/json"])
async def test_one_bad_value_in_200_spans_costs_that_value_at_a_real_collector(
    collector: tuple[str, Path], protocol: str
) -> None:
    """A lone surrogate, ints past int64 and a NaN among 200 spans: the collector takes all 200
    (before, one request of 0 spans exported and 200 dropped, or a 400 from the collector)."""
    endpoint, out = collector
    sink = OtlpSpanSink(endpoint, protocol=protocol, resource_attributes={"service.name": "bad-values"})
    async with Bus() as bus:
        bus.subscribe(sink)
        tel = Telemetry(bus, kind="agent", instance="agent-0")
        bad: list[str | int | float] = ["x\ud800", 2**63, 2**64, -(2**63) - 1]
        if protocol == "http/protobuf":
            # OTLP/JSON spells NaN "NaN" (protobuf's JSON mapping, which OpenTelemetry's
            # collector reads); rotel answers 400 to it, as to the null sent before.
            bad.append(float("nan"))
        for n in range(200):
            with tel.operation("commit", checkpoint_id="c-bad") as op:
                if n < len(bad):
                    op.set_attribute("user.value", bad[n])
                if n == len(bad):
                    op._records = 2**70  # set() refuses it; an event built by hand and emitted can carry it
                op.set_attribute("user.n", n)
    stats = sink.stats()
    assert (stats.exported, stats.dropped, stats.export_failures) == (200, 0, 0)
    assert stats.invalid_values == 5  # a NaN is a double the wire carries: not counted
    text = _wait_for(out, ["user.n", "bad-values"])
    assert "bad-values" in text
