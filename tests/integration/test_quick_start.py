"""The README's "Production quick start", followed as a new user would, on the API emulator.

What a cluster would run is run for real: the operator (local mode: the pool's engine is
named by its ``kvpool.dev/static-endpoints`` annotation instead of Pods), the gateway
with the chart's own arguments for the README's values (``--configmap llm``, the Redis
URL from ``KVPOOL_REDIS_URL`` as the Secret would give it), a real Redis and a real vLLM
engine (the tiny model, served as ``llama-8b``). The user's commands run as the README
prints them, through the real kubectl (pointed at the emulator): ``kvpool validate``,
``kubectl apply``, ``kvpool tenant create ... --apply > chat-product.key``, then the
README's Python client code with the official ``openai`` SDK gets a chat answer.
The cluster-only steps (helm installs, image push, namespaces, port-forward) are checked
offline by
tests/unit/test_readme_quick_start.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.operator_process import run_operator
from tests.support.engine import EngineFactory
from tests.support.gateway import GatewayProcesses
from tests.support.kube import KubeApi, resource_path
from tests.support.redis_server import RedisServer
from tests.support.waiting import wait_until
from tests.unit.test_readme_quick_start import blocks, commands, rendered

pytestmark = [pytest.mark.engine, pytest.mark.redis]

ROOT = Path(__file__).resolve().parents[2]


def user_shell(tmp_path: Path, kube: KubeApi) -> dict[str, str]:
    """The user's PATH: kvpool and kubectl-kvpool installed, a kubectl that talks to the
    emulator (its discovery cache, and no server-side OpenAPI to validate against)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "kubectl"
    wrapper.write_text(
        textwrap.dedent(f"""\
        #!/bin/sh
        case "$1" in apply|create) verb="$1"; shift; set -- "$verb" --validate=false "$@";; esac
        exec /usr/bin/kubectl --kubeconfig={kube.kubeconfig} --cache-dir={kube.kubectl_cache} "$@"
    """)
    )
    wrapper.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin"}


def run_line(line: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["bash", "-c", line], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, (line, done.stdout, done.stderr)
    return done


def edited_pool(tmp_path: Path, engine_url: str) -> None:
    """examples/modelpool-llama-8b.yaml edited "to your cluster": the tiny CPU engine."""
    pool: dict[str, Any] = yaml.safe_load((ROOT / "examples/modelpool-llama-8b.yaml").read_text())
    pool["metadata"]["annotations"] = {"kvpool.dev/static-endpoints": f"e1={engine_url}"}
    pool["spec"]["model"].pop("tokenizerPath")
    pool["spec"]["engine"] |= {"maxModelLen": 512, "maxNumSeqs": 8}
    pool["spec"]["workload"] = {"promptTokens": {"mean": 40, "p95": 96},
                                "outputTokens": {"mean": 40, "p95": 96}}  # fmt: skip
    pool["spec"]["capacity"] |= {"kvTokensPerReplica": 2048, "minReplicas": 1, "maxReplicas": 1,
                                 "peakConcurrency": {"interactive": 2}}  # fmt: skip
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "modelpool-llama-8b.yaml").write_text(yaml.safe_dump(pool))
    (tmp_path / "examples" / "tierpolicy.yaml").write_text(
        (ROOT / "examples" / "tierpolicy.yaml").read_text()
    )


def gateway_args_of_the_chart() -> list[str]:
    (gateway,) = [d for d in rendered() if d["kind"] == "Deployment"
                  and d["metadata"]["name"] == "kvpool-gateway"]  # fmt: skip
    args: list[str] = gateway["spec"]["template"]["spec"]["containers"][0]["args"][1:]
    return [a for a in args if not a.startswith(("--listen=", "--metrics-listen="))]


async def test_the_quick_start_ends_with_a_chat_answer(
    tmp_path: Path,
    kube_api: KubeApi,
    vllm_engine: EngineFactory,
    redis_server: Any,
    gateway_process: GatewayProcesses,
) -> None:
    engine = vllm_engine(served_model_name="llama-8b", max_num_seqs=8,
                         kv_cache_memory_bytes=2 * 1024 * 1024, block_size=32,
                         scheduling_policy="priority")  # fmt: skip
    redis: RedisServer = redis_server()
    env = user_shell(tmp_path, kube_api)
    edited_pool(tmp_path, engine.base_url)
    lines = [" ".join(c) for c in commands()]
    # the emulator has every namespace (it refuses `kubectl create namespace`'s body)
    assert [line for line in lines if line.startswith("kubectl create namespace")]
    step4 = [line for line in lines if line.startswith(("kvpool ", "kubectl apply"))]
    assert len(step4) == 3, step4

    with run_operator(kube_api, tmp_path):
        validate, apply, create_tenant = step4
        run_line(validate, env, tmp_path)
        run_line(apply, env, tmp_path)
        created = re.sub(r" > chat-product.key$", "", create_tenant)
        key = run_line(created, env, tmp_path).stdout.strip()
        (tmp_path / "chat-product.key").write_text(key + "\n")

        def published() -> bool:
            path = resource_path("v1", "configmaps", "llm", "kvpool-admission")
            answer = kube_api.client.request("GET", path)
            return answer.status == 200 and '"chat-product"' in answer.body["data"]["config.json"]

        wait_until(published, timeout=60)
        args = gateway_args_of_the_chart()
        assert "--configmap=llm" in args
        os.environ["KVPOOL_REDIS_URL"] = f"redis://127.0.0.1:{redis.port}/0"
        try:
            gateway = await gateway_process.started(
                configmap=("llm", kube_api.url),
                extra_args=tuple(a for a in args if not a.startswith("--configmap")),
            )
        finally:
            del os.environ["KVPOOL_REDIS_URL"]

        # the README's client, with the port-forward's address replaced by the gateway's
        (code,) = blocks("python")
        code = code.replace("http://127.0.0.1:8080/v1", f"{gateway.url}/v1")
        done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120, check=False)  # fmt: skip

    assert done.returncode == 0, (done.stderr, gateway.log_tail())
    assert done.stdout.strip(), "the engine answered nothing"
    assert "budgets in redis" in gateway.log_tail(200)
