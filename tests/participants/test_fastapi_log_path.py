"""A ``jsonl_path`` that cannot be opened fails the app's startup in one line that says the fix.

Before, a log in a folder that does not exist said only the cause (``cannot open
'nope/events.jsonl' for appending: [Errno 2] No such file or directory: ...``), the way a new
user's first ``uvicorn app:app`` met it. The doc tests never give a path that cannot be opened.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from fastapi import FastAPI

from ckpt_events import ConfigurationError
from ckpt_events.participants.fastapi import instrument


async def _start(path: Path) -> str:
    app = FastAPI()
    instrument(app, kind="judge", instance="judge-0", jsonl_path=str(path))
    with pytest.raises(ConfigurationError) as caught:
        async with app.router.lifespan_context(app):  # what uvicorn runs at startup
            pass
    return str(caught.value)


@pytest.mark.anyio
async def test_a_log_in_a_missing_folder_says_to_make_the_folder(tmp_path: Path) -> None:
    message = await _start(tmp_path / "nope" / "events.jsonl")
    assert "\n" not in message
    assert "No such file or directory" in message  # the cause
    assert f"make the folder first (mkdir -p {shlex.quote(str(tmp_path / 'nope'))})" in message  # the fix
    assert not (tmp_path / "nope").exists()  # nothing made behind the user's back


@pytest.mark.anyio
async def test_a_log_that_is_a_folder_says_its_cause_and_no_false_fix(tmp_path: Path) -> None:
    message = await _start(tmp_path)  # a folder: neither missing nor refused
    assert "Is a directory" in message
    assert "mkdir" not in message


@pytest.mark.anyio
async def test_a_log_under_a_link_to_nowhere_names_the_link_not_mkdir(tmp_path: Path) -> None:
    """A folder that is a link to nowhere was told ``mkdir -p`` it, which fails there (File exists)."""
    (tmp_path / "logs").symlink_to(tmp_path / "gone")
    message = await _start(tmp_path / "logs" / "events.jsonl")
    assert "\n" not in message and "mkdir" not in message
    assert f"'{tmp_path / 'logs'}' is a link to '{tmp_path / 'gone'}', which does not exist" in message


@pytest.mark.anyio
async def test_a_log_under_a_file_says_it_is_a_file(tmp_path: Path) -> None:
    """A file where the log's folder should be said only ``[Errno 20] Not a directory``."""
    (tmp_path / "logs").write_text("")
    message = await _start(tmp_path / "logs" / "events.jsonl")
    assert "\n" not in message and "Not a directory" in message
    assert "is a file, not a folder" in message


@pytest.mark.anyio
async def test_the_folder_to_make_is_said_as_a_shell_reads_it_back(tmp_path: Path) -> None:
    """The ``mkdir -p`` of a folder with a quote in its name was Python's repr (``"it's"``, in
    double quotes a shell would expand ``$`` in); one with a newline in its name cannot be
    pasted on one line, so it is said as a folder to make, escaped, not as a command."""
    folder = str(tmp_path / "it's $HOME")
    quoted = await _start(Path(folder) / "events.jsonl")
    assert f"(mkdir -p {shlex.quote(folder)})" in quoted, quoted
    assert shlex.split(quoted.split("(mkdir -p ", 1)[1].split(")", 1)[0]) == [folder]
    broken = await _start(tmp_path / "two\nlines" / "events.jsonl")
    assert "\n" not in broken and "mkdir -p" not in broken, broken
    assert "make the folder " in broken and "two\\nlines" in broken, broken
