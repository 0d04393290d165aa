"""The components of the local demo, one start function each, and the helpers they share.

Why this module exists: e2e/local_demo.py tells the story; this module knows how to start
and stop each real part on one machine - the Kubernetes API emulator, Redis, Prometheus,
``kvpool operator``, the vLLM CPU engines, ``kvpool gateway`` - on free loopback ports, with
logs in the work directory. Every ``start_*`` registers the component's stop on the given
``ExitStack`` *before* starting it, so a failure halfway still stops what already runs.

The emulator, engine, Redis and process helpers are imported from ``tests.support``: the
local demo is test tooling, and reusing those helpers keeps one way of running each part.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from tests.support import waiting
from tests.support.engine import EngineConfig, VllmEngine
from tests.support.kube import KubeApi, start_kube_api
from tests.support.ports import free_port
from tests.support.processes import ManagedProcess
from tests.support.prometheus import PrometheusServer, prometheus_binary
from tests.support.redis_server import RedisServer, redis_binary
from tests.support.tiny_model import vllm_python
from tests.support.waiting import StopWaitingError

REPO = Path(__file__).resolve().parents[1]
NAMESPACE = "kvpool-demo"  # the namespace of e2e/manifests/*.yaml
POOL = "tiny"  # the ModelPool's name and the model name clients send
KV_CACHE_BYTES = 2 * 1024 * 1024  # 2048 tokens of the tiny model: ~5 batch requests fill it
MEASURE_INTERVAL = "3s"  # the operator's re-plan period (15 s in a cluster)


def check_prerequisites() -> None:
    """Fail early, with the fix, when a binary or the vLLM venv is missing."""
    missing = []
    if not vllm_python().exists():
        missing.append(f"vLLM venv ({vllm_python()}): run scripts/ensure-vllm.sh")
    if prometheus_binary() is None:
        missing.append("prometheus: apt-get install prometheus")
    if redis_binary() is None:
        missing.append("redis-server: apt-get install redis-server")
    if shutil.which("kubectl") is None:
        missing.append("kubectl (expected at /usr/bin/kubectl)")
    if missing:
        raise SystemExit("local demo: missing prerequisites:\n  " + "\n  ".join(missing))


def kvpool_command(*args: str) -> list[str]:
    """The argv of a ``kvpool`` subcommand run with this interpreter (the project venv)."""
    return [sys.executable, "-m", "kvpool.cli", *args]


def start_emulator(stack: contextlib.ExitStack, workdir: Path) -> KubeApi:
    """The Kubernetes API emulator with our CRDs, on a free loopback port (in this process)."""
    (workdir / "kube").mkdir(parents=True, exist_ok=True)
    return stack.enter_context(start_kube_api(workdir / "kube"))


def start_redis(stack: contextlib.ExitStack, workdir: Path) -> RedisServer:
    """A real redis-server (persistence off) for the gateway's tenant budgets."""
    redis = RedisServer(workdir / "redis")
    stack.callback(redis.stop)
    return redis.start()


def start_prometheus(stack: contextlib.ExitStack, workdir: Path) -> PrometheusServer:
    """Prometheus scraping every second; targets are added once the engines exist.

    Its static targets carry the labels kubernetes_sd plus a cluster's relabeling would give
    the engine pods (``ScrapeTarget``); ``set_targets`` re-writes them and reloads.
    """
    prometheus = PrometheusServer(workdir / "prometheus")
    stack.callback(prometheus.stop)
    return prometheus.start()


def start_operator(
    stack: contextlib.ExitStack, kube: KubeApi, prometheus: PrometheusServer, workdir: Path
) -> ManagedProcess:
    """``kvpool operator`` against the emulator (its kubeconfig), reading Prometheus."""
    argv = kvpool_command(
        "operator",
        "--kubeconfig",
        str(kube.kubeconfig),
        "--namespace",
        NAMESPACE,
        "--prometheus-url",
        prometheus.url,
        "--measure-interval",
        MEASURE_INTERVAL,
        "--standalone",
        "--allow-static-endpoints",  # local mode: the engines have no pods
        "--metrics-port",
        "0",
        "--health-port",
        "0",
    )
    operator = ManagedProcess(
        argv, log_path=workdir / "operator.log", env=dict(os.environ), cwd=REPO
    )
    stack.callback(operator.stop)
    operator.start()
    return operator


