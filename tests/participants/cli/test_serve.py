"""`ckpt-events serve`: argument errors are one line and exit 2; a real process serves with auth."""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

import httpx
import pytest

from ckpt_events.participants.cli.fleet import ServerProcess, write_token_file
from ckpt_events.participants.cli.main import COMMANDS, build_parser, main
from ckpt_events.participants.protocol import CONTROL_PREFIX


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    try:
        status = main(list(argv))
    except SystemExit as exc:
        status = int(exc.code or 0)
    return status, capsys.readouterr().err


@pytest.fixture(autouse=True)
def no_ambient_config(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CKPT_EVENTS_TOKEN", "CKPT_EVENTS_INFERENCE_TOKEN", "CKPT_EVENTS_SPAN_GROUPS"):
        monkeypatch.delenv(name, raising=False)


def test_serve_is_registered_in_the_command_registry() -> None:
    """Subcommands come from COMMANDS; serve is one of them."""
    assert "serve" in {c.name for c in COMMANDS}
    assert "serve" in build_parser().format_help()


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (("serve", "agent", "--port", "1", "--verbose"), "unrecognized arguments: --verbose"),
        (("serve", "judge", "--port", "1"), "invalid choice: 'judge'"),
        # Named the choices only: a kind of the user's own is served by their app, and the line says how.
        (
            ("serve", "judge", "--port", "1"),
            "a kind of your own is served by your app: "
            "create_app('judge', kinds=KINDS.replacing(KindRow('judge', ",
        ),
        (("serve", "controller", "--port", "1"), "'controller' is the coordinator's, not a participant's"),
        (("serve", "agent", "--port", "70000"), "not in 0-65535"),
        (("serve", "agent", "--port", "1", "--instance", "../x"), "is not 1-128 characters"),
        (("serve", "agent"), "one of the arguments --port --fd is required"),
        (("serve", "agent", "--port", "1", "--fd", "3"), "argument --fd: not allowed with argument --port"),
        (("serve", "agent", "--fd", "-1"), "-1 is not a file descriptor number"),
        (("serve", "agent", "--port", "1"), "CKPT_EVENTS_TOKEN"),
        # Served, and every model call failed 502 "missing an 'http://' or 'https://' protocol".
        (
            ("serve", "model", "--port", "1", "--inference-url", "127.0.0.1:8000"),
            "argument --inference-url: '127.0.0.1:8000' is not an http(s) URL, e.g. http://127.0.0.1:8000",
        ),
        (
            ("serve", "model", "--port", "1", "--inference-url", "http://127.0.0.1:99999"),
            "argument --inference-url: 'http://127.0.0.1:99999' has an invalid port",
        ),
        (
            ("serve", "agent", "--port", "1", "--token-file", "/nonexistent/token"),
            "cannot read the token file",
        ),
    ],
)
def test_bad_arguments_give_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], fragment: str
) -> None:
    """Each mistake is reported on one line of stderr, with status 2 and no traceback."""
    status, err = run_cli(capsys, *argv)
    assert status == 2
    assert fragment in err and err.count("\n") == 1 and "Traceback" not in err


def test_a_token_in_the_environment_past_the_file_limit_is_refused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``$CKPT_EVENTS_TOKEN`` has the token file's limit (4,096 bytes): it goes into every
    request's header. A 64 KiB one was taken as the token."""
    monkeypatch.setenv("CKPT_EVENTS_TOKEN", "a" * (1 << 16))
    status, err = run_cli(capsys, "serve", "resources", "--port", "1")
    assert status == 2 and err.count("\n") == 1
    assert "$CKPT_EVENTS_TOKEN holds more than 4096 bytes: set it to the token alone" in err


