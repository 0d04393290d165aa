"""The local end-to-end demo: the whole of kvpool on one machine, with no cluster.

Run from the repo root with the project's venv (``make demo`` does this)::

    .venv/bin/python -m e2e.local_demo                # ~60 s of traffic, ~2-3 min in all
    .venv/bin/python -m e2e.local_demo --quick        # ~30 s of traffic (smoke run)
    .venv/bin/python -m e2e.local_demo --engines 2    # two engine replicas
    .venv/bin/python -m e2e.local_demo --keep-running # leave it up, print URLs, Ctrl-C ends

Why it exists: it shows the product's point end to end - the operator *measures* the
engines' KV capacity, plans a floor per tier and publishes the compiled admission config;
the gateway enforces it, so an interactive tenant keeps its latency while a batch tenant
floods the same engines - with every component real except the cluster itself.

What is real: ``kvpool operator`` and ``kvpool gateway`` (subprocesses of this repo's code,
the same commands a container runs), vLLM CPU engines (``--scheduling-policy priority``,
a 2 MiB KV cache = 2048 tokens so contention is real), Prometheus scraping the engines,
Redis holding the tenant budgets, ``kubectl``.

What stands in for what (the narrative says so as it goes):

- the Kubernetes API server -> the project's API emulator (tests/support/kube.py, a kmock
  subclass) served from this process on a loopback port, with our CRDs registered. This
  harness imports it (and the engine/Prometheus/Redis helpers) from ``tests.support``:
  acceptable for a local harness, which is test tooling, not product code;
- the kubelet and the engine pods -> vLLM processes started here; there are no pods, so
  the ModelPool carries the local-mode annotation ``kvpool.dev/static-endpoints`` naming the
  engines, which the operator uses instead of pod IPs (its Deployment stays unscheduled);
- the real model -> the tiny random-weight Llama (tests/support/tiny_model.py);
- Prometheus' kubernetes_sd + relabeling of pod labels -> a file_sd target file written
  here, carrying the labels the operator queries by (``namespace``, ``kvpool_pool``,
  ``kvpool_revision``, ``kvpool_track``, ``pod``) copied from the pod template of the
  Deployment the operator wrote.

Everything started is stopped in ``finally`` (also on Ctrl-C and SIGTERM). Logs and the
rendered manifests stay in the work directory the demo prints; the figures are written to
``bench/results/local_demo.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml
from tests.support.engine import EngineConfig, VllmEngine
from tests.support.kube import KubeApi, KubeApiError, resource_path, start_kube_api
from tests.support.ports import free_port
from tests.support.processes import ManagedProcess
from tests.support.prometheus import prometheus_binary
from tests.support.redis_server import RedisServer, redis_binary
from tests.support.tiny_model import tiny_model_dir, vllm_python

from e2e.report import (
    EngineDelta,
    TierResult,
    build_engine_delta,
    build_results_document,
    build_tier_result,
    format_table,
    parse_samples,
)
from e2e.traffic import build_batch, build_interactive, drive_traffic
from kvpool.api.admission_config import CONFIGMAP_KEY, CONFIGMAP_NAME, AdmissionConfig

REPO = Path(__file__).resolve().parents[1]
MANIFESTS = REPO / "e2e" / "manifests"
RESULTS = REPO / "bench" / "results" / "local_demo.json"

NAMESPACE = "kvpool-demo"
POOL = "tiny"
STATIC_ENDPOINTS = "kvpool.dev/static-endpoints"
KV_CACHE_BYTES = 2 * 1024 * 1024  # 2048 tokens of the tiny model: four batch requests fill it
MEASURE_INTERVAL = "3s"  # the operator's re-plan period (15 s in a cluster)
INTERACTIVE_SECRET = "tenant-chat-app"
BATCH_SECRET = "tenant-bulk-summarizer"
API = "kvpool.dev/v1alpha1"


@dataclass(frozen=True)
class DemoOptions:
    """What the command line asked for."""

    duration: float  # seconds of traffic
    engines: int  # vLLM engine replicas (1 or 2)
    keep_running: bool  # leave everything up after the report, until Ctrl-C
    interactive_rate: float  # interactive requests per second (Poisson)
    batch_rate: float  # batch requests per second (Poisson): far above what the pool holds
    workdir: Path  # logs, rendered manifests, Prometheus data
    results: Path  # where the JSON results go


def parse_options(argv: Sequence[str] | None = None) -> DemoOptions:
    """Options from the command line (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m e2e.local_demo", description=__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--duration", type=float, default=None, help="seconds of traffic (60)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 30 s of traffic")
    parser.add_argument("--engines", type=int, choices=(1, 2), default=1, help="engine replicas")
    parser.add_argument("--keep-running", action="store_true", help="stay up until Ctrl-C")
    parser.add_argument("--interactive-rate", type=float, default=4.0, help="requests/s")
    parser.add_argument("--batch-rate", type=float, default=10.0, help="requests/s")
    parser.add_argument("--workdir", type=Path, default=None, help="default: a new /tmp dir")
    parser.add_argument("--results", type=Path, default=RESULTS, help="JSON results file")
    args = parser.parse_args(argv)
    duration = args.duration if args.duration is not None else (30.0 if args.quick else 60.0)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="kvpool-demo-"))
    return DemoOptions(
        duration=duration,
        engines=args.engines,
        keep_running=args.keep_running,
        interactive_rate=args.interactive_rate,
        batch_rate=args.batch_rate * args.engines,
        workdir=workdir.resolve(),
        results=args.results.resolve(),
    )


