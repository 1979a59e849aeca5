"""``ckpt-events ops --write DIR``: write out the ops pack shipped in ``sinks/ops``.

The pack: Prometheus recording and alert rules (``rules.yml``) with their ``promtool test
rules`` unit tests (``rules_test.yml``), a Grafana dashboard (``dashboard.json``) and a
Grafana data source provisioning file linking exemplars to traces (``grafana-datasource.yml``).
"""

from __future__ import annotations

import argparse
from importlib import resources
from pathlib import Path
from typing import Final

from ckpt_events.participants.cli.command import Command, CommandError, given_path

__all__ = ["OPS", "OPS_FILES", "ops_file"]

#: The files of the pack, in the order they are written.
OPS_FILES: Final = ("rules.yml", "rules_test.yml", "dashboard.json", "grafana-datasource.yml")


def ops_file(name: str) -> str:
    """The text of one file of the pack, as shipped in the installed package."""
    return resources.files("ckpt_events.sinks").joinpath("ops", name).read_text(encoding="utf-8")


def _ops_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--write", required=True, metavar="DIR", type=given_path, help="directory to write the pack into"
    )
    parser.add_argument("--force", action="store_true", help="overwrite files already there")


def _ops(args: argparse.Namespace) -> int:
    directory: Path = args.write
    if directory.exists() and not directory.is_dir():
        raise CommandError(f"--write {directory}: not a directory; name a directory to write the pack into")
    existing = [name for name in OPS_FILES if (directory / name).exists()]
    # Checked before anything is written: a directory named dashboard.json failed the third
    # write, after the first two had replaced what was there.
    not_files = [name for name in existing if not (directory / name).is_file()]
    if not_files:
        raise CommandError(
            f"--write {directory}: not a file: {', '.join(not_files)}; move it away or name another directory"
        )
    if existing and not args.force:
        raise CommandError(
            f"--write {directory}: {', '.join(existing)} already there; pass --force to overwrite"
        )
    written: list[str] = []
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for name in OPS_FILES:
            (directory / name).write_text(ops_file(name), encoding="utf-8")
            written.append(name)
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        done = f" ({', '.join(written)} written)" if written else ""
        raise CommandError(
            f"--write {directory}: cannot write the pack: {where}{exc.strerror or exc}{done}"
        ) from None
    for name in OPS_FILES:
        print(directory / name)
    return 0


OPS = Command(
    "ops",
    "write the ops pack (Prometheus rules and their tests, a Grafana dashboard) into a directory",
    _ops_arguments,
    _ops,
)
