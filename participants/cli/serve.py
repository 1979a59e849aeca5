"""``ckpt-events serve``: one participant or the inference worker under uvicorn.

``serve <kind>`` runs one participant (or the simulated inference worker) under uvicorn,
with the sinks configured from the environment (``CKPT_EVENTS_JSONL``,
``OTEL_EXPORTER_OTLP_ENDPOINT``, ``CKPT_EVENTS_SPAN_GROUPS``, ...). The control token comes
from ``--token-file`` or ``CKPT_EVENTS_TOKEN``, never from the command line, so it does not
show in process listings.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import anyio

from ckpt_events import CkptEventsError, ConfigurationError
from ckpt_events.participants.cli.command import (
    Command,
    CommandError,
    check_reachable,
    file_descriptor,
    given_path,
    http_url,
    instance_name,
    port_number,
    positive_number,
)
from ckpt_events.participants.cli.losses import SinkLosses
from ckpt_events.participants.cli.serve_stop import (
    counting_ports_cut,
    stop_signals_said_as_the_end,
    with_ports_cut,
)
from ckpt_events.participants.cli.startup import (
    check_descriptors,
    check_listen,
    check_workers_can_start,
    claim_logs,
    inherited_socket,
    raise_descriptor_limit,
)
from ckpt_events.participants.cli.text import escape, say
from ckpt_events.participants.cli.words import close_choice
from ckpt_events.participants.errors import Interrupted, shown
from ckpt_events.participants.workloads.registry import KINDS
from ckpt_events.vocab import NAME_RULE, Kind, resolve_span_groups

if TYPE_CHECKING:
    pass

__all__ = ["ENV_INFERENCE_TOKEN", "ENV_SPAN_GROUPS", "ENV_TOKEN", "SERVE", "SERVE_KINDS"]

ENV_TOKEN: Final = "CKPT_EVENTS_TOKEN"
ENV_INFERENCE_TOKEN: Final = "CKPT_EVENTS_INFERENCE_TOKEN"
ENV_SPAN_GROUPS: Final = "CKPT_EVENTS_SPAN_GROUPS"
#: Seconds a stopping server gives requests in flight, and its sinks to flush and close.
SHUTDOWN_TIMEOUT: Final = 2.0
#: The participant kinds (``KINDS``, in stage order), then the inference worker.
SERVE_KINDS: Final = (*KINDS.names, "inference")
#: The most a token file may hold: a token goes into every request's head (64 KiB at most).
#: ``--token-file /dev/zero`` was read until memory ran out (2.8 GB in 15 s).
MAX_TOKEN_BYTES: Final = 4096
#: ``store_files.DEFAULT_CHECKPOINT_ROOT``, spelled here so ``--help`` imports no server stack.
DEFAULT_CHECKPOINT_ROOT: Final = "ckpt-events-checkpoints"


def serve_kind(value: str) -> str:
    """``serve``'s kind: one of ``SERVE_KINDS``. Any other is refused naming them and, for a
    kind of the user's own, how it is served (argparse's line named the choices only)."""
    if value in SERVE_KINDS or close_choice(value, SERVE_KINDS) is not None:
        return value  # a typo (``agnt``) is said with the kind meant, as every choice's
    refused = f"invalid choice: {shown(value)} (choose from {', '.join(map(repr, SERVE_KINDS))})"
    if value == Kind.CONTROLLER:
        raise argparse.ArgumentTypeError(f"{refused}: 'controller' is the coordinator's, not a participant's")
    if NAME_RULE.fullmatch(value) is None:
        raise argparse.ArgumentTypeError(refused)
    raise argparse.ArgumentTypeError(
        f"{refused}: a kind of your own is served by your app: create_app({value!r}, "
        f"kinds=KINDS.replacing(KindRow({value!r}, YourWorkload, ...)), ...) under uvicorn"
    )


def serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "kind", type=serve_kind, choices=SERVE_KINDS, help="participant kind, or the inference worker"
    )
    parser.add_argument("--instance", type=instance_name, help="instance name (default: <kind>-0)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--port", type=port_number, help="port to bind")
    where.add_argument(
        "--fd",
        type=file_descriptor,
        help="serve on this inherited TCP socket, bound and not yet listening, instead of --port "
        "(the demo's fleet binds each server's port itself, so no other process takes it first)",
    )
    parser.add_argument(
        "--token-file", type=given_path, help=f"file holding the control token (else ${ENV_TOKEN})"
    )
    parser.add_argument(
        "--lease-grace-seconds", type=positive_number, default=600.0, help="lease grace (600)"
    )
    parser.add_argument("--inference-url", type=http_url, help="model only: base URL of the inference worker")
    parser.add_argument(
        "--inference-token-file",
        type=given_path,
        help=f"model only: the worker's token (else ${ENV_INFERENCE_TOKEN})",
    )
    parser.add_argument(
        "--sample-ratio",
        type=float,
        help="share of new traces sampled (default: from OTEL_TRACES_SAMPLER/_ARG, else 1.0)",
    )
    parser.add_argument(
        "--otel-context",
        action="store_true",
        help="operations join the current OpenTelemetry span (e.g. under opentelemetry-instrument)",
    )
    parser.add_argument(
        "--step-seconds",
        type=step_amount,
        help="environment only: seconds each unit of work waits (default 0.01, a simulated step)",
    )
    parser.add_argument(
        "--step-cpu-ms",
        type=step_amount,
        help="environment only: milliseconds of CPU (hashing) each unit of work spends (default 0)",
    )
    parser.add_argument(
        "--workers",
        type=worker_count,
        default=1,
        help="worker processes serving the episodes (default 1: no socket, no extra process)",
    )
    parser.add_argument(
        "--checkpoint-root",
        type=given_path,
        default=Path(DEFAULT_CHECKPOINT_ROOT),
        help=f"checkpoints are written and read only under it (default ./{DEFAULT_CHECKPOINT_ROOT})",
    )
    parser.add_argument(
        "--header-timeout",
        type=positive_number,
        default=5.0,
        help="seconds a connection (main and worker ports) may take to send a complete request "
        "head before it is closed (5)",
    )
    parser.add_argument(
        "--require-collector",
        action="store_true",
        help="refuse to start when nothing answers at the OTLP endpoint (default: start, say so "
        "once, export when the collector comes)",
    )
    parser.add_argument(
        "--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug")
    )


def step_amount(text: str) -> float:
    """``--step-seconds`` / ``--step-cpu-ms``: a finite number from 0 to 60,000."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {shown(text)}") from None
    if not (math.isfinite(value) and 0 <= value <= 60_000):
        raise argparse.ArgumentTypeError(f"must be from 0 to 60000, not {text}")
    return value


