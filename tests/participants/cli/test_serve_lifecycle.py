"""``serve`` run as in production: a log on a full disk, a hangup. Real processes on 127.0.0.1."""

from __future__ import annotations

import contextlib
import os
import re
import resource
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ckpt_events.participants.cli.fleet import free_port, write_token_file
from ckpt_events.participants.protocol import CONTROL_PREFIX
from tests.participants.cli.otlp_receiver import otlp_receiver
from tests.participants.cli.sessions import session, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TOKEN = "lifecycle-test-token"
#: Events one prepare and its resume emit on an idle participant (each: started, finished, and
#: the phase's own event), measured on a log with room.
EVENTS_PER_CYCLE = 6


@contextlib.contextmanager
def _serve(
    tmp_path: Path,
    env: dict[str, str],
    file_limit: int | None = None,
    prefix: tuple[str, ...] = (),
    options: tuple[str, ...] = (),
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """``serve resources`` in its own session, listening; killed with its group on the way out."""
    token = write_token_file(tmp_path / "token", TOKEN)
    port = free_port()

    argv = ["serve", "resources", "--port", str(port), "--token-file", str(token), *options]
    with session(argv, tmp_path, env, prefix=prefix) as proc:
        if file_limit is not None:  # a full disk, as a file size limit (no tmpfs to fill here)
            resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (file_limit, file_limit))

        def up() -> bool:
            assert proc.poll() is None, (tmp_path / "err").read_text()
            return _ready(port)

        wait_for(up, 30, "serve to listen")
        yield proc, port


def _ready(port: int) -> bool:
    """Whether ``serve`` answers ``/status``, each of its workers (if any) connected."""
    url = f"http://127.0.0.1:{port}{CONTROL_PREFIX}/status"
    try:
        reply = httpx.get(url, headers={"authorization": f"Bearer {TOKEN}"}, timeout=1)
    except httpx.HTTPError:
        return False
    return reply.status_code == 200 and all(w["connected"] for w in reply.json().get("workers") or [])


def _cycles(port: int, count: int) -> None:
    """``count`` prepares, each resumed: events for the log."""
    headers = {"authorization": f"Bearer {TOKEN}"}
    with httpx.Client(
        base_url=f"http://127.0.0.1:{port}{CONTROL_PREFIX}", headers=headers, timeout=10
    ) as client:
        for index in range(count):
            body = {"checkpoint_id": f"c{index}", "deadline_ts": time.time() + 30}
            assert client.post("/prepare", json=body).status_code == 200
            assert client.post("/resume", json=body).status_code == 200


def test_events_a_full_disk_lost_are_said_in_one_line_at_shutdown(tmp_path: Path) -> None:
    """A log on a full disk (a 4 KiB file size limit): the sink's first failure is logged, and
    the rest were counted in the dead process's memory alone, so a stopped server said nothing
    of the 170 events it lost (a "writing again" line even said 4). At shutdown one line says
    how many events each sink lost, of how many, and why; and the failure logged is one line,
    not the JSON-lines writer's traceback."""
    log = tmp_path / "events.jsonl"
    with _serve(tmp_path, {"CKPT_EVENTS_JSONL": str(log)}, file_limit=4096) as (proc, port):
        _cycles(port, 30)
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(20)
    err = (tmp_path / "err").read_text()
    written = len(log.read_bytes().splitlines())
    emitted = 30 * EVENTS_PER_CYCLE
    assert written < emitted
    lost = re.findall(r"^ckpt-events serve: sink 'jsonl' lost (\d+) of (\d+) events: (.*)$", err, re.M)
    assert lost, err
    assert (int(lost[0][0]), int(lost[0][1])) == (emitted - written, emitted), err
    assert "File too large" in lost[0][2], err
    assert "Traceback" not in err, err  # the failure itself: one line too


def test_a_hangup_stops_serve_as_sigterm_does_its_sinks_flushed(tmp_path: Path) -> None:
    """SIGHUP (the terminal serve runs in closed, an ssh session dropped) killed serve at once:
    requests in flight cut, the sinks never closed, what they held never sent (here the metrics
    of a 60 s export interval, which only the close exports). It now stops as SIGTERM does:
    gracefully, the sinks flushed, and the process ends of its SIGHUP (129 in a shell)."""
    with otlp_receiver() as received:
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": received.url,
            "OTEL_TRACES_EXPORTER": "none",
            "OTEL_METRIC_EXPORT_INTERVAL": "60000",
        }
        with _serve(tmp_path, env) as (proc, port):
            _cycles(port, 2)
            assert "/v1/metrics" not in received.paths
            os.kill(proc.pid, signal.SIGHUP)
            assert proc.wait(20) == -signal.SIGHUP
        err = (tmp_path / "err").read_text()
        assert received.paths == ["/v1/metrics"], err
    assert err == "", err


def test_a_hangup_ignored_by_nohup_stays_ignored(tmp_path: Path) -> None:
    """Under ``nohup`` (SIGHUP ignored, as the user asked) a hangup does not stop serve."""
    with _serve(tmp_path, {}, prefix=("nohup",)) as (proc, port):
        os.kill(proc.pid, signal.SIGHUP)
        time.sleep(0.5)
        _cycles(port, 1)
        assert proc.poll() is None
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(20) in (0, -signal.SIGTERM)


def test_losses_with_stderr_gone_do_not_change_the_stop(tmp_path: Path) -> None:
    """The loss line, with stderr's reader gone (``2>&1 | head`` after head exited), raised
    BrokenPipeError out of uvicorn's shutdown: the SIGTERM was not raised again and serve exited
    1 by way of a traceback. Nowhere to say it: it ends of its SIGTERM, as without losses."""
    log = tmp_path / "events.jsonl"
    token = write_token_file(tmp_path / "token", TOKEN)
    port = free_port()
    read, write = os.pipe()
    os.close(read)
    argv = ["serve", "resources", "--port", str(port), "--token-file", str(token)]
    with session(argv, tmp_path, {"CKPT_EVENTS_JSONL": str(log)}, stdout=write, stderr=write) as proc:
        os.close(write)
        resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (4096, 4096))

        def listening() -> bool:
            assert proc.poll() is None, proc.returncode
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                return True
            return False

        wait_for(listening, 30, "serve to listen")
        _cycles(port, 10)
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(20) == -signal.SIGTERM


def test_events_a_workers_full_disk_lost_are_said_by_that_worker(tmp_path: Path) -> None:
    """``serve --workers 2``, every log on a full disk: each worker's losses are said, in one
    line naming the worker, as the main process's are, and its sink's failure in one line."""
    log = tmp_path / "events.jsonl"
    env = {"CKPT_EVENTS_JSONL": str(log)}
    with _serve(tmp_path, env, file_limit=4096, options=("--workers", "2")) as (proc, port):
        _cycles(port, 30)
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(20)
    err = (tmp_path / "err").read_text()
    for index in (0, 1):
        written = len(Path(f"{log}.w{index}").read_bytes().splitlines())
        said = re.findall(
            rf"^ckpt-events serve: worker {index}: sink 'jsonl' lost (\d+) of (\d+) events: .*File too large",
            err,
            re.M,
        )
        assert said, err
        assert int(said[0][0]) + written == int(said[0][1]), err
    assert "Traceback" not in err, err  # each process's sink failure: one line
