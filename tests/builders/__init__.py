"""The test builders: start from a valid object, change what the case is about. Each name
says what it returns; every builder is importable from here.

Manifests (:mod:`tests.builders.manifests`): what a user applies, as dicts (``.dict()``)
or as the operator's pydantic models (``.obj()``):

- ``tierpolicy_manifest(name)`` / ``standard_tierpolicy_manifest()`` ->
  :class:`TierPolicyManifestBuilder` (``.tier()``, ``.rule()``);
- ``modelpool_manifest(name)`` / ``declared_modelpool_manifest(name, peak)`` ->
  :class:`ModelPoolManifestBuilder`; ``served_modelpool(builder)`` -> a ``ModelPool`` as
  read back from the API server (uid, generation);
- ``tenantbudget_manifest(tenant)`` -> :class:`TenantBudgetManifestBuilder`;
- ``apikey_secret_manifest(name, key, value)`` -> a labelled v1 Secret (dict).

Compiled admission objects (:mod:`tests.builders.compiled`): what the operator compiles
and the gateway enforces:

- ``compiled_tier``, ``compiled_rule``, ``compiled_tenant``, ``compiled_policy``,
  ``compiled_pool`` -> the ``kvpool.api.admission_config`` models;
- :class:`CompiledPoolBuilder` -> a ``CompiledPool`` with floors in tokens and slots;
- :class:`AdmissionConfigBuilder` / ``standard_admission_config(endpoints)`` -> an
  ``AdmissionConfig`` with floors in percents, planned like the operator (``.write(path)``);
  ``tiny_engine_admission_config(url, tokenizer)`` -> the one over the ``tiny_engine``;
- :class:`AdmissionRequests` -> numbered ``AdmissionRequest``\\ s. Key digests come from
  :mod:`kvpool.domain.api_keys`, as the operator and the gateway compute them.

Servers built from these (a fake engine, the gateway process) are in
:mod:`tests.support.gateway`, not here.
"""

from tests.builders.compiled import (
    KEY_SHA,
    AdmissionConfigBuilder,
    AdmissionRequests,
    CompiledPoolBuilder,
    compiled_policy,
    compiled_pool,
    compiled_rule,
    compiled_tenant,
    compiled_tier,
    standard_admission_config,
    tiny_engine_admission_config,
)
from tests.builders.manifests import (
    ModelPoolManifestBuilder,
    TenantBudgetManifestBuilder,
    TierPolicyManifestBuilder,
    apikey_secret_manifest,
    declared_modelpool_manifest,
    modelpool_manifest,
    served_modelpool,
    standard_tierpolicy_manifest,
    tenantbudget_manifest,
    tierpolicy_manifest,
)

__all__ = [
    "KEY_SHA",
    "AdmissionConfigBuilder",
    "AdmissionRequests",
    "CompiledPoolBuilder",
    "ModelPoolManifestBuilder",
    "TenantBudgetManifestBuilder",
    "TierPolicyManifestBuilder",
    "apikey_secret_manifest",
    "compiled_policy",
    "compiled_pool",
    "compiled_rule",
    "compiled_tenant",
    "compiled_tier",
    "declared_modelpool_manifest",
    "modelpool_manifest",
    "served_modelpool",
    "standard_admission_config",
    "standard_tierpolicy_manifest",
    "tenantbudget_manifest",
    "tierpolicy_manifest",
    "tiny_engine_admission_config",
]
