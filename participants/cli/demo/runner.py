"""What ``ckpt-events demo`` runs: a checkpoint, a crash and a restore, end to end, then where the time went.

Two generations of the same fleet (an inference worker and the four participants, or
``--instances N`` servers of each kind): the first runs rollouts and checkpoints them
mid-flight, then dies; the second starts fresh (``--restore-instances M`` servers of each
kind), restores the published checkpoint, finishes every rollout and is checked. The servers
run as real uvicorn servers inside this process by default, or as ``serve`` processes (killed
with SIGKILL) with ``--processes``.
"""

from __future__ import annotations

import contextlib
import secrets
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import msgspec
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from ckpt_events import Bus, InvalidValueError, Telemetry, sinks
from ckpt_events.participants.cli.command import otel_environ
from ckpt_events.participants.cli.demo.checks import diagnosis_checks
from ckpt_events.participants.cli.demo.fleet import check_members, generation_fleet
from ckpt_events.participants.cli.demo.plan import (
    ABORTING_FAULTS,
    WORK_TIMEOUT_S,
    DemoOptions,
    check_options,
    checkpoint_thresholds,
    deadline_s,
    fault_of,
    fault_plans,
    fleet_members,
    lease_target,
    stop_after,
)
from ckpt_events.participants.cli.demo.watch import DemoWatch, stall_environ, view_stall_after
from ckpt_events.participants.cli.report.files import write_report
from ckpt_events.participants.cli.report.overview import Run, overview
from ckpt_events.participants.cli.report.overview_terminal import render_overview
from ckpt_events.participants.cli.report.terminal import render
from ckpt_events.participants.cli.text import escape
from ckpt_events.participants.cli.words import counted
from ckpt_events.participants.controller.collection import Collection, CollectionSummary
from ckpt_events.participants.controller.coordinator import Coordinator
from ckpt_events.participants.errors import DemoFailed
from ckpt_events.participants.faults import FaultPlan
from ckpt_events.sinks.jsonl import JsonLinesStats
from ckpt_events.sinks.otel import OtlpMetricSinkStats
from ckpt_events.testing import MemorySink
from ckpt_events.vocab import CONTROLLER_INSTANCE, Kind

__all__ = ["DemoFailed", "DemoOptions", "DemoResult", "check_options", "run_demo"]


@dataclass
class DemoResult:
    """What the demo measured and checked."""

    first: CollectionSummary
    second: CollectionSummary
    checkpoint_id: str
    continued: list[str]
    seconds: dict[str, float] = field(default_factory=dict)
    events: list[Any] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)
    #: Spans the OTLP exporter failed to deliver (0 without an endpoint).
    spans_not_exported: int = 0
    #: The ``--jsonl`` log's counters (``None`` without one): ``failed`` events were not written.
    jsonl: JsonLinesStats | None = None


async def _run_generation(
    opts: DemoOptions,
    console: Console,
    coordinator: Coordinator,
    run_dir: Path,
    tel: Telemetry,
    *,
    label: str,
    stop_after: int | None,
    checkpoint_after: list[int] | None = None,
    watching: tuple[DemoWatch, dict[str, str]] | None = None,
    stopping: anyio.Event | None = None,
    interrupt: Callable[[], None] = lambda: None,
) -> tuple[Collection, CollectionSummary]:
    """Run one generation's rollouts under progress bars, or with ``watching`` (the watch and the
    generation's participant URLs) under the watch view."""
    collection = Collection(
        coordinator,
        run_dir,
        telemetry=tel,
        rollouts=opts.rollouts,
        steps=opts.steps,
        concurrency=opts.concurrency,
        stop_after=stop_after,
        checkpoint_after=checkpoint_after or (),
        deadline_s=deadline_s(opts),
        work_timeout_s=WORK_TIMEOUT_S,
    )
    if watching is not None:
        return collection, await watching[0].run(collection, watching[1], console, label, opts.rollouts)
    summary: CollectionSummary | None = None
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(label, total=opts.rollouts)

        async def run() -> None:
            nonlocal summary
            summary = await collection.run()

        interrupted = False
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            while summary is None:
                progress.update(task, completed=collection.progress()["done"])
                if stopping is not None and stopping.is_set() and not interrupted:
                    # A Ctrl-C sent to this process alone: pass it on to the servers (the
                    # terminal sends it to the whole group), so the calls to them end now.
                    interrupted = True
                    interrupt()
                await anyio.sleep(0.05)
            progress.update(task, completed=collection.progress()["done"])
    assert summary is not None
    return collection, summary


