"""Cost against scale: how each piece of work grows with its size, as a curve and its exponent.

Four curves, each measured at three sizes in this run, every timing in a fresh process (FastAPI's
route caches keep every fleet's apps alive; one timing must not weigh on the next) that first runs
the same point once untimed, so each timing is a warm one:

* ``rollouts``: a commit and a restore of N rollouts across the four participants, every sink on
  (1,000, 16,000 and 64,000; the original system profiled 16,000);
* ``watch``: one ``watch`` refresh (a poll round of ``GET /status`` and the render) against N real
  participants served by uvicorn in a child process (4, 16, 64);
* ``report``: the report's overview of a run of N checkpoints, read from two JSON-lines files
  (10, 1,000, 10,000);
* ``fleet``: a checkpoint (prepare, commit, resume) and a restore across N servers of each kind,
  4N participants, 1,000 rollouts spread over them as a rollout driver would (1, 4, 16); the work
  is fixed, so the curve is the coordination's own cost against fleet width.

The verdict (``growth``, shared with the scale suite): its exponent is ``k`` of
``time = c + a * size**k`` through the smallest point and the two largest (medians): the smallest
point's time stands for the fixed cost, so what is left is how the work itself grows. The
least-squares slope of log(time) on log(size) over every point averaged the fixed cost of the
smallest size into it: a fixed cost with a quadratic step that overtook it at the largest size
read 0.38, "sub-linear", and passed. ``k`` is 1.0 for linear work, 2.0 for quadratic; n log n
reads more than 1.0, the more so the smaller the sizes (about 1.1 for rollouts, about 1.4 for 4
to 16 participants), so a curve fails when ``k`` is nearer quadratic than n log n at its own
sizes (``fail_at``, never below 1.5). ``k`` is stated with its range over the repeats (each
point anywhere in its min-max spread): a range on both sides of ``fail_at`` is "unknown", never
a pass or a failure the noise made; so is a curve with one timing at a point (no spread to judge
the noise by), and a timing that is not a positive, finite time (a child's NaN read
"sub-linear", a pass) makes that curve unknown with why, its timings and the other curves kept.
Each point is the median of its repeats, printed with their spread (min-max). The repeats are
interleaved across the sizes: round r measures every size once, in an order rotated by r, before
round r + 1 begins (``schedule``), so a burst of load on the machine lands on repeats of several
sizes, where it widens their spread, never on every repeat of one size. Run back to back, the
repeats of one point moved together: a burst over the fleet's quick run read 325.1-325.9 ms at 4
servers per kind against 114 ms at 2, "faster than n log n (a failure)" with a range of
2.10-3.79, falsely (0.34 s and 0.42 s standalone). ``--png PATH`` draws the four curves on
log-log axes (with a dotted linear reference through the first point) through a headless
Chromium.

Run ``python -m ckpt_events.benchmarks.bench_curves [--quick] [--json PATH] [--png PATH]``.
"""

from __future__ import annotations

import argparse
import gc
import html
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, Final

import anyio

from . import report
from .growth import exponent_row, exponent_text, fit_exponent, verdict

DEFAULT_JSON = Path(__file__).parent / "results" / "curves.json"
#: Untimed runs of a point in its process before its timing: the first one pays imports and first calls.
WARMUPS: Final = 1

#: A point's process (its warm-up and one timing) is killed past this. The full run's slowest, the
#: report at 10,000 checkpoints, took 6.4-8.4 s a timing; it was 1,800 s, so a point that would
#: take an hour stalled the run 30 min a timing (36 in a full run), then failed it whole.
POINT_TIMEOUT_S: Final = 300.0

#: Per curve: its sizes (full, quick), the unit of its size, what is timed.
CURVES: Final[dict[str, tuple[tuple[int, ...], tuple[int, ...], str, str]]] = {
    "rollouts": ((1_000, 16_000, 64_000), (500, 2_000, 8_000), "rollouts", "commit + restore, all sinks on"),
    "watch": ((4, 16, 64), (4, 8, 16), "participants", "one watch refresh (poll + render)"),
    "report": ((10, 1_000, 10_000), (10, 100, 1_000), "checkpoints", "the report's overview of the run"),
    "fleet": ((1, 4, 16), (1, 2, 4), "servers per kind", "checkpoint + restore, 1,000 rollouts"),
}