class Narrator:
    """Prints the story as it happens, each line stamped with the seconds since the start."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.timings: dict[str, float] = {}
        self._step = 0

    def step(self, title: str) -> None:
        self._step += 1
        print(f"\n[{self.elapsed():6.1f}s] == {self._step}. {title}", flush=True)

    def say(self, text: str) -> None:
        for line in text.splitlines() or [""]:
            print(f"           {line}", flush=True)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    @contextlib.contextmanager
    def timed(self, name: str) -> Iterator[None]:
        """Record how long a phase took (into the results' ``timings``)."""
        started = time.monotonic()
        yield
        self.timings[name] = round(time.monotonic() - started, 1)


# --- preparation -----------------------------------------------------------------------------


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


def validate_manifests(narrator: Narrator) -> None:
    """``kvpool validate`` on the demo manifests, exactly as a user would before applying."""
    result = subprocess.run(
        kvpool_command("validate", "-f", str(MANIFESTS)),
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )
    narrator.say(f"$ kvpool validate -f e2e/manifests\n{result.stdout.strip()}")
    if result.returncode != 0:
        raise SystemExit(f"the demo manifests do not validate:\n{result.stderr}")


def load_manifests(directory: Path = MANIFESTS) -> list[dict[str, Any]]:
    """Every document of ``directory/*.yaml`` in file order."""
    return [
        doc
        for path in sorted(directory.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if isinstance(doc, dict)
    ]


def find_doc(docs: Sequence[Mapping[str, Any]], kind: str, name: str) -> Mapping[str, Any]:
    """The one document of ``kind`` named ``name``."""
    for doc in docs:
        if doc.get("kind") == kind and doc["metadata"]["name"] == name:
            return doc
    raise LookupError(f"no {kind} {name} in {MANIFESTS}")


def api_key(docs: Sequence[Mapping[str, Any]], secret: str) -> str:
    """A tenant's API key, read from its Secret in the manifests."""
    return str(find_doc(docs, "Secret", secret)["stringData"]["api-key"])


def build_local_manifests(
    docs: Sequence[dict[str, Any]], model_dir: Path, engine_ports: Sequence[int]
) -> list[dict[str, Any]]:
    """The manifests with this machine's facts filled in (the ModelPool only):

    the engines' URLs in ``kvpool.dev/static-endpoints``, the model and tokenizer paths,
    and ``minReplicas`` = the number of engines started (no peaks are declared, so the
    plan keeps ``minReplicas`` warm).
    """
    rendered: list[dict[str, Any]] = json.loads(json.dumps(docs))
    for doc in rendered:
        if doc.get("kind") != "ModelPool":
            continue
        endpoints = ",".join(
            f"engine-{i}=http://127.0.0.1:{port}" for i, port in enumerate(engine_ports)
        )
        doc["metadata"].setdefault("annotations", {})[STATIC_ENDPOINTS] = endpoints
        doc["spec"]["model"]["name"] = str(model_dir)
        doc["spec"]["model"]["tokenizerPath"] = str(model_dir / "tokenizer.json")
        doc["spec"]["capacity"]["minReplicas"] = len(engine_ports)
    return rendered


def write_manifests(docs: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Write documents as one multi-document YAML file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return path


# --- components ------------------------------------------------------------------------------


def start_emulator(stack: contextlib.ExitStack, workdir: Path) -> KubeApi:
    """The Kubernetes API emulator with our CRDs, on a free loopback port (in this process)."""
    (workdir / "kube").mkdir(parents=True, exist_ok=True)
    return stack.enter_context(start_kube_api(workdir / "kube"))


def start_redis(stack: contextlib.ExitStack, workdir: Path) -> RedisServer:
    """A real redis-server (persistence off) for the gateway's tenant budgets."""
    redis = RedisServer(workdir / "redis")
    stack.callback(redis.stop)
    return redis.start()


@dataclass(frozen=True)
class ScrapeTarget:
    """One ``host:port`` Prometheus scrapes, with the labels its series get."""

    address: str
    labels: Mapping[str, str]


class DemoPrometheus:
    """Prometheus with file-based service discovery.

    The target file stands in for kubernetes_sd plus the relabeling a cluster's scrape
    config does (pod labels ``kvpool.dev/*`` -> ``kvpool_*``, namespace, pod name).
    Prometheus re-reads it within a second of a change, so no reload is needed.
    """

    def __init__(self, work_dir: Path) -> None:
        binary = prometheus_binary()
        assert binary is not None  # check_prerequisites ran
        self.port = free_port()
        self.targets_file = work_dir / "targets.json"
        work_dir.mkdir(parents=True, exist_ok=True)
        self.set_targets([])
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                {
                    "job_name": "kvpool-demo",
                    "scrape_interval": "1s",
                    "scrape_timeout": "1s",
                    "file_sd_configs": [
                        {"files": [str(self.targets_file)], "refresh_interval": "1s"}
                    ],
                }
            ],
        }
        (work_dir / "prometheus.yml").write_text(json.dumps(config, indent=2))
        self.process = ManagedProcess(
            [
                binary,
                f"--config.file={work_dir / 'prometheus.yml'}",
                f"--storage.tsdb.path={work_dir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            log_path=work_dir / "prometheus.log",
            env={"PATH": "/usr/bin:/bin"},
            cwd=work_dir,
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set_targets(self, targets: Sequence[ScrapeTarget]) -> None:
        """Replace the scraped targets (atomically: write, then rename)."""
        groups = [{"targets": [t.address], "labels": dict(t.labels)} for t in targets]
        tmp = self.targets_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups, indent=2))
        tmp.rename(self.targets_file)

    def start(self, timeout: float = 60.0) -> DemoPrometheus:
        self.process.start()
        wait_until(lambda: http_ok(f"{self.url}/-/ready"), timeout, "Prometheus ready", self)
        return self

    def running(self) -> bool:
        return self.process.running()

    def log_tail(self) -> str:
        return self.process.log_tail(20)

    def stop(self) -> None:
        self.process.stop(timeout=10)

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query's result vector."""
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
        result: list[dict[str, Any]] = fetch_json(url)["data"]["result"]
        return result


def start_prometheus(stack: contextlib.ExitStack, workdir: Path) -> DemoPrometheus:
    """Prometheus scraping every second; targets are added once the engines exist."""
    prometheus = DemoPrometheus(workdir / "prometheus")
    stack.callback(prometheus.stop)
    return prometheus.start()


def start_operator(
    stack: contextlib.ExitStack, kube: KubeApi, prometheus: DemoPrometheus, workdir: Path
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
    stack: contextlib.ExitStack,
    model_dir: Path,
    ports: Sequence[int],
    workdir: Path,
    narrator: Narrator,
) -> list[VllmEngine]:
    """The vLLM engines, one after another (two cores do not start two at once well)."""
    engines = []
    for index, port in enumerate(ports):
        config = EngineConfig(
            model_dir=model_dir,
            served_model_name=POOL,
            max_model_len=512,
            max_num_seqs=8,
            kv_cache_memory_bytes=KV_CACHE_BYTES,
            scheduling_policy="priority",
        )
        engine = VllmEngine(config, log_path=workdir / f"engine-{index}.log", port=port)
        stack.callback(engine.stop)
        engine.start()
        info = engine.fetch_cache_config()
        narrator.say(
            f"engine-{index}: {engine.base_url} healthy after {engine.start_seconds:.0f} s; "
            f"it reports {info.capacity_tokens} KV tokens "
            f"({info.num_gpu_blocks} blocks of {info.block_size})"
        )
        engines.append(engine)
    return engines


def start_gateway(
    stack: contextlib.ExitStack, kube: KubeApi, redis: RedisServer, workdir: Path
) -> tuple[ManagedProcess, str]:
    """``kvpool gateway`` reading the operator's ConfigMap from the API, budgets in Redis."""
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
    )
    gateway = ManagedProcess(argv, log_path=workdir / "gateway.log", env=dict(os.environ), cwd=REPO)
    stack.callback(gateway.stop)
    gateway.start()
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: http_ok(f"{url}/readyz"), 30, "gateway ready", gateway)
    return gateway, url


