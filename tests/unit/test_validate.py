"""``kvpool validate``: each kind of mistake is caught at the right field with a clear reason.

Every case starts from a valid set of manifests (one TierPolicy, one ModelPool, one
TenantBudget and its Secret, built with the builders) and changes the one thing the case
is about. The CLI runs in-process through ``kvpool.cli.main``; one test runs the installed
``kvpool`` console script as a user would.
"""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvpool.adapters.manifests import load_and_validate
from kvpool.api.crd import build_crds
from kvpool.api.validation import Document, assess_rule, validate_documents
from kvpool.api.validation.rules import rule_message
from kvpool.cli import main
from tests.builders import (
    apikey_secret_manifest,
    modelpool_manifest,
    standard_tierpolicy_manifest,
    tenantbudget_manifest,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

Manifest = dict[str, Any]


# --- builders ---------------------------------------------------------------------------------


def acme_budget(name: str = "acme") -> Manifest:
    """A valid TenantBudget of tenant ``name`` using the standard policy's first two tiers."""
    budget = tenantbudget_manifest(name).policy("tiers").tiers("interactive", "batch")
    return budget.limit("1m", 100_000).limit("1d", 10**8).dict()


def acme_secret(name: str = "acme-key") -> Manifest:
    """The labelled Secret holding ``api-key`` of :func:`acme_budget` (each Secret its own
    value: one key identifies one tenant)."""
    return apikey_secret_manifest(name, "api-key", f"s3cret-{name}")


@dataclass
class ManifestSet:
    """The manifests of one case, by role; ``extra`` holds any further documents."""

    policy: Manifest
    pool: Manifest
    budget: Manifest
    secret: Manifest
    extra: list[Any]

    def documents(self) -> list[Any]:
        return [self.policy, self.pool, self.budget, self.secret, *self.extra]


def valid_set() -> ManifestSet:
    pool = modelpool_manifest("chat").peak(interactive=60, batch=40).dict()
    return ManifestSet(
        standard_tierpolicy_manifest().dict(), pool, acme_budget(), acme_secret(), []
    )


def write_manifests(path: Path, documents: list[Any]) -> Path:
    path.write_text(yaml.safe_dump_all(documents, sort_keys=False), encoding="utf-8")
    return path


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], str]:
    """Exit code, stdout lines and stderr of ``kvpool ARGV`` run in-process."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


# --- the valid set ------------------------------------------------------------------------------


def test_valid_set_passes_with_a_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifests = valid_set()
    file = write_manifests(tmp_path / "set.yaml", manifests.documents())

    code, out, err = run_cli(capsys, "validate", "-f", str(file))

    assert (code, out, err) == (0, [f"{len(manifests.documents())} objects valid"], "")


def test_load_and_validate_returns_typed_objects(tmp_path: Path) -> None:
    manifests = valid_set()
    file = write_manifests(tmp_path / "set.yaml", manifests.documents())

    validated = load_and_validate([str(file)])

    assert validated.problems == []
    assert [p.metadata.name for p in validated.pools] == ["chat"]
    assert validated.pools[0].spec.capacity.peak_concurrency == {"interactive": 60, "batch": 40}
    assert validated.tier_policies[0].tier_names() == ["interactive", "batch", "eval"]
    assert validated.tenant_budgets[0].spec.tenant == "acme"
    assert (validated.secrets[0].name, dict(validated.secrets[0].values)) == (
        "acme-key",
        {"api-key": "s3cret-acme-key"},
    )


# --- one mistake per case -------------------------------------------------------------------------


def _five_tiers(m: ManifestSet) -> None:
    m.policy["spec"]["tiers"] += [
        {"name": f"extra{i}", "floorPercent": 1, "maxQueueWait": "1m"} for i in range(2)
    ]


def _window(*windows: tuple[str, int]) -> Callable[[ManifestSet], None]:
    def change(m: ManifestSet) -> None:
        m.budget["spec"]["limits"] = [{"window": w, "tokens": t} for w, t in windows]

    return change


def _set(role: str, path: str, value: Any) -> Callable[[ManifestSet], None]:
    """Set a dotted path (list indexes as numbers) in one of the set's manifests."""

    def change(m: ManifestSet) -> None:
        node: Any = getattr(m, role)
        *parents, last = path.split(".")
        for part in parents:
            node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
        node[int(last) if last.isdigit() else last] = value

    return change


def _drop(role: str, path: str) -> Callable[[ManifestSet], None]:
    def change(m: ManifestSet) -> None:
        node: Any = getattr(m, role)
        *parents, last = path.split(".")
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        del node[last]

    return change


def _second_policy(m: ManifestSet) -> None:
    other = standard_tierpolicy_manifest().dict()
    other["metadata"]["name"] = "other"
    m.extra.append(other)
    del m.budget["spec"]["tierPolicyRef"]


