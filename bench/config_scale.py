"""Many tenants and the control plane: publish size and the gateway's loop while it polls.

Why this benchmark exists: a tenant costs ~250 bytes of compiled config, so 5,000 of them
no longer fit one ConfigMap (1 MiB), and a gateway that fetched and parsed the whole
document on every 2 s poll stalled its event loop even when nothing changed (issue 18,
item 5). Measured here, against the Kubernetes API emulator run in a child process (so
its own JSON work does not share the gateway's GIL):

1. publish: ``apply_admission_config`` of ``--tenants`` tenants (one ConfigMap per shard
   plus the index), the number of objects and the largest one's bytes (target: none over
   900 KiB);
2. the gateway's ``ConfigMapSource`` polling the unchanged config every ``--interval``
   seconds for ``--seconds`` while tasks sleeping 1 ms and 50 ms (the gateway's own
   ``kvpool_gateway_event_loop_lag_seconds`` period) note how late the loop wakes:
   p50/p99/max lag and stalls over 25 ms (target: p99 under 10 ms).

``--code DIR`` imports kvpool and the test support from another checkout (e.g. the
integration checkout before this change: it publishes one ConfigMap, which must then be
small enough for the emulator, e.g. ``--tenants 4000``). The config is built by
``tests/builders/compiled.py:admission_config_with_tenants``, the builder the sharding
tests use; a checkout older than it needs that file copied in.

    .venv/bin/python bench/config_scale.py [--tenants 10000] [--interval 0.25] [--seconds 10]

Prints the figures and writes bench/results/config_scale.json (``--out`` to change).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
LAG_INTERVAL_SECONDS = 0.05  # as kvpool.gateway.loop_lag samples it

CHILD = """
import sys, time, pathlib
from tests.support.kube import start_kube_api
with start_kube_api(pathlib.Path(sys.argv[1])) as api:
    print(api.url, flush=True)
    sys.stdin.read()
"""


def _paths(code: Path) -> list[str]:
    return [str(code / "operator"), str(code)]


async def publish(url: str, config: Any) -> dict[str, Any]:
    """Publish ``config`` as the operator does; the objects' sizes."""
    from kvpool.adapters import kube
    from kvpool.domain import manifests as m
    from kvpool.domain.compile import config_hash

    client = kube.KubeClient(kube.KubeConnection(server=url), backoff=0.01)
    started = time.perf_counter()
    try:
        try:
            from kvpool.controller.publisher import apply_admission_config
        except ImportError:  # before sharding: one ConfigMap
            desired = m.build_admission_configmap("default", config.to_json(), config_hash(config))
            await client.create(kube.CONFIGMAPS, "default", desired)
        else:
            await apply_admission_config(client, "default", config)
        seconds = time.perf_counter() - started
        items = await client.list_objects(kube.CONFIGMAPS, "default")
    finally:
        await client.close()
    sizes = {
        o["metadata"]["name"]: sum(len(k) + len(v.encode()) for k, v in (o["data"] or {}).items())
        for o in items
    }
    return {
        "publish_seconds": round(seconds, 3),
        "objects": len(sizes),
        "largest_object_bytes": max(sizes.values()),
        "total_bytes": sum(sizes.values()),
    }


async def poll_lag(url: str, interval: float, seconds: float) -> dict[str, Any]:
    """Loop lag while the gateway's source polls the unchanged config."""
    from kvpool.adapters.config_source import ConfigMapSource, KubeAccess

    source = ConfigMapSource("default", KubeAccess(server=url), interval=interval)
    started = time.perf_counter()
    config = await source.load()
    load_seconds = time.perf_counter() - started
    delivered: list[Any] = []
    watcher = asyncio.create_task(source.watch(delivered.append))
    loop = asyncio.get_running_loop()
    end = time.monotonic() + seconds

    async def sample(period: float) -> list[float]:
        lags: list[float] = []
        while time.monotonic() < end:
            asked = loop.time()
            await asyncio.sleep(period)
            lags.append(max(loop.time() - asked - period, 0.0))
        return sorted(lags)

    try:
        # 1 ms sleeps catch every stall; 50 ms ones are the gateway's own loop-lag gauge
        fine, gateway = await asyncio.gather(sample(0.001), sample(LAG_INTERVAL_SECONDS))
    finally:
        watcher.cancel()

    def ms(lags: list[float], q: float) -> float:
        return round(lags[min(len(lags) - 1, int(len(lags) * q))] * 1000, 2)

    return {
        "tenants_loaded": len(config.tenants),
        "load_seconds": round(load_seconds, 3),
        "polls": int(seconds / interval),
        "lag_1ms_samples": len(fine),
        "lag_1ms_p50_ms": ms(fine, 0.5),
        "lag_1ms_p99_ms": ms(fine, 0.99),
        "lag_max_ms": round(fine[-1] * 1000, 2),
        "stalls_over_25ms": sum(1 for x in fine if x > 0.025),
        "lag_50ms_samples": len(gateway),
        "lag_50ms_p99_ms": ms(gateway, 0.99),
        "delivered_while_unchanged": len(delivered),
    }


async def run(args: argparse.Namespace, url: str) -> dict[str, Any]:
    try:
        from tests.builders.compiled import admission_config_with_tenants
    except ImportError:
        sys.exit(
            f"{args.code} has no tests/builders/compiled.py:admission_config_with_tenants "
            "(added with this benchmark's shared builder): measure an older checkout with "
            "that file copied in from this one"
        )
    config = admission_config_with_tenants(args.tenants)
    result: dict[str, Any] = {"tenants": len(config.tenants)}
    result["document_bytes"] = len(config.to_json())
    result.update(await publish(url, config))
    result.update(await poll_lag(url, args.interval, args.seconds))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=10_000)
    parser.add_argument("--interval", type=float, default=0.25, help="poll period (s)")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--code", type=Path, default=REPO, help="checkout to import from")
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/config_scale.json")
    args = parser.parse_args()
    sys.path[:0] = _paths(args.code)
    load_before = os.getloadavg()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(_paths(args.code)))
    with tempfile.TemporaryDirectory() as tmp:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, tmp],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=args.code,
        )
        try:
            assert child.stdout is not None
            url = child.stdout.readline().strip()
            result = asyncio.run(run(args, url))
        finally:
            assert child.stdin is not None
            child.stdin.close()
            child.wait(timeout=20)
    result = {
        "code": str(args.code),
        "interval_seconds": args.interval,
        "seconds": args.seconds,
        **result,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        },
    }
    for key, value in result.items():
        print(f"{key:28} {value}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print("results:", args.out)


if __name__ == "__main__":
    main()
