"""The rollout part of the local demo: a half-KV revision is paused, batch stays on stable,
an abort restores stable-only routing.

Why it exists: kvpool's third job is rolling a new engine revision out as a canary gated on
what matters for LLM serving (docs/0006-rollouts.md). The demo changes the pool's engine to
half the KV cache (a real second vLLM engine with ``--kv-cache-memory-bytes`` halved),
shows the operator pausing the rollout with ``KVCapacityShrunk`` before the canary gets any
traffic, sends batch traffic through the gateway (none of it reaches the canary), then
aborts with ``kvpool rollout abort`` (the ``kubectl kvpool`` plugin's command) and shows the
compiled config routing to stable only.

Local mode: there are no pods, so the canary's engine is named by the ModelPool annotation
``kvpool.dev/canary-static-endpoints`` and scraped by Prometheus with the labels of the
canary Deployment's pod template (as kubernetes_sd + relabeling would).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tests.support.engine import EngineConfig, VllmEngine
from tests.support.kube import resource_path
from tests.support.ports import free_port
from tests.support.prometheus import ScrapeTarget

from e2e.components import NAMESPACE, POOL, REPO, wait_until
from e2e.report import parse_samples
from e2e.traffic import build_batch, drive_traffic

HALF_KV_BYTES = 1024 * 1024  # half the demo engines' 2 MiB: 1,024 tokens of the tiny model


def _pool_path() -> str:
    return resource_path("kvpool.dev/v1alpha1", "modelpools", NAMESPACE, POOL)


def _finished(engine: VllmEngine) -> float:
    samples = parse_samples(engine.fetch_metrics_text())
    return sum(v for name, _, v in samples if name == "vllm:e2e_request_latency_seconds_count")


def _canary_labels(kube: Any) -> dict[str, str]:
    path = resource_path("apps/v1", "deployments", NAMESPACE, f"{POOL}-canary")
    try:
        body = kube.client.get(path)
    except Exception:  # not created yet
        return {}
    labels: dict[str, str] = body["spec"]["template"]["metadata"]["labels"]
    return labels


def _tracks(kube: Any) -> dict[str, Any]:
    cm = kube.client.get(resource_path("v1", "configmaps", NAMESPACE, "kvpool-admission"))
    pool = json.loads(cm["data"]["config.json"])["pools"][0]
    return {t["name"]: t for t in pool["tracks"]}


def run_rollout(
    stack: contextlib.ExitStack,
    system: Any,
    say: Callable[[str], None],
    step: Callable[[str], None],
    batch_key: str,
    workdir: Path,
) -> dict[str, Any]:
    """The rollout story; returns the ``rollout`` section of the results."""
    kube, prometheus = system.kube, system.prometheus
    step("Rollout: start a canary engine with HALF the KV cache (1 MiB = 1,024 tokens)")
    model_dir = Path(system.engines[0].config.model_dir)
    canary = VllmEngine(
        EngineConfig(
            model_dir=model_dir,
            served_model_name=POOL,
            max_model_len=512,
            max_num_seqs=8,
            kv_cache_memory_bytes=HALF_KV_BYTES,
            scheduling_policy="priority",
        ),
        log_path=workdir / "engine-canary.log",
        port=free_port(),
    )
    stack.callback(canary.stop)
    canary.start()
    say(f"canary engine {canary.base_url}: {canary.fetch_cache_config().capacity_tokens} KV tokens")

    step("Change the pool's engine (--kv-cache-memory-bytes halved): a new revision")
    kube.client.patch(
        _pool_path(),
        {
            "metadata": {"annotations": {"kvpool.dev/canary-static-endpoints": canary.base_url}},
            "spec": {"engine": {"args": [f"--kv-cache-memory-bytes={HALF_KV_BYTES}"]}},
        },
    )
    labels = wait_until(lambda: _canary_labels(kube), 30, "the canary Deployment", system.operator)
    copied = {
        "kvpool_" + k.removeprefix("kvpool.dev/"): v
        for k, v in labels.items()
        if k.startswith("kvpool.dev/")
    }
    target = ScrapeTarget(canary.target, {**copied, "namespace": NAMESPACE, "pod": "canary-0"})
    prometheus.set_targets({"vllm": [*system.targets, target]})
    say(
        f"operator created {POOL}-canary (revision {labels.get('kvpool.dev/revision')}); "
        f"{POOL}-stable keeps its template"
    )
    prometheus.wait_for(
        f'vllm:cache_config_info{{kvpool_revision="{labels["kvpool.dev/revision"]}"}}',
        timeout=30,
        interval=0.2,
    )
    ready = time.monotonic()
    pool = wait_until(
        lambda: _paused(kube.client.get(_pool_path())), 60, "rollout paused", system.operator
    )
    reaction = round(time.monotonic() - ready, 2)
    rollout = pool["status"]["rollout"]
    say(
        f"rollout {rollout['phase']} ({rollout['reason']}) {reaction:.1f} s after the canary "
        f"was measurable:\n{rollout['message']}"
    )
    say(_plugin("status", kube.kubeconfig))

    step("Batch traffic through the gateway while the rollout is paused (10 s)")
    before_canary, before_stable = _finished(canary), sum(_finished(e) for e in system.engines)
    records = asyncio.run(
        drive_traffic(
            [system.gateway_url], POOL, [build_batch(batch_key, 1.0)], 10.0, drain_seconds=60.0
        )
    )
    batch_on_canary = round(_finished(canary) - before_canary)
    batch_on_stable = round(sum(_finished(e) for e in system.engines) - before_stable)
    ok = sum(1 for r in records if r.status == 200)
    say(
        f"{ok}/{len(records)} batch requests answered; on stable: {batch_on_stable}, "
        f"on the canary: {batch_on_canary}"
    )

    step("Abort with the kubectl plugin: `kubectl kvpool rollout abort`")
    say(_plugin("abort", kube.kubeconfig))
    wait_until(
        lambda: (
            (kube.client.get(_pool_path()).get("status") or {}).get("rollout", {}).get("phase")
            == "Aborted"
        ),
        30,
        "rollout aborted",
        system.operator,
    )
    wait_until(lambda: _tracks(kube)["canary"]["endpoints"] == [], 30, "stable-only routing")
    tracks = _tracks(kube)
    say(
        "compiled config: "
        + ", ".join(
            f"{name} weight {t['weight']} endpoints {len(t['endpoints'])}"
            for name, t in tracks.items()
        )
        + " -> every request goes to stable"
    )
    final = kube.client.get(_pool_path())["status"]["rollout"]
    return {
        "paused_phase": rollout["phase"],
        "paused_reason": rollout["reason"],
        "message": rollout["message"],
        "seconds_from_canary_ready_to_paused": reaction,
        "kv_gate": rollout["gates"][0],
        "batch_requests_sent": len(records),
        "batch_requests_answered": ok,
        "batch_requests_on_stable": batch_on_stable,
        "batch_requests_reached_canary": batch_on_canary,
        "after_abort_phase": final["phase"],
        "after_abort_tracks": {
            name: {"weight": t["weight"], "endpoints": len(t["endpoints"])}
            for name, t in tracks.items()
        },
    }


def _paused(pool: Mapping[str, Any]) -> Mapping[str, Any] | None:
    rollout = (pool.get("status") or {}).get("rollout") or {}
    return pool if rollout.get("phase") == "Paused" else None


def _plugin(verb: str, kubeconfig: Path) -> str:
    """``kvpool rollout VERB`` (what ``kubectl kvpool rollout VERB`` runs)."""
    argv = [sys.executable, "-m", "kvpool.cli", "rollout", verb, POOL, "-n", NAMESPACE]
    argv.append(f"--kubeconfig={kubeconfig}")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO, check=False)
    return (done.stdout + done.stderr).rstrip()
