"""The engine revision: a short, stable hash of everything that defines a vLLM engine.

Why it exists: capacity is per engine configuration. Two replicas of one revision run the
same image, model, arguments and placement, so their measured KV capacity is comparable,
and a change to any of those is a new revision whose capacity must be measured again (and
which the rollout machinery ships as a canary). Fields that only steer planning
(``capacity``, ``workload``, ``rollout``) or admission (``tierPolicyRef``) are not part of
the revision: changing a peak must not restart engines.

The hash is over canonical JSON (sorted keys, wire names), so it is stable across Python
versions, dict orders and processes, and it is a valid label value (10 hex digits).

Worked example::

    >>> from kvpool.api.modelpool import EngineSpec, ModelRef
    >>> model = ModelRef(name="m", served_name="m", version="1")
    >>> a = build_revision(model, EngineSpec(max_model_len=4096))
    >>> b = build_revision(model, EngineSpec(max_model_len=8192))
    >>> len(a), a == b
    (10, False)
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from kvpool.api.modelpool import EngineSpec, ModelPoolSpec, ModelRef

REVISION_LENGTH = 10


# Engine fields added after v1alpha1 first shipped: left out of the hash while unset, so
# an operator upgrade does not give every existing pool a new revision (and restart it).
LATER_ENGINE_FIELDS = (
    "envFrom",
    "volumes",
    "volumeMounts",
    "serviceAccountName",
    "imagePullSecrets",
    "affinity",
    "priorityClassName",
    "securityContext",
    "podSecurityContext",
    "terminationGracePeriodSeconds",
    "lifecycle",
)


def _engine_for_hash(engine: EngineSpec) -> dict[str, Any]:
    dumped: dict[str, Any] = engine.model_dump(by_alias=True, mode="json")
    for name in LATER_ENGINE_FIELDS:
        if dumped.get(name) in (None, [], {}):
            dumped.pop(name, None)
    for env in dumped.get("env", []):
        if env.get("valueFrom") is None:
            env.pop("valueFrom", None)
    return dumped


def build_revision(model: ModelRef, engine: EngineSpec) -> str:
    """The revision hash of a model and engine spec (10 lower-case hex digits)."""
    defining = {
        "model": {"name": model.name, "servedName": model.served_name, "version": model.version},
        "engine": _engine_for_hash(engine),
    }
    canonical = json.dumps(defining, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:REVISION_LENGTH]


def revision_of(spec: ModelPoolSpec) -> str:
    """The revision of a ModelPool spec (see :func:`build_revision`)."""
    return build_revision(spec.model, spec.engine)
