"""Checkpoint participants: the control plane, the store and four workload kinds as FastAPI apps.

``create_app(kind, instance=..., token=...)`` builds a participant; ``create_inference_app``
the simulated inference worker the model participant calls; ``Coordinator`` drives their
checkpoints and ``Collection`` runs rollouts on them. The wire format is in
``participants.protocol``, the on-disk format in ``participants.store``.
"""

from participants._app import PARTICIPANT_KINDS, create_app
from participants._inference import create_inference_app
from participants.collection import Collection
from participants.coordinator import Coordinator

__all__ = ["PARTICIPANT_KINDS", "Collection", "Coordinator", "create_app", "create_inference_app"]