def worker_count(text: str) -> int:
    """``--workers``: an int from 1 to 64."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {shown(text)}") from None
    if not 1 <= value <= 64:
        raise argparse.ArgumentTypeError(f"must be from 1 to 64, not {value}")
    return value


def _read_token(path: Path | None, env_name: str, what: str) -> str:
    token = _token_text(path, env_name, what)
    if not (token.isascii() and token.isprintable()):
        # Said where it came from: a file of two lines read "must be printable ASCII" alone.
        where = f"in {shown(str(path))}" if path is not None else f"in ${env_name}"
        why = (
            f"it holds a line break: a {what} file holds the {what} alone, on one line"
            if "\n" in token or "\r" in token
            else "it goes into an HTTP header"
        )
        raise CommandError(f"the {what} {where} must be printable ASCII ({why})")
    return token


def _token_text(path: Path | None, env_name: str, what: str) -> str:
    if path is not None:
        try:
            with path.open("rb") as file:
                raw = file.read(MAX_TOKEN_BYTES + 1)
        except OSError as exc:
            raise CommandError(
                f"cannot read the {what} file {shown(str(path))}: {exc.strerror or exc}"
            ) from None
        if len(raw) > MAX_TOKEN_BYTES:
            raise CommandError(
                f"the {what} file {shown(str(path))} holds more than {MAX_TOKEN_BYTES} bytes: "
                f"a {what} file holds the {what} alone"
            )
        token = raw.decode(errors="replace").strip()
        if not token:
            raise CommandError(f"the {what} file {shown(str(path))} is empty")
        return token
    token = os.environ.get(env_name, "").strip()
    if not token:
        raise CommandError(f"no {what}: pass --{what.replace(' ', '-')}-file PATH or set ${env_name}")
    if len(token.encode(errors="replace")) > MAX_TOKEN_BYTES:
        # As for the file: it goes into every request's header, where no server takes 1 MB.
        raise CommandError(f"${env_name} holds more than {MAX_TOKEN_BYTES} bytes: set it to the {what} alone")
    return token


class _StopServing:
    """``on_workers_spent`` for ``serve``: ends its uvicorn server as a SIGTERM does (gracefully,
    within its deadline), but without a signal: uvicorn raises the signal it stopped on again
    once stopped, so ``serve`` died of its own SIGTERM (-15, 143 in a shell) with the cause in a
    log line only, where it now exits 1 with the cause in one line."""

    def __init__(self) -> None:
        self.server: Any = None  # the uvicorn server, once built

    def __call__(self, why: str) -> None:
        if self.server is not None:
            self.server.should_exit = True


def _build_app(args: argparse.Namespace, token: str, stop: _StopServing, losses: SinkLosses) -> Any:
    # Imported here so `ckpt-events --help` and the other subcommands need no server stack.
    from ckpt_events import sinks
    from ckpt_events.participants import create_app, create_inference_app
    from ckpt_events.participants.faults import FAULT_ENV, FaultPlan

    if args.kind == "inference":
        return create_inference_app(token=token)
    options: dict[str, Any] = {}
    row = KINDS[args.kind]
    if row.uses_inference:
        if not args.inference_url:
            raise CommandError(f"serve {args.kind} needs --inference-url (the inference worker's base URL)")
        options["inference_url"] = args.inference_url
        options["inference_token"] = (
            _read_token(args.inference_token_file, ENV_INFERENCE_TOKEN, "inference token")
            if args.inference_token_file is not None or os.environ.get(ENV_INFERENCE_TOKEN)
            else token
        )
    elif args.inference_url or args.inference_token_file:
        raise CommandError("--inference-url and --inference-token-file are for serve model only")
    blocked = _not_a_folder(args.checkpoint_root)
    if blocked == args.checkpoint_root:
        # Served anyway, every commit and restore under it would fail, one by one.
        raise CommandError(
            f"--checkpoint-root {args.checkpoint_root}: not a folder; name the folder "
            "checkpoints are written under"
        )
    if blocked is not None:
        # A file above it: the root can never be made, and each commit failed with "File exists".
        raise CommandError(
            f"--checkpoint-root {args.checkpoint_root}: {blocked} is "
            f"{'a symlink to nothing' if blocked.is_symlink() else 'a file'}, not a folder, so it "
            "cannot be made; name a folder checkpoints can be written under"
        )
    for flag, name in (("--step-seconds", "step_seconds"), ("--step-cpu-ms", "step_cpu_ms")):
        if (value := getattr(args, name)) is not None:
            if args.kind != "environment":
                raise CommandError(f"{flag} is for serve environment only")
            options[name] = value
    instance = args.instance or row.instance
    try:
        ratio = sinks.sample_ratio_from_env(os.environ) if args.sample_ratio is None else args.sample_ratio
    except CkptEventsError as exc:
        raise CommandError(str(exc)) from None
    if not 0.0 <= ratio <= 1.0:
        raise CommandError(f"--sample-ratio must be between 0 and 1, not {ratio}")
    try:
        # Read once, here at the process's edge: the demo passes its fault to servers this way.
        faults = FaultPlan.from_environ()
    except CkptEventsError as exc:
        raise CommandError(f"${FAULT_ENV}: {exc}") from None
    workers: dict[str, Any] = {}
    if args.workers > 1:
        from ckpt_events.participants.cli.worker_process import worker_command
        from ckpt_events.participants.server.workers.worker_http import ENV_WORKER_HEADER_TIMEOUT

        command = worker_command(args.kind, instance, options)
        command.env[ENV_WORKER_HEADER_TIMEOUT] = str(args.header_timeout)
        command.env.update(faults.environ())  # each worker process reads it once too
        workers = {
            "workers": args.workers,
            "worker_command": command,
            "worker_host": args.host,
            # A server whose workers keep dying stops (and exits non-zero) rather than linger.
            "on_workers_spent": stop,
        }
    return create_app(
        args.kind,
        instance=instance,
        token=token,
        configure_sinks=functools.partial(
            _configure_sinks,
            instance=instance,
            close_predecessor=True,
            announce_metrics=True,
            buses=losses.buses,
        ),
        lease_grace_seconds=args.lease_grace_seconds,
        sample_ratio=ratio,
        otel_context=args.otel_context,
        checkpoint_root=args.checkpoint_root,
        faults=faults,
        **options,
        **workers,
    )


def _not_a_folder(root: Path) -> Path | None:
    """``root``, or the parent of it, that exists and is not a folder (the nearest one that
    exists decides; a symlink to nothing counts, since no folder can be made there); ``None``
    when that is a folder, or cannot be looked at (left to the store)."""
    for candidate in (root, *root.absolute().parents):
        try:
            if candidate.exists() or candidate.is_symlink():
                return None if candidate.is_dir() else candidate
        except OSError:
            return None
    return None


def _configure_sinks(
    bus: Any,
    *,
    instance: str | None = None,
    close_predecessor: bool = False,
    announce_metrics: bool = False,
    buses: list[Any] | None = None,
) -> Any:
    from ckpt_events import sinks

    if buses is not None:
        buses.append(bus)  # its sinks' losses are said once the server has stopped
    configured = sinks.configure(bus, service_instance_id=instance)
    # Bounded: a collector gone since start-up must not hold a Ctrl-C for its retries (13 s).
    configured.close_timeout = SHUTDOWN_TIMEOUT
    if announce_metrics and configured.prometheus is not None and configured.settings.prometheus_port == 0:
        # Port 0 (any free port, as the taken-worker-port error suggests): said nowhere else.
        say(f"ckpt-events serve: metrics at {configured.prometheus.url}")
    if close_predecessor and configured.jsonl_sink is not None and configured.jsonl_sink.path is not None:
        _close_predecessors_work(bus, configured.jsonl_sink.path)
    return configured


def _close_predecessors_work(bus: Any, path: Path) -> None:
    """Emit the end of every span a server killed before us left open in our JSON-lines log
    (``sinks.jsonl.emit_truncated_spans``): ended at its last event, status ERROR, marked
    truncated. The log then reads as finished, and the spans reach the collector as part of
    their checkpoint's trace. Nothing of ours is in the log yet: the bus has delivered nothing."""
    from ckpt_events.sinks.jsonl import emit_truncated_spans

    try:
        closed = emit_truncated_spans(bus, path)
    except OSError as exc:
        say(
            f"ckpt-events serve: cannot read {shown(str(path))} for open work: {exc.strerror or exc}",
        )
        return
    if closed:
        say(
            f"ckpt-events serve: {closed} span(s) a previous server left open in {shown(str(path))} "
            "closed as truncated",
        )


