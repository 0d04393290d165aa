"""The README's "Production quick start" is true: the chart renders with exactly its values
into what the steps rely on, and every command it shows is one its tool accepts, naming
things that exist (files, the Secret the values read, the Service it port-forwards, the
pool it calls, the tiers it grants). Followed for real on the API emulator:
tests/integration/test_quick_start.py.
"""

from __future__ import annotations

import argparse
import ast
import re
import shlex
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

import kvpool
from kvpool.cli import SUBCOMMANDS
from kvpool.commands import rollout

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def quick_start() -> str:
    start = README.index("## Production quick start")
    return README[start : README.index("\n## ", start + 1)]


def blocks(language: str) -> list[str]:
    found = re.findall(rf"```{language}\n(.*?)```", quick_start(), flags=re.DOTALL)
    return [textwrap_dedent(b) for b in found]


def textwrap_dedent(text: str) -> str:
    lines = text.splitlines()
    indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
    return "\n".join(line[indent:] for line in lines) + "\n"


def commands() -> list[list[str]]:
    return [shlex.split(line) for block in blocks("bash") for line in block.splitlines() if line]


def values() -> dict[str, Any]:
    (block,) = [b for b in blocks("yaml") if b.startswith("# kvpool-values.yaml")]
    loaded: dict[str, Any] = yaml.safe_load(block)
    return loaded


def helm_install() -> list[str]:
    (command,) = [c for c in commands() if c[:3] == ["helm", "install", "kvpool"]]
    return command


def flag(command: list[str], *names: str) -> str:
    for index, word in enumerate(command):
        if word in names:
            return command[index + 1]
    raise AssertionError(f"{names} not in {command}")


def rendered() -> list[dict[str, Any]]:
    command = helm_install()
    chart = helm_python.Chart.load(ROOT / command[3])
    docs = chart.render(values(), name=command[2], namespace=flag(command, "-n"))
    return [d for path, text in docs.items() if path.endswith(".yaml")
            for d in yaml.safe_load_all(text) if d]  # fmt: skip