def start_engines(
    stack: contextlib.ExitStack, model_dir: Path, ports: Sequence[int], workdir: Path
) -> list[VllmEngine]:
    """The vLLM engines, one after another (two cores do not start two at once well).

    Each serves the tiny model as ``tiny`` with a 2 MiB KV cache, ``--max-num-seqs 8`` and
    ``--scheduling-policy priority`` (the request field ``priority`` the gateway sets by tier).
    With several engines, each is pinned to its own core (``VLLM_CPU_OMP_THREADS_BIND``):
    left to "auto", they bind their OpenMP threads to the same core and crawl.
    """
    engines = []
    cores = os.cpu_count() or 1
    for index, port in enumerate(ports):
        env = {"VLLM_CPU_OMP_THREADS_BIND": str(index % cores)} if len(ports) > 1 else {}
        config = EngineConfig(
            model_dir=model_dir,
            served_model_name=POOL,
            max_model_len=512,
            max_num_seqs=8,
            kv_cache_memory_bytes=KV_CACHE_BYTES,
            scheduling_policy="priority",
            extra_env=env,
        )
        engine = VllmEngine(config, log_path=workdir / f"engine-{index}.log", port=port)
        stack.callback(engine.stop)
        engine.start()
        engines.append(engine)
    return engines


def start_gateway(
    stack: contextlib.ExitStack,
    kube: KubeApi,
    redis: RedisServer,
    workdir: Path,
    name: str = "gateway",
) -> tuple[ManagedProcess, str]:
    """``kvpool gateway`` reading the operator's ConfigMap from the API, budgets in Redis
    (and, with Redis, leasing the plan with any other replica on it); ``name`` is its id
    among the replicas and its log's name."""
    port = free_port()
    argv = kvpool_command(
        "gateway",
        "--configmap",
        NAMESPACE,
        "--kube-server",
        kube.url,
        "--redis",
        redis.url,
        "--listen",
        f"127.0.0.1:{port}",
        "--no-access-log",
        "--replica-id",
        name,
        "--metrics-on-api-port",  # scraped from the API port by the demo's Prometheus
        "--metrics-listen",
        "",  # no second listener: 0.0.0.0:8081 may be taken on a shared machine
    )
    gateway = ManagedProcess(argv, log_path=workdir / f"{name}.log", env=dict(os.environ), cwd=REPO)
    stack.callback(gateway.stop)
    gateway.start()
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: http_ok(f"{url}/readyz"), 30, "gateway ready", gateway)
    return gateway, url


class Watched(Protocol):
    """A running component :func:`wait_until` can watch (ManagedProcess, PrometheusServer)."""

    def running(self) -> bool: ...

    def log_tail(self) -> str: ...


def wait_until(
    predicate: Callable[[], Any],
    timeout: float,
    what: str,
    process: Watched | None = None,
    interval: float = 0.5,
) -> Any:
    """Poll until ``predicate()`` is truthy and return its value
    (:func:`tests.support.waiting.wait_until`).

    Fails early, with the component's log tail, if ``process`` exits; on a timeout the
    message also ends with its log tail (the operator's log says why a status is missing).
    """

    def check() -> Any:
        value = predicate()
        if not value and process is not None and not process.running():
            raise StopWaitingError(f"{what}: the process exited\n{process.log_tail()}")
        return value

    try:
        return waiting.wait_until(check, timeout, what, interval=interval)
    except StopWaitingError as exc:
        raise RuntimeError(str(exc)) from None
    except waiting.WaitTimeoutError as exc:
        tail = f"\nlast log lines:\n{process.log_tail()}" if process is not None else ""
        raise TimeoutError(f"{what}: not after {timeout:.0f} s{tail}") from exc


def http_ok(url: str) -> bool:
    """True when ``GET url`` answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def fetch_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def fetch_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return str(resp.read().decode())


def warm_up(engines: Sequence[VllmEngine]) -> None:
    """One request straight to each engine, so the first measured request pays no warm-up."""
    for engine in engines:
        engine.post_json(
            "/v1/completions", {"model": POOL, "prompt": "warm up", "max_tokens": 8}, timeout=60
        )


class HasRss(Protocol):
    """Anything whose resident memory can be measured."""

    def rss_bytes(self) -> int: ...


def rss_mib(processes: Mapping[str, HasRss]) -> dict[str, float]:
    """Resident memory of each component (and of this process, which runs the emulator)."""
    sizes = {name: round(p.rss_bytes() / 2**20, 1) for name, p in processes.items()}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            sizes["demo+emulator"] = round(int(line.split()[1]) / 1024, 1)
    sizes["total"] = round(sum(sizes.values()), 1)
    return sizes


class EngineGroup:
    """Several engines measured as one (their summed RSS)."""

    def __init__(self, engines: Sequence[VllmEngine]) -> None:
        self.engines = engines

    def rss_bytes(self) -> int:
        return sum(e.rss_bytes() for e in self.engines)