def test_empty_token_file_and_bad_span_groups_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An empty token file, then an unknown span group in the environment, are both one-line errors."""
    empty = tmp_path / "empty"
    empty.write_text("\n")
    status, err = run_cli(capsys, "serve", "resources", "--port", "1", "--token-file", str(empty))
    assert status == 2 and "is empty" in err
    monkeypatch.setenv("CKPT_EVENTS_SPAN_GROUPS", "default,bogus")
    status, err = run_cli(
        capsys,
        "serve",
        "resources",
        "--port",
        "1",
        "--token-file",
        str(write_token_file(tmp_path / "t", "x")),
    )
    assert status == 2 and "unknown span group 'bogus'" in err


def test_model_needs_an_inference_url(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """serve model without --inference-url is a usage error."""
    token = write_token_file(tmp_path / "token", "secret-token")
    status, err = run_cli(capsys, "serve", "model", "--port", "1", "--token-file", str(token))
    assert status == 2 and "--inference-url" in err


def test_an_fd_that_is_not_an_inherited_tcp_socket_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--fd naming no open descriptor, a file, or a UDP socket: one line naming the fix, exit 2."""
    token = str(write_token_file(tmp_path / "token", "x"))
    with open(tmp_path / "file", "wb") as file, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        for fd, fragment in (
            (4000, "--fd 4000 is not a socket this process inherited (Bad file descriptor)"),
            (file.fileno(), "is not a socket this process inherited (Socket operation on non-socket)"),
            (udp.fileno(), f"--fd {udp.fileno()} is not a TCP socket: pass a bound TCP socket"),
        ):
            status, err = run_cli(capsys, "serve", "resources", "--fd", str(fd), "--token-file", token)
            assert status == 2 and fragment in err and err.count("\n") == 1, err
        assert udp.fileno() >= 0  # the refused socket was left to its owner, not closed


@pytest.mark.e2e
async def test_a_fleet_servers_port_is_its_own_from_the_start(tmp_path: Path) -> None:
    """ServerProcess binds the port and hands the server the socket (--fd): from the moment it
    returns no one else can bind that port, not even with SO_REUSEADDR (a worker's port 0 once
    took a fleet's model port between its choice and its bind), and connecting is refused until
    the server listens, so wait_listening still waits for its startup."""
    token_file = write_token_file(tmp_path / "token", "served-token")
    process = ServerProcess("resources", instance="resources-9", token_file=token_file, log_dir=tmp_path)
    try:
        with socket.socket() as other:
            other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            with pytest.raises(OSError) as taken:
                other.bind(("127.0.0.1", process.port))
            assert taken.value.errno == errno.EADDRINUSE
        assert "--fd" in process.proc.args and "--port" not in process.proc.args  # type: ignore[operator]
        with pytest.raises(ConnectionRefusedError):  # its Python has not even imported uvicorn yet
            socket.create_connection(("127.0.0.1", process.port), timeout=5).close()
        await process.wait_listening(30.0)
        headers = {"authorization": "Bearer served-token"}
        async with httpx.AsyncClient(base_url=process.url, headers=headers) as http:
            reply = await http.get(CONTROL_PREFIX + "/status")
            assert reply.status_code == 200 and reply.json()["instance"] == "resources-9"
    finally:
        process.terminate()
    with socket.socket() as after:  # the server gone, its port is free again
        after.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        after.bind(("127.0.0.1", process.port))


@pytest.mark.e2e
async def test_serve_runs_a_participant_with_bearer_auth(tmp_path: Path) -> None:
    """A served participant answers /status with the token (from a file) and 401 without it."""
    token_file = write_token_file(tmp_path / "token", "served-token")
    process = ServerProcess("resources", instance="resources-7", token_file=token_file, log_dir=tmp_path)
    try:
        await process.wait_listening(30.0)
        async with httpx.AsyncClient(base_url=process.url) as http:
            ok = await http.get(CONTROL_PREFIX + "/status", headers={"authorization": "Bearer served-token"})
            assert ok.status_code == 200 and ok.json()["instance"] == "resources-7"
            denied = await http.get(CONTROL_PREFIX + "/status")
            assert denied.status_code == 401 and denied.json()["error"]["code"] == "unauthorized"
    finally:
        process.terminate()


