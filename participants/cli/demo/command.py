"""``ckpt-events demo``: run rollouts, checkpoint mid-flight, kill, restore, finish, and report."""

from __future__ import annotations

import argparse
import functools
import logging
from pathlib import Path
from typing import Any, Final

import anyio

from ckpt_events.participants.cli.command import (
    Command,
    CommandError,
    check_reachable,
    console,
    filtered,
    fraction,
    given_path,
    otlp_base_from_env,
    otlp_base_url,
    positive_int,
    run_interruptibly,
    writable_path,
)
from ckpt_events.participants.cli.words import counted

__all__ = ["DEMO"]


# One step over 60 lines: the demo's options declared, one add_argument per option, no logic.
def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rollouts", type=positive_int, default=1000, help="rollouts to run (1000)")
    parser.add_argument("--steps", type=positive_int, default=2, help="steps per rollout (2)")
    parser.add_argument("--concurrency", type=positive_int, default=16, help="rollouts in flight (16)")
    parser.add_argument(
        "--checkpoint-at", type=fraction, default=0.4, help="checkpoint when this share is done (0.4)"
    )
    parser.add_argument(
        "--checkpoints",
        type=positive_int,
        help="checkpoints during generation 1, spread over its rollouts; the last is restored "
        "(1; 2 with --fault stall or lease; 8 with --fault slow)",
    )
    parser.add_argument(
        "--fault",
        action=_OneFault,
        choices=("stall", "lease", "slow-restore", "slow"),
        help="inject a failure for real (via $CKPT_EVENTS_FAULT) on one server, the middle one of "
        "its kind (environment-0 of 1, environment-2 of 4): stall = an environment server not "
        "ready at the prepare deadline, lease = the controller stalls past the lease (with "
        "--instances, of that environment server alone), slow-restore = a model server reads "
        "slowly, slow = an environment server's commits write 5x slower (--instances 2 or more)",
    )
    parser.add_argument(
        "--instances",
        type=positive_int,
        default=1,
        help="servers of each participant kind (1); each rollout's session is on one of each, "
        "the least loaded",
    )
    parser.add_argument(
        "--restore-instances",
        type=positive_int,
        metavar="M",
        help="servers of each kind after the crash (default: --instances); a restored rollout "
        "whose server is gone restarts from its input",
    )
    parser.add_argument(
        "--watch",
        action="store_true",
        help="show the watch view of the fleet (phases, blockers, open work) instead of progress bars; "
        "with --fault, work open past 0.5 s is marked stalled and warned about",
    )
    parser.add_argument(
        "--processes", action="store_true", help="run the servers as real processes, killed with SIGKILL"
    )
    parser.add_argument(
        "--workers", type=positive_int, default=1, help="worker processes per participant (1)"
    )
    parser.add_argument(
        "--restore-workers",
        type=positive_int,
        help="worker processes per participant after the crash (default: --workers)",
    )
    parser.add_argument(
        "--jsonl", type=writable_path, metavar="PATH", help="also write every event as JSON lines"
    )
    parser.add_argument(
        "--report",
        type=given_path,
        metavar="PATH",
        help="also write the report: .html, .svg, .png (headless chromium), .perfetto.json (ui.perfetto.dev)",
    )
    parser.add_argument(
        "--otlp-endpoint",
        type=otlp_base_url,
        metavar="URL",
        help="export spans and metrics to this OTLP/HTTP collector's base URL, to which /v1/traces and "
        "/v1/metrics are appended (default: $OTEL_EXPORTER_OTLP_ENDPOINT)",
    )
    parser.add_argument(
        "--workdir", type=given_path, metavar="DIR", help="keep checkpoints and logs here (default: temp)"
    )