# --- the points, each measured in the child process that runs it -------------------------------


async def _rollouts_point(n: int) -> float:
    from .bench_scale import _one

    base = "/dev/shm" if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory(prefix="ckpt-curves-", dir=base) as tmp:
        run = await _one(n, True, Path(tmp))
    return float(run["commit_s"] + run["restore_s"])


async def _watch_point(n: int) -> float:
    from .bench_watch import _measure_size

    figures = await _measure_size(n, 5)
    if figures["errors"]:
        raise RuntimeError(f"{figures['errors']} failed polls against {n} participants")
    return float(figures["poll_median_s"] + figures["render_median_s"])


async def _report_point(n: int) -> float:
    from ckpt_events.participants.cli.report.logs import LogProblems, merged_events
    from ckpt_events.participants.cli.report.overview import overview

    from .bench_report import _write_run

    with tempfile.TemporaryDirectory(prefix="ckpt-curves-") as tmp:
        folder = Path(tmp)
        await anyio.to_thread.run_sync(_write_run, folder, n)
        paths = sorted(folder.iterdir())
        gc.collect()
        began = time.perf_counter()
        run = overview(merged_events(paths, LogProblems()))
        took = time.perf_counter() - began
    if len(run.rows) != n:
        raise RuntimeError(f"the overview of {n} checkpoints has {len(run.rows)} rows")
    return took


async def _fleet_point(instances: int, rollouts: int = 1_000) -> float:
    """A checkpoint and a restore across ``instances`` servers of each kind, in this process."""
    import httpx

    from ckpt_events import Bus, Telemetry
    from ckpt_events.participants import create_app
    from ckpt_events.participants.controller.coordinator import Coordinator, Member
    from ckpt_events.participants.protocol import EpisodeId

    from .bench_scale import MEMBERS, TOKEN, _Router, subscribe_all_sinks

    kinds = [kind for kind, _ in MEMBERS]
    names = [(kind, f"{kind}-{i}") for kind in kinds for i in range(instances)]
    # Each rollout's session lives on one server of each kind, as a rollout driver spreads them.
    scope = {
        name: [
            EpisodeId(f"r{r:06d}", 0) for r in range(rollouts) if r % instances == int(name.rsplit("-", 1)[1])
        ]
        for _, name in names
    }

    def fleet(bus: Bus, root: Path, install: bool) -> tuple[dict[str, Any], list[Member]]:
        apps = {
            name: create_app(kind, instance=name, token=TOKEN, bus=bus, checkpoint_root=root)
            for kind, name in names
        }
        if install:
            for name, app in apps.items():
                for episode in scope[name]:
                    app.state.workload.start(episode, 4)
        members = [Member(name=name, kind=kind, instance=name, url=f"http://{name}") for kind, name in names]
        return apps, members

    base = "/dev/shm" if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory(prefix="ckpt-curves-", dir=base) as tmp:
        root = Path(tmp)
        async with AsyncExitStack() as stack:
            bus = await stack.enter_async_context(Bus(buffer_size=1 << 20))
            await subscribe_all_sinks(stack, bus, root)
            tel = Telemetry(bus, kind="controller", instance="coordination")
            apps, members = fleet(bus, root, install=True)
            gc.collect()
            began = time.perf_counter()
            async with (
                httpx.AsyncClient(transport=_Router(apps), timeout=600) as http,
                Coordinator(members, token=TOKEN, telemetry=tel, client=http) as co,
            ):
                deadline = time.time() + 600
                prepared = await co.prepare("c1", deadline_ts=deadline)
                if not prepared.prepared:
                    raise RuntimeError(f"prepare across {len(members)} participants: {prepared}")
                await co.commit("c1", str(root / "ckpt"), deadline_ts=deadline, episode_ids=scope)
                await co.resume("c1", deadline_ts=deadline)
            apps, members = fleet(bus, root, install=False)
            async with (
                httpx.AsyncClient(transport=_Router(apps), timeout=600) as http,
                Coordinator(members, token=TOKEN, telemetry=tel, client=http) as co,
            ):
                await co.restore("r1", str(root / "ckpt"), scope, deadline_ts=time.time() + 600)
                await co.resume("r1", deadline_ts=time.time() + 600)
            return time.perf_counter() - began


