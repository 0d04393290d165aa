"""``kvpool compile`` writes exactly what the operator publishes for the same manifests.

Given examples/ applied to the API emulator with the operator running (local mode: the
pool's engines from its ``kvpool.dev/static-endpoints`` annotation, no Prometheus, so the
pools are planned on their declared KV capacity), the ConfigMap ``kvpool-admission`` and
``kvpool compile -f examples/ --endpoints ...`` with the same endpoints must be the same
document (``generatedAt`` aside). The gateway started on the compiled file serves a
completion: tests/integration/test_gateway_without_operator.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.operator_process import run_operator
from tests.support.kube import KubeApi, resource_path
from tests.support.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
ENDPOINTS = "e1=http://127.0.0.1:9001,e2=http://127.0.0.1:9002"
PLURALS = {"ModelPool": "modelpools", "TierPolicy": "tierpolicies",
           "TenantBudget": "tenantbudgets", "Secret": "secrets"}  # fmt: skip


def apply_examples(kube: KubeApi) -> None:
    for file in sorted(EXAMPLES.glob("*.yaml")):
        for doc in yaml.safe_load_all(file.read_text()):
            if not doc:
                continue
            if doc["kind"] == "ModelPool" and doc["metadata"]["name"] == "llama-8b":
                doc["metadata"]["annotations"] = {"kvpool.dev/static-endpoints": ENDPOINTS}
            path = resource_path(doc["apiVersion"], PLURALS[doc["kind"]], "llm")
            kube.client.create(path, doc)


def published(kube: KubeApi) -> dict[str, Any] | None:
    cm = kube.client.request("GET", resource_path("v1", "configmaps", "llm", "kvpool-admission"))
    if cm.status != 200:
        return None
    config: dict[str, Any] = json.loads(cm.body["data"]["config.json"])
    complete = len(config["tenants"]) == 3 and all(p["planOk"] for p in config["pools"])
    endpoints = [p["tracks"][0]["endpoints"] for p in config["pools"] if p["name"] == "llama-8b"]
    return config if complete and endpoints and endpoints[0] else None


def without_time(config: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k != "generatedAt"}


def test_compile_writes_what_the_operator_publishes(kube_api: KubeApi, tmp_path: Path) -> None:
    with run_operator(kube_api, tmp_path):
        apply_examples(kube_api)
        from_operator = wait_until(lambda: published(kube_api), timeout=60)

    out = tmp_path / "config.json"
    done = subprocess.run(
        [sys.executable, "-m", "kvpool.cli", "compile", "-f", str(EXAMPLES),
         "--endpoints", f"llama-8b={ENDPOINTS}", "-o", str(out)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    compiled = json.loads(out.read_text())
    assert without_time(compiled) == without_time(from_operator)
    assert compiled["generatedAt"].endswith("Z")
    assert "ModelPool llm/llama-70b has no endpoints" in done.stderr
