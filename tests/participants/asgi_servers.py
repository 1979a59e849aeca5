"""A user's app served by a real ASGI server process (uvicorn or hypercorn) on 127.0.0.1, as the
FastAPI integration's end-to-end tests share it: started, its port read from its stderr, and
stopped by SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

import anyio
from anyio.abc import Process
from anyio.streams.text import TextReceiveStream

#: What each server says on its stderr once it listens, the port in group 1.
READY: Final = {
    "uvicorn": r"Uvicorn running on http://127\.0\.0\.1:(\d+)",
    "hypercorn": r"Running on http://127\.0\.0\.1:(\d+)",
}


@dataclass
class Served:
    """A server process, the URL it listens on, and its stderr: so far, then all of it once the
    ``async with`` block has ended."""

    process: Process
    url: str
    output: str


def _command(server: Literal["uvicorn", "hypercorn"], app: str, folder: Path) -> list[str]:
    """The command serving ``app`` (``module:attribute`` in ``folder``) on a free loopback port."""
    if server == "hypercorn":
        return [sys.executable, "-m", "hypercorn", app, "--bind", "127.0.0.1:0"]
    command = [sys.executable, "-m", "uvicorn", app, "--app-dir", str(folder)]
    return [*command, "--host", "127.0.0.1", "--port", "0"]


@asynccontextmanager
async def asgi_server(
    server: Literal["uvicorn", "hypercorn"], app: str, folder: Path, env: dict[str, str] | None = None
) -> AsyncIterator[Served]:
    """``server`` serving ``app`` from ``folder`` (its cwd), in this environment less its
    ``OTEL_``/``CKPT_EVENTS_`` variables, plus ``env``; yielded once its stderr says it listens
    (within 30 s). On the way out it is sent SIGTERM unless it has ended, the rest of its stderr
    is read into ``output`` and it is waited for (30 s for both)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "CKPT_EVENTS_"))}
    async with await anyio.open_process(
        _command(server, app, folder), env={**clean, **(env or {})}, cwd=folder
    ) as process:
        assert process.stderr is not None
        chunks = TextReceiveStream(process.stderr)
        served = Served(process, "", "")
        found = None
        try:
            with anyio.fail_after(30):
                async for chunk in chunks:
                    served.output += chunk
                    if found := re.search(READY[server], served.output):
                        break
            assert found, served.output
            served.url = f"http://127.0.0.1:{found[1]}"
            yield served
        finally:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
            with anyio.fail_after(30):
                async for chunk in chunks:
                    served.output += chunk
                await process.wait()
