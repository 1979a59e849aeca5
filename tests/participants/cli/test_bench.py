"""``ckpt-events bench`` runs the suites that drive the participants, end to end, at their quick size.

Benchmarks assert no times; this only keeps them runnable as the participants change (the
workers suite once broke silently when checkpoints had to lie under a participant's root).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ckpt_events.benchmarks import rotel
from ckpt_events.benchmarks.load import children_pids
from ckpt_events.participants.cli.main import build_parser, main

pytestmark = pytest.mark.slow


def _quick_suite(suite: str, json_path: Path) -> subprocess.CompletedProcess[str]:
    """``ckpt-events bench --quick --only SUITE --json JSON_PATH``, run as the user runs it."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "ckpt_events.participants.cli.main",
            "bench",
            "--quick",
            "--only",
            suite,
            "--json",
            str(json_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.fixture(scope="module")
def scale_through_a_link(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """One quick scale run whose ``--json`` is a link into folders that do not exist: the
    quick-suite test and the link test read the same run (each ran its own suite before)."""
    base = tmp_path_factory.mktemp("scale")
    link = base / "figures.json"
    target = base / "elsewhere" / "deep" / "figures.json"
    link.symlink_to(target)
    return _quick_suite("scale", link), target


@pytest.mark.parametrize("suite", ["scale", "workers"])
def test_a_quick_suite_runs_and_writes_its_figures(
    suite: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The suite exits 0, prints its table and writes its figures as JSON."""
    if suite == "scale":
        run, out = request.getfixturevalue("scale_through_a_link")
    else:
        out = tmp_path / "figures.json"
        run = _quick_suite(suite, out)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "ratios measured side by side" in run.stdout
    assert suite in json.loads(out.read_text())["figures"]


def test_the_build_comparison_runs_this_checkout_against_itself(tmp_path: Path) -> None:
    """compare_build runs each build's own scale round in a child and writes per-pair ratios."""
    out = tmp_path / "compare.json"
    root = Path(__file__).resolve().parents[3]
    run = subprocess.run(
        [sys.executable, "-m", "ckpt_events.benchmarks.compare_build", "--baseline", str(root)]
        + ["--size", "200", "--pairs", "2", "--warmup", "0", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=root,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "candidate / baseline (median of 2 pairs)" in run.stdout
    figures = json.loads(out.read_text())["figures"]
    assert figures["size"] == 200 and len(figures["ratio_pairs"]["total_s"]) == 2
    for build in ("baseline", "candidate"):
        assert [r["records"] for r in figures["runs"][build]] == [
            {"environment-0": 200, "model-0": 200, "agent-0": 200, "resources-0": 200}
        ] * 2


def test_every_suite_in_the_benchmarks_folder_can_be_chosen() -> None:
    """``--only`` offers exactly the ``bench_*.py`` suites (a new suite cannot be left out), but
    ``bench_app``, which measures the user's own app and runs with ``--app``."""
    from ckpt_events import benchmarks

    folder = Path(benchmarks.__file__).parent
    found = sorted(p.stem.removeprefix("bench_") for p in folder.glob("bench_*.py"))
    assert sorted(benchmarks.SUITES) == [name for name in found if name != "app"]


_APP = """
from fastapi import FastAPI

from ckpt_events.participants.fastapi import instrument

app = FastAPI()
instrument(app, kind="judge", instance="judge-0")
"""


def test_sigterm_stops_what_the_bench_started(tmp_path: Path) -> None:
    """SIGTERM ended the bench at once and left its servers running; it now stops them, as
    Ctrl-C does, and says it was interrupted."""
    (tmp_path / "termapp.py").write_text(_APP)
    bench = subprocess.Popen(
        [sys.executable, "-m", "ckpt_events.participants.cli.main", "bench", "--app", "termapp:app"]
        + ["--request", "GET /", "--sinks", "jsonl", "--driver", "httpx", "--json", str(tmp_path / "o.json")],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
    )
    servers: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while not servers and bench.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
            servers = children_pids(bench.pid)
        assert servers, "the bench started no server"
        bench.send_signal(signal.SIGTERM)
        _, err = bench.communicate(timeout=60)
        assert bench.returncode == 130, err
        assert err.strip().splitlines()[-1] == "ckpt-events bench: interrupted"
        assert not [pid for pid in servers if os.path.exists(f"/proc/{pid}")], "a server outlived the bench"
    finally:
        bench.kill()
        for pid in servers:  # what the old code left behind
            if os.path.exists(f"/proc/{pid}"):
                os.kill(pid, signal.SIGKILL)


def test_a_collector_that_does_not_run_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """$CKPT_EVENTS_BENCH_ROTEL naming a program that exits at once: "RuntimeError: rotel-agent
    exited at start (3 tries)" and a traceback before; one line naming the variable now."""
    monkeypatch.setenv(rotel.ENV_BINARY, "/bin/true")
    argv = ["bench", "--app", "nosuch:app", "--request", "GET /", "--sinks", "otlp"]
    assert main([*argv, "--json", str(tmp_path / "o.json")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[1:] == [
        "ckpt-events bench: error: rotel-agent exited at start (3 tries): /bin/true "
        f"(check ${rotel.ENV_BINARY}=/bin/true, or unset it)"
    ]


def test_a_suite_named_twice_runs_once() -> None:
    """``--only core --only core`` ran core twice: its rows twice in the table, and only the
    second run's figures in the JSON. Each suite runs once, in the order first named."""
    args = build_parser().parse_args(["bench", "--only", "report", "--only", "core", "--only", "report"])
    assert args.only == ["report", "core"]


def test_a_suite_that_fails_is_one_line_and_the_others_keep_their_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A suite raising (here server: its collector exits at start) lost the figures of the
    suites run before it, and any RuntimeError of a suite ('the server did not start') was a
    traceback: now one line for the suite, the others' figures written, and exit 2 naming it."""
    monkeypatch.setenv(rotel.ENV_BINARY, "/bin/true")
    out = tmp_path / "figures.json"
    argv = ["bench", "--quick", "--only", "prometheus", "--only", "server", "--json", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[2:] == [
        "ckpt-events bench: suite server failed: rotel-agent exited at start (3 tries): /bin/true "
        f"(check ${rotel.ENV_BINARY}=/bin/true, or unset it)",
        f"ckpt-events bench: error: 1 suite failed (server): the others' figures are in {out}",
    ]
    written = json.loads(out.read_text())
    assert list(written["figures"]) == ["prometheus"]
    # The JSON says which suite failed and why, as the table's reader was told on stderr.
    assert list(written["failed"]) == ["server"]
    assert written["failed"]["server"].startswith("rotel-agent exited at start")


def test_the_json_holds_the_table_with_a_skipped_rows_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the collector the table said why a row was skipped and how to get it, but the JSON
    held only ``"to_collector": null``: now it holds the table's rows as printed."""
    monkeypatch.setenv(rotel.ENV_BINARY, str(tmp_path / "no-rotel-agent"))
    out = tmp_path / "figures.json"
    assert main(["bench", "--quick", "--only", "otlp", "--json", str(out)]) == 0
    table = json.loads(out.read_text())["table"]
    skipped = [row for row in table if row["value"] is None]
    assert len(skipped) == 2
    assert all("skipped:" in row["measurement"] and rotel.HOW in row["measurement"] for row in skipped)
    assert all(row["shown"] == "n/a" and row["met"] is None for row in skipped)


def test_a_json_path_in_missing_folders_is_taken_as_the_suites_take_it(tmp_path: Path) -> None:
    """``bench --json results/today.json`` was refused ("the folder ... does not exist") where each
    suite's own ``--json`` makes the folders; the bench makes them too, and still refuses a path
    under a file."""
    wanted = tmp_path / "results" / "today" / "figures.json"
    assert build_parser().parse_args(["bench", "--json", str(wanted)]).json == wanted
    (tmp_path / "a-file").write_text("")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--json", str(tmp_path / "a-file" / "x.json")])


def test_a_json_link_into_missing_folders_is_written_where_it_points(
    scale_through_a_link: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    """A link whose target lies in folders that do not exist passed the probe (folders are made)
    and the write then failed after the whole run, a traceback: the target's folders are made."""
    run, target = scale_through_a_link
    assert run.returncode == 0, run.stderr[-2000:]
    assert (target.parent.parent.parent / "figures.json").is_symlink()
    assert "scale" in json.loads(target.read_text())["figures"]


def test_a_quick_tables_title_says_its_figures_are_a_short_runs() -> None:
    """``bench --quick`` printed the full run's title over its figures (curves at 500 to 8,000
    rollouts, two repeats), nothing to tell them from the docs' figures when pasted."""
    from ckpt_events.participants.cli.bench import _title

    assert "--quick: a short run's figures" in _title(quick=True)
    assert "quick" not in _title(quick=False)