def _duplicate_budget_tenant(m: ManifestSet) -> None:
    twin = acme_budget("acme-2")
    twin["spec"]["tenant"] = "acme"
    m.extra += [twin, acme_secret("acme-2-key")]


def _both(*changes: Callable[[ManifestSet], None]) -> Callable[[ManifestSet], None]:
    def change(m: ManifestSet) -> None:
        for one in changes:
            one(m)

    return change


@dataclass(frozen=True)
class Case:
    change: Callable[[ManifestSet], None]  # the one mistake, made on a valid set
    on: str  # Kind/name of the object the problem is reported on
    path: str  # the exact field path
    reason: str  # a fragment of the reason


POLICY, POOL, BUDGET, SECRET = (
    "TierPolicy/tiers",
    "ModelPool/chat",
    "TenantBudget/acme",
    "Secret/acme-key",
)

REJECTED = {
    "five-tiers": Case(_five_tiers, POLICY, "spec.tiers", "at most 4 tiers: more than four"),
    "floors-over-100": Case(
        _set("policy", "spec.tiers.2.floorPercent", 30),
        POLICY,
        "spec.tiers",
        "must sum to at most 100, not 110 (interactive 50, batch 30, eval 30)",
    ),
    "floor-over-100-percent": Case(
        _set("policy", "spec.tiers.1.floorPercent", 101),
        POLICY,
        "spec.tiers[1].floorPercent",
        "must be at most 100 (got 101)",
    ),
    "duplicate-tier-names": Case(
        _set("policy", "spec.tiers.2.name", "batch"),
        POLICY,
        "spec.tiers[2].name",
        "tier name 'batch' is also the name of spec.tiers[1]; tier names must be unique",
    ),
    "classification-unknown-tier": Case(
        _set(
            "policy",
            "spec.classification",
            [{"pathPrefix": "/v1", "tier": "batch"}, {"host": "h", "tier": "gold"}],
        ),
        POLICY,
        "spec.classification[1].tier",
        "tier 'gold' is not in spec.tiers (tiers: batch, eval, interactive)",
    ),
    "classification-unreachable": Case(
        _set("policy", "spec.classification", [{"tier": "batch"}, {"host": "a", "tier": "eval"}]),
        POLICY,
        "spec.classification[1]",
        "unreachable: spec.classification[0] has no matcher",
    ),
    "bad-duration": Case(
        _set("policy", "spec.tiers.0.maxQueueWait", "2 seconds"),
        POLICY,
        "spec.tiers[0].maxQueueWait",
        "'2 seconds' is not a duration",
    ),
    "limit-zero-tokens": Case(
        _window(("1h", 0)), BUDGET, "spec.limits[0].tokens", "must be at least 1 (got 0)"
    ),
    "limit-negative-tokens": Case(
        _window(("1h", -5)), BUDGET, "spec.limits[0].tokens", "must be at least 1 (got -5)"
    ),
    "window-over-31d": Case(
        _window(("32d", 10)),
        BUDGET,
        "spec.limits[0].window",
        "window must be between 1m and 31d (got 32d)",
    ),
    "window-in-hours-over-31d": Case(
        _window(("745h", 10)), BUDGET, "spec.limits[0].window", "between 1m and 31d"
    ),
    "window-under-1m": Case(
        _window(("30s", 10)), BUDGET, "spec.limits[0].window", "between 1m and 31d"
    ),
    "window-in-two-units": Case(
        _window(("1h30m", 10)),
        BUDGET,
        "spec.limits[0].window",
        "'1h30m' is not a window in one unit",
    ),
    "duplicate-windows": Case(
        _window(("1h", 10), ("1h", 20)),
        BUDGET,
        "spec.limits[1]",
        "duplicate entry with window '1h' (also at spec.limits[0])",
    ),
    "same-window-spelled-differently": Case(
        _window(("1h", 10), ("60m", 20)),
        BUDGET,
        "spec.limits[1].window",
        "'60m' is the same window as spec.limits[0].window ('1h')",
    ),
    "duplicate-budget-tiers": Case(
        _set("budget", "spec.tiers", ["batch", "batch"]),
        BUDGET,
        "spec.tiers[1]",
        "duplicate value 'batch'",
    ),
    "max-replicas-below-min": Case(
        _both(
            _set("pool", "spec.capacity.minReplicas", 3),
            _set("pool", "spec.capacity.maxReplicas", 2),
        ),
        POOL,
        "spec.capacity.maxReplicas",
        "maxReplicas (2) must be greater than or equal to minReplicas (3)",
    ),
    "max-replicas-below-defaulted-min": Case(
        _both(
            _drop("pool", "spec.capacity.minReplicas"), _set("pool", "spec.capacity.maxReplicas", 0)
        ),
        POOL,
        "spec.capacity.maxReplicas",
        "maxReplicas (0) must be greater than or equal to minReplicas (1)",
    ),
    "p95-below-mean": Case(
        _set("pool", "spec.workload.promptTokens.p95", 500),
        POOL,
        "spec.workload.promptTokens.p95",
        "p95 (500) must be greater than or equal to mean (1000)",
    ),
    "lengths-over-max-model-len": Case(
        _set("pool", "spec.engine.maxModelLen", 2048),
        POOL,
        "spec.workload",
        "must fit in engine.maxModelLen: 2048 + 1024 = 3072 tokens, over maxModelLen 2048",
    ),
    "unknown-tier-policy-ref": Case(
        _set("pool", "spec.tierPolicyRef.name", "nope"),
        POOL,
        "spec.tierPolicyRef.name",
        "TierPolicy 'nope' not found in namespace 'default' (TierPolicies there: tiers)",
    ),
    "policy-in-another-namespace": Case(
        _set("policy", "metadata.namespace", "elsewhere"),
        POOL,
        "spec.tierPolicyRef.name",
        "TierPolicy 'tiers' not found in namespace 'default'",
    ),
    "peak-for-unknown-tier": Case(
        _set("pool", "spec.capacity.peakConcurrency.gold", 5),
        POOL,
        "spec.capacity.peakConcurrency.gold",
        "tier 'gold' is not in TierPolicy 'tiers'",
    ),
    "canary-unknown-tier": Case(
        _set("pool", "spec.rollout", {"canaryTiers": ["gold"]}),
        POOL,
        "spec.rollout.canaryTiers[0]",
        "tier 'gold' is not in TierPolicy 'tiers'",
    ),
    "engine-arg-owned-by-field": Case(
        _set("pool", "spec.engine.args", ["--max-model-len=4096"]),
        POOL,
        "spec.engine.args[0]",
        "--max-model-len is set from spec.engine.maxModelLen",
    ),
    "declared-kv-below-one-sequence": Case(
        _set("pool", "spec.capacity.kvTokensPerReplica", 4096),
        POOL,
        "spec.capacity.kvTokensPerReplica",
        "cannot hold one sequence of engine.maxModelLen 8192",
    ),
    "unknown-field": Case(
        _set("pool", "spec.engine.maxModelLength", 4096),
        POOL,
        "spec.engine.maxModelLength",
        "unknown field",
    ),
    "missing-required-field": Case(
        _drop("pool", "spec.workload"), POOL, "spec.workload", "required field is missing"
    ),
    "wrong-type": Case(
        _set("pool", "spec.capacity.maxReplicas", "eight"),
        POOL,
        "spec.capacity.maxReplicas",
        "must be an integer (got 'eight')",
    ),
    "bad-enum": Case(
        _set("budget", "spec.overBudget", "Ignore"),
        BUDGET,
        "spec.overBudget",
        "must be one of Reject, Demote (got 'Ignore')",
    ),
    "int-or-string-resource": Case(
        _set("pool", "spec.engine.resources", {"limits": {"cpu": [1]}}),
        POOL,
        "spec.engine.resources.limits.cpu",
        "must be an integer or a string",
    ),
    "budget-unknown-tier": Case(
        _set("budget", "spec.tiers", ["interactive", "gold"]),
        BUDGET,
        "spec.tiers[1]",
        "tier 'gold' is not in TierPolicy 'tiers' (tiers: batch, eval, interactive)",
    ),
    "budget-without-ref-two-policies": Case(
        _second_policy,
        BUDGET,
        "spec.tierPolicyRef",
        "namespace 'default' has 2 TierPolicies (other, tiers)",
    ),
    "secret-key-missing": Case(
        _set("budget", "spec.apiKeySecretRef.key", "token"),
        BUDGET,
        "spec.apiKeySecretRef.key",
        "Secret 'acme-key' has no key 'token' (keys: api-key)",
    ),
    "tenant-without-a-key": Case(
        _drop("budget", "spec.apiKeySecretRef"),
        BUDGET,
        "spec",
        "a tenant needs an API key: set apiKeySecretRef or apiKeySecretRefs",
    ),
    "five-keys": Case(
        _set(
            "budget",
            "spec.apiKeySecretRefs",
            [{"name": "acme-key", "key": f"k{i}"} for i in range(4)],
        ),
        BUDGET,
        "spec.apiKeySecretRefs",
        "at most 4 API keys per tenant",
    ),
    "same-key-twice": Case(
        _set("budget", "spec.apiKeySecretRefs", [{"name": "acme-key", "key": "api-key"}]),
        BUDGET,
        "spec.apiKeySecretRefs[0]",
        "key 'api-key' of Secret 'acme-key' is already spec.apiKeySecretRef",
    ),
    "second-key-missing-in-secret": Case(
        _set("budget", "spec.apiKeySecretRefs", [{"name": "acme-key", "key": "next"}]),
        BUDGET,
        "spec.apiKeySecretRefs[0].key",
        "Secret 'acme-key' has no key 'next' (keys: api-key)",
    ),
    "duplicate-tenant": Case(
        _duplicate_budget_tenant,
        "TenantBudget/acme-2",
        "spec.tenant",
        "tenant 'acme' is also claimed",
    ),
    "secret-bad-base64": Case(
        _set("secret", "data", {"api-key": "not base64!"}),
        SECRET,
        "data.api-key",
        "not valid base64",
    ),
    "secret-unknown-field": Case(
        _set("secret", "stringdata", {"api-key": "x"}), SECRET, "stringdata", "unknown field"
    ),
    "old-api-version": Case(
        _set("policy", "apiVersion", "kvpool.dev/v1beta9"),
        POLICY,
        "apiVersion",
        "kvpool.dev/v1beta9 is not served; use kvpool.dev/v1alpha1",
    ),
    "bad-name": Case(
        _set("budget", "metadata.name", "Acme"),
        "TenantBudget/Acme",
        "metadata.name",
        "not a valid name",
    ),
}