async def _verify(
    opts: DemoOptions,
    first: CollectionSummary,
    second: CollectionSummary,
    continued: list[str],
    urls: dict[str, str],
    token: str,
    holders: Callable[[str], set[str]],
    lost: list[str],
) -> list[str]:
    """Check the outcome; returns the checks that passed (raises DemoFailed on the first that fails).
    ``holders(rollout_id)``: the participants its last attempt ran on (one of each kind); ``lost``:
    the rollouts in flight on servers the restored fleet lacks (they restart as attempt 1)."""
    passed: list[str] = []
    if not first.stopped or first.completed >= opts.rollouts:
        raise DemoFailed("the first generation was not checkpointed mid-flight")
    if second.completed != opts.rollouts:
        raise DemoFailed(f"{counted(opts.rollouts - second.completed, 'rollout')} did not complete")
    passed.append(f"all {counted(opts.rollouts, 'rollout')} completed")
    attempts = second.attempts
    wrong = [r for r in continued if attempts[r] != 1]
    if wrong:
        raise DemoFailed(f"continued rollouts not on attempt 1: {wrong[:5]}")
    kept = [r for r in continued if r not in lost]
    passed.append(
        f"{counted(len(kept), 'rollout')} in flight at the checkpoint continued as attempt 1"
        + (f", {len(lost):,} on servers the restored fleet lacks restarted as attempt 1" if lost else "")
    )
    redone = [r for r, a in attempts.items() if a > 1]
    if redone:
        raise DemoFailed(f"rollouts ran more than one extra attempt: {redone[:5]}")
    passed.append("no rollout ran twice (every attempt number is 0 or 1)")
    async with httpx.AsyncClient(timeout=10, headers={"authorization": f"Bearer {token}"}) as http:
        if continued:
            sample = kept[0] if kept else continued[0]
            held = holders(sample)
            for instance, url in urls.items():
                if instance in held:
                    view = (await http.get(f"{url}/work/{sample}-a1")).json()
                    if view.get("boundary") != opts.steps or view.get("attempt") != 1:
                        raise DemoFailed(f"{instance} holds {sample} as {view}, not finished as attempt 1")
                late = await http.post(f"{url}/work/advance", json={"rollout_id": sample, "attempt": 0})
                code = late.json().get("error", {}).get("code") if late.status_code == 409 else None
                if code != "stale_attempt":
                    raise DemoFailed(f"{instance} answered a late attempt-0 call with {late.status_code}")
            passed.append(f"a late attempt-0 call for {sample} got 409 stale_attempt on every participant")
    return passed


async def _first_generation(
    opts: DemoOptions,
    console: Console,
    bus: Bus,
    tel: Telemetry,
    token: str,
    workdir: Path,
    stopping: anyio.Event | None,
    watch: DemoWatch | None,
    faults: FaultPlan,
) -> tuple[Collection, CollectionSummary]:
    """Run rollouts, checkpoint them mid-flight and stop, then crash every participant."""
    async with (
        generation_fleet(opts, bus, token, workdir, 1, stopping, faults) as fleet,
        await Coordinator.discover(fleet.urls, token=token, telemetry=tel, faults=faults) as coordinator,
    ):
        check_members(coordinator, fleet.urls)
        collection, summary = await _run_generation(
            opts,
            console,
            coordinator,
            workdir / "run",
            tel,
            label="generation 1: checkpoint and stop",
            stop_after=stop_after(opts),
            checkpoint_after=checkpoint_thresholds(opts),
            watching=None if watch is None else (watch, fleet.urls),
            stopping=stopping,
            interrupt=fleet.interrupt,
        )
        fleet.crash()
    return collection, summary


