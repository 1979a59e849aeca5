"""Fleet trace benchmark: one trace per checkpoint across a fleet of real processes, at a real collector.

For N = 1, 4 and 16 servers of each kind (4, 16 and 64 participant processes, with the inference
worker and the controller), runs ``ckpt-events demo --instances N --processes --checkpoints 2
--otlp-endpoint URL --jsonl PATH`` in a child process against a ``rotel`` collector on loopback
whose debug log prints every span it receives, then reads back:

* per checkpoint: the trace ids of the spans that carry its id (it must be one), the spans the
  collector holds in that trace, and the participants with no ``prepare`` or no ``commit`` span in
  it (must be 0; the first fleet is killed with SIGKILL right after the last checkpoint, so this
  is also issue #28's check that finished operations are exported before the crash);
* for the restore: the same, with every restored participant's ``restore`` span;
* links broken at the collector: spans whose parent is in none of the spans received (0);
* the time to checkpoint and to restore, from the demo's JSON-lines log: the controller's
  ``gym.checkpoint.collection.checkpoint`` span of the last (published) checkpoint (admission
  closed, prepare, commit, publish, resume) and its ``gym.checkpoint.collection.restore`` span
  (restore, retire, resume); the ``coordinate.prepare``, ``coordinate.commit`` and
  ``coordinate.restore`` spans inside them are kept in the JSON.

The rollouts grow with the fleet (10 per participant, at least 80) so that every server has
sessions in flight at a checkpoint. A run the demo refuses because another program took one of
its servers' ports is run once more (``retried_after`` in the JSON says why). ``--keep DIR`` keeps
each run's log, workdir and collector output (``DIR/n<N>/``), e.g. for ``ckpt-events report
DIR/n16/demo.jsonl``; ``--sizes`` runs those sizes only.

Run ``python -m ckpt_events.benchmarks.bench_fleet_trace [--quick] [--sizes N ...] [--json PATH]
[--keep DIR]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from ckpt_events import CollectionFinished, CoordinateFinished
from ckpt_events.participants.cli.command import given_path
from ckpt_events.participants.cli.demo.plan import fleet_members
from ckpt_events.sinks.jsonl import read_events
from ckpt_events.vocab import (
    COLLECTION_SPANS,
    COORDINATE_SPANS,
    OPERATION_SPANS,
    Attr,
    CollectionAction,
    Operation,
)

from . import report, rotel
from .rotel_spans import ReceivedSpan, received_spans, settled_text

DEFAULT_JSON = Path(__file__).parent / "results" / "fleet_trace.json"
#: Servers of each kind (full run, quick run).
SIZES: Final = (1, 4, 16)
QUICK_SIZES: Final = (1, 2, 4)
CHECKPOINTS: Final = 2
#: The demo's refusal when a server's port was taken by another program between its choice and
#: its bind (on a shared machine, another fleet): the size is run once more, on new ports.
PORT_TAKEN: Final = "a port was taken, run again"
#: A demo at 16 servers of each kind took 224 s on 2 shared cores; past this it has failed.
DEMO_TIMEOUT_S: Final = 900.0

_CHECKPOINT: Final = COLLECTION_SPANS[CollectionAction.CHECKPOINT]
_RESTORE: Final = COLLECTION_SPANS[CollectionAction.RESTORE]
_COORDINATE_RESTORE: Final = COORDINATE_SPANS[Operation.RESTORE]
#: The operation spans every participant has in each kind of trace.
_WANTED: Final = {
    _CHECKPOINT: (OPERATION_SPANS[Operation.PREPARE], OPERATION_SPANS[Operation.COMMIT]),
    _RESTORE: (OPERATION_SPANS[Operation.RESTORE],),
}


@dataclass
class TraceFigures:
    """One checkpoint's (or the restore's) trace at the collector."""

    action: str
    checkpoint_id: str
    trace_ids: int
    spans: int
    missing: list[str]


@dataclass
class SizeFigures:
    """One demo run at ``instances`` servers of each kind."""

    instances: int
    participants: int
    rollouts: int
    exit_status: int
    demo_s: float
    traces: list[TraceFigures] = field(default_factory=list)
    broken_links: int = 0
    #: From the demo's log: the controller's spans, in ms (see the module docstring).
    checkpoint_ms: float | None = None
    restore_ms: float | None = None
    coordinate_ms: dict[str, float] = field(default_factory=dict)
    error: str = ""
    #: Why the size was not run (no collector here) and how to get what it needs: not a failure.
    skipped: str = ""
    #: The first run's failure, when a port was taken and the size was run again.
    retried_after: str = ""


def traces(spans: list[ReceivedSpan], instances: list[str]) -> list[TraceFigures]:
    """Each checkpoint's trace and the restore's, as the collector holds them, in the order it
    printed their root spans; ``instances``: the participants each should hold."""
    by_trace: dict[str, list[ReceivedSpan]] = {}
    for span in spans:
        by_trace.setdefault(span.trace_id, []).append(span)
    found: list[TraceFigures] = []
    for root in (s for s in spans if s.name in _WANTED):
        checkpoint_id = root.attributes.get(Attr.ID, "")
        # A checkpoint's spans carry its id; a restore's (but its root) the restore's own id.
        own = {checkpoint_id}
        if root.name == _RESTORE:
            own = {
                s.attributes.get(Attr.ID, "")
                for s in by_trace[root.trace_id]
                if s.name == _COORDINATE_RESTORE
            }
        ids = {s.trace_id for s in spans if s.attributes.get(Attr.ID) in own and s.name != _RESTORE}
        inside = by_trace[root.trace_id]
        have = {(s.attributes.get(Attr.INSTANCE), s.name) for s in inside}
        missing = [i for i in instances if any((i, name) not in have for name in _WANTED[root.name])]
        found.append(
            TraceFigures(root.name.rsplit(".", 1)[-1], checkpoint_id, len(ids), len(inside), missing)
        )
    return found


def broken_links(spans: list[ReceivedSpan]) -> int:
    """Spans whose parent is none of ``spans`` (a root has no parent)."""
    ids = {s.span_id for s in spans}
    return sum(1 for s in spans if s.parent_id and s.parent_id not in ids)


def timings(log: Path) -> tuple[float | None, float | None, dict[str, float]]:
    """From the demo's JSON-lines ``log``, in ms: the last checkpoint's and the restore's collection
    spans, and the last ``coordinate.prepare``, ``coordinate.commit`` and ``coordinate.restore``."""
    checkpoint: float | None = None
    restore: float | None = None
    coordinate: dict[str, float] = {}
    for _, event in read_events(log):
        match event:
            case CollectionFinished(action=CollectionAction.CHECKPOINT):
                checkpoint = (event.end_ns - event.start_ns) / 1e6
            case CollectionFinished(action=CollectionAction.RESTORE):
                restore = (event.end_ns - event.start_ns) / 1e6
            case CoordinateFinished(operation=Operation.PREPARE | Operation.COMMIT | Operation.RESTORE):
                coordinate[str(event.operation)] = (event.end_ns - event.start_ns) / 1e6
    return checkpoint, restore, coordinate


def measure(instances: int, workdir: Path) -> SizeFigures:
    """Run the demo at ``instances`` servers of each kind against a collector of its own."""
    members = [instance for _, instance in fleet_members(instances)]
    rollouts = max(80, 10 * len(members))
    out, log = workdir / "collector.out", workdir / "demo.jsonl"
    with rotel.collector(debug_out=out) as url:
        if url is None:
            return SizeFigures(instances, len(members), rollouts, -1, 0.0, skipped=rotel.why_missing())
        argv = [sys.executable, "-m", "ckpt_events.participants.cli", "demo", "--processes"]
        argv += ["--instances", str(instances), "--checkpoints", str(CHECKPOINTS), "--otlp-endpoint", url]
        argv += ["--rollouts", str(rollouts), "--concurrency", str(max(8, len(members)))]
        argv += ["--jsonl", str(log), "--workdir", str(workdir / "work")]
        start = time.monotonic()
        with open(workdir / "demo.out", "wb") as printed:
            try:
                code = subprocess.run(
                    argv,
                    stdout=printed,
                    stderr=subprocess.STDOUT,
                    timeout=DEMO_TIMEOUT_S,
                    check=False,
                    env={**os.environ, "COLUMNS": "160"},
                ).returncode
            except subprocess.TimeoutExpired:
                code = -1
        figures = SizeFigures(instances, len(members), rollouts, code, time.monotonic() - start)
        spans = received_spans(settled_text(out))
    if code != 0:
        lines = (workdir / "demo.out").read_text(errors="replace").strip().splitlines()
        said = [line for line in lines if line.startswith("ckpt-events demo: ")] or lines[-3:]
        figures.error = f"demo exited with {code}: " + " / ".join(said)
    figures.traces = traces(spans, members)
    figures.broken_links = broken_links(spans)
    if log.exists():
        checkpoint, restore, coordinate = timings(log)
        figures.checkpoint_ms = checkpoint
        figures.restore_ms = restore
        figures.coordinate_ms = coordinate
    return figures


def _split(size: SizeFigures) -> tuple[list[TraceFigures], list[TraceFigures]]:
    """``size``'s checkpoint traces and restore traces."""
    checkpoints = [t for t in size.traces if t.action == CollectionAction.CHECKPOINT]
    return checkpoints, [t for t in size.traces if t.action == CollectionAction.RESTORE]