@pytest.mark.parametrize("case", REJECTED.values(), ids=REJECTED.keys())
def test_rejects_with_field_path_and_reason(
    case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifests = valid_set()
    case.change(manifests)
    file = write_manifests(tmp_path / "set.yaml", manifests.documents())

    code, out, _ = run_cli(capsys, "validate", "-f", str(file))

    prefix = f"{file}: {case.on}: {case.path}: "
    assert code == 1
    matching = [line for line in out if line.startswith(prefix)]
    assert matching, f"no line starts with {prefix!r}:\n" + "\n".join(out)
    assert any(case.reason in line for line in matching), "\n".join(out)


# --- files, documents and usage ---------------------------------------------------------------


LOAD_ERRORS = {
    "malformed-yaml": (
        "tiers:\n  - name: a\n   floorPercent: 5\n",
        "bad.yaml: line 3, column 4: malformed YAML: ",
    ),
    "duplicate-key": (
        "apiVersion: v1\nkind: Secret\nkind: ConfigMap\n",
        "bad.yaml: line 3, column 1: malformed YAML: duplicate key 'kind'",
    ),
    "not-a-mapping": ("- a\n- b\n", "bad.yaml: document 1: not a Kubernetes object (a list"),
    "scalar-document": ("just text\n", "bad.yaml: document 1: not a Kubernetes object"),
    "unknown-kvpool-kind": (
        "apiVersion: kvpool.dev/v1alpha1\nkind: ModelPoool\nmetadata: {name: web}\n",
        "bad.yaml: ModelPoool/web: kind: 'ModelPoool' is not a kind of kvpool.dev (kinds: "
        "ModelPool, TierPolicy, TenantBudget)",
    ),
    "only-other-kinds": (
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n",
        "bad.yaml: no kvpool objects found (skipped 1 document kvpool does not check: "
        "apps/v1 Deployment/web (bad.yaml))",
    ),
    "no-kind": ("apiVersion: v1\nmetadata: {name: x}\n", "bad.yaml: ?/x: kind: required"),
    "no-name": (
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {}\n",
        "bad.yaml: ConfigMap/?: metadata.name: required field is missing",
    ),
    "configmap-bad-field": (
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: [1]\n",
        "bad.yaml: ConfigMap/c: data: ",
    ),
    "only-empty-documents": ("---\n---\n", "bad.yaml: no objects found"),
}


@pytest.mark.parametrize(("text", "expected"), LOAD_ERRORS.values(), ids=LOAD_ERRORS.keys())
def test_file_problems_are_one_clear_line(
    text: str,
    expected: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("bad.yaml").write_text(text, encoding="utf-8")

    code, out, err = run_cli(capsys, "validate", "-f", "bad.yaml")

    assert code == 1
    assert any(line.startswith(expected) for line in out), "\n".join(out)
    assert "Traceback" not in err


PATH_ERRORS = {
    "missing-file": ("nope.yaml", "nope.yaml: no such file or directory"),
    "empty-path": ("", "'': empty path"),
    "empty-directory": ("empty", "empty: no *.yaml or *.yml files in this directory"),
}


@pytest.mark.parametrize(("path", "expected"), PATH_ERRORS.values(), ids=PATH_ERRORS.keys())
def test_path_problems_are_one_clear_line(
    path: str,
    expected: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()

    code, out, err = run_cli(capsys, "validate", "-f", path)

    assert (code, out) == (1, [expected])
    assert "Traceback" not in err


def test_no_path_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "validate")

    assert (code, out) == (2, [])
    assert "-f" in err


def test_directories_are_searched_recursively(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifests = valid_set()
    (tmp_path / "a" / "b").mkdir(parents=True)
    write_manifests(tmp_path / "policy.yml", [manifests.policy])
    write_manifests(tmp_path / "a" / "pool.yaml", [manifests.pool])
    write_manifests(tmp_path / "a" / "b" / "tenant.yaml", [manifests.budget, manifests.secret])
    (tmp_path / "a" / "notes.txt").write_text("not a manifest: [", encoding="utf-8")

    code, out, _ = run_cli(capsys, "validate", "-f", str(tmp_path))

    assert (code, out) == (0, ["4 objects valid"])


def test_references_resolve_across_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifests = valid_set()
    policy = write_manifests(tmp_path / "policy.yaml", [manifests.policy])
    rest = write_manifests(tmp_path / "rest.yaml", [manifests.pool])

    alone = run_cli(capsys, "validate", "-f", str(rest))
    together = run_cli(capsys, "validate", "-f", str(rest), "-f", str(policy))

    assert alone[0] == 1
    assert together[:2] == (0, ["2 objects valid"])


def test_standard_input_is_read_for_a_dash(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(yaml.safe_dump_all(valid_set().documents())))

    code, out, _ = run_cli(capsys, "validate", "-f", "-")

    assert (code, out) == (0, ["4 objects valid"])


def test_console_script_reports_problems_without_a_traceback(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "kvpool"
    manifests = valid_set()
    manifests.policy["spec"]["tiers"][0]["floorPercent"] = 90
    file = write_manifests(tmp_path / "set.yaml", manifests.documents())

    bad = subprocess.run(
        [str(script), "validate", "-f", str(file), "-f", str(tmp_path / "missing.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert bad.returncode == 1
    assert f"{file}: TierPolicy/tiers: spec.tiers: the floors of all tiers" in bad.stdout
    assert f"{tmp_path / 'missing.yaml'}: no such file or directory" in bad.stdout
    assert "Traceback" not in bad.stderr


# --- a GitOps repository: other kinds, kustomize, Secrets kept elsewhere ------------------------


DEPLOYMENT = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "redis", "namespace": "llm"},
    "spec": {"replicas": 1},
}
HELM_RELEASE = {
    "apiVersion": "helm.toolkit.fluxcd.io/v2",
    "kind": "HelmRelease",
    "metadata": {"name": "kvpool"},
}
KUSTOMIZATION = {"resources": ["kvpool.yaml", "redis.yaml"], "namespace": "llm"}


def test_other_kinds_and_kustomization_files_are_skipped_with_one_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifests = valid_set()
    write_manifests(tmp_path / "kvpool.yaml", manifests.documents())
    write_manifests(tmp_path / "redis.yaml", [DEPLOYMENT, HELM_RELEASE])
    write_manifests(tmp_path / "kustomization.yaml", [KUSTOMIZATION])

    code, out, err = run_cli(capsys, "validate", "-f", str(tmp_path))

    assert (code, out) == (0, ["4 objects valid"]), err
    assert err.splitlines() == [
        f"note: skipped 3 documents kvpool does not check: "
        f"kustomization file ({tmp_path / 'kustomization.yaml'}), "
        f"apps/v1 Deployment/redis ({tmp_path / 'redis.yaml'}), "
        f"helm.toolkit.fluxcd.io/v2 HelmRelease/kvpool ({tmp_path / 'redis.yaml'})"
    ]


def test_a_secret_missing_from_the_manifests_is_a_warning_unless_required(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifests = valid_set()
    manifests.budget["spec"]["apiKeySecretRef"]["name"] = "from-external-secrets"
    file = write_manifests(tmp_path / "set.yaml", manifests.documents())
    line = (
        f"{file}: TenantBudget/acme: spec.apiKeySecretRef.name: Secret 'from-external-secrets' "
        "is not in the given manifests: the operator reads it from namespace 'default'"
    )

    lenient = run_cli(capsys, "validate", "-f", str(file))
    strict = run_cli(capsys, "validate", "-f", str(file), "--require-secrets")

    assert lenient[0] == 0
    assert [o.split(" (labelled")[0] for o in lenient[1]] == [
        f"warning: {line}",
        "4 objects valid (1 warning)",
    ]
    assert strict[0] == 1
    assert [o.split(" (labelled")[0] for o in strict[1]] == [line]


def test_one_bad_policy_rule_gives_one_line_not_one_per_user(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifests = valid_set()
    manifests.policy["spec"]["classification"] = [{"host": "batch.example", "tier": "batcj"}]
    manifests.extra += [
        modelpool_manifest("code").peak(interactive=10).dict(),
        acme_budget("other"),
        acme_secret("other-key"),
    ]
    file = write_manifests(tmp_path / "set.yaml", manifests.documents())

    code, out, _ = run_cli(capsys, "validate", "-f", str(file))

    assert (code, out) == (
        1,
        [
            f"{file}: TierPolicy/tiers: spec.classification[0].tier: tier 'batcj' is not in "
            "spec.tiers (tiers: batch, eval, interactive)"
        ],
    )


def test_a_budget_whose_only_policy_is_invalid_adds_no_line() -> None:
    manifests = valid_set()
    del manifests.budget["spec"]["tierPolicyRef"]
    manifests.policy["spec"]["tiers"][0]["floorPercent"] = 90

    validated = validate_documents(_docs(*manifests.documents()))

    assert [(p.kind, p.path) for p in validated.problems] == [("TierPolicy", "spec.tiers")]


def test_a_wrongly_typed_field_leaves_no_library_error_on_stderr(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    manifests = valid_set()
    manifests.policy["spec"]["tiers"][0]["floorPercent"] = "50"
    file = write_manifests(tmp_path / "set.yaml", manifests.documents())

    code = main(["validate", "-f", str(file)])

    out, err = capfd.readouterr()
    assert code == 1
    assert out.splitlines() == [
        f"{file}: TierPolicy/tiers: spec.tiers[0].floorPercent: must be an integer (got '50')"
    ]
    assert err.splitlines() == ["1 problem found"], err


# --- the pure checks on dicts -------------------------------------------------------------------


def _docs(*bodies: Any) -> list[Document]:
    return [Document("mem", index, body) for index, body in enumerate(bodies, start=1)]


def test_budget_without_ref_uses_the_namespace_only_policy() -> None:
    manifests = valid_set()
    del manifests.budget["spec"]["tierPolicyRef"]

    validated = validate_documents(_docs(*manifests.documents()))

    assert validated.problems == []
    assert validated.tenant_budgets[0].spec.tier_policy_ref is None


def test_namespaces_separate_references() -> None:
    manifests = valid_set()
    for body in manifests.documents():
        body["metadata"]["namespace"] = "team-a"
    other_pool = modelpool_manifest("chat", namespace="team-b").dict()

    validated = validate_documents(_docs(*manifests.documents(), other_pool))

    assert [(p.path, p.reason.split(" (")[0]) for p in validated.problems] == [
        ("spec.tierPolicyRef.name", "TierPolicy 'tiers' not found in namespace 'team-b'")
    ]


def test_objects_without_namespace_are_in_default() -> None:
    manifests = valid_set()
    for body in manifests.documents():
        body["metadata"].pop("namespace", None)

    validated = validate_documents(_docs(*manifests.documents()))

    assert validated.problems == []


def test_duplicate_objects_are_reported() -> None:
    manifests = valid_set()

    validated = validate_documents(
        _docs(*manifests.documents(), standard_tierpolicy_manifest().dict())
    )

    assert [p.format() for p in validated.problems] == [
        "mem: TierPolicy/tiers: metadata.name: duplicate TierPolicy in namespace 'default' "
        "(first in mem)"
    ]


def test_a_key_secret_without_the_operator_label_is_reported() -> None:
    manifests = valid_set()
    del manifests.secret["metadata"]["labels"]

    validated = validate_documents(_docs(*manifests.documents()))

    assert [(p.path, p.reason.split(" (")[0]) for p in validated.problems] == [
        (
            "spec.apiKeySecretRef.name",
            "Secret 'acme-key' lacks the label kvpool.dev/api-key: \"true\"",
        )
    ]


def test_a_tenant_may_have_several_keys_during_a_rotation() -> None:
    manifests = valid_set()
    manifests.secret["stringData"] = {"next": "sk-new"}
    manifests.budget["spec"]["apiKeySecretRefs"] = [{"name": "acme-key", "key": "next"}]

    validated = validate_documents(_docs(*manifests.documents()))

    assert validated.problems == []
    (budget,) = validated.tenant_budgets
    assert [(path, ref.key) for path, ref in budget.key_refs()] == [
        ("spec.apiKeySecretRef", "api-key"),
        ("spec.apiKeySecretRefs[0]", "next"),
    ]


def test_string_data_satisfies_the_key_reference() -> None:
    manifests = valid_set()
    manifests.secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "acme-key", "labels": {"kvpool.dev/api-key": "true"}},
        "stringData": {"api-key": "plain"},
    }

    validated = validate_documents(_docs(*manifests.documents()))

    assert validated.problems == []
    assert dict(validated.secrets[0].values) == {"api-key": "plain"}


# --- the CEL rules, one by one --------------------------------------------------------------------


def _rules_in_crds() -> set[str]:
    rules: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            rules.update(entry["rule"] for entry in node.get("x-kubernetes-validations", []))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(build_crds())
    return rules


_TIERS_OK = {"tiers": [{"name": "a", "floorPercent": 60}, {"name": "b", "floorPercent": 40}]}
_TIERS_DUP = {"tiers": [{"name": "a", "floorPercent": 10}, {"name": "a", "floorPercent": 10}]}
_TIERS_OVER = {"tiers": [{"name": "a", "floorPercent": 60}, {"name": "b", "floorPercent": 41}]}
_WORKLOAD = {"promptTokens": {"p95": 3000}, "outputTokens": {"p95": 1000}}

# rule fragment -> (a value it accepts, a value it rejects); every rule in the CRDs is here.
CEL_RULES: dict[str, tuple[str, Any, Any]] = {
    "unique-tier-names": ("exists_one", _TIERS_OK, _TIERS_DUP),
    "floors-sum": (".sum() <= 100", _TIERS_OK, _TIERS_OVER),
    "classification-tiers": (
        "self.classification.all",
        {**_TIERS_OK, "classification": [{"tier": "b"}]},
        {**_TIERS_OK, "classification": [{"tier": "b"}, {"tier": "c"}]},
    ),
    "classification-absent": (
        "!has(self.classification)",
        _TIERS_OK,
        {**_TIERS_OK, "classification": [{"tier": "z"}]},
    ),
    "at-most-4-tiers": ("size(self) <= 4", [1, 2, 3, 4], [1, 2, 3, 4, 5]),
    "p95-at-least-mean": ("self.p95 >= self.mean", {"mean": 5, "p95": 5}, {"mean": 5, "p95": 4}),
    "max-at-least-min": (
        "self.maxReplicas >= self.minReplicas",
        {"minReplicas": 2, "maxReplicas": 2},
        {"minReplicas": 2, "maxReplicas": 1},
    ),
    "kv-target-at-least-1": ("self >= 1", 1, 0),
    "lengths-fit": (
        "<= self.engine.maxModelLen",
        {"workload": _WORKLOAD, "engine": {"maxModelLen": 4000}},
        {"workload": _WORKLOAD, "engine": {"maxModelLen": 3999}},
    ),
    "window-days": ("self.window.endsWith('d')", {"window": "31d"}, {"window": "32d"}),
    "window-hours": ("self.window.endsWith('d')", {"window": "744h"}, {"window": "745h"}),
    "window-minutes": ("self.window.endsWith('d')", {"window": "1m"}, {"window": "0m"}),
    "window-seconds": ("self.window.endsWith('d')", {"window": "60s"}, {"window": "59s"}),
    "env-one-source": (
        "has(self.fieldRef)].filter",
        {"secretKeyRef": {"name": "s", "key": "k"}},
        {"secretKeyRef": {"name": "s", "key": "k"}, "fieldRef": {"fieldPath": "x"}},
    ),
    "env-value-or-value-from": (
        "has(self.valueFrom) && has(self.value)",
        {"name": "A", "value": "", "valueFrom": {}},
        {"name": "A", "value": "x", "valueFrom": {}},
    ),
    "env-from-one-source": (
        "has(self.secretRef) != has(self.configMapRef)",
        {"secretRef": {"name": "s"}},
        {"secretRef": {"name": "s"}, "configMapRef": {"name": "c"}},
    ),
    "tenant-has-a-key": (
        "size(self.apiKeySecretRefs) > 0",
        {"apiKeySecretRefs": [{"name": "s", "key": "k"}]},
        {"apiKeySecretRefs": []},
    ),
    "tenant-at-most-4-keys": (
        "size(self.apiKeySecretRefs) < 4",
        {"apiKeySecretRef": {}, "apiKeySecretRefs": [{}, {}, {}]},
        {"apiKeySecretRef": {}, "apiKeySecretRefs": [{}, {}, {}, {}]},
    ),
    "lifecycle-one-action": (
        "has(self.sleep)].filter",
        {"sleep": {"seconds": 5}},
        {"sleep": {"seconds": 5}, "exec": {"command": ["x"]}},
    ),
}


def _rule(fragment: str) -> str:
    (rule,) = [r for r in _rules_in_crds() if fragment in r]
    return rule


@pytest.mark.parametrize(("fragment", "good", "bad"), CEL_RULES.values(), ids=CEL_RULES.keys())
def test_each_cel_rule_passes_and_fails(fragment: str, good: Any, bad: Any) -> None:
    rule = _rule(fragment)

    assert (assess_rule(rule, good), assess_rule(rule, bad)) == (True, False)


def test_every_cel_rule_in_the_crds_has_a_case() -> None:
    covered = {_rule(fragment) for fragment, _, _ in CEL_RULES.values()}

    assert covered == _rules_in_crds()


def _entries_in_crds() -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            entries.extend(node.get("x-kubernetes-validations", []))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(build_crds())
    return entries


# rule id (as in CEL_RULES) -> what its messageExpression says about the rejected value
NAMED_VALUES = {
    "unique-tier-names": "tier names must be unique; repeated: a, a",
    "floors-sum": "must sum to at most 100, not 101 (a 60, b 41)",
    "classification-tiers": "defined in spec.tiers (a, b); not defined: c",
    "classification-absent": "defined in spec.tiers (a, b); not defined: z",
    "p95-at-least-mean": "p95 (4) must be greater than or equal to mean (5)",
    "max-at-least-min": "maxReplicas (1) must be greater than or equal to minReplicas (2)",
    "kv-target-at-least-1": "kvUtilizationTarget must be at least 1 (got 0)",
    "lengths-fit": "3000 + 1000 = 4000 tokens, over maxModelLen 3999",
    "window-days": "window must be between 1m and 31d (got 32d)",
    "window-seconds": "window must be between 1m and 31d (got 59s)",
}


@pytest.mark.parametrize(("case", "expected"), NAMED_VALUES.items(), ids=NAMED_VALUES.keys())
def test_a_message_expression_names_the_values_of_a_failing_object(
    case: str, expected: str
) -> None:
    fragment, _, bad = CEL_RULES[case]
    entry = next(e for e in _entries_in_crds() if e["rule"] == _rule(fragment))

    assert expected in rule_message(entry, bad)


def test_rules_without_a_message_expression_need_no_value() -> None:
    plain = {e["message"] for e in _entries_in_crds() if "messageExpression" not in e}

    assert all(
        m.startswith(("exactly one of", "a tenant needs an API key", "at most 4"))
        or "exclusive" in m
        for m in plain
    ), plain


RULE_ERRORS = {
    "missing-field": ("self.p95 >= self.mean", {"p95": 1}),
    "syntax": ("self.p95 >=", {"p95": 1}),
    "not-a-boolean": ("self.p95", {"p95": 1}),
}


@pytest.mark.parametrize(("rule", "value"), RULE_ERRORS.values(), ids=RULE_ERRORS.keys())
def test_a_rule_that_cannot_be_evaluated_says_why(rule: str, value: Any) -> None:
    verdict = assess_rule(rule, value)

    assert isinstance(verdict, str)
    assert verdict


# --- the shipped examples -------------------------------------------------------------------------


def test_examples_are_valid(capsys: pytest.CaptureFixture[str]) -> None:
    documents = [
        doc
        for file in sorted(EXAMPLES.rglob("*.yaml"))
        if file.name != "compose.yaml"  # examples/compose/: skipped, with a note
        for doc in yaml.safe_load_all(file.read_text(encoding="utf-8"))
        if doc is not None
    ]

    code, out, err = run_cli(capsys, "validate", "-f", str(EXAMPLES))

    assert documents, "examples/ has no manifests"
    assert (code, out) == (0, [f"{len(documents)} objects valid"]), err
    assert err.splitlines() == [
        f"note: skipped 1 document kvpool does not check: compose file "
        f"({EXAMPLES / 'compose' / 'compose.yaml'})"
    ]


# --- one API key, one tenant ---------------------------------------------------------------------

DUPLICATE_KEY_CASES = [
    pytest.param(
        [apikey_secret_manifest("shared", "api-key", "sk-same")],
        {"alice": ("shared", "api-key"), "zed": ("shared", "api-key")},
        id="two-budgets-on-one-secret-key",
    ),
    pytest.param(
        [
            apikey_secret_manifest("alice-key", "api-key", "sk-same"),
            apikey_secret_manifest("zed-key", "api-key", "sk-same\n"),  # echo's newline
        ],
        {"alice": ("alice-key", "api-key"), "zed": ("zed-key", "api-key")},
        id="two-secrets-with-equal-values",
    ),
]


@pytest.mark.parametrize(("secrets", "refs"), DUPLICATE_KEY_CASES)
def test_one_api_key_for_two_tenants_is_refused_naming_the_other(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    secrets: list[dict[str, Any]],
    refs: dict[str, tuple[str, str]],
) -> None:
    budgets = [
        tenantbudget_manifest(tenant).spec(apiKeySecretRef={"name": name, "key": key}).dict()
        for tenant, (name, key) in refs.items()
    ]
    policy = standard_tierpolicy_manifest().dict()
    file = write_manifests(tmp_path / "set.yaml", [policy, *budgets, *secrets])

    code, out, err = run_cli(capsys, "validate", "-f", str(file))

    assert code == 1, f"kvpool validate accepted one key for alice and zed: {out} {err}"
    assert len(out) == 2, out
    alice, zed = sorted(out)
    assert "TenantBudget/alice: spec.apiKeySecretRef" in alice and "TenantBudget/zed" in alice
    assert "TenantBudget/zed: spec.apiKeySecretRef" in zed and "TenantBudget/alice" in zed