class _OneFault(argparse.Action):
    """Store ``--fault``, refusing a second, different one: argparse kept the last, so
    ``--fault stall --fault lease`` ran and passed with the lease fault alone, the stall
    silently dropped."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        given = getattr(namespace, self.dest, None)
        if given is not None and given != values:
            raise argparse.ArgumentError(
                self,
                f"given twice ({given}, then {values}): the demo injects one failure per run: "
                "give one --fault",
            )
        setattr(namespace, self.dest, values)


def _demo(args: argparse.Namespace) -> int:
    # Imported here so `ckpt-events --help` and the other commands load no server stack.
    from ckpt_events.participants.cli.demo.runner import (
        DemoFailed,
        DemoOptions,
        DemoResult,
        check_options,
        run_demo,
    )

    endpoint = args.otlp_endpoint if args.otlp_endpoint is not None else otlp_base_from_env()
    options = DemoOptions(
        rollouts=args.rollouts,
        steps=args.steps,
        concurrency=args.concurrency,
        checkpoint_at=args.checkpoint_at,
        processes=args.processes,
        workers=args.workers,
        restore_workers=args.restore_workers,
        workdir=args.workdir,
        jsonl=args.jsonl,
        report=args.report,
        otlp_endpoint=endpoint,
        checkpoints=args.checkpoints,
        fault=args.fault,
        watch=args.watch,
        instances=args.instances,
        restore_instances=args.restore_instances,
    )
    if (refusal := check_options(options)) is not None:
        raise CommandError(refusal)
    if args.report is not None:
        from ckpt_events.participants.cli.report.files import check_report_path

        if (refusal := check_report_path(args.report)) is not None:
            raise CommandError(refusal)
    if endpoint is not None:
        anyio.run(check_reachable, endpoint)
    if (refusal := _not_fresh(args.workdir, args.jsonl)) is not None:  # last: it makes the workdir
        raise CommandError(refusal)
    from ckpt_events.participants.server.limits import SINK_FAILURE_LOGGER, OsErrorInOneLine

    quiet = _QuietOnceInterrupted()
    forced = _QuietOnceForced()

    async def run(stopping: anyio.Event) -> DemoResult:
        quiet.stopping = stopping
        return await run_demo(options, console(), stopping)

    try:
        with (
            filtered(OsErrorInOneLine(), SINK_FAILURE_LOGGER),
            filtered(quiet, *_CONTROLLER_LOGGERS),
            filtered(forced, _SERVERS_LOGGER),
        ):
            result = anyio.run(functools.partial(run_interruptibly, run, forcing=forced.force))
    except DemoFailed as exc:
        raise CommandError(f"the run finished with a wrong result: {exc}") from None
    if result.spans_not_exported:
        raise CommandError(
            f"{counted(result.spans_not_exported, 'span')} could not be exported to {endpoint}: "
            "is a collector listening there?"
        )
    if result.jsonl is not None and result.jsonl.failed:
        # The log asked for holds none (or part) of the run: not a success to report on.
        raise CommandError(
            f"--jsonl {args.jsonl}: {counted(result.jsonl.failed, 'event')} could not be written "
            f"({result.jsonl.last_error}): free space there, or name another file"
        )
    return 0


#: The loggers on which the controller says a call to a participant failed.
_CONTROLLER_LOGGERS: Final = (
    "ckpt_events.participants.controller.collection",
    "ckpt_events.participants.controller.coordinator",
)


#: The logger on which the demo's in-process servers (uvicorn) say what a forced exit cut.
_SERVERS_LOGGER: Final = "uvicorn.error"


class _QuietOnceForced(logging.Filter):
    """Drop what the demo's servers log once a second signal forced the exit: each said its
    lifespan and each request cancelled, one line apiece (6 to 16 lines after Ctrl-C twice); the
    cut is said once, in the "interrupted" line (``force()`` returns its words)."""

    def __init__(self) -> None:
        super().__init__()
        self.forced = False

    def force(self) -> str:
        """Start dropping; what the forced exit cuts short, for the one line."""
        self.forced = True
        return "the servers still stopping were cancelled, events not yet written may be lost"

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.forced


class _QuietOnceInterrupted(logging.Filter):
    """Drop the controller's warnings once the demo is interrupted (``stopping`` set): its
    servers are being stopped, so the calls to them fail, and "restore of ... failed, restarting
    its rollouts: ... agent-0: unreachable" named a cause that was the interrupt. The one line
    "interrupted" says what happened."""

    def __init__(self) -> None:
        super().__init__()
        self.stopping: anyio.Event | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        return self.stopping is None or not self.stopping.is_set()


#: What a demo leaves in its workdir: a later demo there would resume its run (its restore
#: found two checkpoints) and merge its logs.
_WORKDIR_FILES: Final = ("run", "logs", "token")


def _not_fresh(workdir: Path | None, jsonl: Path | None) -> str | None:
    """Why the demo cannot start clean in ``workdir`` or write its log to ``jsonl``, or ``None``.

    A demo's report is of its own run: a workdir holding another demo's files, or a ``--jsonl``
    already holding events (appended to, ``report`` showed both runs), is refused, not mixed in.
    So is a ``--jsonl`` that is not a regular file: the log is rewritten at the end (``merge_into``
    renames a new file over it), and ``/dev/null`` as root became a file.
    """
    if jsonl is not None and jsonl.exists() and not jsonl.is_file():
        return (
            f"--jsonl {jsonl} is not a regular file (a device, a pipe): the demo rewrites its log at "
            "the end, merging every process's log into it: name a file"
        )
    if workdir is not None:
        if workdir.exists() and not workdir.is_dir():
            return f"--workdir {workdir} is not a folder: name a folder (made if missing) or leave it out"
        taken = [name for name in _WORKDIR_FILES if (workdir / name).exists()]
        if taken:
            return (
                f"--workdir {workdir} holds another demo's files ({', '.join(taken)}): the demo starts "
                "in a folder of its own: remove them, or name another --workdir"
            )
        # The demo makes these itself: a log there was a traceback (mkdir on the log) or a clash.
        if jsonl is not None and jsonl.parent.resolve() == workdir.resolve() and jsonl.name in _WORKDIR_FILES:
            return (
                f"--jsonl {jsonl}: the demo keeps its own {jsonl.name!r} in --workdir {workdir}: "
                "name another file"
            )
        try:
            workdir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return f"--workdir {workdir}: cannot make it ({exc.strerror or exc})"
    if jsonl is not None and jsonl.is_file() and jsonl.stat().st_size > 0:
        return (
            f"--jsonl {jsonl} holds events already: the demo writes a log of its own run (report "
            "would show both): remove it, or name another file"
        )
    return None


DEMO = Command(
    "demo",
    "run rollouts, checkpoint mid-flight, kill, restore, finish, and show where the time went",
    _demo_arguments,
    _demo,
    needs=("rich", "fastapi", "uvicorn", "httpx"),
)
