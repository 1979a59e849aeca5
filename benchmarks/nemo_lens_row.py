"""The server benchmark's nemo-lens row: find the interpreter that runs it, or say why it is skipped.

nemo-lens (NeMo Gym's telemetry layer) requires Python >= 3.13, so its server
(``server_app_nemo_lens.py``) runs under an interpreter given with ``--nemo-lens-python`` or
``CKPT_EVENTS_BENCH_NEMO_LENS_PYTHON``, which must import ``nemo.lens`` (with its ``sdk`` extra),
fastapi and uvicorn. Without one, the row is printed as skipped with its reason, never an error.
With one, the same server also runs uninstrumented on that interpreter (``BASELINE``), so a row
compares nemo-lens with no telemetry on the same interpreter too.
"""

from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from . import report

__all__ = [
    "BASELINE",
    "ENV",
    "SERVER",
    "VARIANT",
    "VARIANTS",
    "LensInterpreter",
    "command",
    "environment",
    "name",
    "probe",
    "same_interpreter_row",
    "skipped_row",
]

ENV: Final = "CKPT_EVENTS_BENCH_NEMO_LENS_PYTHON"
VARIANT: Final = "nemo_lens"
BASELINE: Final = "nemo_lens_uninstrumented"
VARIANTS: Final = (BASELINE, VARIANT)
SERVER: Final = Path(__file__).with_name("server_app_nemo_lens.py")
_PROBE: Final = (
    "import platform, fastapi, uvicorn, nemo.lens, opentelemetry.sdk.trace, "
    "opentelemetry.exporter.otlp.proto.http.trace_exporter; "
    "print(platform.python_implementation(), platform.python_version())"
)


@dataclass(frozen=True)
class LensInterpreter:
    """The probe's answer: ``python`` and its ``runtime`` ("CPython 3.13.0") when usable, else ``skipped``."""

    python: str | None
    runtime: str = ""
    skipped: str = ""


def probe(python: str | None, timeout: float = 30.0) -> LensInterpreter:
    """Whether ``python`` can run the nemo-lens server; the reason (one line) when it cannot."""
    if not python:
        return LensInterpreter(None, skipped=f"no interpreter given (--nemo-lens-python PATH or {ENV})")
    try:
        run = subprocess.run(
            [python, "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=environment(),
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return LensInterpreter(None, skipped=f"{python} did not answer within {timeout:.0f} s")
    except OSError as exc:
        return LensInterpreter(None, skipped=f"{python} cannot run: {exc.strerror or exc}")
    if run.returncode != 0:
        lines = run.stderr.strip().splitlines()
        why = lines[-1] if lines else f"exit status {run.returncode}"
        return LensInterpreter(None, skipped=f"{python} lacks nemo-lens[sdk], fastapi or uvicorn ({why})")
    return LensInterpreter(python, runtime=run.stdout.strip())


def environment() -> dict[str, str]:
    """The environment for the other interpreter: ours without the paths of our own interpreter."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def command(python: str, port: int, collector: str | None) -> list[str]:
    """The nemo-lens server's command line (run as a file: it is no module of this interpreter);
    uninstrumented without a ``collector``."""
    return [python, str(SERVER), str(port), *([collector] if collector else [])]


def name(variant: str, runtime: str) -> str:
    """A variant's name in the table: it says which interpreter, since the comparison crosses them."""
    ours = f"{platform.python_implementation()} {platform.python_version()}"
    if variant == BASELINE:
        return f"uninstrumented, on {runtime} (the nemo-lens server, no telemetry)"
    return f"nemo-lens managed_span, OTLP/HTTP to rotel, on {runtime} (the other rows: {ours})"


def same_interpreter_row(rounds: dict[str, list[float]], runtime: str) -> tuple[str, float, str, None]:
    """nemo-lens against no telemetry on its own interpreter: the ratio without the interpreters'
    gap, taken within each round (``rounds``: us per request per variant, by round) like the
    bench's other ratios, median over rounds."""
    what = f"server CPU/request: nemo-lens managed_span / uninstrumented, both on {runtime}"
    return (what, report.paired_ratio(rounds[VARIANT], rounds[BASELINE]), "", None)


def skipped_row(reason: str) -> tuple[str, None, str, None]:
    """The ratio row, printed with the reason it was not measured."""
    what = f"server CPU/request: nemo-lens managed_span / uninstrumented (skipped: {reason})"
    return (what, None, "", None)
