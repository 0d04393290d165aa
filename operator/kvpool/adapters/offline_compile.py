"""Compile manifests into the gateway's admission config without a cluster or an operator.

Why it exists: teams that run vLLM on VMs or with compose, or want to try the gateway
before the operator, need the document the operator publishes (docs/0002: SHA-256 key
digests, absolute floors, endpoint URLs) and nothing else produces it. This module makes
*exactly* that document from the same inputs: the manifests pass the checks of
``kvpool validate``, each pool is planned by the operator's planner
(:func:`kvpool.domain.planner.plan_pool`) on its declared ``capacity.kvTokensPerReplica``
(or an override: the operator would use the measured figure), endpoints are given per
pool (as the ``kvpool.dev/static-endpoints`` annotation gives them in local mode), keys
are digested by :func:`kvpool.domain.api_keys.api_key_digest` from the manifests'
Secrets or from key files, and :func:`kvpool.domain.compile.build_admission_config`
compiles them. ``tests/integration/test_offline_compile.py`` compares the result with
the operator's ConfigMap for the same manifests.

Used by ``kvpool compile`` and by ``kvpool gateway -f`` (:class:`ManifestConfigSource`,
which recompiles when a manifest or key file changes; manifests that stop passing the
checks are not applied: the gateway keeps the last good config and logs why).

Worked example::

    compile_manifests(["examples/"], endpoints={"llama-8b": "http://10.0.0.7:8000"},
                      key_files={}, namespace=None)
    # -> OfflineCompile(config=AdmissionConfig(namespace="llm", ...), problems=[],
    #    warnings=["ModelPool llm/llama-70b has no endpoints: ..."])
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kvpool.adapters.config_source import ConfigError, OnConfig, OnError
from kvpool.adapters.manifests import find_manifest_files, load_and_validate
from kvpool.api.admission_config import AdmissionConfig, Endpoint
from kvpool.api.modelpool import ModelPool
from kvpool.api.tenantbudget import TenantBudget
from kvpool.api.tierpolicy import TierPolicy
from kvpool.api.validation import DEFAULT_NAMESPACE, Problem, ValidatedSet
from kvpool.domain.api_keys import api_key_digest
from kvpool.domain.compile import (
    PoolInput,
    TenantInput,
    build_admission_config,
    parse_static_endpoints,
)
from kvpool.domain.manifests import ANNOTATION_STATIC_ENDPOINTS
from kvpool.domain.planner import PlanError, plan_pool
from kvpool.domain.revision import revision_of

log = logging.getLogger("kvpool.config")


class OfflineCompileError(ValueError):
    """A flag value that cannot be used (the message names it and the fix)."""


@dataclass(frozen=True)
class OfflineCompile:
    """The compiled config (None when the manifests have problems) and what to tell."""

    config: AdmissionConfig | None
    problems: list[Problem] = field(default_factory=list)  # as kvpool validate prints them
    warnings: list[str] = field(default_factory=list)  # one line each, for humans


def parse_endpoint_flags(values: Iterable[str]) -> dict[str, str]:
    """``POOL=URL[,URL]...`` flags -> pool name -> endpoint list text.

    >>> parse_endpoint_flags(["chat=http://a:8000,http://b:8000"])
    {'chat': 'http://a:8000,http://b:8000'}
    """
    endpoints: dict[str, str] = {}
    for value in values:
        pool, sep, urls = value.partition("=")
        if not sep or not pool or not urls.strip():
            raise OfflineCompileError(
                f"--endpoints {value!r}: expected POOL=URL[,URL]... "
                "(e.g. chat=http://10.0.0.7:8000,http://10.0.0.8:8000)"
            )
        for endpoint in parse_static_endpoints(urls):
            if not endpoint.url.startswith(("http://", "https://")):
                raise OfflineCompileError(
                    f"--endpoints {value!r}: {endpoint.url!r} is not an http(s) URL"
                )
        if pool in endpoints:
            raise OfflineCompileError(f"--endpoints: pool {pool!r} given twice; list its URLs once")
        endpoints[pool] = urls
    return endpoints


def parse_key_file_flags(values: Iterable[str]) -> dict[tuple[str, str | None], Path]:
    """``SECRET/KEY=PATH`` (or ``SECRET=PATH``: every key of it a tenant references) flags
    -> (Secret, key or None) -> file.

    >>> parse_key_file_flags(["tenant-a/api-key=/run/secrets/a", "tenant-b=b.txt"])
    {('tenant-a', 'api-key'): PosixPath('/run/secrets/a'), ('tenant-b', None): PosixPath('b.txt')}
    """
    files: dict[tuple[str, str | None], Path] = {}
    for value in values:
        target, sep, path = value.partition("=")
        secret, _, key = target.partition("/")
        if not sep or not secret or not path:
            raise OfflineCompileError(
                f"--key-file {value!r}: expected SECRET/KEY=PATH or SECRET=PATH "
                "(the Secret a TenantBudget's apiKeySecretRef names)"
            )
        files[(secret, key or None)] = Path(path)
    return files


def _read_key(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise OfflineCompileError(f"--key-file {path}: cannot read: {error.strerror}") from None
    digest = api_key_digest(raw)
    if digest == api_key_digest(b""):
        raise OfflineCompileError(f"--key-file {path}: the file is empty")
    return digest


def _namespace_of(validated: ValidatedSet, wanted: str | None) -> str:
    found = sorted(
        {p.metadata.namespace or DEFAULT_NAMESPACE for p in validated.pools}
        | {p.metadata.namespace or DEFAULT_NAMESPACE for p in validated.tier_policies}
        | {b.metadata.namespace or DEFAULT_NAMESPACE for b in validated.tenant_budgets}
    )
    if wanted is not None:
        if wanted not in found:
            listed = ", ".join(found) or "none"
            raise OfflineCompileError(
                f"--namespace {wanted!r}: no kvpool object there (namespaces: {listed})"
            )
        return wanted
    if len(found) > 1:
        raise OfflineCompileError(
            f"the manifests hold several namespaces ({', '.join(found)}): one config serves "
            "one namespace, choose it with --namespace"
        )
    return found[0] if found else DEFAULT_NAMESPACE


def _in(namespace: str, obj: ModelPool | TierPolicy | TenantBudget) -> bool:
    return (obj.metadata.namespace or DEFAULT_NAMESPACE) == namespace


def compile_manifests(
    paths: Sequence[str],
    endpoints: Mapping[str, str],
    key_files: Mapping[tuple[str, str | None], Path],
    namespace: str | None = None,
    kv_tokens_per_replica: int | None = None,
    generated_at: str | None = None,
) -> OfflineCompile:
    """The admission config of one namespace of the manifests under ``paths``.

    Raises :class:`OfflineCompileError` for a flag that cannot be used (an unknown pool
    in ``endpoints``, an unreadable key file, an ambiguous namespace).
    """
    validated = load_and_validate(paths)
    if validated.problems:
        return OfflineCompile(None, problems=validated.problems)
    ns = _namespace_of(validated, namespace)
    pools = [p for p in validated.pools if _in(ns, p)]
    policies = [p for p in validated.tier_policies if _in(ns, p)]
    budgets = [b for b in validated.tenant_budgets if _in(ns, b)]
    unknown = sorted(set(endpoints) - {p.metadata.name for p in pools})
    if unknown:
        names = ", ".join(sorted(p.metadata.name for p in pools)) or "none"
        raise OfflineCompileError(
            f"--endpoints names ModelPool {unknown[0]!r}, which is not in namespace {ns!r} "
            f"(ModelPools: {names})"
        )
    warnings: list[str] = []
    policy_by_name = {p.metadata.name: p for p in policies}
    pool_inputs = []
    for pool in pools:
        name = pool.metadata.name
        text = endpoints.get(name) or pool.metadata.annotations.get(ANNOTATION_STATIC_ENDPOINTS)
        pool_endpoints: tuple[Endpoint, ...] = parse_static_endpoints(text or "")
        if not pool_endpoints:
            warnings.append(
                f"ModelPool {ns}/{name} has no endpoints: the gateway answers 503 for it "
                f"(give --endpoints {name}=URL[,URL]...)"
            )
        plan = plan_pool(
            pool, policy_by_name[pool.spec.tier_policy_ref.name], kv_tokens_per_replica
        )
        if isinstance(plan, PlanError):
            warnings.append(
                f"ModelPool {ns}/{name}: no plan ({plan.reason}): the gateway admits nothing to "
                "it; set spec.capacity.kvTokensPerReplica or --kv-tokens-per-replica"
            )
        pool_inputs.append(
            PoolInput(
                pool=pool,
                plan=plan.to_status() if not isinstance(plan, PlanError) else None,
                revision=revision_of(pool.spec),
                endpoints=pool_endpoints,
            )
        )
    digests = _secret_digests(validated, ns)
    tenant_inputs = []
    for budget in budgets:
        keys: list[str | None] = []
        for path, ref in budget.key_refs():
            file = key_files.get((ref.name, ref.key)) or key_files.get((ref.name, None))
            keys.append(_read_key(file) if file is not None else digests.get((ref.name, ref.key)))
            if keys[-1] is None and len(budget.key_refs()) > 1:
                warnings.append(
                    f"TenantBudget {ns}/{budget.metadata.name}: {path} (key {ref.key!r} of "
                    f"Secret {ref.name!r}) is neither in the manifests nor a --key-file: "
                    "requests with that key get 401"
                )
        tenant_inputs.append(TenantInput(budget=budget, key_sha256s=tuple(keys)))
    compiled = build_admission_config(
        ns, pool_inputs, policies, tenant_inputs, generated_at=generated_at
    )
    warnings += [
        f"TenantBudget {ns}/{budget_name} left out ({reason}): its requests get 401; put its "
        "Secret in the manifests or give --key-file SECRET/KEY=PATH"
        for budget_name, reason in compiled.skipped
    ]
    return OfflineCompile(compiled.config, warnings=warnings)


def _secret_digests(validated: ValidatedSet, namespace: str) -> dict[tuple[str, str], str]:
    """(Secret, key) -> digest, for the labelled Secrets of the namespace (the operator
    reads no other)."""
    return {
        (secret.name, key): api_key_digest(value)
        for secret in validated.secrets
        if secret.namespace == namespace
        for key, value in secret.values.items()
    }


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ManifestConfigSource:
    """The gateway's config compiled from manifests, recompiled when a file changes.

    The same interface as :class:`kvpool.adapters.config_source.FileConfigSource`
    (``load``, ``watch``). A file's identity is ``(path, inode, mtime_ns, size)`` for every
    manifest under the paths and every key file; a new, removed or changed one recompiles.
    """

    def __init__(
        self,
        paths: Sequence[str],
        endpoints: Mapping[str, str],
        key_files: Mapping[tuple[str, str | None], Path],
        namespace: str | None = None,
        kv_tokens_per_replica: int | None = None,
        interval: float = 1.0,
    ) -> None:
        self.paths = list(paths)
        self.endpoints = dict(endpoints)
        self.key_files = dict(key_files)
        self.namespace = namespace
        self.kv_tokens_per_replica = kv_tokens_per_replica
        self.interval = interval
        self._identity: frozenset[tuple[str, int, int, int]] | None = None

    def _stat(self) -> frozenset[tuple[str, int, int, int]]:
        files = [f for p in self.paths for f in find_manifest_files(Path(p))]
        files += list(self.key_files.values())
        found = set()
        for file in files:
            try:
                st = file.stat()
            except OSError:
                continue
            found.add((str(file), st.st_ino, st.st_mtime_ns, st.st_size))
        return frozenset(found)

    def load(self) -> AdmissionConfig:
        """Compile now (raises ConfigError with every problem); remembers the identity."""
        identity = self._stat()
        try:
            result = compile_manifests(
                self.paths,
                self.endpoints,
                self.key_files,
                namespace=self.namespace,
                kv_tokens_per_replica=self.kv_tokens_per_replica,
                generated_at=_now(),
            )
        except OfflineCompileError as error:
            raise ConfigError(str(error)) from error
        finally:
            self._identity = identity
        if result.config is None:
            lines = "; ".join(p.format() for p in result.problems)
            raise ConfigError(f"{len(result.problems)} problem(s) in the manifests: {lines}")
        for warning in result.warnings:
            log.warning("%s", warning)
        return result.config

    def changed(self) -> bool:
        return self._stat() != self._identity

    async def watch(self, on_config: OnConfig, on_error: OnError | None = None) -> None:
        """Poll forever (cancel the task to stop); deliver each new valid config."""
        while True:
            await asyncio.sleep(self.interval)
            if not await asyncio.to_thread(self.changed):
                continue
            try:
                config = await asyncio.to_thread(self.load)
            except ConfigError as exc:
                log.error("manifests not recompiled, keeping the last good config: %s", exc)
                if on_error is not None:
                    on_error(str(exc))
                continue
            log.info("config recompiled from %s", ", ".join(self.paths))
            result = on_config(config)
            if result is not None:
                await result
