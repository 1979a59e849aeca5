"""``report``: what a row says is printed as it is, brackets included; an output path is checked
before the run (every suite's ``--json``); a suite that fails is one line."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

import pytest

from ckpt_events.benchmarks import SUITES, report, rotel
from ckpt_events.benchmarks.spread import NO_DIFFERENCE


def test_a_skipped_rows_install_hint_keeps_its_extra(capsys: pytest.CaptureFixture[str]) -> None:
    """rich took ``[dev]`` in "pip install 'ckpt-events[dev]'" for markup and printed 'ckpt-events'."""
    why = rotel.why_missing({})
    assert "'ckpt-events[dev]'" in why
    report.print_table("a [bold]title[/bold]", [(f"otlp ({why})", None, "<= [1.15]", None)])
    printed = capsys.readouterr().out  # wrapped at spaces: none of these holds one
    assert "'ckpt-events[dev]'" in printed
    assert "a [bold]title[/bold]" in printed and "<= [1.15]" in printed


def test_the_json_table_keeps_a_ratios_spread() -> None:
    """A paired ratio whose spread covers 1.0 prints "no measurable difference"; the JSON keeps
    that verdict and the spread, not the median alone."""
    ratio = report.paired_ratio([1.02, 0.97, 1.01], [1.0, 1.0, 1.0])
    (row,) = report.table_json([("on / off", ratio, "<= 1.05", None)])
    assert row["shown"].startswith(NO_DIFFERENCE)
    assert row["value"]["no_measurable_difference"] is True
    assert (row["value"]["low"], row["value"]["high"], row["value"]["rounds"]) == (0.97, 1.02, 3)


@pytest.mark.parametrize(("columns", "widest"), [("80", 80), ("", 110), ("12", 110)])
def test_a_piped_table_keeps_to_columns(
    columns: str, widest: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Piped, the table was drawn 110 columns wide whatever ``$COLUMNS`` said (a narrow CI log
    wrapped every line); too small a number keeps the default."""
    monkeypatch.setenv("COLUMNS", columns)
    row = ("server CPU/request: ckpt-events, every sink in configure()'s export process / uninstrumented",)
    report.print_table("a table", [(*row, 1.108, "<= 1.08", False)] * 3)
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= widest
    assert max(map(len, lines)) > widest - 10  # the long row fills the width it has


