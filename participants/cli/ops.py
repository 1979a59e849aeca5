"""``ckpt-events ops --write DIR``: write out the ops pack shipped in ``sinks/ops``.

The pack: Prometheus recording and alert rules (``rules.yml``) with their ``promtool test
rules`` unit tests (``rules_test.yml``), a Grafana dashboard (``dashboard.json``) and a
Grafana data source provisioning file linking exemplars to traces (``grafana-datasource.yml``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import sys
from importlib import resources
from pathlib import Path
from typing import Final

from ckpt_events.participants.cli.command import Command, CommandError, given_path
from ckpt_events.participants.cli.text import escape
from ckpt_events.participants.errors import shown

__all__ = ["OPS", "OPS_FILES", "ops_file"]

#: The files of the pack, in the order they are written.
OPS_FILES: Final = ("rules.yml", "rules_test.yml", "dashboard.json", "grafana-datasource.yml")
#: A file of the pack is staged in a new file of its own, never through a link.
_CREATE: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


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
    # A symlink is there too, dangling or not: the pack was written through one, outside DIR.
    existing = [name for name in OPS_FILES if os.path.lexists(directory / name)]
    # Checked before anything is written: a directory named dashboard.json failed the third
    # write, after the first two had replaced what was there.
    not_files = [
        name for name in existing if (directory / name).exists() and not (directory / name).is_file()
    ]
    if not_files:
        raise CommandError(
            f"--write {directory}: not a file: {', '.join(not_files)}; move it away or name another directory"
        )
    if existing and not args.force:
        raise CommandError(
            f"--write {directory}: {', '.join(existing)} already there; pass --force to overwrite"
        )
    if directory.is_symlink() and not directory.exists():
        # mkdir said only "File exists": the link is there, what it names is not.
        raise CommandError(
            f"--write {directory}: a link to {shown(os.readlink(directory))}, which does not exist; "
            "create that directory or name another"
        )
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        raise CommandError(
            f"--write {directory}: cannot write the pack: {where}{exc.strerror or exc}"
        ) from None
    _write_whole(directory)
    try:
        for name in OPS_FILES:
            # A folder named with ESC[2J cleared the terminal; each path shown as report shows names.
            print(escape(directory / name))
        if sys.stdout is not None:  # None when started with stdout closed (``>&-``)
            sys.stdout.flush()
    except BrokenPipeError:
        raise  # the reader has gone (``| head -1``): main's quiet exit
    except OSError as exc:
        # stdout on a full disk (``> /dev/full``) was a traceback, the pack written all the same.
        # What stdout still holds goes to the null device, or the interpreter's last flush fails
        # again ("Exception ignored", status 120).
        with contextlib.suppress(OSError, ValueError):
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, sys.stdout.fileno())
            os.close(null)
        raise CommandError(
            f"--write {directory}: the pack is written, but listing it on stdout failed: "
            f"{exc.strerror or exc}; send stdout elsewhere"
        ) from None
    return 0


def _write_whole(directory: Path) -> None:
    """Write every file of the pack into ``directory``, or none: each goes to a temporary file
    beside it first, and only once all are written are they renamed into place (a link named
    like one is replaced, not written through). A full disk cut dashboard.json at 4096 of its
    12,139 bytes, after rules.yml and rules_test.yml had replaced an older pack's."""
    staged: list[tuple[Path, Path]] = []
    target = directory
    try:
        for name in OPS_FILES:
            target = directory / name
            temporary = directory / f".{name}.{secrets.token_hex(4)}.tmp"
            fd = os.open(temporary, _CREATE, 0o666)  # the umask applies, as to any file written
            staged.append((temporary, target))
            with os.fdopen(fd, "w", encoding="utf-8") as file:
                file.write(ops_file(name))
    except OSError as exc:
        _unlink_staged(staged)
        raise CommandError(
            f"--write {directory}: cannot write the pack: {target}: {exc.strerror or exc}; nothing written"
        ) from None
    renamed: list[str] = []
    for temporary, target in staged:
        try:
            os.replace(temporary, target)
        except OSError as exc:  # a rename within one folder: not seen failing, said if it does
            _unlink_staged(staged)
            done = f" ({', '.join(renamed)} written)" if renamed else "; nothing written"
            raise CommandError(
                f"--write {directory}: cannot write the pack: {target}: {exc.strerror or exc}{done}"
            ) from None
        renamed.append(target.name)


OPS = Command(
    "ops",
    "write the ops pack (Prometheus rules and their tests, a Grafana dashboard) into a directory",
    _ops_arguments,
    _ops,
)


def _unlink_staged(staged: list[tuple[Path, Path]]) -> None:
    """Remove the temporary files of a pack not written (those renamed already are gone)."""
    for temporary, _ in staged:
        with contextlib.suppress(OSError):
            temporary.unlink()
