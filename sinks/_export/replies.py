"""The export process's replies on its stdout: ``ready`` once its sinks are built, ``closed``
once they are closed, each one JSON line, read by ``ExportProcess.start`` (blocking, within the
start timeout) and ``ExportProcess.aclose`` (in its task, within the close deadline). Any other
line there is what a start-up hook printed before the child pointed its stdout at stderr: it is
passed on to this process's stderr."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from typing import Any, Final

import anyio
import msgspec

__all__ = ["await_reply", "read_reply"]

#: The longest reply read; past it, no reply came.
_REPLY_LIMIT: Final = 1 << 20


def read_reply(process: subprocess.Popen[bytes], deadline: float) -> dict[str, Any] | None:
    """The child's next reply (a ``ready`` or ``closed`` object), by ``deadline`` (``None``: none came)."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    line = bytearray()
    while (reply := _take_reply(line)) is None:
        left = deadline - time.monotonic()
        if left <= 0 or len(line) >= _REPLY_LIMIT:
            return None
        if not select.select([fd], [], [], min(left, 0.5))[0]:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            return None
        line += chunk
    return reply


async def await_reply(process: subprocess.Popen[bytes], deadline: float) -> dict[str, Any] | None:
    """``read_reply`` in this task: a cancel stops the reading before the pipe is closed."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    os.set_blocking(fd, False)
    line = bytearray()
    with anyio.move_on_after(deadline - time.monotonic()):
        while (reply := _take_reply(line)) is None:
            if len(line) >= _REPLY_LIMIT:
                return None
            try:
                chunk = os.read(fd, 4096)
            except BlockingIOError:
                await anyio.wait_readable(fd)
                continue
            if not chunk:
                return None
            line += chunk
        return reply
    return None


def _take_reply(line: bytearray) -> dict[str, Any] | None:
    """The first reply among the whole lines of ``line``, taken out of it with those before it.

    Another line is what a start-up hook (a ``sitecustomize``, a debugger) printed before the
    child pointed its stdout at stderr: it is passed to our stderr, where the child's prints go
    (it was taken for the reply: "did not start within 20 s", said after one second)."""
    while (end := line.find(b"\n")) >= 0:
        head = bytes(line[:end])
        del line[: end + 1]
        try:
            reply = msgspec.json.decode(head)
        except msgspec.DecodeError:
            reply = None
        if isinstance(reply, dict) and ("ready" in reply or "closed" in reply):
            return reply
        sys.stderr.write(head.decode(errors="replace") + "\n")
    return None
