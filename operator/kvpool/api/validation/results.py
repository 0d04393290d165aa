"""What manifest validation produces: problems a user can act on, and the typed objects.

A :class:`Finding` is a problem inside one object (a field path and a reason); a
:class:`Problem` places it in a file and an object, and formats as the line
``kvpool validate`` prints: ``FILE: Kind/name: field.path: reason``. A warning is a
:class:`Problem` too, kept apart (:attr:`ValidatedSet.warnings`): something the set
cannot show but a cluster may have (a Secret managed by External Secrets or SOPS).
Documents kvpool does not check (a Deployment, a kustomization file) are
:class:`Skipped`, not problems: they are normal in a GitOps repository.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvpool.api.modelpool import ModelPool
from kvpool.api.tenantbudget import TenantBudget
from kvpool.api.tierpolicy import TierPolicy

DEFAULT_NAMESPACE = "default"


@dataclass(frozen=True)
class Document:
    """One YAML document as loaded, before any check."""

    source: str  # the file it came from (as the user named it), or "-" for stdin
    index: int  # position in the file, from 1
    body: Any  # the parsed YAML: a mapping when the document is an object


@dataclass(frozen=True)
class Finding:
    """A problem at one place inside an object."""

    path: str  # field path from the object root, e.g. "spec.tiers[1].floorPercent"
    reason: str  # what is wrong, for a human
    # the CEL rule that failed, when a rule is the source (lets a precise check replace it)
    rule: str | None = field(default=None, compare=False)


@dataclass(frozen=True, order=True)
class Problem:
    """A problem located in a file and (when known) an object.

    >>> Problem("tp.yaml", "TierPolicy", "tiers", "spec.tiers", "at most 4 tiers").format()
    'tp.yaml: TierPolicy/tiers: spec.tiers: at most 4 tiers'
    >>> Problem("bad.yaml", "", "", "document 2", "malformed YAML: ...").format()
    'bad.yaml: document 2: malformed YAML: ...'
    """

    file: str  # the file, as the user named it
    kind: str  # object kind; "" when the problem is the document or file itself
    name: str  # object name; "" when unknown
    path: str  # field path inside the object, or a place in the file ("document 2")
    reason: str  # what is wrong, for a human

    def format(self) -> str:
        parts = [self.file]
        if self.kind or self.name:
            parts.append(f"{self.kind or '?'}/{self.name or '?'}")
        if self.path:
            parts.append(self.path)
        parts.append(self.reason)
        return ": ".join(parts)


@dataclass(frozen=True)
class SecretData:
    """A v1 Secret from the manifests: where it is and its decoded string values."""

    name: str  # metadata.name
    namespace: str  # metadata.namespace, or "default"
    values: Mapping[str, str]  # data (base64-decoded) merged with stringData
    labels: Mapping[str, str] = field(default_factory=dict)  # metadata.labels


@dataclass(frozen=True)
class Skipped:
    """A document left unchecked: a kind kvpool does not check, or a kustomization file."""

    file: str  # the file, as the user named it
    what: str  # "apps/v1 Deployment/redis", or the file's role ("kustomization file")

    def format(self) -> str:
        """
        >>> Skipped("redis.yaml", "apps/v1 Deployment/redis").format()
        'apps/v1 Deployment/redis (redis.yaml)'
        """
        return f"{self.what} ({self.file})"


@dataclass(frozen=True)
class ValidatedSet:
    """The objects of a set of manifests that passed every check, and the problems found.

    Objects with a problem are left out of the typed lists; callers that act on the
    set (``kvpool plan``) should refuse to when ``problems`` is not empty.
    """

    pools: list[ModelPool] = field(default_factory=list)
    tier_policies: list[TierPolicy] = field(default_factory=list)
    tenant_budgets: list[TenantBudget] = field(default_factory=list)
    secrets: list[SecretData] = field(default_factory=list)
    others: list[Mapping[str, Any]] = field(default_factory=list)  # ConfigMaps, Namespaces
    problems: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)  # e.g. a Secret not in the set
    skipped: list[Skipped] = field(default_factory=list)  # documents kvpool does not check

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def object_count(self) -> int:
        """Objects that passed every check."""
        return (
            len(self.pools)
            + len(self.tier_policies)
            + len(self.tenant_budgets)
            + len(self.secrets)
            + len(self.others)
        )