POINTS: Final[dict[str, Callable[[int], Any]]] = {
    "rollouts": _rollouts_point,
    "watch": _watch_point,
    "report": _report_point,
    "fleet": _fleet_point,
}


class PointError(RuntimeError):
    """A point's process failed or ran past its time: its curve is unknown, the run goes on."""


def measure_point(
    curve: str, size: int, repeats: int, *, warmups: int = WARMUPS, timeout_s: float = POINT_TIMEOUT_S
) -> list[float]:
    """``repeats`` timings of one point, in a fresh Python process, after ``warmups`` untimed runs
    of it there (the first run in a process paid its imports and first calls: 26 ms against 5 ms
    for the watch at 4 participants). ``PointError`` when the process fails, or has not finished
    within ``timeout_s`` (it is killed)."""
    module = __spec__.name if __spec__ is not None else __name__
    command = [sys.executable, "-m", module, "--point", curve, str(size), "--repeats", str(repeats)]
    command += ["--warmups", str(warmups)]
    # PYTHONSAFEPATH: the child's path is ours, never its working directory's modules.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "PYTHONSAFEPATH": "1"}
    try:
        done = subprocess.run(command, capture_output=True, timeout=timeout_s, env=env, check=False)
    except subprocess.TimeoutExpired:
        raise PointError(
            f"{curve} at {size:,}: {repeats} timing(s) and {warmups} warm-up(s) ran past {timeout_s:g} s "
            "and were stopped (the rest of the curve was not measured)"
        ) from None
    if done.returncode != 0:
        last = (done.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        raise PointError(f"{curve} at {size:,}: the child exited {done.returncode}: {last}")
    timings: list[float] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    return timings


async def _point_in_this_process(curve: str, size: int, repeats: int, warmups: int = 0) -> list[float]:
    for _ in range(warmups):
        await POINTS[curve](size)
    return [await POINTS[curve](size) for _ in range(repeats)]


def _one_timing(curve: str, size: int) -> float:
    return measure_point(curve, size, 1)[0]


def schedule(sizes: Sequence[int], repeats: int) -> list[list[int]]:
    """The order of measurement: one round per repeat, each round every size once, round r's
    order rotated by r (over three sizes and three rounds every size takes every place once)."""
    ordered = list(sizes)
    return [ordered[r % len(ordered) :] + ordered[: r % len(ordered)] for r in range(repeats)]


# --- the table and the picture ------------------------------------------------------------------


def run(
    quick: bool = False,
    curves: Sequence[str] = tuple(CURVES),
    *,
    measure: Callable[[str, int], float] = _one_timing,
) -> dict[str, Any]:
    """Measure every curve; returns the figures and the rows of the table. ``measure(curve, size)``
    is one timing in seconds (by default a fresh process's, after a warm-up), called in the order
    of ``schedule``: each point's timings are listed by round."""
    repeats = 2 if quick else 3
    figures: dict[str, Any] = {"quick": quick, "repeats": repeats, "warmups": WARMUPS, "curves": {}}
    rows: list[Any] = []
    for curve in curves:
        full, small, unit, what = CURVES[curve]
        sizes = small if quick else full
        order = schedule(sizes, repeats)
        points: dict[int, list[float]] = {size: [] for size in sizes}
        try:
            for round_sizes in order:
                for size in round_sizes:
                    points[size].append(measure(curve, size))
            said = verdict(points)
        except (PointError, ValueError) as exc:
            # A point that failed or ran past its time (the rest of its curve is not measured), or
            # a timing no verdict can use (a child's NaN, a zero): this curve is unknown and says
            # why; the timings it has and the other curves' figures are kept.
            timed = {size: timings for size, timings in points.items() if timings}
            figures["curves"][curve] = {
                "unit": unit,
                "what": what,
                "points": {str(size): t for size, t in timed.items()},
                "order": order,
                "error": str(exc),
                "met": None,
            }
            rows.extend(point_rows(curve, timed, repeats))
            rows.append((f"{curve}: exponent of time on {unit}: unknown, {exc}", None, "", None))
            continue
        measured = {
            "unit": unit,
            "what": what,
            "points": {str(size): t for size, t in points.items()},
            "order": order,
        }
        figures["curves"][curve] = {
            **measured,
            **said,
            "loglog_slope": fit_exponent([(size, statistics.median(t)) for size, t in points.items()]),
        }
        rows.extend(curve_rows(curve, points, repeats))
    return {**figures, "rows": rows}


def curve_rows(curve: str, points: Mapping[int, Sequence[float]], repeats: int) -> list[tuple[Any, ...]]:
    """A curve's rows: each point's median and spread (``point_rows``), then its growth
    (``exponent_row``)."""
    return [*point_rows(curve, points, repeats), exponent_row(curve, CURVES[curve][2], points)]


def point_rows(curve: str, points: Mapping[int, Sequence[float]], repeats: int) -> list[tuple[Any, ...]]:
    """Each point's median and spread (min-max) over its timings, in ms."""
    _, _, unit, what = CURVES[curve]
    rows: list[tuple[Any, ...]] = []
    for size, timings in sorted(points.items()):
        spread = f"{min(timings) * 1e3:,.1f}-{max(timings) * 1e3:,.1f}"
        rows.append(
            (
                f"{curve}: {what} at {size:,} {unit}: ms, median (spread of {repeats})",
                f"{statistics.median(timings) * 1e3:,.1f} ({spread})",
                "",
                None,
            )
        )
    return rows


#: Room right of the last panel for its top point's label: "1,134 ms" at the top right of a
#: one-curve picture was cut at "1,134 m".
RIGHT_MARGIN: Final = 40


def svg_width(curves: int, panel: int = 300) -> int:
    """The picture's width: a panel per curve and the right margin."""
    return panel * curves + RIGHT_MARGIN


def curves_svg(figures: dict[str, Any], *, panel: int = 300) -> str:
    """The curves on log-log axes, one small panel each, with a dotted linear reference."""
    curves = figures["curves"]
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{svg_width(len(curves), panel)}" '
        f'height="{panel - 28}" '
        'font-family="sans-serif" font-size="11">'
    ]
    for index, (name, curve) in enumerate(curves.items()):
        parts.extend(_panel_svg(name, curve, left=index * panel, panel=panel))
    parts.append("</svg>")
    return "".join(parts)