def by(kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in rendered() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def container(name: str) -> dict[str, Any]:
    found: dict[str, Any] = by("Deployment", name)["spec"]["template"]["spec"]["containers"][0]
    return found


def test_the_first_two_commands_are_still_make_demo_and_make_test() -> None:
    first = re.search(r"```bash\n(.*?)```", README, flags=re.DOTALL)
    assert first is not None
    assert [line.split()[:2] for line in first.group(1).splitlines()] == [
        ["make", "demo"],
        ["make", "test"],
    ]
    assert README.index("## Production quick start") > README.index("make test")


def test_the_values_file_is_the_one_helm_install_reads() -> None:
    command = helm_install()

    assert flag(command, "-f") == "kvpool-values.yaml"
    assert (ROOT / command[3] / "Chart.yaml").exists()
    assert rendered()


def test_redis_comes_from_the_secret_the_steps_create() -> None:
    (create,) = [c for c in commands() if c[4:7] == ["secret", "generic", "kvpool-redis"]]
    namespace = flag(create, "-n")
    (literal,) = [w for w in create if w.startswith("--from-literal=")]
    key, _, url = literal.removeprefix("--from-literal=").partition("=")
    assert url.startswith("redis://:$(kubectl -n redis get secret redis")  # bitnami's Secret

    env = {e["name"]: e for e in container("kvpool-gateway")["env"]}
    assert env["KVPOOL_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "kvpool-redis",
        "key": key,
    }
    assert namespace == flag(helm_install(), "-n")  # the gateway runs in the release namespace
    assert by("Deployment", "kvpool-gateway")["spec"]["replicas"] == 2


def test_prometheus_scrapes_what_the_operator_queries() -> None:
    args = container("kvpool-operator")["args"]

    assert f"--prometheus-url={values()['operator']['prometheusUrl']}" in args
    kinds = {d["kind"] for d in rendered()}
    assert {"ServiceMonitor", "PodMonitor", "PrometheusRule"} <= kinds
    (install,) = [c for c in commands() if c[:3] == ["helm", "install", "kube-prometheus-stack"]]
    monitors = [d for d in rendered() if d["kind"] in {"ServiceMonitor", "PodMonitor",
                                                       "PrometheusRule"}]  # fmt: skip
    # kube-prometheus-stack selects monitors by its release name
    assert all(m["metadata"]["labels"]["release"] == install[2] for m in monitors)
    assert flag(install, "-n") == "monitoring" and "monitoring.svc" in values()["operator"][
        "prometheusUrl"]  # fmt: skip


def test_the_image_is_the_one_make_image_builds_and_pushes() -> None:
    (build,) = [c for c in commands() if c[:2] == ["make", "image"]]
    (push,) = [c for c in commands() if c[:2] == ["docker", "push"]]
    repository = build[2].removeprefix("IMAGE=")

    assert values()["image"]["repository"] == repository
    assert push[2] == f"{repository}:{kvpool.__version__}"
    assert container("kvpool-gateway")["image"] == push[2]


def parse_kvpool(argv: list[str]) -> argparse.Namespace:
    module_name = SUBCOMMANDS[argv[0]][0]
    module = __import__(module_name, fromlist=["add_arguments"])
    parser = argparse.ArgumentParser(prog=f"kvpool {argv[0]}")
    module.add_arguments(parser)
    return parser.parse_args(argv[1:])


def test_every_kvpool_command_parses_and_names_existing_files() -> None:
    kvpool_commands = [c[1:] for c in commands() if c[0] == "kvpool"]
    assert {c[0] for c in kvpool_commands} == {"validate", "tenant"}
    for argv in kvpool_commands:
        args = parse_kvpool([w for w in argv if w not in (">", "chat-product.key")])
        for path in getattr(args, "paths", []):
            assert (ROOT / path).exists(), path


def test_the_tenant_gets_tiers_of_the_policy_and_the_label_its_rule_matches() -> None:
    (create,) = [c for c in commands() if c[:3] == ["kvpool", "tenant", "create"]]
    args = parse_kvpool([w for w in create[1:] if w not in (">", "chat-product.key")])
    policy = yaml.safe_load((ROOT / "examples" / "tierpolicy.yaml").read_text())

    assert set(args.tiers) <= {t["name"] for t in policy["spec"]["tiers"]}
    assert args.namespace == policy["metadata"]["namespace"] == values()["gateway"]["poolNamespace"]
    key, _, value = args.labels[0].partition("=")
    chat_rule = next(r for r in policy["spec"]["classification"]
                     if r.get("pathPrefix") == "/v1/chat/completions")  # fmt: skip
    assert chat_rule["tenantSelector"]["matchLabels"] == {key: value}
    assert chat_rule["tier"] in args.tiers
    assert args.apply and create[-2:] == [">", "chat-product.key"]


def test_the_applied_files_exist_and_the_plugin_command_parses() -> None:
    applied = [c for c in commands() if c[:2] == ["kubectl", "apply"]]
    for command in applied:
        files = [command[i + 1] for i, w in enumerate(command) if w == "-f"]
        assert files and all((ROOT / f).exists() for f in files)
    parser = argparse.ArgumentParser(prog="kubectl kvpool")
    rollout.add_arguments(parser)
    assert "kubectl kvpool rollout list -n llm" in quick_start()
    assert parser.parse_args(["list", "-n", "llm"]).verb == "list"


def test_the_client_calls_the_port_forwarded_api_service_for_the_pool() -> None:
    (forward,) = [c for c in commands() if "port-forward" in c]
    service, ports = forward[-2], forward[-1]
    local, remote = ports.split(":")
    api = by("Service", service.removeprefix("svc/"))
    (code,) = blocks("python")
    tree = ast.parse(code)
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
               and isinstance(n.value, str)}  # fmt: skip
    pool = yaml.safe_load((ROOT / "examples" / "modelpool-llama-8b.yaml").read_text())

    assert flag(forward, "-n") == api["metadata"]["namespace"]
    assert [p["port"] for p in api["spec"]["ports"]] == [int(remote)]
    assert f"http://127.0.0.1:{local}/v1" in strings
    assert pool["spec"]["model"]["servedName"] in strings
    assert "chat-product.key" in strings
    assert any(isinstance(n, ast.ImportFrom) and n.module == "openai" for n in ast.walk(tree))


@pytest.mark.parametrize("step", ["helm test kvpool -n kvpool-system"])
def test_the_closing_checks_name_the_release(step: str) -> None:
    assert step in quick_start()
    assert flag(helm_install(), "-n") == step.rsplit(maxsplit=1)[-1]