# --- helpers ---------------------------------------------------------------------------------


def wait_until(
    predicate: Callable[[], Any],
    timeout: float,
    what: str,
    process: Any = None,
    interval: float = 0.5,
) -> Any:
    """Poll until ``predicate()`` is truthy; fail with the process' log tail if it died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if process is not None and not process.running():
            tail = process.log_tail() if callable(getattr(process, "log_tail", None)) else ""
            raise RuntimeError(f"{what}: the process exited\n{tail}")
        time.sleep(interval)
    raise TimeoutError(f"{what}: not after {timeout:.0f} s")


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


def fetch_pool(kube: KubeApi) -> dict[str, Any]:
    """The ModelPool as the API has it (spec and status)."""
    body: dict[str, Any] = kube.client.get(resource_path(API, "modelpools", NAMESPACE, POOL))
    return body


def fetch_admission_config(kube: KubeApi) -> AdmissionConfig | None:
    """The compiled config the operator published (None until it exists)."""
    try:
        body = kube.client.get(resource_path("v1", "configmaps", NAMESPACE, CONFIGMAP_NAME))
    except KubeApiError as exc:
        if exc.status == 404:
            return None
        raise
    return AdmissionConfig.model_validate_json(body["data"][CONFIGMAP_KEY])


def fetch_engine_template_labels(kube: KubeApi) -> dict[str, str]:
    """Pod-template labels of the pool's engine Deployment (what its pods would carry)."""
    deployments = kube.client.get(resource_path("apps/v1", "deployments", NAMESPACE))
    for item in deployments.get("items", []):
        labels = item["metadata"].get("labels") or {}
        if labels.get("kvpool.dev/pool") == POOL:
            template_labels: dict[str, str] = item["spec"]["template"]["metadata"]["labels"]
            return template_labels
    return {}


