"""Local mode: engines named by annotation instead of discovered as pods.

Why it exists: on a laptop or against the API emulator there are no engine pods, so the
ModelPool annotations ``kvpool.dev/static-endpoints`` (and ``kvpool.dev/canary-static-
endpoints`` for a canary) list the engines' URLs. In a cluster, anyone allowed to annotate
a ModelPool could send every tenant's traffic for its model to any URL, so the annotations
are honoured only with ``--allow-static-endpoints``, and otherwise ignored with one log
line per pool and annotation.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from kvpool.api.modelpool import ModelPool
from kvpool.domain.manifests import ANNOTATION_STATIC_ENDPOINTS

log = logging.getLogger(__name__)


@dataclass
class StaticEndpoints:
    """Reads the static-endpoints annotations when allowed (``--allow-static-endpoints``)."""

    allowed: bool
    _warned: set[tuple[str, str, str]] = field(default_factory=set)  # (annotation, ns, pool)

    def of(self, pool: ModelPool, annotation: str = ANNOTATION_STATIC_ENDPOINTS) -> str | None:
        """The annotation's text when honoured; None when absent or not allowed."""
        text = pool.metadata.annotations.get(annotation)
        if not text or self.allowed:
            return text or None
        key = (annotation, pool.metadata.namespace or "default", pool.metadata.name)
        if key not in self._warned:
            self._warned.add(key)
            log.warning(
                "ModelPool %s/%s: annotation %s ignored (the operator runs without "
                "--allow-static-endpoints)",
                key[1],
                key[2],
                annotation,
            )
        return None
