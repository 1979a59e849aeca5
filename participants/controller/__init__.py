"""The controller side: the client of the control plane, the coordinator and the rollout collection.

``client.ControlClient`` calls one participant; ``coordinator.Coordinator`` drives a checkpoint
or a restore across all of them (prepare in stages, commit and restore fanned out, abort);
``collection.Collection`` runs rollouts on the fleet and checkpoints them into a run directory
(``run_directory``). The controller speaks ``ckpt_events.participants.protocol`` only: it never imports the
server or the workloads.
"""

from ckpt_events.participants.controller.client import ControlClient, ParticipantCallError
from ckpt_events.participants.controller.collection import Collection, CollectionSummary
from ckpt_events.participants.controller.coordinator import Coordinator
from ckpt_events.participants.controller.types import (
    CheckpointNotPrepared,
    CoordinationError,
    Member,
    PrepareResult,
)

__all__ = [
    "CheckpointNotPrepared",
    "Collection",
    "CollectionSummary",
    "ParticipantCallError",
    "ControlClient",
    "CoordinationError",
    "Coordinator",
    "Member",
    "PrepareResult",
]