def build_scrape_targets(
    addresses: Sequence[str], pod_labels: Mapping[str, str]
) -> list[ScrapeTarget]:
    """Each engine with the labels kubernetes_sd + relabeling would give its pod's series.

    ``kvpool.dev/pool: tiny`` becomes ``kvpool_pool="tiny"`` (likewise revision, track);
    the namespace and the pod name (here: the static endpoint's name) are added.
    """
    copied = {
        "kvpool_" + key.removeprefix("kvpool.dev/"): value
        for key, value in pod_labels.items()
        if key.startswith("kvpool.dev/")
    }
    return [
        ScrapeTarget(address, {**copied, "namespace": NAMESPACE, "pod": f"engine-{i}"})
        for i, address in enumerate(addresses)
    ]


def warm_up(engines: Sequence[VllmEngine]) -> None:
    """One request straight to each engine, so the first measured request pays no warm-up."""
    for engine in engines:
        engine.post_json(
            "/v1/completions", {"model": POOL, "prompt": "warm up", "max_tokens": 8}, timeout=60
        )


# --- showing what the operator did -------------------------------------------------------------


def show_plan(narrator: Narrator, pool: Mapping[str, Any]) -> None:
    """The pool's capacity figure and per-tier plan, from its status."""
    status = pool.get("status") or {}
    capacity = status.get("capacity") or {}
    plan = status.get("plan") or {}
    narrator.say(
        f"status.capacity: {capacity.get('kvTokensPerReplica')} KV tokens/replica, "
        f"source {capacity.get('source')}, revision {capacity.get('revision')}, "
        f"replicas measured {capacity.get('replicasMeasured', '-')}"
    )
    narrator.say(
        f"status.plan: {plan.get('replicas')} replica(s) x "
        f"{plan.get('usableKvTokensPerReplica')} usable tokens, "
        f"{plan.get('liveSequencesPerReplica')} live sequences each; "
        f"shared {plan.get('sharedTokens')} tokens / {plan.get('sharedSlots')} slots"
    )
    for tier in plan.get("tiers", []):
        narrator.say(
            f"  {tier['name']:<12} floor {tier['floorTokens']:>5} tokens {tier['floorSlots']:>2}"
            f" slots, lendable {tier['lendableTokens']:>5} tokens {tier['lendableSlots']:>2} slots"
        )
    for cond in status.get("conditions", []):
        narrator.say(f"  condition {cond['type']}={cond['status']} ({cond['reason']})")