async def run_demo(opts: DemoOptions, console: Console, stopping: anyio.Event | None = None) -> DemoResult:
    """Run both generations, verify, and print the breakdown, timeline and counts.

    Setting ``stopping`` shuts the in-process servers down gracefully (Ctrl-C)."""
    if (refusal := check_options(opts)) is not None:
        raise InvalidValueError(refusal)
    token = secrets.token_urlsafe(24)
    with contextlib.ExitStack() as stack:
        fault = fault_of(opts)
        workdir = opts.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ckpt-demo-")))
        workdir.mkdir(parents=True, exist_ok=True)
        memory = MemorySink()
        async with Bus(buffer_size=1 << 20) as bus:
            bus.subscribe(memory, name="demo-report")
            configured, watch = _subscribe_sinks(opts, bus, workdir, token)
            tel = Telemetry(
                bus, kind=Kind.CONTROLLER, instance=CONTROLLER_INSTANCE, sample_ratio=configured.sample_ratio
            )
            try:
                ran = await _generations(opts, console, bus, tel, token, workdir, stopping, watch)
            finally:
                await bus.flush(timeout=10)
                await configured.aclose()
        span_stats = configured.span_sink.stats() if configured.span_sink is not None else None
        events, merged = _all_events(opts, list(memory.events), workdir)
        run = overview(events)
        expected = opts.checkpoint_count() - (1 if opts.fault in ABORTING_FAULTS else 0)
        passed = ran.passed + diagnosis_checks(
            run,
            published=expected,
            ids=ran.first.checkpoints,
            fault=fault,
            one_of=opts.instances if opts.instances > 1 else None,
            lease_on=lease_target(opts),
            blockers=ran.collected.not_prepared[0].blockers() if ran.collected.not_prepared else None,
        )
        _show(console, opts, events, run, ran.checkpoint_id, passed)
        _exported(console, opts, configured, merged)
        return DemoResult(
            ran.first,
            ran.second,
            ran.checkpoint_id,
            ran.continued,
            ran.seconds,
            events,
            passed,
            span_stats.dropped if span_stats is not None else 0,
            configured.jsonl_sink.stats() if configured.jsonl_sink is not None else None,
        )


def _subscribe_sinks(
    opts: DemoOptions, bus: Bus, workdir: Path, token: str
) -> tuple[sinks.Configured, DemoWatch | None]:
    """The sinks the options ask for (``--jsonl``, ``--otlp-endpoint``, the environment's), and
    the watch view's sink with ``--watch``."""
    stall_env = stall_environ(opts.fault) if opts.watch else {}
    configured = sinks.configure(
        bus,
        jsonl_path=opts.jsonl,
        otlp_endpoint=opts.otlp_endpoint,
        environ={**otel_environ(), **stall_env},
    )
    watch = None
    if opts.watch:
        (workdir / "logs").mkdir(exist_ok=True)
        watch = DemoWatch(workdir / "logs", stall_after=view_stall_after(stall_env), token=token)
        bus.subscribe(watch, name="demo-watch")
    return configured, watch


@dataclass
class _Ran:
    """What the two generations left: the first's collection and both summaries, the checkpoint
    restored, the rollouts in flight at it, the checks passed and each generation's seconds."""

    collected: Collection
    first: CollectionSummary
    second: CollectionSummary
    checkpoint_id: str
    continued: list[str]
    passed: list[str]
    seconds: dict[str, float]


