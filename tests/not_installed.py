"""Run Python in interpreters where an extra's packages are not installed.

``run_without(folder, blocked, argv)`` runs ``python -c argv[0] argv[1:]`` with a
``sitecustomize`` that installs a meta-path finder refusing the packages ``blocked`` names
(comma-separated, each with everything below it: ``opentelemetry.sdk`` is an install with the API
alone), as the import system does when no finder has them. Every interpreter started from it (the
export process too) inherits the refusal through ``CKPT_TEST_NOT_INSTALLED``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SITECUSTOMIZE = """
import os, sys

blocked = [name for name in os.environ.get("CKPT_TEST_NOT_INSTALLED", "").split(",") if name]

class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in blocked):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
"""


def run_without(folder: Path, blocked: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``python -c argv[0] argv[1:]`` in ``folder``, the packages ``blocked`` names refused."""
    site = folder / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return subprocess.run(
        [sys.executable, "-c", *argv],
        check=False,
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env={
            "PATH": "/usr/bin:/bin",
            "HOME": str(folder),
            "PYTHONPATH": f"{site}{os.pathsep}{ROOT}",
            "CKPT_TEST_NOT_INSTALLED": blocked,
        },
    )
