"""A real Prometheus server for tests: started on 127.0.0.1 with a 1 s scrape interval,
exemplar storage and a temporary TSDB, queried over its HTTP API; skips where not installed."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from ckpt_events.benchmarks.load import stop_process
from ckpt_events.participants.cli.fleet import free_port

READY_SECONDS = 30.0


def prometheus_binary() -> str:
    """The ``prometheus`` executable, or skip the test saying why."""
    found = shutil.which("prometheus")
    if found is None:
        pytest.skip("prometheus is not installed (Debian: apt-get install prometheus)")
    return found


def promtool_binary() -> str:
    """The ``promtool`` executable, or skip the test saying why."""
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    return found


class Prometheus:
    """A running server: ``query``, ``query_range``-free helpers over ``/api/v1``."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client = httpx.Client(base_url=url, timeout=10.0)

    def api(self, path: str, **params: Any) -> Any:
        reply = self.client.get(f"/api/v1/{path}", params=params)
        body = reply.json()
        assert body["status"] == "success", (path, params, body)
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return self.api("query", query=expr)["result"]  # type: ignore[no-any-return]

    def wait_for(self, expr: str, timeout: float = 30.0, check: Any = bool) -> list[dict[str, Any]]:
        """Poll ``expr`` until ``check(result)``; fail after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        result: list[dict[str, Any]] = []
        for _ in range(int(timeout / 0.25) + 1):
            result = self.query(expr)
            if check(result):
                return result
            if time.monotonic() > deadline:
                break
            time.sleep(0.25)
        raise AssertionError(f"{expr!r} never satisfied the check within {timeout} s: {result}")


@contextmanager
def running_prometheus(
    tmp_path: Path, targets: Sequence[str], rule_files: Sequence[Path] = ()
) -> Iterator[Prometheus]:
    """Prometheus scraping ``targets`` (host:port) every second, evaluating ``rule_files``."""
    binary = prometheus_binary()
    port = free_port()
    config = tmp_path / "prometheus.yml"
    rules = "".join(f"\n  - {path}" for path in rule_files)
    listed = ", ".join(f"'{t}'" for t in targets)
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        + (f"rule_files:{rules}\n" if rules else "")
        + f"scrape_configs:\n  - job_name: ckpt\n    static_configs:\n      - targets: [{listed}]\n"
    )
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--enable-feature=exemplar-storage",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    server = Prometheus(f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + READY_SECONDS
        for _ in range(int(READY_SECONDS / 0.1)):
            if proc.poll() is not None:
                raise AssertionError(
                    f"prometheus exited with {proc.returncode}: {(tmp_path / 'prometheus.log').read_text()}"
                )
            try:
                if server.client.get("/-/ready").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError("prometheus not ready within 30 s")
            time.sleep(0.1)
        yield server
    finally:
        server.client.close()
        stop_process(proc)
        log.close()
