"""JsonLinesSink when its file is moved, deleted or emptied under it (logrotate's ``create`` and
``copytruncate`` modes, a cleanup script), or its folder disappears."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from ckpt_events import Bus, OperationFinished, Telemetry
from ckpt_events.sinks.jsonl import JsonLinesSink, read_events


async def _commits(bus: Bus, tel: Telemetry, first: int, count: int) -> None:
    for n in range(first, first + count):
        with tel.operation("commit", checkpoint_id=f"c{n}"):
            pass
    await bus.flush()


def _ids(path: Path) -> list[str | None]:
    return [e.checkpoint_id for _, e in read_events(path) if isinstance(e, OperationFinished)]


async def test_a_renamed_log_is_followed_by_a_new_file_at_the_path(tmp_path: Path) -> None:
    """logrotate's ``create`` mode renames the log: the lines after it go to a new file at the
    path (they went on into the renamed file for ever)."""
    path = tmp_path / "events.jsonl"
    async with Bus() as bus:
        sink = JsonLinesSink(path)
        bus.subscribe(sink)
        tel = Telemetry(bus, kind="resources", instance="r0")
        await _commits(bus, tel, 0, 2)
        path.rename(tmp_path / "events.jsonl.1")
        await _commits(bus, tel, 2, 2)
    assert _ids(tmp_path / "events.jsonl.1") == ["c0", "c1"]
    assert _ids(path) == ["c2", "c3"]
    assert sink.stats().reopened == 1


async def test_a_deleted_log_is_made_again_and_loses_nothing(tmp_path: Path) -> None:
    """A log deleted under the sink is made again: the events after it were written into the
    unlinked file, counted as written, and lost."""
    path = tmp_path / "events.jsonl"
    async with Bus() as bus:
        sink = JsonLinesSink(path)
        bus.subscribe(sink)
        tel = Telemetry(bus, kind="resources", instance="r0")
        await _commits(bus, tel, 0, 1)
        path.unlink()
        await _commits(bus, tel, 1, 2)
    assert _ids(path) == ["c1", "c2"]
    assert sink.stats().events == 6 and sink.stats().failed == 0


async def test_copytruncate_does_not_rotate_early(tmp_path: Path) -> None:
    """A log emptied under the sink (``copytruncate``) is measured again before rotating: the sink
    rotated after one more line, taking the emptied file for a full one."""
    path = tmp_path / "events.jsonl"
    async with Bus() as bus:
        sink = JsonLinesSink(path, max_bytes=4000)
        bus.subscribe(sink)
        tel = Telemetry(bus, kind="resources", instance="r0")
        await _commits(bus, tel, 0, 4)
        shutil.copy(path, tmp_path / "copy.jsonl")
        os.truncate(path, 0)
        await _commits(bus, tel, 4, 4)
    assert _ids(path) == ["c4", "c5", "c6", "c7"]
    assert sink.stats().rotations == 0


async def test_a_folder_removed_and_made_again(tmp_path: Path) -> None:
    """With its folder gone the batches fail and are counted; once the folder is back, writing
    resumes at the path."""
    folder = tmp_path / "logs"
    folder.mkdir()
    path = folder / "events.jsonl"
    async with Bus() as bus:
        sink = JsonLinesSink(path)
        bus.subscribe(sink)
        tel = Telemetry(bus, kind="resources", instance="r0")
        await _commits(bus, tel, 0, 1)
        shutil.rmtree(folder)
        await _commits(bus, tel, 1, 1)
        sink.flush()  # the file failed to open again: nothing to flush, no error
        folder.mkdir()
        await _commits(bus, tel, 2, 1)
    assert _ids(path) == ["c2"]
    stats = sink.stats()
    assert (stats.failed, stats.write_errors) == (2, 1)
    assert bus.stats().sinks[0].failed == 2
    assert stats.reopened == 1


async def test_a_relative_path_stays_where_it_was_after_a_chdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relative path names the file in the folder it was given in, as ``logging.FileHandler``
    makes it absolute: after a ``chdir`` a rotation renamed nothing (the batch failed, and every
    later one), and following the path moved the log to the new folder."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    monkeypatch.chdir(first)
    async with Bus() as bus:
        sink = JsonLinesSink("events.jsonl", max_bytes=1500)
        bus.subscribe(sink)
        tel = Telemetry(bus, kind="resources", instance="r0")
        await _commits(bus, tel, 0, 1)
        monkeypatch.chdir(second)
        await _commits(bus, tel, 1, 4)
    assert sink.path == first / "events.jsonl"
    assert list(second.iterdir()) == []
    assert sink.stats().failed == 0 and sink.stats().rotations > 0
    read = [_ids(path) for path in sorted(first.iterdir(), reverse=True)]
    assert [n for ids in read for n in ids] == [f"c{n}" for n in range(5)]