def _panel_svg(name: str, curve: dict[str, Any], *, left: int, panel: int, pad: int = 44) -> list[str]:
    if "error" in curve:  # timings no verdict could use: no line drawn through them, the why said
        return [
            f'<text x="{left + pad}" y="14" font-weight="bold">{html.escape(f"{name}: unknown")}</text>',
            f'<foreignObject x="{left + pad}" y="20" width="{panel - 2 * pad}" height="{panel - 2 * pad}">'
            f'<div xmlns="http://www.w3.org/1999/xhtml">{html.escape(curve["error"])}</div></foreignObject>',
        ]
    points = sorted((int(size), statistics.median(t)) for size, t in curve["points"].items())
    xs = [math.log10(size) for size, _ in points]
    ys = [math.log10(seconds) for _, seconds in points]
    linear = [ys[0] + (x - xs[0]) for x in xs]  # slope 1 through the first point
    low, high = min(ys + linear), max(ys + linear)
    span_x, span_y, inner = (xs[-1] - xs[0]) or 1.0, (high - low) or 1.0, panel - 2 * pad

    def at(x: float, y: float) -> tuple[float, float]:
        return left + pad + (x - xs[0]) / span_x * inner, 20 + inner - (y - low) / span_y * inner

    def line(values: list[float]) -> str:
        return " ".join("{:.1f},{:.1f}".format(*at(x, y)) for x, y in zip(xs, values, strict=True))

    # The table's verdict too: a failed or unknown curve's panel read like a passed one's.
    said = {True: "", False: ", a failure", None: ", unknown"}[curve.get("met", True)]
    title = html.escape(f"{name}: exponent {exponent_text(curve['exponent'])}{said}")
    parts = [
        f'<text x="{left + pad}" y="14" font-weight="bold">{title}</text>',
        f'<rect x="{left + pad}" y="20" width="{inner}" height="{inner}" fill="none" stroke="#bbb"/>',
        f'<polyline points="{line(linear)}" fill="none" stroke="#999" stroke-dasharray="4 3"/>',
        f'<polyline points="{line(ys)}" fill="none" stroke="#1f77b4" stroke-width="2"/>',
    ]
    for (size, seconds), x, y in zip(points, xs, ys, strict=True):
        px, py = at(x, y)
        parts.append(
            f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3" fill="#1f77b4"/>'
            f'<text x="{px:.1f}" y="{20 + inner + 14}" text-anchor="middle">{size:,}</text>'
            f'<text x="{px + 5:.1f}" y="{py - 5:.1f}">{seconds * 1e3:,.0f} ms</text>'
        )
    unit = html.escape(f"{curve['unit']} (log)")
    parts.append(f'<text x="{left + panel / 2:.0f}" y="{20 + inner + 30}" text-anchor="middle">{unit}</text>')
    return parts