def test_a_long_hint_in_a_narrow_table_wraps_and_is_never_cut(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """At 80 columns a skipped row's variable name was cut to 'CKPT_EVENTS_BENCH_NEMO_LENS_…':
    the row no longer said how to get it."""
    monkeypatch.setenv("COLUMNS", "80")
    why = "skipped: no interpreter given (--nemo-lens-python PATH or CKPT_EVENTS_BENCH_NEMO_LENS_PYTHON)"
    rows = [
        ("added CPU/request, ours (OTLP) / the SDK's", "0.156 (0.106-0.201 over 7 rounds)", "<= 0.15", False),
        (f"nemo-lens / uninstrumented ({why})", None, "", None),
    ]
    report.print_table("a table", rows)
    printed = capsys.readouterr().out
    assert "…" not in printed
    cells = "".join(line.split("│")[1].strip() for line in printed.splitlines() if line.startswith("│"))
    assert "CKPT_EVENTS_BENCH_NEMO_LENS_PYTHON" in cells


#: Every benchmark module whose ``main`` takes ``--json PATH``.
WITH_JSON = (
    "bench_connections",
    "bench_core",
    "bench_curves",
    "bench_fleet_trace",
    "bench_prometheus",
    "bench_report",
    "bench_scale",
    "bench_server",
    "bench_sinks",
    "bench_watch",
    "bench_workers",
    "compare_build",
    "server_parts",
    "server_profile",
)


@pytest.mark.parametrize("module", WITH_JSON)
def test_a_json_path_that_cannot_be_written_is_refused_before_the_run(
    module: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python -m ckpt_events.benchmarks.X --json ''`` (a folder, a place with no right to
    write) ran the whole suite, then failed writing with a traceback: refused when parsed."""
    main = importlib.import_module(f"ckpt_events.benchmarks.{module}").main
    for bad, said in (
        ("", "is an empty path"),
        (str(tmp_path), "is a folder"),
        ("/proc/x.json", "cannot write"),
    ):
        with pytest.raises(SystemExit) as info:
            main(["--json", bad])
        assert info.value.code == 2
        assert said in capsys.readouterr().err.splitlines()[-1]


def test_a_json_path_in_missing_folders_is_taken_and_a_file_left_as_it_was(tmp_path: Path) -> None:
    """The folders ``write_json`` makes may be missing; an existing file is opened, not emptied."""
    assert report.output_path(str(tmp_path / "a" / "b" / "x.json")) == tmp_path / "a" / "b" / "x.json"
    assert not (tmp_path / "a").exists()
    (kept := tmp_path / "kept.json").write_text("kept")
    assert report.output_path(str(kept)) == kept and kept.read_text() == "kept"


def _raise(*args: object, **kwargs: object) -> NoReturn:
    raise RuntimeError("the all server did not start")


@pytest.mark.parametrize("suite", SUITES)
def test_a_suite_that_fails_is_one_line_and_exit_1(
    suite: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python -m ckpt_events.benchmarks.bench_<suite>`` whose run raised (a server that did not
    start) printed a traceback: one line now, with the cause and what to do, and exit status 1;
    ``$CKPT_EVENTS_BENCH_TRACEBACK`` gives the traceback back."""
    module = importlib.import_module(f"ckpt_events.benchmarks.bench_{suite}")
    monkeypatch.setattr(module, "run", _raise)
    argv = ["--quick", *(["--json", str(tmp_path / "x.json")] if f"bench_{suite}" in WITH_JSON else [])]
    with pytest.raises(SystemExit) as info:
        module.main(argv)
    assert info.value.code == 1
    assert capsys.readouterr().err.splitlines() == [
        f"bench_{suite}: failed: the all server did not start (RuntimeError: the output above may say "
        f"why; {report.TRACEBACK_ENV}=1 shows where it was raised)"
    ]
    monkeypatch.setenv(report.TRACEBACK_ENV, "1")
    with pytest.raises(RuntimeError, match="did not start"):
        module.main(argv)


@pytest.mark.slow
def test_a_collector_that_does_not_run_is_one_line_with_its_fix(tmp_path: Path) -> None:
    """``python -m ckpt_events.benchmarks.bench_otlp`` with a collector that exits at start: the
    collector error's own line (it says what to check), no traceback, exit status 1."""
    done = subprocess.run(
        [sys.executable, "-m", "ckpt_events.benchmarks.bench_otlp", "--quick"],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, rotel.ENV_BINARY: "/bin/true", "PYTHONPATH": os.pathsep.join(sys.path)},
        cwd=tmp_path,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1] == (
        "bench_otlp: failed: rotel-agent exited at start (3 tries): /bin/true "
        f"(check ${rotel.ENV_BINARY}=/bin/true, or unset it)"
    )


@pytest.mark.parametrize("module", sorted({*WITH_JSON, "bench_otlp"}))
def test_no_benchmark_parser_takes_an_abbreviation(
    module: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--hel`` was taken for ``--help`` (``--qu`` for ``--quick``, ``--js`` for ``--json``):
    every benchmark module's parser refuses an abbreviation when parsed, before any run."""
    main = importlib.import_module(f"ckpt_events.benchmarks.{module}").main
    required = ["--baseline", str(tmp_path)] if module == "compare_build" else []
    with pytest.raises(SystemExit) as info:
        main([*required, "--hel"])
    assert info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith("error: unrecognized arguments: --hel")


def test_a_json_path_is_refused_in_the_command_lines_words(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A suite's ``--json`` and ``ckpt-events bench --json`` refuse a path with the same line (one
    write probe, ``participants.writable``): they said a folder given with a slash, or a file in
    the way of a folder, in words of their own."""
    from ckpt_events.participants.cli.main import build_parser

    (a_file := tmp_path / "f").write_text("x")
    main = importlib.import_module("ckpt_events.benchmarks.bench_core").main
    for bad in (f"{tmp_path}/", str(a_file / "x.json"), "/proc/x.json"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["bench", "--json", bad])
        cli = capsys.readouterr().err.strip().removeprefix("ckpt-events bench: error: ")
        with pytest.raises(SystemExit):
            main(["--json", bad])
        suite = capsys.readouterr().err.splitlines()[-1].partition(": error: ")[2]  # after its prog
        assert suite == cli and cli.startswith("argument --json: "), (suite, cli)