def show_kubectl(narrator: Narrator, kube: KubeApi, *args: str) -> None:
    """Run kubectl against the emulator and print its output."""
    result = kube.kubectl(*args, check=False)
    narrator.say(f"$ kubectl {' '.join(args)}\n{(result.stdout or result.stderr).rstrip()}")


def show_admission_config(narrator: Narrator, config: AdmissionConfig) -> None:
    """A summary of the compiled ConfigMap the gateway will load."""
    narrator.say(
        f"ConfigMap {NAMESPACE}/{CONFIGMAP_NAME} (formatVersion {config.format_version}, "
        f"generated {config.generated_at}):"
    )
    for pool in config.pools:
        endpoints = ", ".join(f"{e.name}={e.url}" for t in pool.tracks for e in t.endpoints)
        narrator.say(
            f"  pool {pool.name} (model '{pool.served_name}'): {pool.replicas} replica(s), "
            f"{pool.tokens_per_replica} tokens and {pool.slots_per_replica} slots per replica, "
            f"planOk {pool.plan_ok}; endpoints {endpoints or '-'}"
        )
        for name, tier in pool.tiers.items():
            narrator.say(
                f"    {name:<12} floor {tier.floor_tokens:>5} tokens {tier.floor_slots:>2} slots"
            )
    for tenant in config.tenants:
        narrator.say(
            f"  tenant {tenant.tenant}: tiers {tenant.tiers}, key sha256 "
            f"{tenant.key_sha256[:12]}..., limits "
            + ", ".join(f"{w.tokens} tokens/{w.window_seconds:.0f}s" for w in tenant.limits)
        )


