"""Manifest validation without an API server: pure checks over already-loaded documents.

``kvpool validate`` loads YAML (:mod:`kvpool.adapters.manifests`) and hands the documents
to :func:`validate_documents`; the operator can run the same checks on objects it reads.
See :mod:`kvpool.api.validation.documents` for the order of the checks.
"""

from kvpool.api.validation.documents import (
    BUILTIN_KINDS,
    BuiltinCheck,
    check_custom_object,
    validate_documents,
)
from kvpool.api.validation.references import (
    budget_tier_findings,
    pool_tier_findings,
    resolve_budget_policy,
)
from kvpool.api.validation.results import (
    DEFAULT_NAMESPACE,
    Document,
    Finding,
    Problem,
    SecretData,
    Skipped,
    ValidatedSet,
)
from kvpool.api.validation.rules import KUBERNETES_FUNCTIONS, assess_rule, check_extensions

__all__ = [
    "BUILTIN_KINDS",
    "DEFAULT_NAMESPACE",
    "KUBERNETES_FUNCTIONS",
    "BuiltinCheck",
    "Document",
    "Finding",
    "Problem",
    "SecretData",
    "Skipped",
    "ValidatedSet",
    "assess_rule",
    "budget_tier_findings",
    "check_custom_object",
    "check_extensions",
    "pool_tier_findings",
    "resolve_budget_policy",
    "validate_documents",
]
