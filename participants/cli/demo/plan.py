"""What ``ckpt-events demo`` is asked to run: its options, its checkpoints and its injected fault.

``--checkpoints N`` spreads N checkpoints over generation 1 (the last one stops it and is
restored); ``--fault`` is a ``FaultPlan`` (``ckpt_events.participants.faults``) for the
generation it hits (``fault_plans``), with a short deadline and lease so the failure shows in
seconds. ``--instances N`` runs N servers of each kind (``--restore-instances M``: M in the
restored generation), and a fault hits one of them: ``<kind>-<N // 2>`` (``environment-2`` of
4; ``environment-0`` of one).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

from ckpt_events.participants.cli.words import counted
from ckpt_events.participants.errors import shown
from ckpt_events.participants.faults import NO_FAULTS, Fault, FaultPlan, parse_fault

__all__ = [
    "ABORTING_FAULTS",
    "FAULTS",
    "FIRST_GENERATION_FAULTS",
    "MAX_INSTANCES",
    "MAX_INSTANCES_PROCESSES",
    "MAX_WORKER_PROCESSES",
    "DemoOptions",
    "check_options",
    "checkpoint_thresholds",
    "deadline_s",
    "fault_of",
    "fault_plans",
    "fleet_members",
    "lease_target",
    "stop_after",
]


@dataclass
class DemoOptions:
    """What ``ckpt-events demo`` runs; the defaults finish in well under a minute on 2 cores."""

    rollouts: int = 1000
    steps: int = 2
    concurrency: int = 16
    checkpoint_at: float = 0.4
    processes: bool = False
    #: Worker processes per participant in generation 1 and (if set) in the restored generation 2.
    workers: int = 1
    restore_workers: int | None = None
    workdir: Path | None = None
    jsonl: Path | None = None
    report: Path | None = None
    otlp_endpoint: str | None = None
    #: Checkpoints generation 1 takes, spread over its rollouts, the last one stopping it
    #: (``None``: 1, or 2 with a fault that aborts one).
    checkpoints: int | None = None
    #: One of ``FAULT_MODES``: injected for real (``fault_plans``; see ``faults``).
    fault: str | None = None
    #: Show the ``watch`` view of the fleet during each generation instead of progress bars.
    watch: bool = False
    #: Servers of each participant kind in generation 1, and (if set) in the restored generation 2.
    instances: int = 1
    restore_instances: int | None = None

    def checkpoint_count(self) -> int:
        if self.checkpoints:
            return self.checkpoints
        return 2 if self.fault in ABORTING_FAULTS else SLOW_CHECKPOINTS if self.fault == "slow" else 1

    def servers(self, generation: int) -> int:
        """Servers of each kind in ``generation`` (1 or 2)."""
        return self.instances if generation == 1 else (self.restore_instances or self.instances)


#: What each ``--fault`` injects (``parse_fault``'s syntax), on which participant (``{i}``: the
#: index of the one it hits among the servers of its kind, ``fault_of``).
FAULTS: Final = {
    "stall": "stall:environment-{i}",
    "lease": "lease:3",
    "slow-restore": "slow-restore:model-{i}:0.05",
    "slow": "slow:environment-{i}:5",
}
#: Faults that abort the checkpoint they hit (the first one).
ABORTING_FAULTS: Final = ("stall", "lease")
#: Faults that hit generation 1 (its checkpoints); the others hit generation 2 (its restore).
FIRST_GENERATION_FAULTS: Final = ("stall", "lease", "slow")
#: Checkpoints by default with ``--fault slow``: the straggler flag judges a server that is the
#: slowest of its kind in more than two thirds of them, and a short run needs a clear margin.
SLOW_CHECKPOINTS: Final = 8
#: With a fault: the prepare deadline and the participants' lease grace, short so the failure
#: shows in seconds (the lease expires 2.5 s after prepare; the ``lease`` fault stalls 3 s).
FAULT_DEADLINE_S: Final = 2.0
FAULT_LEASE_GRACE_S: Final = 0.5
#: Work calls wait this long whatever the deadline: a stalled step is held from the start until
#: the first checkpoint has come and gone (60 s at most), which on a loaded machine with many
#: servers came after 30 s, and the held call timed out and failed its rollout.
WORK_TIMEOUT_S: Final = 90.0


#: Servers of each kind the demo starts at most: in its own process, and each in a process
#: of its own (~60 MB each).
MAX_INSTANCES: Final = 64
MAX_INSTANCES_PROCESSES: Final = 16
#: Worker processes (``--workers``, ``--restore-workers``) a generation starts at most, over all its
#: participants: as many as the servers of ``MAX_INSTANCES_PROCESSES``, each as large.
MAX_WORKER_PROCESSES: Final = 4 * MAX_INSTANCES_PROCESSES


def check_options(opts: DemoOptions) -> str | None:
    """Why ``opts`` cannot run, in one line, or ``None``."""
    if opts.fault is not None and opts.fault not in FAULTS:
        return f"--fault {shown(opts.fault)} is not one of {', '.join(FAULTS)}"
    if opts.instances < 1 or (opts.restore_instances is not None and opts.restore_instances < 1):
        return "--instances and --restore-instances must be 1 or more"
    # The flag named is the one over the limit: "--instances 64" answered --restore-instances 64.
    most, most_flag = (opts.instances, "--instances")
    if (opts.restore_instances or 0) > opts.instances:
        most, most_flag = (opts.restore_instances or 0, "--restore-instances")
    limit = MAX_INSTANCES_PROCESSES if opts.processes else MAX_INSTANCES
    if most > limit:
        # 6,000 (24,000 servers) started for minutes with no word, until killed.
        where = "a process each" if opts.processes else "one process"
        return (
            f"{most_flag} {most}: at most {limit} servers of each kind with {where} on one machine "
            f"({4 * limit} participants)"
        )
    # Each generation's (instances, workers), named by the flags that set them.
    restored = (
        (opts.restore_instances, "--restore-instances")
        if opts.restore_instances
        else (opts.instances, "--instances"),
        (opts.restore_workers, "--restore-workers") if opts.restore_workers else (opts.workers, "--workers"),
    )
    for (instances, instances_flag), (workers, workers_flag) in (
        ((opts.instances, "--instances"), (opts.workers, "--workers")),
        restored,
    ):
        participants = len(fleet_members(instances))
        if workers > 1 and (started := participants * workers) > MAX_WORKER_PROCESSES:
            # --workers 999999 was taken, and started worker processes until the machine stalled.
            return (
                f"{workers_flag} {workers}: {started} worker processes for "
                f"{counted(participants, 'participant')}, at most {MAX_WORKER_PROCESSES} on one machine: "
                f"lower {workers_flag} or {instances_flag}"
            )
    if opts.checkpoints is not None and opts.checkpoints < 1:
        return f"--checkpoints must be 1 or more, not {opts.checkpoints} (the last one stops generation 1)"
    if opts.fault == "slow" and opts.instances < 2:
        return "--fault slow makes one server slower than its peers: use --instances 2 or more"
    count = opts.checkpoint_count()
    if opts.fault == "slow" and count < 3:
        return "--fault slow is judged over the run's checkpoints: use --checkpoints 3 or more (8 by default)"
    if opts.fault == "slow" and count < (needed := straggler_checkpoints(opts.instances)):
        return (
            f"--fault slow with --instances {opts.instances} needs --checkpoints {needed} or more: a server "
            f"slowest at each of {count} could be luck among {opts.instances} equals, and is not flagged"
        )
    if opts.fault in ABORTING_FAULTS and count < 2:
        return (
            f"--fault {opts.fault} aborts the first checkpoint: use --checkpoints 2 or more "
            "so a later one publishes and is restored"
        )
    if count > 1 and stop_after(opts) < count:
        return (
            f"--checkpoints {count} needs at least {counted(count, 'rollout')} done before the last "
            f"checkpoint ({stop_after(opts)} are): raise --rollouts or --checkpoint-at"
        )
    return None


def straggler_checkpoints(instances: int) -> int:
    """The fewest checkpoints (3 or more) over which a server slowest at every one of them is
    flagged as a straggler among ``instances`` (the report's rule: luck among equals would do
    it with a chance under ``STRAGGLER_CHANCE``): 5 for 2 servers, 3 for 3 or more."""
    from ckpt_events.participants.cli.report.trends import STRAGGLER_CHANCE, binomial_tail

    count = 3
    while binomial_tail(count, count, 1 / instances) >= STRAGGLER_CHANCE:
        count += 1
    return count


def fleet_members(instances: int) -> tuple[tuple[str, str], ...]:
    """(kind, instance) of ``instances`` servers of each kind, kind by kind: ``<kind>-0``,
    ``<kind>-1``, ...; with one, each kind's own instance name (``KINDS``)."""
    from ckpt_events.participants.workloads.registry import KINDS

    if instances == 1:
        return KINDS.members()
    return tuple((str(row.kind), f"{row.kind}-{i}") for row in KINDS for i in range(instances))


