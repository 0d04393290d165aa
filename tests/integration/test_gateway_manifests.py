"""``kvpool gateway -f MANIFESTS``: the gateway compiles its own config, without an operator,
at start and whenever a manifest changes; and what stops it says so in one line.

- -f serves the manifests' tenants against a fake engine at ``--endpoints``; a tenant
  added to the manifests authenticates after the recompile; manifests that stop passing
  the checks are not applied (the last good config keeps serving, the log says why);
- a port in use is one line naming the address, exit 1, no traceback;
- ``--fail-closed-tier`` naming no tier of the config is one line, exit 2.
(A real vLLM engine behind ``kvpool compile`` and ``gateway -f``:
tests/integration/test_gateway_without_operator.py.)
"""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from tests.builders import (
    apikey_secret_manifest,
    modelpool_manifest,
    standard_tierpolicy_manifest,
    tenantbudget_manifest,
)
from tests.support.gateway import FakeEngine, GatewayProcesses
from tests.support.ports import free_port
from tests.support.waiting import wait_until_async


def write_repo(path: Path, tenants: dict[str, str]) -> None:
    """A policy (every chat call interactive), the pool chat, tenants with their keys."""
    policy = standard_tierpolicy_manifest().rule("interactive", pathPrefix="/v1/").dict()
    pool = modelpool_manifest("chat").peak(interactive=4).capacity(kvTokensPerReplica=200_000)
    docs: list[Any] = [policy, pool.dict()]
    for tenant, key in tenants.items():
        docs.append(tenantbudget_manifest(tenant).tiers("interactive").dict())
        docs.append(apikey_secret_manifest(f"{tenant}-key", "api-key", key))
    path.mkdir(exist_ok=True)
    (path / "kvpool.yaml").write_text(yaml.safe_dump_all(docs))


async def chat(session: aiohttp.ClientSession, url: str, key: str) -> int:
    body = {"model": "chat", "prompt": "hi", "max_tokens": 2}
    headers = {"Authorization": f"Bearer {key}"}
    async with session.post(f"{url}/v1/completions", json=body, headers=headers) as rsp:
        await rsp.read()
        return rsp.status


async def test_the_gateway_compiles_its_manifests_and_recompiles_on_change(
    tmp_path: Path, fake_engine: FakeEngine, gateway_process: GatewayProcesses
) -> None:
    repo = tmp_path / "repo"
    write_repo(repo, {"acme": "sk-acme"})
    gateway = await gateway_process.started(
        manifests=(str(repo),),
        extra_args=("--endpoints", f"chat=e1={fake_engine.url}", "--reload-interval", "0.1"),
    )
    async with aiohttp.ClientSession() as session:
        assert await chat(session, gateway.url, "sk-acme") == 200
        assert await chat(session, gateway.url, "sk-beta") == 401

        # When a tenant is added to the manifests, it is served after the recompile
        first = gateway.config_generated_at()
        write_repo(repo, {"acme": "sk-acme", "beta": "sk-beta"})

        async def beta_served() -> bool:
            return await chat(session, gateway.url, "sk-beta") == 200

        await wait_until_async(beta_served, timeout=15)
        assert gateway.config_generated_at() is not None and first is not None

        # When the manifests break, the last good config keeps serving
        (repo / "kvpool.yaml").write_text("apiVersion: kvpool.dev/v1alpha1\nkind: TierPolicy\n")
        await wait_until_async(
            lambda: "manifests not recompiled" in gateway.log_tail(200), timeout=15
        )
        assert await chat(session, gateway.url, "sk-beta") == 200
        assert "problem(s) in the manifests" in gateway.log_tail(200)


def run_gateway(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvpool.cli", "gateway", *argv],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_a_port_in_use_is_one_line_naming_the_address(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_repo(repo, {"acme": "sk-acme"})
    port = free_port()
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
        taken.bind(("127.0.0.1", port))
        taken.listen()
        done = run_gateway("-f", str(repo), "--listen", f"127.0.0.1:{port}",
                           "--metrics-listen", f"127.0.0.1:{free_port()}")  # fmt: skip

    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if "kvpool gateway:" in line]
    in_use = os.strerror(errno.EADDRINUSE)
    assert errors == [f"kvpool gateway: cannot listen on 127.0.0.1:{port} (--listen): {in_use}"]
    assert "Traceback" not in done.stderr


def test_a_fail_closed_tier_the_config_lacks_is_refused(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_repo(repo, {"acme": "sk-acme"})

    done = run_gateway("-f", str(repo), "--fail-closed-tier", "nosuch",
                       "--listen", f"127.0.0.1:{free_port()}")  # fmt: skip

    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[-1] == (
        "kvpool gateway: error: --fail-closed-tier 'nosuch' is not a tier of the config "
        "(tiers: batch, eval, interactive)"
    )
    assert "Traceback" not in done.stderr