def _whole(size: SizeFigures) -> bool:
    """One trace for each checkpoint and one for the restore, every participant in each, no
    span whose parent never arrived, and the demo passed."""
    checkpoints, restores = _split(size)
    return (
        size.exit_status == 0
        and len(checkpoints) == CHECKPOINTS
        and len(restores) == 1
        and all(t.trace_ids == 1 and not t.missing for t in size.traces)
        and size.broken_links == 0
    )


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def print_sizes(sizes: list[SizeFigures]) -> None:
    """The figures as one row per fleet size."""
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title="fleet trace: the demo's traces at the collector, by servers of each kind (N)",
        caption="trace ids: per checkpoint, then the restore (1 each); missing: participants without "
        "their operation spans in a trace; broken links: spans whose parent never arrived; checkpoint "
        "and restore ms: the controller's gym.checkpoint.collection.checkpoint (the last) and "
        ".restore spans, from the demo's log",
        caption_justify="left",
    )
    columns = (
        "N",
        "participants",
        "trace ids",
        "spans per checkpoint trace",
        "restore trace spans",
        "missing",
        "broken links",
        "checkpoint ms",
        "restore ms",
        "demo s",
    )
    for column in columns:
        table.add_column(column, justify="right")
    for size in sizes:
        checkpoints, restores = _split(size)
        table.add_row(
            str(size.instances),
            str(size.participants),
            " / ".join(str(t.trace_ids) for t in size.traces) or "n/a",
            " / ".join(str(t.spans) for t in checkpoints) or "n/a",
            " / ".join(str(t.spans) for t in restores) or "n/a",
            str(sum(len(t.missing) for t in size.traces)),
            str(size.broken_links),
            _ms(size.checkpoint_ms),
            _ms(size.restore_ms),
            "n/a (skipped)"
            if size.skipped
            else f"{size.demo_s:.1f}" + ("" if size.exit_status == 0 else f" (exit {size.exit_status})"),
        )
    Console(width=160).print(table)