def fault_of(opts: DemoOptions) -> Fault | None:
    """The fault ``opts`` injects, on the middle server of its kind (of both generations' for a
    restore's fault: it must hold records and still be there)."""
    if opts.fault is None:
        return None
    servers = (
        opts.servers(1) if opts.fault in FIRST_GENERATION_FAULTS else min(opts.servers(1), opts.servers(2))
    )
    fault = parse_fault(FAULTS[opts.fault].format(i=servers // 2))
    if fault.mode == "slow-restore":
        # With N servers of each kind the slowed one holds about 1/N of the rollouts in flight,
        # so at 50 ms a record its read no longer dominated a restore of 4N participants
        # (--instances 8: 2 records, 140 ms of a 420 ms restore), and the demo failed its own
        # check on a correct diagnosis: each record sleeps N times as long (N at most the
        # rollouts in flight), so the read takes about as long as with one server.
        fault = replace(fault, seconds=fault.seconds * max(1, min(opts.instances, opts.concurrency)))
    return fault


#: The controller's deadline for each operation without an aborting fault.
DEADLINE_S: Final = 30.0


def deadline_s(opts: DemoOptions) -> float:
    """The controller's deadline per operation: ``FAULT_DEADLINE_S`` for the faults that abort
    at it (stall, lease), else ``DEADLINE_S``. Every fault had the short one: with
    ``--fault slow-restore --instances 8`` on a loaded machine, generation 1's commit of 32
    participants passed its 2 s deadline (1 of 3 runs beside two busy loops on one core), and
    the demo failed a checkpoint its fault never touched."""
    return FAULT_DEADLINE_S if opts.fault in ABORTING_FAULTS else DEADLINE_S


def lease_target(opts: DemoOptions) -> str | None:
    """With ``--fault lease`` and several servers of each kind: the one whose lease alone is
    short (``environment-<N // 2>``), so it alone expires; ``None``: every lease is short."""
    if opts.fault != "lease" or opts.instances == 1:
        return None
    return f"environment-{opts.instances // 2}"


def checkpoint_thresholds(opts: DemoOptions) -> list[int]:
    """After how many finished rollouts generation 1 checkpoints, before its last (stopping) one."""
    count, last = opts.checkpoint_count(), stop_after(opts)
    return [last * i // count for i in range(1, count)]


def stop_after(opts: DemoOptions) -> int:
    """How many rollouts generation 1 finishes before its checkpoint: at least one stays in flight."""
    return min(int(opts.checkpoint_at * opts.rollouts), opts.rollouts - 1)


def fault_plans(opts: DemoOptions) -> tuple[FaultPlan, FaultPlan]:
    """What each generation injects: the stall, lease and slow faults hit generation 1's
    checkpoints, slow-restore generation 2's restore; the other generation gets ``NO_FAULTS``.
    In-process servers and the coordinator take the plan as is; server and worker processes
    are passed it in their environment (``FaultPlan.environ``) and read it at start-up."""
    fault = fault_of(opts)
    if fault is None:
        return NO_FAULTS, NO_FAULTS
    plan = FaultPlan(fault)
    return (plan, NO_FAULTS) if fault.mode in FIRST_GENERATION_FAULTS else (NO_FAULTS, plan)