async def _check_settings(require_collector: bool, workers: int = 1) -> None:
    """Build the sinks from the environment once, before uvicorn runs, then close them.

    A bad setting raises here as one line naming the variable (inside the app's lifespan it
    was a traceback and exit 3). An OTLP
    endpoint nobody answers at is said once, on stderr, and the server starts: its spans are
    exported once the collector is up (until then they are dropped and counted), so start-up
    order is no hard dependency; ``require_collector`` refuses to start instead.
    """
    from ckpt_events import Bus, sinks

    settings = sinks.read_otel_env(os.environ)
    # The traces' endpoint, else the metrics' (traces off, metrics over OTLP).
    signal, otlp = (
        ("traces", settings.traces_otlp) if settings.traces_otlp else ("metrics", settings.metrics_otlp)
    )
    endpoint = otlp.endpoint if otlp is not None else None
    if endpoint is None and require_collector:
        why = (
            "OTEL_SDK_DISABLED turns every export off"
            if settings.sdk_disabled
            else "nothing is exported over OTLP: set OTEL_EXPORTER_OTLP_ENDPOINT to the collector's URL "
            "(with OTEL_TRACES_EXPORTER or OTEL_METRICS_EXPORTER not 'none')"
        )
        raise CommandError(f"--require-collector, but {why}; or leave out --require-collector")
    if endpoint is not None:
        try:
            await check_reachable(endpoint)
        except CommandError as exc:
            if require_collector:
                own = f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT"
                source = own if os.environ.get(own, "").strip() else "OTEL_EXPORTER_OTLP_ENDPOINT"
                raise CommandError(f"--require-collector: ${source}: {exc}") from None
            say(
                f"ckpt-events serve: the collector at {endpoint} does not answer (yet): serving "
                "anyway, spans are exported once it does (dropped and counted until then; "
                "--require-collector refuses to start instead)",
            )
    async with Bus(close_timeout=SHUTDOWN_TIMEOUT) as bus:
        await _configure_sinks(bus).aclose()


