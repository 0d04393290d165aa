"""What of the kind e2e can be checked without Docker: its manifests and its early exits.

e2e/kind/run.sh cannot run on the development machines (no Docker engine), so these tests
keep its inputs honest: the manifests it applies are valid (kvpool's own checks for the
custom resources, kubernetes-validate for the built-in ones), the Prometheus scrape config
copies the pod labels the operator queries by, and the script stops at once, saying what
is missing, when a tool is absent.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from kvpool.adapters.prometheus import LABEL_NAMESPACE, LABEL_POOL, LABEL_REPLICA, LABEL_REVISION
from kvpool.commands.manifests import load_and_validate
from kvpool.domain.manifests import LABEL_POOL as POD_LABEL_POOL
from kvpool.domain.manifests import LABEL_REVISION as POD_LABEL_REVISION

REPO = Path(__file__).resolve().parents[1]
KIND = REPO / "e2e" / "kind"
RUN_SH = KIND / "run.sh"


def load_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]


def test_the_resources_run_sh_applies_are_valid_together() -> None:
    paths = [
        REPO / "examples" / "tierpolicy.yaml",
        REPO / "examples" / "tenants.yaml",
        KIND / "modelpool-tiny.yaml",
    ]
    validated = load_and_validate([str(p) for p in paths])
    assert validated.ok, [p.format() for p in validated.problems]
    assert validated.object_count == sum(len(load_docs(p)) for p in paths)


@pytest.mark.parametrize(
    "doc",
    [
        pytest.param(d, id=f"{d['kind']}-{d['metadata']['name']}")
        for d in load_docs(KIND / "prometheus.yaml")
    ],
)
def test_prometheus_manifests_are_valid_kubernetes(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def test_prometheus_relabels_pod_labels_to_what_the_operator_queries() -> None:
    configmap = next(d for d in load_docs(KIND / "prometheus.yaml") if d["kind"] == "ConfigMap")
    scrape = yaml.safe_load(configmap["data"]["prometheus.yml"])["scrape_configs"][0]
    copied = {
        rule["target_label"]: rule["source_labels"][0]
        for rule in scrape["relabel_configs"]
        if rule.get("target_label") and rule["target_label"] != "__address__"
    }

    def meta(pod_label: str) -> str:
        """Prometheus' name for a pod label (non-alphanumerics become underscores)."""
        return "__meta_kubernetes_pod_label_" + "".join(
            c if c.isalnum() else "_" for c in pod_label
        )

    assert copied[LABEL_POOL] == meta(POD_LABEL_POOL)
    assert copied[LABEL_REVISION] == meta(POD_LABEL_REVISION)
    assert copied[LABEL_NAMESPACE] == "__meta_kubernetes_namespace"
    assert copied[LABEL_REPLICA] == "__meta_kubernetes_pod_name"


def test_run_sh_is_shellcheck_clean() -> None:
    if shutil.which("shellcheck") is None:
        if os.environ.get("CI"):
            pytest.fail("shellcheck missing: make system-deps installs it")
        pytest.skip("shellcheck not installed (make system-deps)")
    result = subprocess.run(
        ["shellcheck", str(RUN_SH)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize(
    ("present", "named_missing"),
    [
        pytest.param((), ("docker", "kind", "helm", "kubectl"), id="nothing-installed"),
        pytest.param(("docker", "kubectl", "curl"), ("kind", "helm"), id="no-kind-no-helm"),
    ],
)
def test_run_sh_stops_at_once_naming_missing_tools(
    tmp_path: Path, present: tuple[str, ...], named_missing: tuple[str, ...]
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "mktemp", "rm", *present):
        (bin_dir / tool).symlink_to(shutil.which(tool) or "/bin/false")
    result = subprocess.run(
        ["bash", str(RUN_SH)],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
        env={**os.environ, "PATH": str(bin_dir)},
    )
    assert result.returncode == 2, result.stderr
    for tool in named_missing:
        assert f"  - {tool} " in result.stderr, result.stderr
    for tool in present:
        assert f"  - {tool} " not in result.stderr
