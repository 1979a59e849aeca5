"""``participants.writable``: the write probe of the command line and the benchmarks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ckpt_events.participants.writable import unwritable


def test_what_can_be_written_is_left_as_it_was(tmp_path: Path) -> None:
    """A new file in a folder, or an existing file, is writable: nothing is made or emptied."""
    (tmp_path / "kept.txt").write_text("kept")
    assert unwritable(tmp_path / "new.txt") is None and not (tmp_path / "new.txt").exists()
    assert unwritable(tmp_path / "kept.txt") is None and (tmp_path / "kept.txt").read_text() == "kept"
    assert unwritable(tmp_path / "a" / "b" / "x.txt", make_folders=True) is None
    assert not (tmp_path / "a").exists()


def test_what_cannot_be_written_is_one_line_saying_why(tmp_path: Path) -> None:
    """A folder, a missing folder (unless the writer makes it), a file in the way of a folder and
    a place with no right to write are each refused in one line."""
    (a_file := tmp_path / "f").write_text("x")
    cases = [
        (tmp_path, {}, f"{str(tmp_path)!r} is a folder: name a file in it"),
        (
            tmp_path / "missing" / "x.txt",
            {},
            f"the folder of {str(tmp_path / 'missing' / 'x.txt')!r} does not exist",
        ),
        (a_file / "sub" / "x.txt", {"make_folders": True}, f"{str(a_file)!r} is a file, not a folder"),
        (a_file / "x.txt", {}, f"{str(a_file)!r} is a file, not a folder"),
        (Path("/proc/x.json"), {"make_folders": True}, "cannot write '/proc/x.json': "),
    ]
    for path, options, said in cases:
        refusal = unwritable(path, **options)
        assert refusal is not None and said in refusal and "\n" not in refusal, (path, refusal)


def test_it_is_a_leaf_so_the_benchmarks_report_does_not_import_the_command_line() -> None:
    """The benchmarks' report used the command line's probe through a circular import
    (``participants.cli`` -> ``bench`` -> ``bench_app`` -> ``benchmarks.bench_app`` -> ``report``):
    the probe is a leaf; ``benchmarks.bench_app`` imports first, and ``report`` loads no CLI."""
    code = (
        "import sys, ckpt_events.benchmarks.bench_app, ckpt_events.benchmarks.report\n"
        "print(sorted(m for m in sys.modules if m.startswith('ckpt_events.participants.cli')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_link_is_judged_by_where_it_points(tmp_path: Path) -> None:
    """A link to a file in a folder that does not exist was taken (its own folder can take a
    file), and the write then failed on a traceback: judged by its target, named in the line.
    A link to a file that can be written is writable."""
    (dangling := tmp_path / "report.html").symlink_to(tmp_path / "gone" / "x.html")
    refusal = unwritable(dangling)
    assert refusal is not None and "\n" not in refusal
    assert f"the folder of {str(dangling)!r} (a link to {str(tmp_path / 'gone' / 'x.html')!r})" in refusal
    (to_a_file := tmp_path / "to-file.html").symlink_to(tmp_path / "target.html")
    assert unwritable(to_a_file) is None and not (tmp_path / "target.html").exists()
