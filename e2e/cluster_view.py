"""What the demo applies to, and reads back from, the Kubernetes API - and how it shows it.

Why this module exists: the demo must show the operator's work as a user sees it (the
ModelPool status, ``kubectl get kvpool -A``, the compiled ConfigMap), and must fill the
machine-specific facts into the demo manifests (the engines' URLs, the model's path) before
applying them. Reading and printing are kept here so e2e/local_demo.py reads as a story.
Functions that print take a ``say`` callable (the narrator).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from tests.support.kube import KubeApi, KubeApiError, resource_path
from tests.support.prometheus import ScrapeTarget

from e2e.components import NAMESPACE, POOL, REPO, kvpool_command
from kvpool.api.admission_config import CONFIGMAP_KEY, CONFIGMAP_NAME, AdmissionConfig

MANIFESTS = REPO / "e2e" / "manifests"
STATIC_ENDPOINTS = "kvpool.dev/static-endpoints"  # local mode: engine URLs without pods
API = "kvpool.dev/v1alpha1"
Say = Callable[[str], None]


def validate_manifests(say: Say) -> None:
    """``kvpool validate`` on the demo manifests, exactly as a user would before applying."""
    result = subprocess.run(
        kvpool_command("validate", "-f", str(MANIFESTS)),
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )
    say(f"$ kvpool validate -f e2e/manifests\n{result.stdout.strip()}")
    if result.returncode != 0:
        raise SystemExit(f"the demo manifests do not validate:\n{result.stderr}")


def load_manifests(directory: Path = MANIFESTS) -> list[dict[str, Any]]:
    """Every document of ``directory/*.yaml`` in file order."""
    return [
        doc
        for path in sorted(directory.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if isinstance(doc, dict)
    ]


def find_doc(docs: Sequence[Mapping[str, Any]], kind: str, name: str) -> Mapping[str, Any]:
    """The one document of ``kind`` named ``name``."""
    for doc in docs:
        if doc.get("kind") == kind and doc["metadata"]["name"] == name:
            return doc
    raise LookupError(f"no {kind} {name} in {MANIFESTS}")


def api_key(docs: Sequence[Mapping[str, Any]], secret: str) -> str:
    """A tenant's API key, read from its Secret in the manifests."""
    return str(find_doc(docs, "Secret", secret)["stringData"]["api-key"])


def build_local_manifests(
    docs: Sequence[dict[str, Any]], model_dir: Path, engine_ports: Sequence[int]
) -> list[dict[str, Any]]:
    """The manifests with this machine's facts filled in (the ModelPool only):

    the engines' URLs in ``kvpool.dev/static-endpoints``, the model and tokenizer paths,
    and ``minReplicas`` = the number of engines started (no peaks are declared, so the
    plan keeps ``minReplicas`` warm).
    """
    rendered: list[dict[str, Any]] = json.loads(json.dumps(docs))
    for doc in rendered:
        if doc.get("kind") != "ModelPool":
            continue
        endpoints = ",".join(
            f"engine-{i}=http://127.0.0.1:{port}" for i, port in enumerate(engine_ports)
        )
        doc["metadata"].setdefault("annotations", {})[STATIC_ENDPOINTS] = endpoints
        doc["spec"]["model"]["name"] = str(model_dir)
        doc["spec"]["model"]["tokenizerPath"] = str(model_dir / "tokenizer.json")
        doc["spec"]["capacity"]["minReplicas"] = len(engine_ports)
    return rendered


def write_manifests(docs: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Write documents as one multi-document YAML file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return path


def fetch_pool(kube: KubeApi) -> dict[str, Any]:
    """The ModelPool as the API has it (spec and status)."""
    body: dict[str, Any] = kube.client.get(resource_path(API, "modelpools", NAMESPACE, POOL))
    return body


def fetch_admission_config(kube: KubeApi) -> AdmissionConfig | None:
    """The compiled config the operator published (None until it exists)."""
    try:
        body = kube.client.get(resource_path("v1", "configmaps", NAMESPACE, CONFIGMAP_NAME))
    except KubeApiError as exc:
        if exc.status == 404:
            return None
        raise
    return AdmissionConfig.model_validate_json(body["data"][CONFIGMAP_KEY])


def fetch_engine_template_labels(kube: KubeApi) -> dict[str, str]:
    """Pod-template labels of the pool's engine Deployment (what its pods would carry)."""
    deployments = kube.client.get(resource_path("apps/v1", "deployments", NAMESPACE))
    for item in deployments.get("items", []):
        labels = item["metadata"].get("labels") or {}
        if labels.get("kvpool.dev/pool") == POOL:
            template_labels: dict[str, str] = item["spec"]["template"]["metadata"]["labels"]
            return template_labels
    return {}


def build_scrape_targets(
    addresses: Sequence[str], pod_labels: Mapping[str, str]
) -> list[ScrapeTarget]:
    """Each engine with the labels kubernetes_sd + relabeling would give its pod's series.

    ``kvpool.dev/pool: tiny`` becomes ``kvpool_pool="tiny"`` (likewise revision, track);
    the namespace and the pod name (here: the static endpoint's name) are added.
    """
    copied = {
        "kvpool_" + key.removeprefix("kvpool.dev/"): value
        for key, value in pod_labels.items()
        if key.startswith("kvpool.dev/")
    }
    return [
        ScrapeTarget(address, {**copied, "namespace": NAMESPACE, "pod": f"engine-{i}"})
        for i, address in enumerate(addresses)
    ]


def pool_when(
    kube: KubeApi, condition: Callable[[Mapping[str, Any]], bool]
) -> dict[str, Any] | None:
    """The ModelPool if ``condition`` holds for it now, else None (for :func:`wait_until`)."""
    pool = fetch_pool(kube)
    return pool if condition(pool) else None


def planned(pool: Mapping[str, Any]) -> bool:
    """True once the status carries a plan."""
    return bool((pool.get("status") or {}).get("plan"))


def measured(pool: Mapping[str, Any], engines: int) -> bool:
    """True once the status plans with the engines' measured capacity."""
    capacity = (pool.get("status") or {}).get("capacity") or {}
    return capacity.get("source") == "Measured" and (capacity.get("replicasMeasured") or 0) >= (
        engines
    )


def published_config(kube: KubeApi, engines: int) -> AdmissionConfig | None:
    """The published config once it matches the pool's measured plan, else None."""
    config = fetch_admission_config(kube)
    return config if config_matches(config, fetch_pool(kube), engines) else None


def config_matches(config: AdmissionConfig | None, pool: Mapping[str, Any], engines: int) -> bool:
    """True once the published config carries the measured plan and every engine."""
    if config is None or not config.pools:
        return False
    plan = (pool.get("status") or {}).get("plan") or {}
    compiled = config.pools[0]
    endpoints = sum(len(t.endpoints) for t in compiled.tracks)
    return compiled.tokens_per_replica == plan.get("usableKvTokensPerReplica") and (
        endpoints == engines
    )


def show_plan(say: Say, pool: Mapping[str, Any]) -> None:
    """The pool's capacity figure and per-tier plan, from its status."""
    status = pool.get("status") or {}
    capacity = status.get("capacity") or {}
    plan = status.get("plan") or {}
    say(
        f"status.capacity: {capacity.get('kvTokensPerReplica')} KV tokens/replica, "
        f"source {capacity.get('source')}, revision {capacity.get('revision')}, "
        f"replicas measured {capacity.get('replicasMeasured', '-')}"
    )
    say(
        f"status.plan: {plan.get('replicas')} replica(s) x "
        f"{plan.get('usableKvTokensPerReplica')} usable tokens, "
        f"{plan.get('liveSequencesPerReplica')} live p95 sequences and "
        f"{plan.get('slotsPerReplica')} admission slots each; "
        f"shared {plan.get('sharedTokens')} tokens / {plan.get('sharedSlots')} slots"
    )
    for tier in plan.get("tiers", []):
        say(
            f"  {tier['name']:<12} floor {tier['floorTokens']:>5} tokens {tier['floorSlots']:>2}"
            f" slots, lendable {tier['lendableTokens']:>5} tokens {tier['lendableSlots']:>2} slots"
        )
    for cond in status.get("conditions", []):
        say(f"  condition {cond['type']}={cond['status']} ({cond['reason']})")


def show_kubectl(say: Say, kube: KubeApi, *args: str) -> None:
    """Run kubectl against the emulator and print its output."""
    result = kube.kubectl(*args, check=False)
    say(f"$ kubectl {' '.join(args)}\n{(result.stdout or result.stderr).rstrip()}")


def show_admission_config(say: Say, config: AdmissionConfig) -> None:
    """A summary of the compiled ConfigMap the gateway will load."""
    say(
        f"ConfigMap {NAMESPACE}/{CONFIGMAP_NAME} (formatVersion {config.format_version}, "
        f"generated {config.generated_at}):"
    )
    for pool in config.pools:
        endpoints = ", ".join(f"{e.name}={e.url}" for t in pool.tracks for e in t.endpoints)
        say(
            f"  pool {pool.name} (model '{pool.served_name}'): {pool.replicas} replica(s), "
            f"{pool.tokens_per_replica} tokens and {pool.slots_per_replica} slots per replica, "
            f"planOk {pool.plan_ok}; endpoints {endpoints or '-'}"
        )
        for name, tier in pool.tiers.items():
            say(f"    {name:<12} floor {tier.floor_tokens:>5} tokens {tier.floor_slots:>2} slots")
    for tenant in config.tenants:
        say(
            f"  tenant {tenant.tenant}: tiers {tenant.tiers}, key sha256 "
            f"{tenant.key_sha256[:12]}..., limits "
            + ", ".join(f"{w.tokens} tokens/{w.window_seconds:.0f}s" for w in tenant.limits)
        )