@pytest.mark.e2e
async def test_serve_starts_before_its_collector_and_exports_once_it_comes(tmp_path: Path) -> None:
    """serve with nothing at OTEL_EXPORTER_OTLP_ENDPOINT starts anyway, says so in one line, and
    its spans reach the collector started afterwards (it refused to start: start-up order was a
    hard dependency); --require-collector keeps the refusal, in one line."""
    import anyio

    from ckpt_events.participants.cli.fleet import free_port
    from tests.participants.cli.otlp_receiver import otlp_receiver
    from tests.participants.helpers import body

    token_file = write_token_file(tmp_path / "token", "served-token")
    port = free_port()
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}", "OTEL_BSP_SCHEDULE_DELAY": "20"}
    strict = ServerProcess(
        "resources",
        instance="resources-8",
        token_file=token_file,
        log_dir=tmp_path / "strict",
        env=env,
        extra_args=["--require-collector"],
    )
    assert strict.wait(30) == 2
    assert strict.stderr_path.read_text().splitlines() == [
        "ckpt-events serve: error: --require-collector: $OTEL_EXPORTER_OTLP_ENDPOINT: nothing answers at "
        f"http://127.0.0.1:{port}/v1/traces: start a collector there, or fix the endpoint"
    ]
    process = ServerProcess(
        "resources", instance="resources-7", token_file=token_file, log_dir=tmp_path, env=env
    )
    try:
        await process.wait_listening(30.0)
        assert process.stderr_path.read_text().splitlines() == [
            f"ckpt-events serve: the collector at http://127.0.0.1:{port}/v1/traces does not answer "
            "(yet): serving anyway, spans are exported once it does (dropped and counted until then; "
            "--require-collector refuses to start instead)"
        ]
        with otlp_receiver(port) as received:
            async with httpx.AsyncClient(
                base_url=process.url, headers={"authorization": "Bearer served-token"}
            ) as http:
                reply = await http.post(CONTROL_PREFIX + "/prepare", json=body("c-late"))
                assert reply.status_code == 200, reply.text
            with anyio.fail_after(15):
                while "/v1/traces" not in received.paths:
                    await anyio.sleep(0.05)
    finally:
        process.terminate()


def test_a_checkpoint_root_that_is_a_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--checkpoint-root FILE`` served, and every commit under it would have failed: one line."""
    token = write_token_file(tmp_path / "token", "secret-token")
    argv = ("serve", "agent", "--port", "1", "--token-file", str(token), "--checkpoint-root", str(token))
    status, err = run_cli(capsys, *argv)
    assert status == 2
    assert err == f"ckpt-events serve: error: --checkpoint-root {token}: not a folder; name the folder " + (
        "checkpoints are written under\n"
    )


def test_a_checkpoint_root_under_a_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--checkpoint-root FILE/sub`` can never be made: it was served, and every commit failed
    with "cannot create ...: File exists". One line naming the file, exit 2."""
    token = write_token_file(tmp_path / "token", "secret-token")
    root = token / "sub" / "ck"
    argv = ("serve", "agent", "--port", "1", "--token-file", str(token), "--checkpoint-root", str(root))
    status, err = run_cli(capsys, *argv)
    assert status == 2
    assert err == (
        f"ckpt-events serve: error: --checkpoint-root {root}: {token} is a file, not a folder, so it "
        "cannot be made; name a folder checkpoints can be written under\n"
    )