async def _generations(
    opts: DemoOptions,
    console: Console,
    bus: Bus,
    tel: Telemetry,
    token: str,
    workdir: Path,
    stopping: anyio.Event | None,
    watch: DemoWatch | None,
) -> _Ran:
    """Generation 1 to its checkpoint and the crash, then generation 2 restored from it, checked."""
    seconds: dict[str, float] = {}
    start = time.monotonic()
    first_faults, second_faults = fault_plans(opts)
    collected, first = await _first_generation(
        opts, console, bus, tel, token, workdir, stopping, watch, first_faults
    )
    seconds["generation 1"] = time.monotonic() - start
    if not first.checkpoints:
        raise DemoFailed("generation 1 finished without its checkpoint")
    checkpoint_id = first.checkpoints[-1]
    continued, lost = _crashed(opts, console, workdir, checkpoint_id)
    start = time.monotonic()
    async with (
        generation_fleet(opts, bus, token, workdir, 2, stopping, second_faults) as fleet,
        await Coordinator.discover(
            fleet.urls, token=token, telemetry=tel, faults=second_faults
        ) as coordinator,
    ):
        check_members(coordinator, fleet.urls)
        restored, second = await _run_generation(
            opts,
            console,
            coordinator,
            workdir / "run",
            tel,
            label="generation 2 (restored)",
            stop_after=None,
            watching=None if watch is None else (watch, fleet.urls),
            stopping=stopping,
            interrupt=fleet.interrupt,
        )
        passed = _spread(opts, collected, restored)
        passed += await _verify(
            opts, first, second, continued, fleet.urls, token, lambda r: _holders(restored, r), lost
        )
    seconds["generation 2"] = time.monotonic() - start
    return _Ran(collected, first, second, checkpoint_id, continued, passed, seconds)


def _crashed(
    opts: DemoOptions, console: Console, workdir: Path, checkpoint_id: str
) -> tuple[list[str], list[str]]:
    """Say what the crash left of checkpoint ``checkpoint_id`` (its manifest, ``collection.json``):
    returns the rollouts in flight at it and those of them on servers the restored fleet lacks."""
    manifest = msgspec.json.decode((workdir / "run" / checkpoint_id / "collection.json").read_bytes())
    continued = [e["rollout_id"] for e in manifest["continued"]]
    lost = _lost(opts, manifest)
    done, restarted = len(manifest["completed"]), len(manifest["restarted"])
    console.print(
        Text.assemble(
            ("crash", "bold"),
            f": every participant killed after checkpoint {escape(checkpoint_id)} "
            f"({done} done, {len(continued)} in flight, {restarted} to restart, "
            f"{opts.rollouts - done - len(continued) - restarted} not started)" + _resized(opts, lost),
        )
    )
    return continued, lost


def _all_events(
    opts: DemoOptions, events: list[Any], workdir: Path
) -> tuple[list[Any], tuple[int, int] | None]:
    """``events`` (this process's) with the processes' and workers' logs, in time order; with
    ``--jsonl``, the lines of that log once the others were merged into it, and how many were."""
    from ckpt_events.participants.cli.command import load_events
    from ckpt_events.participants.cli.report.logs import event_time

    # Processes' logs (<instance>.gen<n>.jsonl) and their workers' (<...>.jsonl.w<index>).
    logs = workdir / "logs"
    own = sorted(logs.glob("*.jsonl")) if opts.processes else []
    others = [*own, *sorted(logs.glob("*.jsonl.w*"))]
    events.extend(load_events(others))
    # One stream in time order, as `report` merges its files: the overview folds events as
    # they come, and the controller's coming all first left a restore's steps unattributed.
    events.sort(key=event_time)
    merged = None
    if opts.jsonl is not None and others:
        from ckpt_events.participants.cli.demo.logs import merge_into

        merged = (merge_into(opts.jsonl, others), len(others))
    return events, merged


def _holders(collection: Collection, rollout_id: str) -> set[str]:
    """The participants ``rollout_id``'s last attempt ran on in ``collection``."""
    return {m.name for m in collection.rollouts[rollout_id].placed}


def _lost(opts: DemoOptions, manifest: dict[str, Any]) -> list[str]:
    """The rollouts of the checkpoint ``manifest`` (``collection.json``) in flight on servers the
    restored fleet lacks: they restart (a server reads only its own records)."""
    names = {instance for _, instance in fleet_members(opts.servers(2))}
    placement: dict[str, list[str]] = manifest.get("placement", {})
    return sorted(r for r, where in placement.items() if any(n not in names for n in where))