def _serve(args: argparse.Namespace) -> int:
    groups = os.environ.get(ENV_SPAN_GROUPS)
    if groups is not None:
        try:
            resolve_span_groups(groups)
        except CkptEventsError as exc:
            raise CommandError(f"${ENV_SPAN_GROUPS}: {exc}") from None
    if args.fd is None:
        check_listen(args.host, args.port)
    sockets = None if args.fd is None else [inherited_socket(args.fd)]
    try:
        return _serve_on(args, sockets)
    finally:
        # A refusal before uvicorn took the socket (a bad token file, a log another server
        # holds) left it to the garbage collector: "ResourceWarning: unclosed <socket.socket>"
        # after the one-line error under -X dev, an "Exception ignored" with -W error. Closing
        # one uvicorn closed already does nothing.
        for sock in sockets or ():
            sock.close()


def _serve_on(args: argparse.Namespace, sockets: list[socket.socket] | None) -> int:
    stop = _StopServing()
    losses = SinkLosses()
    check_workers_can_start(args.workers)
    app = _build_app(args, _read_token(args.token_file, ENV_TOKEN, "token"), stop, losses)
    from ckpt_events.participants.server.limits import (
        log_resource_exhaustion_once,
        log_shutdown_cuts_in_one_line,
        log_sink_os_errors_in_one_line,
    )

    log_resource_exhaustion_once()
    log_shutdown_cuts_in_one_line()
    log_sink_os_errors_in_one_line()
    claimed = claim_logs(args.workers)
    try:
        return _run_server(args, app, sockets, stop, losses)
    finally:
        losses.say()  # a server that did not start, or stopped without a signal
        for fd in claimed:
            os.close(fd)  # the lock goes with it