def _rows(sizes: list[SizeFigures]) -> list[Any]:
    rows: list[Any] = []
    for size in sizes:
        where = f"fleet N={size.instances} ({size.participants} participants)"
        if size.skipped:
            # Not measured, so neither met nor missed (without rotel each size said "NO", and
            # "missing 0" of its traces, as if its demo had failed).
            rows.append((f"{where}: {size.skipped}", None, "", None))
            rows.append((f"{where}: one whole trace per checkpoint, missing", None, "0", None))
            continue
        if size.error:
            rows.append((f"{where}: {size.error}"[:200], None, "", False))
        missing = sum(len(t.missing) for t in size.traces)
        rows.append((f"{where}: one whole trace per checkpoint, missing", missing, "0", _whole(size)))
        rows.append(
            (
                f"{where}: checkpoint / restore ms",
                f"{_ms(size.checkpoint_ms)} / {_ms(size.restore_ms)}",
                "",
                None,
            )
        )
    return rows


def run(quick: bool = False, keep: Path | None = None, only: tuple[int, ...] = ()) -> dict[str, Any]:
    """Measure each size (``only`` these, if given); returns the figures and the rows of the table."""
    sizes: list[SizeFigures] = []
    with tempfile.TemporaryDirectory(prefix="ckpt-fleet-trace-") as tmp:
        for n in only or (QUICK_SIZES if quick else SIZES):
            workdir = (keep or Path(tmp)) / f"n{n}"
            workdir.mkdir(parents=True, exist_ok=True)
            print(f"fleet trace: demo at {n} servers of each kind...", file=sys.stderr)
            figures = measure(n, workdir)
            if PORT_TAKEN in figures.error:
                print(f"fleet trace: {figures.error}; again", file=sys.stderr)
                again = measure(n, workdir / "again")
                again.retried_after = figures.error
                figures = again
            sizes.append(figures)
    print_sizes(sizes)
    return {"sizes": [asdict(s) for s in sizes], "rows": _rows(sizes)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None, allow_abbrev=False
    )
    parser.add_argument("--quick", action="store_true", help=f"sizes {QUICK_SIZES} instead of {SIZES}")
    parser.add_argument(
        "--json", type=report.output_path, default=DEFAULT_JSON, help="where to write the figures"
    )
    parser.add_argument("--keep", type=given_path, metavar="DIR", help="keep each run's files in DIR/n<N>/")
    parser.add_argument("--sizes", type=int, nargs="+", metavar="N", help="these servers of each kind only")
    args = parser.parse_args(argv)
    with report.failure_in_one_line("fleet_trace"):
        result = run(args.quick, args.keep, tuple(args.sizes or ()))
        rows = result.pop("rows")
        report.publish(
            "ckpt-events fleet trace: one trace per checkpoint at a real collector", rows, args.json, result
        )
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
