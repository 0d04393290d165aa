"""Checks within one object that neither the schema nor a CEL rule can express.

Each looks at an object already parsed into its model and says what a user would want
to hear before the operator acts on it:

- TenantBudget: two limits over the same window spelled differently (``1h`` and
  ``60m``) - the list-map key sees two windows, the gateway would enforce one twice;
  the same Secret key referenced twice among its API keys;
- TierPolicy: a classification rule without any matcher matches every request, so the
  rules after it can never match;
- ModelPool: engine ``args`` that repeat a flag the operator sets from a typed field
  (``--max-model-len`` from ``engine.maxModelLen``...), a declared
  ``kvTokensPerReplica`` too small to hold one ``maxModelLen`` sequence (vLLM refuses to
  start such an engine), volumes without a (unique) name and mounts naming no volume, a
  ``tokenizerPath`` under ``/dev``, ``/proc`` or ``/sys`` (a device or kernel file, never
  a tokenizer.json: ``/dev/zero`` grew the gateway to 2 GB in a second; ``kvpool
  validate`` also refuses a FIFO or device it finds at the path on this machine).

Worked example: limits ``[{window: 1h, tokens: 100}, {window: 60m, tokens: 50}]`` give
``Finding("spec.limits[1].window", "'60m' is the same window as spec.limits[0].window
('1h'); keep one limit per window")``.

Two CEL rules of TierPolicy judge a whole list, so an API server can only name the
values at fault; :func:`explain_rule_findings` replaces their one finding with one per
entry at fault, with its index (``spec.classification[2].tier: tier 'evl' is not in
spec.tiers (tiers: batch, eval, interactive)``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kvpool.api.common import parse_duration
from kvpool.api.modelpool import ModelPool
from kvpool.api.tenantbudget import TenantBudget
from kvpool.api.tierpolicy import RULE_CLASSIFICATION_TIERS, RULE_UNIQUE_TIER_NAMES, TierPolicy
from kvpool.api.validation.results import Finding
from kvpool.api.validation.rules import UNEVALUATED

# Where no tokenizer.json lives: devices and kernel files (reading them never ends).
SPECIAL_FILE_ROOTS = ("/dev/", "/proc/", "/sys/")

# Engine flags the operator derives from typed ModelPool fields.
OWNED_ENGINE_FLAGS = {
    "--max-model-len": "spec.engine.maxModelLen",
    "--max-num-seqs": "spec.engine.maxNumSeqs",
    "--port": "spec.engine.port",
    "--model": "spec.model.name",
    "--served-model-name": "spec.model.servedName",
}


def check_tenant_budget(budget: TenantBudget) -> list[Finding]:
    """Limits whose windows are equal in length but written differently, and an API key
    referenced twice."""
    findings = []
    first_ref: dict[tuple[str, str], str] = {}
    for path, ref in budget.key_refs():
        where = first_ref.setdefault((ref.name, ref.key), path)
        if where != path:
            findings.append(
                Finding(
                    path,
                    f"key {ref.key!r} of Secret {ref.name!r} is already {where}; "
                    "list each key once",
                )
            )
    first_of: dict[float, int] = {}
    for index, limit in enumerate(budget.spec.limits):
        seconds = parse_duration(limit.window)
        if seconds not in first_of:
            first_of[seconds] = index
            continue
        earlier = budget.spec.limits[first_of[seconds]].window
        if earlier != limit.window:  # identical spellings are the list-map check's
            findings.append(
                Finding(
                    f"spec.limits[{index}].window",
                    f"{limit.window!r} is the same window as "
                    f"spec.limits[{first_of[seconds]}].window ({earlier!r}); "
                    "keep one limit per window",
                )
            )
    return findings


def check_tier_policy(policy: TierPolicy) -> list[Finding]:
    """Classification rules that can never match because a catch-all precedes them."""
    rules = policy.spec.classification
    for index, rule in enumerate(rules):
        if rule.path_prefix is None and rule.host is None and rule.tenant_selector is None:
            return [
                Finding(
                    f"spec.classification[{later}]",
                    f"unreachable: spec.classification[{index}] has no matcher, "
                    "so it matches every request first",
                )
                for later in range(index + 1, len(rules))
            ]
    return []


def _volume_findings(pool: ModelPool) -> list[Finding]:
    """Volumes (kept as given, not typed) need a unique name; mounts must name one."""
    engine = pool.spec.engine
    findings, names = [], set()
    for index, volume in enumerate(engine.volumes):
        name = volume.get("name")
        if not isinstance(name, str) or not name:
            findings.append(Finding(f"spec.engine.volumes[{index}].name", "required"))
        elif name in names:
            findings.append(Finding(f"spec.engine.volumes[{index}].name", f"duplicate {name!r}"))
        names.add(name)
    for index, mount in enumerate(engine.volume_mounts):
        if mount.name not in names:
            findings.append(
                Finding(
                    f"spec.engine.volumeMounts[{index}].name",
                    f"no volume {mount.name!r} in spec.engine.volumes",
                )
            )
    return findings


def _tokenizer_path_findings(path: str | None) -> list[Finding]:
    """A tokenizerPath under a device or kernel file system.

    >>> _tokenizer_path_findings("/dev/zero")[0].reason.split(";")[0]
    "'/dev/zero' is a device or kernel file (under /dev/), not a tokenizer.json"
    >>> _tokenizer_path_findings("/models/llama/tokenizer.json")
    []
    """
    if path is None:
        return []
    normal = "/" + "/".join(part for part in path.split("/") if part not in ("", "."))
    root = next((r for r in SPECIAL_FILE_ROOTS if (normal + "/").startswith(r)), None)
    if root is None:
        return []
    return [
        Finding(
            "spec.model.tokenizerPath",
            f"{path!r} is a device or kernel file (under {root}), not a tokenizer.json; "
            "point it to the model's tokenizer.json (a regular file) or the folder holding it",
        )
    ]


def check_model_pool(pool: ModelPool) -> list[Finding]:
    """Engine args that fight typed fields, and a declared KV size below one sequence."""
    findings = []
    for index, arg in enumerate(pool.spec.engine.args):
        flag = arg.split("=", 1)[0]
        if flag in OWNED_ENGINE_FLAGS:
            findings.append(
                Finding(
                    f"spec.engine.args[{index}]",
                    f"{flag} is set from {OWNED_ENGINE_FLAGS[flag]}; remove it from args",
                )
            )
    findings += _volume_findings(pool)
    findings += _tokenizer_path_findings(pool.spec.model.tokenizer_path)
    declared = pool.spec.capacity.kv_tokens_per_replica
    max_len = pool.spec.engine.max_model_len
    if declared is not None and declared < max_len:
        findings.append(
            Finding(
                "spec.capacity.kvTokensPerReplica",
                f"{declared} KV tokens cannot hold one sequence of engine.maxModelLen "
                f"{max_len} (vLLM refuses to start such an engine)",
            )
        )
    return findings


def _entries(spec: Any, field: str) -> list[tuple[int, Mapping[str, Any]]]:
    items = spec.get(field) if isinstance(spec, Mapping) else None
    if not isinstance(items, list):
        return []
    return [(index, item) for index, item in enumerate(items) if isinstance(item, Mapping)]


def _tier_names(spec: Any) -> list[str]:
    return [str(t.get("name")) for _, t in _entries(spec, "tiers")]


def _unknown_classification_tiers(spec: Any) -> list[Finding]:
    """``spec.classification[i].tier`` for each rule naming a tier not in ``spec.tiers``."""
    names = _tier_names(spec)
    listed = ", ".join(sorted(names))
    return [
        Finding(
            f"spec.classification[{index}].tier",
            f"tier {rule.get('tier')!r} is not in spec.tiers (tiers: {listed})",
        )
        for index, rule in _entries(spec, "classification")
        if rule.get("tier") not in names
    ]


def _repeated_tier_names(spec: Any) -> list[Finding]:
    """``spec.tiers[i].name`` for each tier whose name an earlier tier already has."""
    first: dict[str, int] = {}
    findings = []
    for index, tier in _entries(spec, "tiers"):
        name = str(tier.get("name"))
        if name in first:
            findings.append(
                Finding(
                    f"spec.tiers[{index}].name",
                    f"tier name {name!r} is also the name of spec.tiers[{first[name]}]; "
                    "tier names must be unique",
                )
            )
        else:
            first[name] = index
    return findings


# rule -> the per-entry findings that replace its one finding (given the object's spec)
_EXPLAINERS: dict[str, Callable[[Any], list[Finding]]] = {
    RULE_CLASSIFICATION_TIERS: _unknown_classification_tiers,
    RULE_UNIQUE_TIER_NAMES: _repeated_tier_names,
}


def explain_rule_findings(body: Mapping[str, Any], findings: list[Finding]) -> list[Finding]:
    """``findings`` with each violated list-wide rule replaced by one finding per entry at
    fault (index and value); other findings, and rules that could not be evaluated, stay.

    >>> spec = {"tiers": [{"name": "a"}], "classification": [{"tier": "a"}, {"tier": "b"}]}
    >>> found = Finding("spec.classification", "...", rule=RULE_CLASSIFICATION_TIERS)
    >>> [(f.path, f.reason) for f in explain_rule_findings({"spec": spec}, [found])]
    [('spec.classification[1].tier', "tier 'b' is not in spec.tiers (tiers: a)")]
    """
    out: list[Finding] = []
    for finding in findings:
        explain = _EXPLAINERS.get(finding.rule or "")
        violated = explain is not None and UNEVALUATED not in finding.reason
        precise = explain(body.get("spec")) if explain is not None and violated else []
        out.extend(precise or [finding])
    return out
