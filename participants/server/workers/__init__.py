"""Several workers per participant server: one control plane, N worker processes.

``frames`` (the wire format), ``channel`` (one connection, both ways), ``socket_stream`` (the
channel's socket reads and writes), ``coordinator`` (the main process's socket), ``pool`` (the
workload the control plane drives: every worker at once), ``placement`` (which worker holds each
session, and the work calls sent there), ``worker`` (a worker's end), ``supervisor`` (the worker
processes) and ``app`` (``create_worker_app``).
"""

from ckpt_events.participants.server.workers.app import WorkerControlPlane, create_worker_app
from ckpt_events.participants.server.workers.coordinator import ENV_SOCKET, WorkerCoordinator
from ckpt_events.participants.server.workers.pool import WorkerPool
from ckpt_events.participants.server.workers.worker import run_worker

__all__ = [
    "ENV_SOCKET",
    "WorkerControlPlane",
    "WorkerCoordinator",
    "WorkerPool",
    "create_worker_app",
    "run_worker",
]