def _saying_losses(base: type[Any], losses: SinkLosses) -> type[Any]:
    """uvicorn's server (``base``), saying ``losses`` once it has stopped serving, its lifespan
    ended: after a SIGTERM, uvicorn raises the signal again on the way out of ``serve()``, and
    the process died of it before any line of ours after ``run()``."""

    class SayingLosses(base):  # type: ignore[misc]  # uvicorn is imported lazily
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            with super().capture_signals():
                try:
                    yield
                finally:
                    losses.say()

    return SayingLosses


def _run_server(
    args: argparse.Namespace,
    app: Any,
    sockets: list[socket.socket] | None,
    stop: _StopServing,
    losses: SinkLosses,
) -> int:
    import uvicorn

    from ckpt_events.participants.server.connection_guard import ConnectionLimits
    from ckpt_events.participants.server.interrupts import once_per_interrupt
    from ckpt_events.participants.server.limits import server_limits

    try:
        anyio.run(_check_settings, args.require_collector, args.workers)
    except ConfigurationError as exc:
        raise CommandError(f"bad setting: {exc}") from None
    limits = ConnectionLimits(header_timeout=args.header_timeout)
    config = uvicorn.Config(
        app,
        host=args.host,
        port=0 if args.port is None else args.port,
        log_level=args.log_level,
        access_log=False,
        lifespan="on",
        **server_limits(limits),
        timeout_graceful_shutdown=int(SHUTDOWN_TIMEOUT),
    )
    server = _saying_losses(counting_ports_cut(once_per_interrupt(uvicorn.Server)), losses)(config)
    stop.server = server
    check_descriptors()
    raise_descriptor_limit(limits.max_connections)
    try:
        with stop_signals_said_as_the_end(server):
            server.run(sockets=sockets)
    except Interrupted as exc:
        # Said as the main port's cuts are: the workers' own ports were cut as the server's
        # lifespan ended (counted nowhere, the line's count too low).
        raise with_ports_cut(exc, app) from None
    fatal = getattr(app.state, "fatal", None)
    if fatal is not None:
        # It stopped itself (its workers' restart budget spent): the cause, in one line, exit 1.
        cause = escape(str(fatal).removesuffix("; stopping the server"))
        # The cause says where to look (the worker's own error, or what killed it).
        say(f"ckpt-events serve: error: {cause}; stopped: fix it, then start serve again")
        return 1
    return 0 if server.started else 1


SERVE = Command(
    "serve",
    "run one participant (or the inference worker) under uvicorn",
    serve_arguments,
    _serve,
    needs=("fastapi", "uvicorn", "httpx"),
    extra="server",
)
