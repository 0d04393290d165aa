"""``kvpool tenant create --apply`` through a real kubectl against the API emulator: the
Secret and the TenantBudget land in the cluster, the key is printed once and is the one
stored, and a failing kubectl is exit 1 with its own message."""

from __future__ import annotations

import base64
import subprocess
import sys

from tests.support.kube import KubeApi, resource_path


def tenant_create(kube: KubeApi, kubectl: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvpool.cli", "tenant", "create", "acme", "-n", "default",
         "--tier", "interactive", "--tokens-per-minute", "1000", "--apply",
         f"--kubectl={kubectl}", f"--kubectl-arg=--kubeconfig={kube.kubeconfig}",
         f"--kubectl-arg=--cache-dir={kube.kubectl_cache}", "--kubectl-arg=--validate=false",
         *extra],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_apply_creates_both_objects_and_prints_the_stored_key(
    kube_api: KubeApi, kubectl_installed: str
) -> None:
    done = tenant_create(kube_api, kubectl_installed)

    assert done.returncode == 0, done.stderr
    key = done.stdout.strip()
    assert key.startswith("kvp_") and "\n" not in key
    assert "secret/tenant-acme created" in done.stderr
    assert "tenantbudget.kvpool.dev/acme created" in done.stderr
    secret = kube_api.client.get(resource_path("v1", "secrets", "default", "tenant-acme"))
    stored = secret.get("data", {}).get("api-key")
    stored = base64.b64decode(stored).decode() if stored else secret["stringData"]["api-key"]
    assert stored == key
    assert secret["metadata"]["labels"] == {"kvpool.dev/api-key": "true"}
    budget = kube_api.client.get(
        resource_path("kvpool.dev/v1alpha1", "tenantbudgets", "default", "acme")
    )
    assert budget["spec"]["apiKeySecretRef"] == {"name": "tenant-acme", "key": "api-key"}


def test_a_failing_kubectl_is_exit_1_with_its_message(
    kube_api: KubeApi, kubectl_installed: str
) -> None:
    done = tenant_create(kube_api, kubectl_installed, "--kubectl-arg=--server=http://127.0.0.1:1")

    assert done.returncode == 1
    assert done.stdout == ""  # no key printed for objects that were not created
    assert "kubectl apply exited 1" in done.stderr
