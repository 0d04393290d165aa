"""Rollout reaction time: seconds from a half-KV canary being ready to the rollout paused.

Why this benchmark exists: a canary that holds half the KV cache of stable must be stopped
before it gets traffic (docs/0006-rollouts.md). The target is under one measurement
interval (the operator's ``--measure-interval``, 15 s): a controller that only looks at
each tick reacts within 0..15 s (7.5 s on average, if the canary's readiness falls at a
random point of the interval); kvpool re-reconciles every 2 s while the KV gate waits for
the canary's first measurement.

Real parts: the API emulator, a real Prometheus (1 s scrapes), two vLLM CPU engines of the
tiny model (stable 2 MiB of KV = 2,048 tokens, canary 1 MiB = 1,024 tokens), the operator
as a process with ``--measure-interval 15s``, in local mode (static endpoints).

Each round: the canary engine is already scraped under the revision the next spec will
have (so it is "ready and measurable" at once); t0 = the spec change; reaction = until
``status.rollout.phase`` is Paused with KVCapacityShrunk; then the spec is reverted (Idle)
for the next round.

    .venv/bin/python bench/rollout_reaction.py [--rounds 5]

Prints the figures and writes bench/results/rollout_reaction.json.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.builders import make_policy, make_pool  # noqa: E402
from tests.support.engine import EngineConfig, VllmEngine  # noqa: E402
from tests.support.kube import KubeApi, resource_path, start_kube_api  # noqa: E402
from tests.support.processes import ManagedProcess  # noqa: E402
from tests.support.prometheus import PrometheusServer, ScrapeTarget  # noqa: E402
from tests.support.tiny_model import tiny_model_dir  # noqa: E402

from benchkit import machine_info, write_results  # noqa: E402
from kvpool.api.modelpool import ModelPool  # noqa: E402
from kvpool.domain.revision import revision_of  # noqa: E402

INTERVAL = 15.0
MP = resource_path("kvpool.dev/v1alpha1", "modelpools", "default", "chat")


def _pool_doc(stable_url: str) -> dict[str, Any]:
    doc = (
        make_pool("chat")
        .lengths((50, 100), (16, 32))
        .engine(maxNumSeqs=8, maxModelLen=512)
        .replicas(1, 1)
        .dict()
    )
    doc["spec"]["model"]["servedName"] = "tiny"
    doc["metadata"]["annotations"] = {"kvpool.dev/static-endpoints": f"s1={stable_url}"}
    return doc


def _revision(doc: dict[str, Any], args: list[str]) -> str:
    changed = {**doc, "spec": {**doc["spec"], "engine": {**doc["spec"]["engine"], "args": args}}}
    return revision_of(ModelPool.model_validate(changed).spec)


def _target(engine: VllmEngine, revision: str, pod: str) -> ScrapeTarget:
    labels = {"namespace": "default", "kvpool_pool": "chat", "kvpool_revision": revision}
    return ScrapeTarget(engine.target, {**labels, "pod": pod})


def _wait(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise TimeoutError(what)


def _rollout(kube: KubeApi) -> dict[str, Any]:
    return (kube.client.get(MP).get("status") or {}).get("rollout") or {}


def run(rounds: int, workdir: Path) -> dict[str, Any]:
    load = os.getloadavg()
    with contextlib.ExitStack() as stack:
        (workdir / "kube").mkdir(parents=True, exist_ok=True)
        kube = stack.enter_context(start_kube_api(workdir / "kube"))
        model = tiny_model_dir()
        engines = []
        for name, size in (("stable", 2 * 2**20), ("canary", 2**20)):
            engine = VllmEngine(
                EngineConfig(model_dir=model, kv_cache_memory_bytes=size, block_size=32),
                log_path=workdir / f"engine-{name}.log",
            )
            stack.callback(engine.stop)
            engines.append(engine.start())
        stable, canary = engines
        prom = PrometheusServer(workdir / "prom")
        stack.callback(prom.stop)
        prom.start()
        policy = make_policy().tier("interactive", floor=50).tier("batch", floor=40)
        kube.client.create(
            resource_path("kvpool.dev/v1alpha1", "tierpolicies", "default"), policy.dict()
        )
        doc = _pool_doc(stable.base_url)
        kube.client.create(resource_path("kvpool.dev/v1alpha1", "modelpools", "default"), doc)
        results: dict[str, list[float]] = {}
        for mode, recheck in (("kvpool", "2"), ("tick_only", "0")):
            with _operator(kube, prom, workdir, mode, recheck):
                first = _wait(
                    lambda: (kube.client.get(MP).get("status") or {}).get("revision"), 60, "rev"
                )
                prom.set_targets({"vllm": [_target(stable, first, "stable-0")]})
                _wait(
                    lambda: (
                        ((kube.client.get(MP).get("status") or {}).get("capacity") or {}).get(
                            "kvTokensPerReplica"
                        )
                        == 2048
                    ),
                    90,
                    "stable measured",
                )
                seed = 1 if mode == "kvpool" else 1 + rounds
                results[mode] = _rounds(kube, prom, doc, stable, canary, first, rounds, seed, mode)
    summary = {
        mode: {
            "reaction_seconds": values,
            "median_seconds": round(statistics.median(values), 3),
            "max_seconds": max(values),
            "within_one_interval": max(values) < INTERVAL,
        }
        for mode, values in results.items()
    }
    return {
        "benchmark": "rollout_reaction",
        "what": "seconds from a half-KV canary being ready (spec change, canary already "
        "scraped) to status.rollout Paused/KVCapacityShrunk",
        "measure_interval_seconds": INTERVAL,
        "modes": {
            "kvpool": "the operator as shipped: re-reconciles every 2 s while the KV gate waits",
            "tick_only": "the same operator with KVPOOL_ROLLOUT_RECHECK_SECONDS=0: it looks "
            "only at each --measure-interval tick (what a periodic analysis gives)",
        },
        "rounds": rounds,
        **summary,
        "machine": machine_info(load),
    }


@contextlib.contextmanager
def _operator(kube: KubeApi, prom: PrometheusServer, workdir: Path, mode: str, recheck: str) -> Any:
    operator = ManagedProcess(
        [
            sys.executable,
            "-m",
            "kvpool.cli",
            "operator",
            f"--kubeconfig={kube.kubeconfig}",
            f"--prometheus-url={prom.url}",
            f"--measure-interval={INTERVAL:g}s",
            "--standalone",
            "--metrics-port=0",
            "--health-port=0",
        ],
        log_path=workdir / f"operator-{mode}.log",
        env=dict(os.environ) | {"KVPOOL_ROLLOUT_RECHECK_SECONDS": recheck},
        cwd=REPO,
    )
    operator.start()
    try:
        yield operator
    finally:
        operator.stop()


def _rounds(
    kube: KubeApi,
    prom: PrometheusServer,
    doc: dict[str, Any],
    stable: VllmEngine,
    canary: VllmEngine,
    first: str,
    rounds: int,
    seed: int,
    mode: str,
) -> list[float]:
    reactions: list[float] = []
    for index in range(rounds):
        args = ["--kv-cache-memory-bytes=1048576", f"--seed={seed + index}"]
        new = _revision(doc, args)
        prom.set_targets(
            {"vllm": [_target(stable, first, "stable-0"), _target(canary, new, "canary-0")]}
        )
        prom.wait_for(f'vllm:cache_config_info{{kvpool_revision="{new}"}}', timeout=30)
        # the tick phase at which the canary gets ready is arbitrary: spread it
        time.sleep((index * 3.7) % INTERVAL)
        started = time.monotonic()
        kube.client.patch(
            MP,
            {
                "metadata": {
                    "annotations": {"kvpool.dev/canary-static-endpoints": canary.base_url}
                },
                "spec": {"engine": {"args": args}},
            },
        )
        _wait(lambda: _rollout(kube).get("reason") == "KVCapacityShrunk", 4 * INTERVAL, "paused")
        reactions.append(round(time.monotonic() - started, 3))
        print(f"{mode} round {index + 1}: paused KVCapacityShrunk after {reactions[-1]:.2f} s")
        kube.client.patch(MP, {"spec": {"engine": {"args": []}}})
        _wait(lambda: _rollout(kube).get("phase") == "Idle", 60, "reverted")
    return reactions


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvpool-rollout-bench-") as tmp:
        result = run(args.rounds, Path(tmp))
    for mode in ("kvpool", "tick_only"):
        print(
            f"{mode}: reaction median {result[mode]['median_seconds']:.2f} s, max "
            f"{result[mode]['max_seconds']:.2f} s (measurement interval {INTERVAL:g} s)"
        )
    path = write_results(REPO / "bench" / "results" / "rollout_reaction.json", result)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
