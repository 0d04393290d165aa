"""The kvpool.dev/v1alpha1 API: typed models of the custom resources.

These pydantic models are the single source of truth: the CRDs in ``crds/`` are
generated from them (``kvpool crds``), the CLI validates manifests with them, and
the operator and gateway read resources through them.
"""

from kvpool.api.common import API_VERSION, GROUP, VERSION
from kvpool.api.modelpool import ModelPool, ModelPoolSpec
from kvpool.api.tenantbudget import TenantBudget, TenantBudgetSpec
from kvpool.api.tierpolicy import TierPolicy, TierPolicySpec

__all__ = [
    "API_VERSION",
    "GROUP",
    "VERSION",
    "ModelPool",
    "ModelPoolSpec",
    "TenantBudget",
    "TenantBudgetSpec",
    "TierPolicy",
    "TierPolicySpec",
]