# --- the run ---------------------------------------------------------------------------------


def pool_when(
    kube: KubeApi, condition: Callable[[Mapping[str, Any]], bool]
) -> dict[str, Any] | None:
    """The ModelPool if ``condition`` holds for it now, else None (for :func:`wait_until`)."""
    pool = fetch_pool(kube)
    return pool if condition(pool) else None


def planned(pool: Mapping[str, Any]) -> bool:
    """True once the status carries a plan."""
    return bool((pool.get("status") or {}).get("plan"))


def measured(pool: Mapping[str, Any], engines: int) -> bool:
    """True once the status plans with the engines' measured capacity."""
    capacity = (pool.get("status") or {}).get("capacity") or {}
    return capacity.get("source") == "Measured" and (capacity.get("replicasMeasured") or 0) >= (
        engines
    )


def published_config(kube: KubeApi, engines: int) -> AdmissionConfig | None:
    """The published config once it matches the pool's measured plan, else None."""
    config = fetch_admission_config(kube)
    return config if config_matches(config, fetch_pool(kube), engines) else None


def config_matches(config: AdmissionConfig | None, pool: Mapping[str, Any], engines: int) -> bool:
    """True once the published config carries the measured plan and every engine."""
    if config is None or not config.pools:
        return False
    plan = (pool.get("status") or {}).get("plan") or {}
    compiled = config.pools[0]
    endpoints = sum(len(t.endpoints) for t in compiled.tracks)
    return compiled.tokens_per_replica == plan.get("usableKvTokensPerReplica") and (
        endpoints == engines
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


def run_demo(options: DemoOptions) -> dict[str, Any]:
    """Bring everything up, drive traffic, report, tear everything down."""
    narrator = Narrator()
    workdir = options.workdir
    workdir.mkdir(parents=True, exist_ok=True)
    docs = load_manifests()
    with contextlib.ExitStack() as stack:
        narrator.step("Check prerequisites and validate the demo manifests")
        check_prerequisites()
        validate_manifests(narrator)
        narrator.say(f"work directory (logs, rendered manifests): {workdir}")

        narrator.step("Generate (or reuse) the tiny random-weight model")
        with narrator.timed("model"):
            model_dir = tiny_model_dir()
        narrator.say(f"{model_dir} - stands in for a real model; 1 KiB of KV cache per token")

        narrator.step("Start the Kubernetes API emulator, Redis and Prometheus")
        with narrator.timed("infrastructure"):
            kube = start_emulator(stack, workdir)
            redis = start_redis(stack, workdir)
            prometheus = start_prometheus(stack, workdir)
        narrator.say(
            f"Kubernetes API emulator {kube.url} (kubeconfig {kube.kubeconfig}) - stands in for"
            " a cluster's API server; CRDs from crds/*.yaml registered\n"
            f"Redis {redis.url} (tenant budgets)\nPrometheus {prometheus.url} (scrapes every 1 s)"
        )

        narrator.step("Start the operator: kvpool operator --prometheus-url ...")
        operator = start_operator(stack, kube, prometheus, workdir)
        narrator.say(
            f"pid {operator.pid}, namespace {NAMESPACE}, re-plans every {MEASURE_INTERVAL}"
        )

        narrator.step("Apply the manifests (TierPolicy, ModelPool, TenantBudgets + Secrets)")
        ports = [free_port() for _ in range(options.engines)]
        rendered = write_manifests(
            build_local_manifests(docs, model_dir, ports), workdir / "manifests" / "demo.yaml"
        )
        narrator.say(
            "filled in for this machine: the ModelPool's kvpool.dev/static-endpoints annotation "
            f"(engines on ports {ports}; there are no pods), model and tokenizer paths, "
            f"minReplicas {options.engines}"
        )
        show_kubectl(narrator, kube, "apply", "--validate=false", "-f", str(rendered))

        narrator.step("The operator plans with the DECLARED capacity (no engine reports yet)")
        with narrator.timed("declared_plan"):
            pool = wait_until(
                lambda: pool_when(kube, planned), 60, "a plan in the ModelPool status", operator
            )
        show_plan(narrator, pool)

        narrator.step(f"Start {options.engines} vLLM CPU engine(s) - they stand in for the pods")
        with narrator.timed("engines"):
            engines = start_engines(stack, model_dir, ports, workdir, narrator)

        narrator.step("Prometheus scrapes the engines with the labels of the operator's pods")
        pod_labels = wait_until(
            lambda: fetch_engine_template_labels(kube), 30, "the engine Deployment", operator
        )
        targets = build_scrape_targets([e.target for e in engines], pod_labels)
        prometheus.set_targets(targets)
        for target in targets:
            labels = ", ".join(f'{k}="{v}"' for k, v in sorted(target.labels.items()))
            narrator.say(f"{target.address}  {{{labels}}}")
        narrator.say("(in a cluster: kubernetes_sd + relabeling of the Deployment's pod labels)")

        narrator.step("The operator replans with the MEASURED capacity")
        with narrator.timed("measured_plan"):
            pool = wait_until(
                lambda: pool_when(kube, lambda p: measured(p, options.engines)),
                90,
                "status.capacity.source Measured",
                operator,
            )
            config = wait_until(
                lambda: published_config(kube, options.engines),
                60,
                "the admission ConfigMap with the measured plan",
                operator,
            )
        show_plan(narrator, pool)
        show_kubectl(narrator, kube, "get", "kvpool", "-A")
        show_admission_config(narrator, config)

        narrator.step("Start the gateway on the compiled config (budgets in Redis)")
        gateway, gateway_url = start_gateway(stack, kube, redis, workdir)
        narrator.say(
            f"{gateway_url} (kvpool gateway --configmap {NAMESPACE} --kube-server {kube.url} "
            f"--redis {redis.url})"
        )
        prometheus.set_targets([*targets, ScrapeTarget(gateway_url[7:], {"job_role": "gateway"})])
        warm_up(engines)

        narrator.step(
            f"Drive traffic for {options.duration:.0f} s: interactive chat at "
            f"{options.interactive_rate:g}/s (Poisson, streamed) + batch flood at "
            f"{options.batch_rate:g}/s of ~370-token requests"
        )
        before = [parse_samples(e.fetch_metrics_text()) for e in engines]
        classes = [
            build_interactive(api_key(docs, INTERACTIVE_SECRET), options.interactive_rate),
            build_batch(api_key(docs, BATCH_SECRET), options.batch_rate),
        ]
        with narrator.timed("traffic"):
            records = asyncio.run(drive_traffic(gateway_url, POOL, classes, options.duration))
        memory = rss_mib(
            {
                "engines": _Group(engines),
                "operator": operator,
                "gateway": gateway,
                "prometheus": prometheus.process,
                "redis": redis.process,
            }
        )
        after = [parse_samples(e.fetch_metrics_text()) for e in engines]
        gateway_samples = parse_samples(fetch_text(f"{gateway_url}/metrics"))

        narrator.step("Results")
        tiers = [
            build_tier_result(t, records, gateway_samples, options.duration)
            for t in ("interactive", "batch")
        ]
        engine_delta = build_engine_delta(before, after)
        print(format_table(tiers, engine_delta), flush=True)
        document = build_results_document(
            tiers,
            engine_delta,
            build_context(options, narrator, pool, config, memory, gateway_samples),
        )
        options.results.parent.mkdir(parents=True, exist_ok=True)
        options.results.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n")
        narrator.say(f"results written to {options.results}")
        narrator.say("memory (RSS, MiB): " + ", ".join(f"{k} {v:.0f}" for k, v in memory.items()))
        narrator.say(summarise(tiers, engine_delta))

        if options.keep_running:
            keep_running(narrator, kube, prometheus, gateway_url, engines, redis, docs)
        narrator.step("Tear down (every process stopped)")
    print(f"[{narrator.elapsed():6.1f}s] done.", flush=True)
    return document


class _Group:
    """Several engines measured as one (their summed RSS)."""

    def __init__(self, engines: Sequence[VllmEngine]) -> None:
        self.engines = engines

    def rss_bytes(self) -> int:
        return sum(e.rss_bytes() for e in self.engines)


def build_context(
    options: DemoOptions,
    narrator: Narrator,
    pool: Mapping[str, Any],
    config: AdmissionConfig,
    memory: Mapping[str, float],
    gateway_samples: Sequence[Any],
) -> dict[str, Any]:
    """Everything in the results besides the per-tier figures."""
    status = pool.get("status") or {}
    return {
        "generated_at": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": " ".join(["python -m e2e.local_demo", *sys.argv[1:]]),
        "duration_seconds": options.duration,
        "engines": options.engines,
        "rates_per_second": {
            "interactive": options.interactive_rate,
            "batch": options.batch_rate,
        },
        "capacity": status.get("capacity"),
        "plan": status.get("plan"),
        "compiled_pool": config.pools[0].model_dump(by_alias=True, mode="json"),
        "queue_histogram_tiers": sorted(
            {s[1]["tier"] for s in gateway_samples if s[0] == "kvpool_gateway_queue_seconds_count"}
        ),
        "timings_seconds": {**narrator.timings, "total_until_report": round(narrator.elapsed(), 1)},
        "memory_mib": dict(memory),
    }


def summarise(tiers: Sequence[TierResult], engine: EngineDelta) -> str:
    """One sentence on what the table shows (computed, not scripted)."""
    by = {t.tier: t for t in tiers}
    interactive, batch = by["interactive"], by["batch"]
    ok = interactive.admitted / interactive.requests if interactive.requests else 0.0
    return (
        f"interactive: {ok:.0%} of {interactive.requests} requests served, TTFT p95 "
        f"{_ms(interactive.ttft_p95)}, queue p95 {_ms(interactive.queue_p95)}; batch: "
        f"{batch.admitted} served at {batch.tokens_per_second:g} output tokens/s, "
        f"{batch.rejected} refused by the gateway, queue p95 {_ms(batch.queue_p95)}; "
        f"{engine.preemptions} engine preemptions"
    )


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def keep_running(
    narrator: Narrator,
    kube: KubeApi,
    prometheus: DemoPrometheus,
    gateway_url: str,
    engines: Sequence[VllmEngine],
    redis: RedisServer,
    docs: Sequence[Mapping[str, Any]],
) -> None:
    """Print where everything is and wait for Ctrl-C."""
    narrator.step("Everything stays up until Ctrl-C")
    key = api_key(docs, INTERACTIVE_SECRET)
    narrator.say(
        f"Kubernetes API  {kube.url}   kubectl --kubeconfig {kube.kubeconfig} get kvpool -A\n"
        f"Gateway         {gateway_url}   (/metrics, /readyz)\n"
        f"Prometheus      {prometheus.url}\n"
        f"Redis           {redis.url}\n"
        + "\n".join(f"Engine {i}        {e.base_url}" for i, e in enumerate(engines))
        + f"\ntry: curl -N {gateway_url}/v1/chat/completions -H 'Authorization: Bearer {key}' "
        f'-d \'{{"model":"{POOL}","messages":[{{"role":"user","content":"hi"}}],'
        '"stream":true,"max_tokens":16}\''
    )
    with contextlib.suppress(KeyboardInterrupt):
        while True:
            time.sleep(3600)


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: SIGTERM is handled like Ctrl-C, so teardown always runs."""
    options = parse_options(argv)
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    try:
        run_demo(options)
    except KeyboardInterrupt:
        print("\ninterrupted: everything started has been stopped", flush=True)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