def _resized(opts: DemoOptions, lost: list[str]) -> str:
    """With ``--restore-instances``: the size of the restored fleet, and the ``lost`` rollouts."""
    after = opts.servers(2)
    if after == opts.servers(1):
        return ""
    gone = f", {counted(len(lost), 'rollout')} in flight on servers it lacks restart" if lost else ""
    return f"; restoring into {counted(after, 'server')} of each kind{gone}"


def _spread(opts: DemoOptions, first: Collection, second: Collection) -> list[str]:
    """With several servers of a kind: how the rollouts spread over them, one line per generation."""
    if opts.servers(1) == 1 and opts.servers(2) == 1:
        return []
    passed = []
    for label, collection in (("generation 1", first), ("generation 2", second)):
        ran: dict[str, int] = {}
        for rollout in collection.rollouts.values():
            for member in rollout.placed:
                ran[member.name] = ran.get(member.name, 0) + 1
        members = collection.coordinator.members
        counts = [ran.get(m.name, 0) for m in members]
        per_kind = len(members) // len({m.kind for m in members})
        passed.append(
            f"{label}: {counted(len(members), 'participant')} ({per_kind} of each kind), each rollout's "
            f"session on one of each kind: {min(counts)} to {counted(max(counts), 'rollout')} per server"
        )
    return passed


def _show(
    console: Console, opts: DemoOptions, events: list[Any], run: Run, checkpoint_id: str, passed: list[str]
) -> None:
    title = f"demo: {counted(opts.rollouts, 'rollout')} x {counted(opts.steps, 'step')}"
    # The breakdown adds up every checkpoint's and restore's records and times: say so, right
    # above the one checkpoint's own "N ms total".
    checkpoints = sum(r.what == "checkpoint" for r in run.rows)
    restores = sum(r.what == "restore" for r in run.rows)
    summed = f"{title}, summed over {counted(checkpoints, 'checkpoint')} and {counted(restores, 'restore')}"
    render(console, events, title=summed)
    render_overview(console, run, title=title)
    for check in passed:
        # A check names checkpoints, instances and causes from the logs: Text, never markup.
        console.print(Text.assemble(("ok", "green"), " ", escape(check)))
    if opts.report is not None:
        written = write_report(opts.report, events, title=f"checkpoint {checkpoint_id} and its restore")
        console.print(Text(escape(written)))


def _exported(
    console: Console, opts: DemoOptions, configured: sinks.Configured, merged: tuple[int, int] | None
) -> None:
    """Say what went where: spans and metrics to the collector, lines to the log (``merged``: the
    lines it holds after the other processes' and workers' logs were folded in, and how many)."""
    elsewhere = " (the participants' own processes exported theirs too)" if opts.processes else ""
    if configured.span_sink is not None:
        spans = configured.span_sink.stats()
        console.print(
            f"exported {counted(spans.exported, 'span')} to {opts.otlp_endpoint}/v1/traces"
            f" ({spans.dropped:,} dropped){elsewhere}"
        )
    if configured.metric_sink is not None:
        metrics = configured.metric_sink.stats()
        how = (
            f"{counted(metrics.exports, 'export request')}, {metrics.export_failures:,} failed"
            if isinstance(metrics, OtlpMetricSinkStats)
            else counted(metrics.sdk_calls, "instrument call")
        )
        console.print(
            f"exported metrics from {counted(metrics.events, 'event')} ({how}) "
            f"to {opts.otlp_endpoint}/v1/metrics{elsewhere}"
        )
    if configured.jsonl_sink is not None:
        lines = configured.jsonl_sink.stats()
        folded = (
            ""
            if merged is None
            else f", merged with {merged[1]} processes' and workers' logs: {counted(merged[0], 'line')}"
        )
        console.print(
            f"wrote {counted(lines.events, 'JSON line')} ({counted(lines.bytes, 'byte')}) "
            f"to {opts.jsonl}{folded}"
            f" (try: ckpt-events report {opts.jsonl})"
        )
    if not configured.enabled:
        console.print("exported nothing (add --jsonl PATH or --otlp-endpoint URL to keep the events)")
