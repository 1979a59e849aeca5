"""Ctrl-C and SIGTERM: ``demo`` and ``serve`` stop all they started, print one line, leave no process."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckpt_events.participants.cli.fleet import free_port, write_token_file
from ckpt_events.participants.protocol import CONTROL_PREFIX
from tests.participants.cli.sessions import ROOT, session, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _interrupt_and_check(
    proc: subprocess.Popen[bytes], tmp_path: Path, sig: int = signal.SIGINT
) -> list[str]:
    """Send ``sig`` to the whole group (as a terminal's Ctrl-C does); wait for it all to end."""
    os.killpg(proc.pid, sig)
    proc.wait(30)
    wait_for(lambda: not _group_alive(proc.pid), 10, "the process group to end")
    return (tmp_path / "err").read_text().splitlines()


@pytest.mark.parametrize("processes", [False, True], ids=["in-process", "processes"])
def test_ctrl_c_during_demo_stops_everything_with_one_line(tmp_path: Path, processes: bool) -> None:
    """Ctrl-C once the fleet runs: exit 130, one line on stderr, no process left in the group."""
    workdir = tmp_path / "work"
    argv = ["demo", "--rollouts", "200", "--steps", "500", "--workdir", str(workdir)] + (
        ["--processes"] if processes else []
    )
    with session(argv, tmp_path) as proc:
        wait_for(lambda: (workdir / "run").is_dir() or proc.poll() is not None, 60, "the fleet to run")
        time.sleep(0.5)
        assert proc.poll() is None, (tmp_path / "err").read_text()
        lines = _interrupt_and_check(proc, tmp_path)
        assert proc.returncode == 130
        assert lines == ["ckpt-events demo: interrupted"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_the_demo_alone_is_passed_on_to_its_processes(tmp_path: Path, sig: int) -> None:
    """SIGINT to the demo's pid only (not its group, as `kill -INT` does): it passes the interrupt
    on to its servers and ends fast with one line, no process left (it took 9.3 s, waiting out
    its grace and then its bus's close deadline, and printed 'bus closed with ... still busy').
    SIGTERM (``kill``, ``timeout``, a supervisor) the same: it ended the demo in 0.2 s with exit
    143 and no word, and left its five server processes running, reparented to init. The exit
    status is the signal's, as a shell reports it: 130 for SIGINT, 143 for SIGTERM (both were 130)."""
    workdir = tmp_path / "work"
    argv = ["demo", "--processes", "--rollouts", "200", "--steps", "500", "--workdir", str(workdir)]
    with session(argv, tmp_path) as proc:
        wait_for(lambda: (workdir / "run").is_dir() or proc.poll() is not None, 60, "the fleet to run")
        time.sleep(0.5)
        assert proc.poll() is None, (tmp_path / "err").read_text()
        started = time.monotonic()
        os.kill(proc.pid, sig)
        proc.wait(30)
        took = time.monotonic() - started
        # Its children are in its process group: all gone once it has exited.
        wait_for(lambda: not _group_alive(proc.pid), 1.0, "the demo's servers to end")
    assert (tmp_path / "err").read_text().splitlines() == ["ckpt-events demo: interrupted"]
    assert proc.returncode == 128 + sig
    assert took < 3.0, f"the demo took {took:.1f} s to stop"  # 1.1-1.4 s measured on a loaded machine


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_serve_stops_cleanly_on_a_signal(tmp_path: Path, sig: int) -> None:
    """serve shuts down on SIGINT (one line, exit 130) or SIGTERM (nothing printed)."""
    token = write_token_file(tmp_path / "token", "signal-test-token")
    port = free_port()
    argv = ["serve", "environment", "--port", str(port), "--token-file", str(token)]
    with session(argv, tmp_path, env={"CKPT_EVENTS_JSONL": str(tmp_path / "events.jsonl")}) as proc:

        def listening() -> bool:
            assert proc.poll() is None, (tmp_path / "err").read_text()
            with (
                contextlib.suppress(OSError),
                __import__("socket").create_connection(("127.0.0.1", port), 0.2),
            ):
                return True
            return False

        wait_for(listening, 30, "serve to listen")
        lines = _interrupt_and_check(proc, tmp_path, sig)
    if sig == signal.SIGINT:
        assert (proc.returncode, lines) == (130, ["ckpt-events serve: interrupted"])
    else:
        assert proc.returncode in (0, -signal.SIGTERM) and lines == []


@contextlib.contextmanager
def _serve_holding_a_request(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``serve`` listening, with a request whose body has not all come: the graceful shutdown
    waits for it (2 s)."""
    with _serve_with_workers(tmp_path, 1) as (proc, port, _), _holding([(port, "/work/start")]):
        yield proc


@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=["SIGTERM", "SIGINT", "SIGHUP"]
)
def test_a_stop_whose_deadline_cuts_a_request_says_it_in_its_one_line(tmp_path: Path, sig: int) -> None:
    """A stop by a signal while a request holds the graceful shutdown: the request is cut at the
    2 s deadline. uvicorn said it in a line of its own ("ERROR: 1 request(s) still running at
    the shutdown deadline ... were cancelled"): next to "interrupted" after a SIGINT (2 lines),
    alone after a SIGTERM or SIGHUP, the process then dead of the signal (-15, -1). Now one line
    of ours says it, the request named, exit 128 + the signal (143, 130, 129)."""
    with _serve_holding_a_request(tmp_path) as proc:
        lines = _interrupt_and_check(proc, tmp_path, sig)
    assert (proc.returncode, lines) == (
        128 + sig,
        [
            "ckpt-events serve: interrupted; at the 2 s shutdown deadline, 1 request in flight was cut "
            "(POST /work/start)"
        ],
    )


@contextlib.contextmanager
def _serve_with_workers(tmp_path: Path, workers: int) -> Iterator[tuple[subprocess.Popen[bytes], int, dict]]:
    """``serve environment`` (with ``--workers`` when above 1), listening, its workers connected:
    the process, its port and its ``/status``."""
    import json
    import urllib.request

    token_file = write_token_file(tmp_path / "token", "signal-test-token")
    port = free_port()
    argv = ["serve", "environment", "--port", str(port), "--token-file", str(token_file)]
    argv += ["--workers", str(workers)] if workers > 1 else []
    with session(argv, tmp_path, env={"CKPT_EVENTS_JSONL": str(tmp_path / "events.jsonl")}) as proc:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}{CONTROL_PREFIX}/status",
            headers={"authorization": "Bearer signal-test-token"},
        )
        status: dict = {}

        def up() -> bool:
            assert proc.poll() is None, (tmp_path / "err").read_text()
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(request, timeout=1) as reply:
                    status.update(json.load(reply))
                return all(w["connected"] and w["url"] for w in status.get("workers", []))
            return False

        wait_for(up, 30, "serve (and its workers) to serve")
        yield proc, port, status


def _hold(port: int, path: str) -> socket.socket:
    """A connection whose request to ``path`` has sent its head, not all its body: in flight."""
    held = socket.create_connection(("127.0.0.1", port), 5)
    held.sendall(
        f"POST {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer signal-test-token\r\n"
        "content-type: application/json\r\ncontent-length: 100\r\n\r\n{".encode()
    )
    return held


@contextlib.contextmanager
def _holding(requests: list[tuple[int, str]]) -> Iterator[None]:
    """Each ``(port, path)`` request held in flight (see ``_hold``) through the block, begun 0.3 s
    before it; their connections closed on the way out."""
    with contextlib.ExitStack() as stack:
        for port, path in requests:
            stack.enter_context(_hold(port, path))
        time.sleep(0.3)
        yield


def _port(worker: dict) -> int:
    """The port of a worker as ``/status`` lists it."""
    return int(worker["url"].rsplit(":", 1)[1])


def _listening_children(pid: int, port: int) -> set[int]:
    """The children of ``pid`` that listen on ``port``."""
    return {p for p in _children(pid) if _listens(p, port)}


@pytest.mark.parametrize("workers", [1, 2], ids=["serve", "serve --workers 2"])
def test_a_second_ctrl_c_during_the_shutdown_of_serve_is_one_line(tmp_path: Path, workers: int) -> None:
    """Ctrl-C twice (the second while requests still hold the graceful shutdown): uvicorn
    exits at once, cancelling the requests and the app's lifespan. Each was a traceback of
    chained exceptions (over 100 lines), then a line of its own before "interrupted" (3 requests
    cut: 5 lines); now one line says what was cut: how many requests, which, and that events
    may be lost. The second comes 1.2 s after the first: sooner, it is the same interrupt."""
    with _serve_with_workers(tmp_path, workers) as (proc, port, status):
        paths = ["/work/start", "/work/start", f"{CONTROL_PREFIX}/prepare"]
        held = [(port, path) for path in paths]
        for worker in status.get("workers", []):
            # Cut as its worker ends with the server, after the forced exit.
            held.append((_port(worker), "/work/advance"))
        with _holding(held):
            os.killpg(proc.pid, signal.SIGINT)
            time.sleep(1.2)
            lines = _interrupt_and_check(proc, tmp_path)
    # The workers' ports are cut after the forced exit, their channels already gone: not known,
    # and said so (the line counted 3 as if the two held there were not cut).
    unknown = "; workers 0, 1 did not say what their own ports cut (not counted)" if workers > 1 else ""
    assert proc.returncode == 130
    assert lines == [
        "ckpt-events serve: interrupted; a second signal forced the exit: 3 requests in flight were cut "
        f"(POST /work/start x2, POST {CONTROL_PREFIX}/prepare); the app's lifespan was cancelled "
        f"before it closed its sinks: events not yet written or exported may be lost{unknown}"
    ], "\n".join(lines)


def test_ctrl_c_forcing_the_exit_after_a_sigterm_says_what_it_cut(tmp_path: Path) -> None:
    """SIGTERM (a supervisor's), then Ctrl-C 1.2 s later while requests hold the graceful stop:
    uvicorn raised the two signals again on its way out, the SIGINT went to asyncio's handler
    (which only cancels) and the SIGTERM killed the process: exit -15 and not a word of the two
    requests cut. Now one line, exit 143 (the first signal's, as a shell reports it)."""
    with _serve_with_workers(tmp_path, 1) as (proc, port, _):
        with _holding([(port, "/work/start")] * 2):
            os.killpg(proc.pid, signal.SIGTERM)
            time.sleep(1.2)
            lines = _interrupt_and_check(proc, tmp_path)
    assert proc.returncode == 143, lines
    assert lines == [
        "ckpt-events serve: interrupted; a second signal forced the exit: 2 requests in flight were cut "
        "(POST /work/start x2); the app's lifespan was cancelled before it closed its sinks: events not "
        "yet written or exported may be lost"
    ], "\n".join(lines)


def test_a_second_ctrl_c_to_a_worker_is_one_line_saying_what_it_cut(tmp_path: Path) -> None:
    """A worker of ``serve --workers 2`` forced by a second SIGINT 1.2 s after the first (its
    own group signalled, as ``pkill -INT`` twice does): its port cut the two requests it was
    reading, and each was a traceback of ~75 lines (156 lines in all); now the worker says
    them in its one line, and the server restarts it."""
    with _serve_with_workers(tmp_path, 2) as (proc, port, status):
        worker_port = _port(status["workers"][0])
        pids = _listening_children(proc.pid, worker_port)
        assert len(pids) == 1, pids
        (worker,) = pids
        with _holding([(worker_port, "/work/advance")] * 2):
            os.killpg(worker, signal.SIGINT)
            time.sleep(1.2)
            os.killpg(worker, signal.SIGINT)
            wait_for(lambda: "worker 0 exited" in (tmp_path / "err").read_text(), 20, "the worker to exit")
        lines = _interrupt_and_check(proc, tmp_path)
    assert proc.returncode == 130
    assert "Traceback" not in "\n".join(lines) and not [x for x in lines if x.startswith("ERROR:")], lines
    assert (
        "ckpt-events serve: worker 0: interrupted; a second signal forced the exit: 2 requests in "
        "flight were cut (POST /work/advance x2)"
    ) in lines, "\n".join(lines)
    assert "worker 0 exited (130); restarting it" in lines, lines


@pytest.mark.parametrize("gap", [0.02, 0.3], ids=["delivered twice", "Ctrl-C twice quickly"])
def test_a_sigint_delivered_twice_at_once_is_one_interrupt_the_shutdown_stays_graceful(
    tmp_path: Path, gap: float
) -> None:
    """``timeout -s INT`` (and a supervisor that signals a process and its group) delivers one
    SIGINT twice, moments apart; uvicorn took the second for a second Ctrl-C and forced the
    exit, cancelling the app's lifespan: the sinks were never closed, events unwritten. Two at
    once are one interrupt: the graceful shutdown runs, a request it waited for is cut at its
    deadline, the lifespan ends in order. Ctrl-C pressed twice 0.3 s apart is one interrupt
    too: it forced the exit (3 lines, the lifespan cancelled before its sinks closed)."""
    with _serve_holding_a_request(tmp_path) as proc:
        # As timeout(1) does: the child, then its group. Sent at once, the kernel often merges
        # the two (a signal pending is pending once); 20 ms apart, each is delivered.
        os.kill(proc.pid, signal.SIGINT)
        time.sleep(gap)
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(30)
    err = (tmp_path / "err").read_text()
    assert proc.returncode == 130, err
    assert "lifespan was cancelled" not in err and "the exit was forced" not in err, err
    assert err.splitlines() == [
        "ckpt-events serve: interrupted; at the 2 s shutdown deadline, 1 request in flight was cut "
        "(POST /work/start)"
    ], err


def test_ctrl_c_during_the_restore_blames_no_participant(tmp_path: Path) -> None:
    """``demo --processes``, Ctrl-C while generation 2 restores: its servers are stopped, so the
    controller's calls to them fail, and it logged those failures as the run's own ("restore of
    ... failed, restarting its rollouts: retire failed: agent-0: unreachable ...", three lines)
    before "interrupted": a false cause. What fails once the interrupt came is not reported."""
    workdir = tmp_path / "work"
    argv = ["demo", "--processes", "--fault", "slow-restore", "--rollouts", "200", "--concurrency", "32",
            "--workdir", str(workdir)]  # fmt: skip
    with session(argv, tmp_path) as proc:

        def restoring() -> bool:
            assert proc.poll() is None, (tmp_path / "err").read_text()
            return any((workdir / "logs").glob("*.gen2.jsonl"))

        wait_for(restoring, 90, "generation 2 to start")
        time.sleep(0.5)  # its restore reads 0.05 s per record on model-0
        os.kill(proc.pid, signal.SIGINT)
        proc.wait(30)
        wait_for(lambda: not _group_alive(proc.pid), 5, "the demo's servers to end")
    assert proc.returncode == 130
    assert (tmp_path / "err").read_text().splitlines() == ["ckpt-events demo: interrupted"]


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def test_serve_whose_workers_spend_their_restart_budget_exits_1_with_one_line(tmp_path: Path) -> None:
    """``serve --workers 2`` whose workers keep dying (their logs became folders, so each start
    fails) gives up after the restart budget: exit 1 and one line saying why and what to do. It
    stopped itself with a SIGTERM that uvicorn raised again on the way out: killed by SIGTERM
    (-15, 143 in a shell), the cause only in a log line. Spent before the workers ever joined,
    it stops then, not at the 30 s join deadline (it said it was stopping 16 s before it did)."""
    token = write_token_file(tmp_path / "token", "budget-test-token")
    port = free_port()
    log = tmp_path / "events.jsonl"
    argv = ["serve", "environment", "--port", str(port), "--token-file", str(token), "--workers", "2"]
    with session(argv, tmp_path, env={"CKPT_EVENTS_JSONL": str(log)}) as proc:
        wait_for(lambda: len(_children(proc.pid)) >= 2, 30, "serve to start its workers")
        for index in range(2):
            (tmp_path / f"events.jsonl.w{index}").unlink()
            (tmp_path / f"events.jsonl.w{index}").mkdir()
        for worker in _children(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker, signal.SIGKILL)
        spent = "restart budget of 5 spent; stopping the server"
        wait_for(lambda: spent in (tmp_path / "err").read_text(), 120, "the restart budget to be spent")
        proc.wait(10)
    err = (tmp_path / "err").read_text()
    last = err.splitlines()[-1]
    assert proc.returncode == 1, (proc.returncode, err[-2000:])
    assert last.startswith("ckpt-events serve: error: worker "), err[-2000:]
    assert "restart budget of 5 spent" in last, last
    assert last.endswith("fix it, then start serve again"), last
    assert "Traceback" not in err


def test_a_sigint_delivered_twice_to_a_worker_is_one_interrupt_and_one_line(tmp_path: Path) -> None:
    """A worker of ``serve --workers 2`` is its own process group; a SIGINT sent to it twice at
    once (``pkill -INT``, a signal to its group, then again) made its port's uvicorn force the
    exit, cutting a request it was serving, and the SIGINT uvicorn raised again on the way out
    was a KeyboardInterrupt traceback, exit -2. Two at once are one interrupt: the request held
    open keeps the worker's graceful stop waiting; once it ends, one line and exit 130."""
    with _serve_with_workers(tmp_path, 2) as (proc, _, status):
        worker_port = _port(status["workers"][0])
        pids = _listening_children(proc.pid, worker_port)
        assert len(pids) == 1, pids
        (worker,) = pids
        with _holding([(worker_port, "/work/advance")]):
            os.killpg(worker, signal.SIGINT)
            time.sleep(0.02)
            os.killpg(worker, signal.SIGINT)
            time.sleep(1.0)
            assert os.path.exists(f"/proc/{worker}"), "the exit was forced: the held request was cut"
        wait_for(lambda: "worker 0 exited" in (tmp_path / "err").read_text(), 20, "the worker to exit")
        err = (tmp_path / "err").read_text()
    assert "Traceback" not in err, err
    assert "ckpt-events serve: worker 0: interrupted" in err.splitlines(), err
    assert "worker 0 exited (130); restarting it" in err, err


def _listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds a listening TCP socket on ``port`` (from ``/proc``)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port and fields[9] in inodes:
                return True
    return False


@pytest.mark.parametrize(
    "second", [signal.SIGINT, signal.SIGTERM], ids=["Ctrl-C twice", "Ctrl-C then SIGTERM"]
)
def test_a_second_signal_soon_after_the_first_keeps_the_demo_stop_graceful(
    tmp_path: Path, second: int
) -> None:
    """Ctrl-C, then 50 ms later Ctrl-C again (or a supervisor's SIGTERM): one interrupt. The
    second forced the exit, and each of the demo's five servers logged its lifespan cancelled,
    and each request cut (6 to 16 lines before "interrupted"); now the graceful stop runs, one
    line, exit 130 (the first signal's), no process left."""
    workdir = tmp_path / "work"
    argv = ["demo", "--rollouts", "200", "--steps", "500", "--workdir", str(workdir)]
    with session(argv, tmp_path) as proc:
        wait_for(lambda: (workdir / "run").is_dir() or proc.poll() is not None, 60, "the fleet to run")
        time.sleep(0.5)
        assert proc.poll() is None, (tmp_path / "err").read_text()
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.05)
        lines = _interrupt_and_check(proc, tmp_path, second)
    assert (proc.returncode, lines) == (130, ["ckpt-events demo: interrupted"])


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_of_serve_with_workers_counts_what_their_own_ports_cut(tmp_path: Path, sig: int) -> None:
    """``serve --workers 2`` stopped by a signal while a request is held on its main port and one
    on each worker's own port: all three are cut, and the line said "1 request in flight was
    cut" (the workers' two cut as they ended, logged at DEBUG only). Now it counts and names them."""
    with _serve_with_workers(tmp_path, 2) as (proc, port, status):
        held = [(port, "/work/start")] + [(_port(w), "/work/advance") for w in status["workers"]]
        with _holding(held):
            lines = _interrupt_and_check(proc, tmp_path, sig)
    assert (proc.returncode, lines) == (
        128 + sig,
        [
            "ckpt-events serve: interrupted; at the 2 s shutdown deadline, 1 request in flight was cut "
            "(POST /work/start); on its workers' own ports, 2 requests in flight were cut "
            "(POST /work/advance on worker 0, POST /work/advance on worker 1)"
        ],
    ), "\n".join(lines)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_stop_cutting_only_a_workers_port_is_said(tmp_path: Path, sig: int) -> None:
    """SIGTERM (or SIGHUP: the terminal closed) to ``serve --workers 2`` with a request held on
    worker 1's port only: nothing was in flight on the main port, so the process died of the
    signal without a word (-15; after SIGHUP still -1, its handler Python's default again when
    uvicorn raised it) while the worker cut the request. Now one line counts it, exit 143 (129)."""
    with _serve_with_workers(tmp_path, 2) as (proc, _, status):
        with _holding([(_port(status["workers"][1]), "/work/advance")]):
            lines = _interrupt_and_check(proc, tmp_path, sig)
    assert (proc.returncode, lines) == (
        128 + sig,
        [
            "ckpt-events serve: interrupted; on its workers' own ports, 1 request in flight was cut "
            "(POST /work/advance on worker 1)"
        ],
    ), "\n".join(lines)


#: ``serve`` run in-process from the main thread, stopped by a SIGINT once it listens; then what
#: the process's stop signals are handled by (``main`` returned: the host goes on).
_EMBEDDED = """
import os, signal, socket, sys, threading, time
from ckpt_events.participants.cli.main import main

port, token = int(sys.argv[1]), sys.argv[2]

def interrupt_once_listening():
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGINT)

threading.Thread(target=interrupt_once_listening, daemon=True).start()
status = main(["serve", "environment", "--port", str(port), "--token-file", token])
print(status, signal.getsignal(signal.SIGINT) is signal.default_int_handler,
      signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, flush=True)
"""


def test_serve_run_in_process_gives_the_stop_signals_back(tmp_path: Path) -> None:
    """``main(["serve", ...])`` called in a process that goes on after it (a test, an embedder),
    stopped by a Ctrl-C: it left SIGTERM ignored in that process (``kill`` no longer stopped it);
    SIGINT and SIGTERM are now handled as before the call."""
    token = write_token_file(tmp_path / "token", "signal-test-token")
    done = subprocess.run(
        [sys.executable, "-c", _EMBEDDED, str(free_port()), str(token)],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "CKPT_EVENTS_JSONL": str(tmp_path / "events.jsonl")},
    )
    assert (done.stdout, done.stderr) == ("130 True True\n", "ckpt-events serve: interrupted\n")


#: ``demo`` run in-process from the main thread, under the caller's own SIGINT and SIGTERM
#: handlers, interrupted once its signal receiver is up; then whose handlers are installed.
_EMBEDDED_DEMO = """
import os, signal, sys, threading, time
from ckpt_events.participants.cli.main import main

def own_sigint(signum, frame):
    raise KeyboardInterrupt

def own_sigterm(signum, frame):
    pass

signal.signal(signal.SIGINT, own_sigint)
signal.signal(signal.SIGTERM, own_sigterm)

def interrupt_once_receiving():
    deadline = time.monotonic() + 20
    while signal.getsignal(signal.SIGTERM) is own_sigterm and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(os.getpid(), signal.SIGINT)

threading.Thread(target=interrupt_once_receiving, daemon=True).start()
status = main(["demo", "--rollouts", "50", "--workdir", sys.argv[1]])
print(status, signal.getsignal(signal.SIGINT) is own_sigint,
      signal.getsignal(signal.SIGTERM) is own_sigterm, flush=True)
"""


def test_demo_run_in_process_gives_the_callers_own_handlers_back(tmp_path: Path) -> None:
    """``main(["demo", ...])`` called under the caller's own SIGINT and SIGTERM handlers and
    stopped by a Ctrl-C: the demo's signal receiver left SIGINT at Python's default and SIGTERM
    at SIG_DFL (a ``kill`` then ended the caller); both are now the caller's again."""
    done = subprocess.run(
        [sys.executable, "-c", _EMBEDDED_DEMO, str(tmp_path / "demo")],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    said = (done.stdout.splitlines()[-1:], done.stderr)
    assert said == (["130 True True"], "ckpt-events demo: interrupted\n")