def test_a_checkpoint_root_under_a_symlink_to_nothing_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A dangling symlink above ``--checkpoint-root`` (a mount point gone) is refused likewise."""
    token = write_token_file(tmp_path / "token", "secret-token")
    (tmp_path / "mnt").symlink_to(tmp_path / "gone")
    root = tmp_path / "mnt" / "ck"
    argv = ("serve", "agent", "--port", "1", "--token-file", str(token), "--checkpoint-root", str(root))
    status, err = run_cli(capsys, *argv)
    assert status == 2
    assert err == (
        f"ckpt-events serve: error: --checkpoint-root {root}: {tmp_path / 'mnt'} is a symlink to "
        "nothing, not a folder, so it cannot be made; name a folder checkpoints can be written under\n"
    )


@pytest.mark.e2e
def test_a_token_file_that_is_not_a_token_is_refused_unread(tmp_path: Path) -> None:
    """A token file is read up to ``MAX_TOKEN_BYTES``: a 1 MiB file is refused in one line (it
    was taken as the token, and served), and ``/dev/zero`` is too (it was read until memory ran
    out: 2.8 GB in 15 s)."""
    big = tmp_path / "big"
    big.write_bytes(b"a" * (1 << 20))
    for name, token_file in (("big", big), ("zero", Path("/dev/zero"))):
        process = ServerProcess("resources", instance=name, token_file=token_file, log_dir=tmp_path)
        try:
            assert process.wait(20) == 2
        finally:
            process.terminate()
        assert process.stderr_path.read_text().splitlines() == [
            f"ckpt-events serve: error: the token file {str(token_file)!r} holds more than 4096 bytes: "
            "a token file holds the token alone"
        ]


@pytest.mark.e2e
def test_a_refusal_under_dev_mode_closes_the_socket_it_was_handed(tmp_path: Path) -> None:
    """A server handed its socket (``--fd``) and refused before it served (a bad token file)
    left the socket to the garbage collector: under ``-X dev`` its one-line error was followed by
    "ResourceWarning: unclosed <socket.socket fd=3 ...>" and a tracemalloc hint; with warnings as
    errors, "Exception ignored in: <socket.socket ...>". It closes it: the error stays one line."""
    big = tmp_path / "big"
    big.write_bytes(b"a" * 5000)
    process = ServerProcess(
        "resources",
        instance="dev",
        token_file=big,
        log_dir=tmp_path,
        env={"PYTHONDEVMODE": "1", "PYTHONWARNINGS": "error"},
    )
    try:
        assert process.wait(20) == 2
    finally:
        process.terminate()
    assert process.stderr_path.read_text().splitlines() == [
        f"ckpt-events serve: error: the token file {str(big)!r} holds more than 4096 bytes: "
        "a token file holds the token alone"
    ]


@pytest.mark.e2e
@pytest.mark.slow
async def test_a_second_server_on_a_log_another_one_writes_is_refused(tmp_path: Path) -> None:
    """Two servers on one ``CKPT_EVENTS_JSONL``: the second took the first's open work (a prepare
    still waiting) for a dead predecessor's and wrote it into the log as truncated, while the
    first was alive and went on. It is refused in one line; once the first has stopped, a server
    on that log starts (and closes what was left open, as before)."""
    token_file = write_token_file(tmp_path / "token", "served-token")
    env = {"CKPT_EVENTS_JSONL": str(tmp_path / "events.jsonl")}
    first = ServerProcess("resources", instance="first", token_file=token_file, log_dir=tmp_path, env=env)
    try:
        await first.wait_listening(30.0)
        second = ServerProcess(
            "resources", instance="second", token_file=token_file, log_dir=tmp_path / "2", env=env
        )
        try:
            assert second.wait(20) == 2
        finally:
            second.terminate()
        assert second.stderr_path.read_text().splitlines() == [
            f"ckpt-events serve: error: $CKPT_EVENTS_JSONL {str(tmp_path / 'events.jsonl')!r}: another "
            f"running server (pid {first.proc.pid}) writes this log: give each server a log of its own"
        ]
    finally:
        first.terminate()
    third = ServerProcess(
        "resources", instance="third", token_file=token_file, log_dir=tmp_path / "3", env=env
    )
    try:
        await third.wait_listening(30.0)
    finally:
        third.terminate()


@pytest.mark.e2e
@pytest.mark.slow
async def test_a_server_on_a_log_a_running_servers_worker_writes_is_refused(tmp_path: Path) -> None:
    """A server with ``--workers 2`` on ``events.jsonl`` writes ``events.jsonl.w0`` and ``.w1`` from
    its workers; those were not locked, so a second server given ``events.jsonl.w1`` as its own
    log started, closed the live worker's open work as a dead predecessor's and wrote into its
    file. It is refused in one line naming the process that holds it, as a second server on a
    main log is."""
    token_file = write_token_file(tmp_path / "token", "served-token")
    log = tmp_path / "events.jsonl"
    first = ServerProcess(
        "resources",
        instance="first",
        token_file=token_file,
        log_dir=tmp_path,
        env={"CKPT_EVENTS_JSONL": str(log)},
        extra_args=["--workers", "2"],
    )
    try:
        await first.wait_listening(30.0)
        second = ServerProcess(
            "resources",
            instance="second",
            token_file=token_file,
            log_dir=tmp_path / "2",
            env={"CKPT_EVENTS_JSONL": f"{log}.w1"},
        )
        try:
            assert second.wait(20) == 2
        finally:
            second.terminate()
        assert second.stderr_path.read_text().splitlines() == [
            f"ckpt-events serve: error: $CKPT_EVENTS_JSONL {f'{log}.w1'!r}: another running server "
            f"(pid {first.proc.pid}) writes this log: give each server a log of its own"
        ]
    finally:
        first.terminate()


@pytest.mark.e2e
def test_a_worker_log_that_cannot_be_opened_is_one_line_before_anything_starts(tmp_path: Path) -> None:
    """``--workers 2`` whose worker 1 log (``$CKPT_EVENTS_JSONL.w1``) is a folder: one line naming
    it, exit 2, at once. The worker died at each start, was restarted 5 times with a traceback
    each, and the server stopped by SIGTERM after 30 s, its main port never served."""
    (tmp_path / "events.jsonl.w1").mkdir()
    env = {"CKPT_EVENTS_JSONL": str(tmp_path / "events.jsonl")}
    token_file = write_token_file(tmp_path / "token", "served-token")
    process = ServerProcess(
        "environment",
        instance="environment-0",
        token_file=token_file,
        log_dir=tmp_path / "logs",
        env=env,
        extra_args=["--workers", "2", "--checkpoint-root", str(tmp_path)],
    )
    try:
        assert process.wait(20) == 2
    finally:
        process.terminate()
    lines = process.stderr_path.read_text().splitlines()
    assert lines == [
        f"ckpt-events serve: error: worker 1's log {str(tmp_path / 'events.jsonl.w1')!r} "
        "($CKPT_EVENTS_JSONL + .w1) cannot be opened for appending (Is a directory): make it a "
        "file this user can write, or point $CKPT_EVENTS_JSONL elsewhere"
    ]


@pytest.mark.e2e
def test_a_log_that_is_a_pipe_with_no_reader_is_one_line_at_start(tmp_path: Path) -> None:
    """``CKPT_EVENTS_JSONL`` naming a FIFO nobody reads: the server held the FIFO open itself (to
    lock the log), so the sink's open found that reader and the server served, its lines going
    into a pipe nobody read (and froze once its 64 KiB were full). Now: one line saying so, exit 2."""
    token_file = write_token_file(tmp_path / "token", "served-token")
    fifo = tmp_path / "events.fifo"
    os.mkfifo(fifo)
    process = ServerProcess(
        "resources",
        instance="fifo",
        token_file=token_file,
        log_dir=tmp_path,
        env={"CKPT_EVENTS_JSONL": str(fifo)},
    )
    try:
        assert process.wait(20) == 2
    finally:
        process.terminate()
    (line,) = process.stderr_path.read_text().splitlines()
    assert line.startswith(
        f"ckpt-events serve: error: bad setting: CKPT_EVENTS_JSONL: cannot open {str(fifo)!r}"
    )
    assert "a named pipe with no reader: start the process reading it first" in line
