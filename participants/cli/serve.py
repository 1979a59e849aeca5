"""``ckpt-events serve``: one participant or the inference worker under uvicorn.

``serve <kind>`` runs one participant (or the simulated inference worker) under uvicorn,
with the sinks configured from the environment (``CKPT_EVENTS_JSONL``,
``OTEL_EXPORTER_OTLP_ENDPOINT``, ``CKPT_EVENTS_SPAN_GROUPS``, ...). The control token comes
from ``--token-file`` or ``CKPT_EVENTS_TOKEN``, never from the command line, so it does not
show in process listings.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, Final

import anyio

from ckpt_events import CkptEventsError, ConfigurationError, resolve_span_groups
from participants.cli.command import (
    Command,
    CommandError,
    check_reachable,
    instance_name,
    port_number,
    positive_number,
)

__all__ = ["ENV_INFERENCE_TOKEN", "ENV_SPAN_GROUPS", "ENV_TOKEN", "SERVE", "SERVE_KINDS"]

ENV_TOKEN: Final = "CKPT_EVENTS_TOKEN"
ENV_INFERENCE_TOKEN: Final = "CKPT_EVENTS_INFERENCE_TOKEN"
ENV_SPAN_GROUPS: Final = "CKPT_EVENTS_SPAN_GROUPS"
ENV_ENDPOINT: Final = "OTEL_EXPORTER_OTLP_ENDPOINT"
#: Seconds a stopping server gives requests in flight, and its sinks to flush and close.
SHUTDOWN_TIMEOUT: Final = 2.0
SERVE_KINDS: Final = ("environment", "model", "agent", "resources", "inference")


def serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kind", choices=SERVE_KINDS, help="participant kind, or the inference worker")
    parser.add_argument("--instance", type=instance_name, help="instance name (default: <kind>-0)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=port_number, required=True, help="port to bind")
    parser.add_argument("--token-file", type=Path, help=f"file holding the control token (else ${ENV_TOKEN})")
    parser.add_argument(
        "--lease-grace-seconds", type=positive_number, default=600.0, help="lease grace (600)"
    )
    parser.add_argument("--inference-url", help="model only: base URL of the inference worker")
    parser.add_argument(
        "--inference-token-file",
        type=Path,
        help=f"model only: the worker's token (else ${ENV_INFERENCE_TOKEN})",
    )
    parser.add_argument(
        "--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug")
    )


def _read_token(path: Path | None, env_name: str, what: str) -> str:
    if path is not None:
        try:
            token = path.read_text().strip()
        except OSError as exc:
            raise CommandError(f"cannot read the {what} file {str(path)!r}: {exc.strerror or exc}") from None
        if not token:
            raise CommandError(f"the {what} file {str(path)!r} is empty")
        return token
    token = os.environ.get(env_name, "").strip()
    if not token:
        raise CommandError(f"no {what}: pass --{what.replace(' ', '-')}-file PATH or set ${env_name}")
    return token


def _build_app(args: argparse.Namespace, token: str) -> Any:
    # Imported here so `ckpt-events --help` and the other subcommands need no server stack.
    from participants import create_app, create_inference_app

    if args.kind == "inference":
        return create_inference_app(token=token)
    options: dict[str, Any] = {}
    if args.kind == "model":
        if not args.inference_url:
            raise CommandError("serve model needs --inference-url (the inference worker's base URL)")
        options["inference_url"] = args.inference_url
        options["inference_token"] = (
            _read_token(args.inference_token_file, ENV_INFERENCE_TOKEN, "inference token")
            if args.inference_token_file is not None or os.environ.get(ENV_INFERENCE_TOKEN)
            else token
        )
    elif args.inference_url or args.inference_token_file:
        raise CommandError("--inference-url and --inference-token-file are for serve model only")
    return create_app(
        args.kind,
        instance=args.instance or f"{args.kind}-0",
        token=token,
        configure_sinks=_configure_sinks,
        lease_grace_seconds=args.lease_grace_seconds,
        **options,
    )


def _configure_sinks(bus: Any) -> Any:
    import sinks

    configured = sinks.configure(bus)
    # Bounded: a collector gone since start-up must not hold a Ctrl-C for its retries (13 s).
    configured.close_timeout = SHUTDOWN_TIMEOUT
    return configured


async def _check_settings() -> None:
    """Build the sinks from the environment once, before uvicorn runs, then close them.

    A bad setting raises here as one line naming the variable (inside the app's lifespan it
    was a traceback and exit 3); an OTLP endpoint nobody answers at is refused the same way.
    """
    from ckpt_events import Bus

    endpoint = os.environ.get(ENV_ENDPOINT, "").strip()
    if endpoint.startswith(("http://", "https://")):  # anything else: configure names the problem
        try:
            await check_reachable(endpoint)
        except CommandError as exc:
            raise CommandError(f"{ENV_ENDPOINT}: {exc}") from None
        except ValueError:
            pass  # a bad port: configure names it
    async with Bus(close_timeout=SHUTDOWN_TIMEOUT) as bus:
        await _configure_sinks(bus).aclose()


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    groups = os.environ.get(ENV_SPAN_GROUPS)
    if groups is not None:
        try:
            resolve_span_groups(groups)
        except CkptEventsError as exc:
            raise CommandError(f"${ENV_SPAN_GROUPS}: {exc}") from None
    app = _build_app(args, _read_token(args.token_file, ENV_TOKEN, "token"))
    try:
        anyio.run(_check_settings)
    except ConfigurationError as exc:
        raise CommandError(f"bad setting: {exc}") from None
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=int(SHUTDOWN_TIMEOUT),
    )
    server = uvicorn.Server(config)
    server.run()
    return 0 if server.started else 1


SERVE = Command(
    "serve", "run one participant (or the inference worker) under uvicorn", serve_arguments, _serve
)