def cannot_draw(out: Path) -> str | None:
    """Why ``--png`` could not draw into ``out`` (no Chromium), with the fix; ``None`` if it can."""
    from ckpt_events.participants.cli.report.png import find_browser

    if find_browser() is not None:
        return None
    return (
        f"cannot draw {out}: no Chromium found; install Debian's 'chromium' package (or set "
        "$CKPT_EVENTS_CHROMIUM to a Chrome), or drop --png: nothing was measured"
    )


def write_png(figures: dict[str, Any], out: Path) -> None:
    """The curves as a PNG through a headless Chromium (``CommandError`` without one)."""
    from ckpt_events.participants.cli.report.png import screenshot

    svg = curves_svg(figures)
    with tempfile.TemporaryDirectory(prefix="ckpt-curves-") as tmp:
        page = Path(tmp) / "curves.html"
        page.write_text(f"<!doctype html><html><body style='margin:0;background:#fff'>{svg}</body></html>")
        out.parent.mkdir(parents=True, exist_ok=True)
        screenshot(page, out, width=svg_width(len(figures["curves"])), height=272)


def title(*, quick: bool) -> str:
    """The table's title; a quick run's says so, and that its figures are not the docs'."""
    said = "ckpt-events cost against scale: each curve and its exponent"
    return f"{said} (--quick: smaller sizes, 2 repeats; not the full run's figures)" if quick else said


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None, allow_abbrev=False
    )
    parser.add_argument("--quick", action="store_true", help="smaller sizes, two repeats")
    parser.add_argument(
        "--json", type=report.output_path, default=DEFAULT_JSON, help="where to write the figures"
    )
    parser.add_argument(
        "--png", type=report.output_path, help="draw the curves into this PNG (needs Chromium)"
    )
    parser.add_argument("--only", action="append", choices=tuple(CURVES), help="one curve (repeatable)")
    parser.add_argument("--point", nargs=2, metavar=("CURVE", "SIZE"), help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=3, help=argparse.SUPPRESS)
    parser.add_argument("--warmups", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    with report.failure_in_one_line("curves"):
        if args.point is not None:
            curve, size = args.point[0], int(args.point[1])
            print(json.dumps(anyio.run(_point_in_this_process, curve, size, args.repeats, args.warmups)))
            return 0
        if args.png is not None and (refusal := cannot_draw(args.png)) is not None:
            # Said before the run: a missing Chromium was found only after minutes of measuring.
            print(f"bench_curves: {refusal}", file=sys.stderr)
            return 1
        result = run(quick=args.quick, curves=args.only or tuple(CURVES))
        rows = result.pop("rows")
        report.publish(title(quick=args.quick), rows, args.json, result)
        if args.png is not None:
            write_png(result, args.png)
            print(f"curves drawn in {args.png}")
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
