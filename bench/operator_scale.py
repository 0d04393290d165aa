"""Operator at scale: 1,000 ModelPools x 4 tiers and 5,000 TenantBudgets.

Why this benchmark exists: the operator re-plans every pool on every measurement tick and
recompiles a namespace's admission config on every change, so both must stay cheap at the
scale of a large platform. Measured:

1. pure planning (``plan_pool``) of every pool - target **under 1 s** for all 1,000;
2. compiling the gateway config (``build_admission_config`` + canonical JSON + hash) of
   every namespace, with all pools and tenants;
3. end to end against the Kubernetes API emulator (tests/support/kube.py): the real
   operator process (``kvpool operator``, kopf) started on a populated API - time until
   every pool has a plan in ``status`` and every namespace's ConfigMap lists all of its
   pools and tenants - and the operator's resident memory (RSS) once converged.

Objects: ``--namespaces`` namespaces (default 10), each with one 4-tier TierPolicy and an
equal share of the pools and budgets; every budget has its Secret. The emulator runs in
this process (a thread), so end-to-end time includes its own cost; planning and compiling
are timed in isolation (best of ``--repeat`` rounds).

    .venv/bin/python bench/operator_scale.py [--pools 1000] [--tenants 5000] [--quick]

Prints the figures and writes bench/results/operator_scale.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.builders import (  # noqa: E402
    apikey_secret_manifest,
    modelpool_manifest,
    tenantbudget_manifest,
    tierpolicy_manifest,
)

from benchkit import write_results  # noqa: E402
from kvpool.api.modelpool import ModelPool  # noqa: E402
from kvpool.api.tenantbudget import TenantBudget  # noqa: E402
from kvpool.api.tierpolicy import TierPolicy  # noqa: E402
from kvpool.domain.api_keys import api_key_digest  # noqa: E402
from kvpool.domain.compile import (  # noqa: E402
    PoolInput,
    TenantInput,
    build_admission_config,
    config_hash,
)
from kvpool.domain.planner import PoolPlan, plan_pool  # noqa: E402
from kvpool.domain.revision import revision_of  # noqa: E402

RESULTS = REPO / "bench" / "results" / "operator_scale.json"
TIERS = ("interactive", "standard", "batch", "eval")


def build_objects(pools: int, tenants: int, namespaces: int) -> dict[str, list[dict[str, Any]]]:
    """Manifests (dicts) of every object, spread over the namespaces."""
    out: dict[str, list[dict[str, Any]]] = {
        "policies": [],
        "pools": [],
        "budgets": [],
        "secrets": [],
    }
    for n in range(namespaces):
        ns = f"team-{n:02d}"
        out["policies"].append(
            tierpolicy_manifest("tiers", ns)
            .tier("interactive", floor=40, max_wait="2s")
            .tier("standard", floor=25, lend=50, max_wait="10s")
            .tier("batch", floor=15, max_wait="5m")
            .tier("eval", floor=5, max_wait="30m")
            .rule("batch", pathPrefix="/v1/completions")
            .dict()
        )
    for i in range(pools):
        ns = f"team-{i % namespaces:02d}"
        out["pools"].append(
            modelpool_manifest(f"pool-{i:04d}", ns)
            .lengths((200 + i % 7 * 50, 1000 + i % 5 * 200), (100, 400 + i % 3 * 100))
            .peak(interactive=10 + i % 40, standard=5 + i % 20, batch=i % 30, eval=1)
            .replicas(1, 16)
            .capacity(kvTokensPerReplica=100_000 + (i % 10) * 20_000)
            .dict()
        )
    for t in range(tenants):
        ns = f"team-{t % namespaces:02d}"
        name = f"tenant-{t:05d}"
        tiers = [TIERS[t % 4], TIERS[(t + 1) % 4]] if t % 4 != 3 else ["eval"]
        out["budgets"].append(
            tenantbudget_manifest(name, ns)
            .tiers(*sorted(set(tiers)))
            .limit("1h", 100_000)
            .limit("1d", 1_000_000)
            .dict()
        )
        out["secrets"].append(apikey_secret_manifest(f"{name}-key", "api-key", f"sk-{name}", ns))
    return out


def best_of(repeat: int, fn: Any) -> tuple[float, Any]:
    best, result = float("inf"), None
    for _ in range(repeat):
        started = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - started)
    return best, result


def bench_pure(objs: dict[str, list[dict[str, Any]]], repeat: int) -> dict[str, Any]:
    policies = {p["metadata"]["namespace"]: TierPolicy.model_validate(p) for p in objs["policies"]}
    pools = [ModelPool.model_validate(p) for p in objs["pools"]]
    budgets = [TenantBudget.model_validate(b) for b in objs["budgets"]]

    def plan_all() -> list[Any]:
        return [plan_pool(p, policies[p.metadata.namespace or ""], None) for p in pools]

    plan_seconds, plans = best_of(repeat, plan_all)
    assert all(isinstance(p, PoolPlan) for p in plans), "every pool must plan"
    inputs: dict[str, list[PoolInput]] = {ns: [] for ns in policies}
    for pool, plan in zip(pools, plans, strict=True):
        inputs[pool.metadata.namespace or ""].append(
            PoolInput(
                pool=pool, plan=plan.to_status(), revision=revision_of(pool.spec), endpoints=()
            )
        )
    tenants: dict[str, list[TenantInput]] = {ns: [] for ns in policies}
    for b in budgets:
        tenants[b.metadata.namespace or ""].append(
            TenantInput(b, (api_key_digest(f"sk-{b.metadata.name}"),))
        )

    def compile_all() -> list[tuple[str, int]]:
        out = []
        for ns, policy in policies.items():
            config = build_admission_config(ns, inputs[ns], [policy], tenants[ns]).config
            out.append((config_hash(config), len(config.to_json())))
        return out

    compile_seconds, compiled = best_of(repeat, compile_all)
    return {
        "plan_all_seconds": round(plan_seconds, 4),
        "plan_per_pool_us": round(plan_seconds / len(pools) * 1e6, 1),
        "plan_target_seconds": 1.0,
        "plan_within_target": plan_seconds < 1.0,
        "compile_all_seconds": round(compile_seconds, 4),
        "config_bytes_per_namespace": max(size for _, size in compiled),
    }


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_operator(objs: dict[str, list[dict[str, Any]]], timeout: float) -> dict[str, Any]:
    from tests.operator_process import OperatorProcess
    from tests.support.kube import resource_path, start_kube_api
    from tests.support.waiting import wait_until

    workdir = Path(tempfile.mkdtemp(prefix="kvpool-bench-"))
    with start_kube_api(workdir) as kube:
        started = time.perf_counter()
        namespaces = sorted({p["metadata"]["namespace"] for p in objs["policies"]})
        for ns in namespaces:
            kube.client.create(resource_path("v1", "namespaces"), {"metadata": {"name": ns}})

        def create(kind: tuple[str, str], doc: dict[str, Any]) -> None:
            kube.client.create(resource_path(kind[0], kind[1], doc["metadata"]["namespace"]), doc)

        kinds = {
            "policies": ("kvpool.dev/v1alpha1", "tierpolicies"),
            "secrets": ("v1", "secrets"),
            "budgets": ("kvpool.dev/v1alpha1", "tenantbudgets"),
            "pools": ("kvpool.dev/v1alpha1", "modelpools"),
        }
        with ThreadPoolExecutor(4) as pool:
            for key, kind in kinds.items():
                list(pool.map(lambda d, k=kind: create(k, d), objs[key]))
        populate_seconds = time.perf_counter() - started

        op = OperatorProcess(kube, workdir, interval="15s")
        total_pools, total_tenants = len(objs["pools"]), len(objs["budgets"])

        def planned() -> int:
            items = kube.client.get(resource_path("kvpool.dev/v1alpha1", "modelpools"))["items"]
            return sum(1 for i in items if (i.get("status") or {}).get("plan"))

        def published() -> tuple[int, int]:
            pools = tenants = 0
            for ns in namespaces:
                rsp = kube.client.request(
                    "GET", resource_path("v1", "configmaps", ns, "kvpool-admission")
                )
                if rsp.status == 200:
                    config = json.loads(rsp.body["data"]["config.json"])
                    pools += sum(1 for p in config["pools"] if p["planOk"])
                    tenants += len(config["tenants"])
            return pools, tenants

        try:
            started = time.perf_counter()
            op.start()
            ready_seconds = time.perf_counter() - started
            wait_until(lambda: planned() == total_pools, timeout=timeout, interval=2.0)
            plan_seconds = time.perf_counter() - started
            wait_until(
                lambda: published() == (total_pools, total_tenants), timeout=timeout, interval=1.0
            )
            converge_seconds = time.perf_counter() - started
            rss = op.process.rss_bytes()
            cpu = _cpu_seconds(op.process.pid)
            metrics = op.metrics()
        finally:
            op.stop()
    reconciles = sum(
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("kvpool_operator_reconciles_total")
    )
    return {
        "populate_seconds": round(populate_seconds, 2),
        "operator_ready_seconds": round(ready_seconds, 2),
        "all_pools_planned_seconds": round(plan_seconds, 2),
        "all_configs_published_seconds": round(converge_seconds, 2),
        "operator_rss_mib": round(rss / 2**20, 1),
        "operator_cpu_seconds": round(cpu, 2),
        "reconciles": int(reconciles),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pools", type=int, default=1000)
    parser.add_argument("--tenants", type=int, default=5000)
    parser.add_argument("--namespaces", type=int, default=10)
    parser.add_argument(
        "--repeat", type=int, default=5, help="rounds of the pure timings (best kept)"
    )
    parser.add_argument("--timeout", type=float, default=600, help="end-to-end limit, seconds")
    parser.add_argument("--skip-operator", action="store_true", help="pure timings only")
    parser.add_argument("--quick", action="store_true", help="100 pools, 500 tenants (smoke run)")
    parser.add_argument("--no-write", action="store_true", help="do not write bench/results/")
    args = parser.parse_args()
    if args.quick:
        args.pools, args.tenants = 100, 500

    objs = build_objects(args.pools, args.tenants, args.namespaces)
    result: dict[str, Any] = {
        "benchmark": "operator_scale",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_average_1m_at_start": round(os.getloadavg()[0], 2),  # shared machine: noise
        },
        "scale": {
            "pools": args.pools,
            "tiers": 4,
            "tenants": args.tenants,
            "namespaces": args.namespaces,
        },
        "pure": bench_pure(objs, args.repeat),
    }
    if not args.skip_operator:
        result["end_to_end"] = bench_operator(objs, args.timeout)

    pure = result["pure"]
    print(
        f"operator scale: {args.pools} pools x 4 tiers, {args.tenants} tenants, "
        f"{args.namespaces} namespaces"
    )
    print(
        f"  plan all pools      {pure['plan_all_seconds'] * 1000:8.1f} ms  "
        f"({pure['plan_per_pool_us']} us a pool; target < 1000 ms: "
        f"{'met' if pure['plan_within_target'] else 'MISSED'})"
    )
    print(
        f"  compile all configs {pure['compile_all_seconds'] * 1000:8.1f} ms  "
        f"(largest {pure['config_bytes_per_namespace']} bytes)"
    )
    if "end_to_end" in result:
        e2e = result["end_to_end"]
        print(f"  populate the API    {e2e['populate_seconds']:8.1f} s")
        print(f"  operator ready      {e2e['operator_ready_seconds']:8.1f} s")
        print(
            f"  all pools planned   {e2e['all_pools_planned_seconds']:8.1f} s  "
            f"({e2e['reconciles']} reconciles)"
        )
        print(f"  all configs written {e2e['all_configs_published_seconds']:8.1f} s")
        print(
            f"  operator CPU        {e2e['operator_cpu_seconds']:8.1f} s  "
            "(the rest of the time is the emulator's)"
        )
        print(f"  operator RSS        {e2e['operator_rss_mib']:8.1f} MiB")
    if not args.no_write:
        print(f"  written to {write_results(RESULTS, result)}")
    return 0 if pure["plan_within_target"] else 1


if __name__ == "__main__":
    sys.exit(main())
