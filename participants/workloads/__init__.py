"""The simulated work each participant kind does, and what it saves at a checkpoint.

``base.Workload`` is what every kind shares (admission, episodes, parking at a boundary,
records); ``environment``, ``agent``, ``resources`` and ``model`` are the four kinds, each with
its record type; ``generation_cut`` is the model's round with the inference worker. Workloads
know the wire types in ``ckpt_events.participants.protocol`` and nothing of HTTP servers or controllers.
"""

from ckpt_events.participants.workloads.agent import AgentRecord, AgentWorkload
from ckpt_events.participants.workloads.base import Episode, Record, WorkError, Workload
from ckpt_events.participants.workloads.environment import EnvironmentRecord, EnvironmentWorkload
from ckpt_events.participants.workloads.model import ModelRecord, ModelWorkload
from ckpt_events.participants.workloads.records import task_digest
from ckpt_events.participants.workloads.resources import ResourcesRecord, ResourcesWorkload

__all__ = [
    "AgentRecord",
    "AgentWorkload",
    "EnvironmentRecord",
    "EnvironmentWorkload",
    "Episode",
    "ModelRecord",
    "ModelWorkload",
    "Record",
    "ResourcesRecord",
    "ResourcesWorkload",
    "WorkError",
    "Workload",
    "task_digest",
]
