"""The local end-to-end demo: the whole of kvpool on one machine, with no cluster.

Run from the repo root with the project's venv (``make demo`` does this)::

    .venv/bin/python -m e2e.local_demo                # 60 s with kvpool + 30 s baseline, ~2.5 min
    .venv/bin/python -m e2e.local_demo --quick        # 30 s of traffic, no baseline (smoke run)
    .venv/bin/python -m e2e.local_demo --engines 2    # two engine replicas
    .venv/bin/python -m e2e.local_demo --keep-running # leave it up, print URLs, Ctrl-C ends
    .venv/bin/python -m e2e.local_demo --no-rollout   # skip the half-KV canary rollout part
    .venv/bin/python -m e2e.local_demo --no-scaleout  # skip the second gateway replica part

Why it exists: it shows the product's point end to end - the operator *measures* the
engines' KV capacity, plans a floor per tier and publishes the compiled admission config;
the gateway enforces it, so an interactive tenant keeps its latency while a batch tenant
floods the same engines (at twice what they serve, measured at start-up) - with every
component real except the cluster itself. A baseline phase then sends the same traffic
straight to the engines (no kvpool) for comparison. Then a second gateway replica joins
through Redis (no replica count set), batch goes to one replica and chat to the other,
their leases follow the traffic without exceeding the plan, and the chat replica is
killed: the other holds the whole plan within the lease TTL (e2e/scaleout_demo.py).
Last, the pool is rolled out to a
revision with half the KV cache (a second engine): the rollout pauses with
``KVCapacityShrunk``, batch traffic stays on stable, an abort restores stable-only routing
(e2e/rollout_demo.py).

What is real: ``kvpool operator`` and ``kvpool gateway`` (subprocesses of this repo's code,
the same commands a container runs), vLLM CPU engines (``--scheduling-policy priority``,
a 2 MiB KV cache = 2048 tokens so contention is real), Prometheus scraping the engines,
Redis holding the tenant budgets, ``kubectl``.

What stands in for what (the narrative says so as it goes):

- the Kubernetes API server -> the project's API emulator (tests/support/kube.py, a kmock
  subclass) served from this process on a loopback port, with our CRDs registered. The
  demo imports it (and the engine/Prometheus/Redis helpers) from ``tests.support``:
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
import dataclasses
import datetime
import json
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.engine import VllmEngine
from tests.support.kube import KubeApi
from tests.support.ports import free_port
from tests.support.processes import ManagedProcess
from tests.support.prometheus import PrometheusServer, ScrapeTarget
from tests.support.redis_server import RedisServer
from tests.support.tiny_model import tiny_model_dir

from e2e.cluster_view import (
    api_key,
    build_local_manifests,
    build_scrape_targets,
    fetch_engine_template_labels,
    load_manifests,
    measured,
    planned,
    pool_when,
    published_config,
    show_admission_config,
    show_kubectl,
    show_plan,
    validate_manifests,
    write_manifests,
)
from e2e.components import (
    MEASURE_INTERVAL,
    NAMESPACE,
    POOL,
    REPO,
    EngineGroup,
    check_prerequisites,
    fetch_text,
    rss_mib,
    start_emulator,
    start_engines,
    start_gateway,
    start_operator,
    start_prometheus,
    start_redis,
    wait_until,
    warm_up,
)
from e2e.report import (
    EngineDelta,
    RequestRecord,
    Sample,
    TierResult,
    build_engine_delta,
    build_tier_result,
    describe_budget_overlap,
    format_table,
    parse_samples,
)
from e2e.rollout_demo import run_rollout
from e2e.scaleout_demo import run_scaleout
from e2e.traffic import (
    TrafficClass,
    build_batch,
    build_interactive,
    drive_traffic,
    measure_saturated_rate,
)
from kvpool.api.admission_config import AdmissionConfig

RESULTS = REPO / "bench" / "results" / "local_demo.json"
INTERACTIVE_SECRET = "tenant-chat-app"  # e2e/manifests/30-tenants.yaml
BATCH_SECRET = "tenant-bulk-summarizer"
TIERS = ("interactive", "batch")
BASELINE_DRAIN_SECONDS = 20.0  # direct-to-engine requests still queued then are abandoned
FLOOD_FACTOR = 2.0  # the batch tenant sends this many times what the engines can serve
SCRAPE_JOB = "vllm"  # the Prometheus job of the engines (and the gateway)


@dataclass(frozen=True)
class DemoOptions:
    """What the command line asked for."""

    duration: float  # seconds of traffic through kvpool
    baseline_duration: float  # seconds of the same traffic straight to the engines (0: none)
    engines: int  # vLLM engine replicas (1 or 2)
    keep_running: bool  # leave everything up after the report, until Ctrl-C
    interactive_rate: float  # interactive requests per second (Poisson)
    batch_rate: float | None  # batch requests/s (Poisson); None: FLOOD_FACTOR x measured
    workdir: Path  # logs, rendered manifests, Prometheus data
    results: Path  # where the JSON results go
    rollout: bool = True  # roll out a half-KV revision after the traffic phases
    scaleout: bool = True  # a second gateway replica, skewed ingress, one replica killed


def parse_options(argv: Sequence[str] | None = None) -> DemoOptions:
    """Options from the command line (see the module docstring)."""
    parser = argparse.ArgumentParser(
        prog="python -m e2e.local_demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--duration", type=float, default=None, help="seconds of traffic (60)")
    parser.add_argument("--quick", action="store_true", help="30 s of traffic, no baseline")
    parser.add_argument(
        "--baseline",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also send the traffic straight to the engines (default: on unless --quick)",
    )
    parser.add_argument("--engines", type=int, choices=(1, 2), default=1, help="engine replicas")
    parser.add_argument("--keep-running", action="store_true", help="stay up until Ctrl-C")
    parser.add_argument("--interactive-rate", type=float, default=1.5, help="requests/s")
    parser.add_argument(
        "--batch-rate",
        type=float,
        default=None,
        help=f"requests/s (default: {FLOOD_FACTOR:g} x what the engines serve, measured)",
    )
    parser.add_argument("--workdir", type=Path, default=None, help="default: a new /tmp dir")
    parser.add_argument("--results", type=Path, default=RESULTS, help="JSON results file")
    parser.add_argument(
        "--rollout",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="then roll out a half-KV revision: paused KVCapacityShrunk, abort (default: on)",
    )
    parser.add_argument(
        "--scaleout",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="then a second gateway replica with skewed ingress, and one killed (default: on)",
    )
    args = parser.parse_args(argv)
    duration = args.duration if args.duration is not None else (30.0 if args.quick else 60.0)
    baseline = args.baseline if args.baseline is not None else not args.quick
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="kvpool-demo-"))
    return DemoOptions(
        duration=duration,
        baseline_duration=min(duration, 30.0) if baseline else 0.0,
        engines=args.engines,
        keep_running=args.keep_running,
        interactive_rate=args.interactive_rate,
        batch_rate=args.batch_rate,
        workdir=workdir.resolve(),
        results=args.results.resolve(),
        rollout=args.rollout,
        scaleout=args.scaleout,
    )


class Narrator:
    """Prints the story as it happens, each step stamped with the seconds since the start."""

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
        """Record how long a phase took (into the results' ``timings_seconds``)."""
        started = time.monotonic()
        yield
        self.timings[name] = round(time.monotonic() - started, 1)


@dataclass
class System:
    """Everything that runs once bring-up is done."""

    docs: list[dict[str, Any]]  # the demo manifests as written in e2e/manifests
    kube: KubeApi
    redis: RedisServer
    prometheus: PrometheusServer
    operator: ManagedProcess
    engines: list[VllmEngine]
    targets: list[ScrapeTarget]  # what Prometheus scrapes (engines)
    pool: dict[str, Any]  # the ModelPool with its measured status
    config: AdmissionConfig  # the compiled config the operator published
    gateway: ManagedProcess | None = None
    gateway_url: str = ""
    saturated_rate: float | None = None  # batch requests/s the engines serve (measured)
    batch_rate: float = 0.0  # batch requests/s the batch tenant sends


# --- bring-up, one step of the story each ------------------------------------------------------


def prepare(narrator: Narrator, workdir: Path) -> Path:
    """Prerequisites, ``kvpool validate``, the tiny model; returns the model directory."""
    narrator.step("Check prerequisites and validate the demo manifests")
    check_prerequisites()
    validate_manifests(narrator.say)
    narrator.say(f"work directory (logs, rendered manifests): {workdir}")
    narrator.step("Generate (or reuse) the tiny random-weight model")
    with narrator.timed("model"):
        model_dir = tiny_model_dir()
    narrator.say(f"{model_dir} - stands in for a real model; 1 KiB of KV cache per token")
    return model_dir


def start_infrastructure(
    stack: contextlib.ExitStack, narrator: Narrator, workdir: Path
) -> tuple[KubeApi, RedisServer, PrometheusServer, ManagedProcess]:
    """The API emulator, Redis, Prometheus, then the operator against them."""
    narrator.step("Start the Kubernetes API emulator, Redis and Prometheus")
    with narrator.timed("infrastructure"):
        kube = start_emulator(stack, workdir)
        redis = start_redis(stack, workdir)
        prometheus = start_prometheus(stack, workdir)
    narrator.say(
        f"Kubernetes API emulator {kube.url} (kubeconfig {kube.kubeconfig}) - stands in for a"
        " cluster's API server; CRDs from crds/*.yaml registered\n"
        f"Redis {redis.url} (tenant budgets)\nPrometheus {prometheus.url} (scrapes every 1 s)"
    )
    narrator.step("Start the operator: kvpool operator --prometheus-url ...")
    operator = start_operator(stack, kube, prometheus, workdir)
    narrator.say(f"pid {operator.pid}, namespace {NAMESPACE}, re-plans every {MEASURE_INTERVAL}")
    return kube, redis, prometheus, operator


def apply_and_plan_declared(
    narrator: Narrator,
    kube: KubeApi,
    operator: ManagedProcess,
    docs: list[dict[str, Any]],
    model_dir: Path,
    ports: Sequence[int],
    workdir: Path,
) -> None:
    """Apply the manifests; the operator plans with the declared capacity first."""
    narrator.step("Apply the manifests (TierPolicy, ModelPool, TenantBudgets + Secrets)")
    rendered = write_manifests(
        build_local_manifests(docs, model_dir, ports), workdir / "manifests" / "demo.yaml"
    )
    narrator.say(
        "filled in for this machine: the ModelPool's kvpool.dev/static-endpoints annotation "
        f"(engines on ports {list(ports)}; there are no pods), model and tokenizer paths, "
        f"minReplicas {len(ports)}"
    )
    show_kubectl(narrator.say, kube, "apply", "--validate=false", "-f", str(rendered))
    narrator.step("The operator plans with the DECLARED capacity (no engine reports yet)")
    with narrator.timed("declared_plan"):
        pool = wait_until(
            lambda: pool_when(kube, planned), 60, "a plan in the ModelPool status", operator
        )
    show_plan(narrator.say, pool)


def start_and_measure(
    stack: contextlib.ExitStack,
    narrator: Narrator,
    kube: KubeApi,
    prometheus: PrometheusServer,
    operator: ManagedProcess,
    model_dir: Path,
    ports: Sequence[int],
    workdir: Path,
) -> tuple[list[VllmEngine], list[ScrapeTarget], dict[str, Any], AdmissionConfig]:
    """Start the engines, let Prometheus scrape them, wait for the measured plan."""
    narrator.step(f"Start {len(ports)} vLLM CPU engine(s) - they stand in for the pods")
    with narrator.timed("engines"):
        engines = start_engines(stack, model_dir, ports, workdir)
    for index, engine in enumerate(engines):
        info = engine.fetch_cache_config()
        narrator.say(
            f"engine-{index}: {engine.base_url} healthy after {engine.start_seconds:.0f} s; it "
            f"reports {info.capacity_tokens} KV tokens ({info.num_gpu_blocks} blocks of "
            f"{info.block_size})"
        )
    narrator.step("Prometheus scrapes the engines with the labels of the operator's pods")
    pod_labels = wait_until(
        lambda: fetch_engine_template_labels(kube), 30, "the engine Deployment", operator
    )
    targets = build_scrape_targets([e.target for e in engines], pod_labels)
    prometheus.set_targets({SCRAPE_JOB: targets})
    for target in targets:
        labels = ", ".join(f'{k}="{v}"' for k, v in sorted(target.labels.items()))
        narrator.say(f"{target.address}  {{{labels}}}")
    narrator.say("(in a cluster: kubernetes_sd + relabeling of the Deployment's pod labels)")
    narrator.step("The operator replans with the MEASURED capacity")
    with narrator.timed("measured_plan"):
        pool = wait_until(
            lambda: pool_when(kube, lambda p: measured(p, len(engines))),
            90,
            "status.capacity.source Measured",
            operator,
        )
        config = wait_until(
            lambda: published_config(kube, len(engines)),
            60,
            "the admission ConfigMap with the measured plan",
            operator,
        )
    show_plan(narrator.say, pool)
    show_kubectl(narrator.say, kube, "get", "kvpool", "-A")
    show_admission_config(narrator.say, config)
    return engines, targets, pool, config


def bring_up(stack: contextlib.ExitStack, options: DemoOptions, narrator: Narrator) -> System:
    """Everything up to a gateway serving the measured plan."""
    docs = load_manifests()
    model_dir = prepare(narrator, options.workdir)
    kube, redis, prometheus, operator = start_infrastructure(stack, narrator, options.workdir)
    ports = [free_port() for _ in range(options.engines)]
    apply_and_plan_declared(narrator, kube, operator, docs, model_dir, ports, options.workdir)
    engines, targets, pool, config = start_and_measure(
        stack, narrator, kube, prometheus, operator, model_dir, ports, options.workdir
    )
    system = System(docs, kube, redis, prometheus, operator, engines, targets, pool, config)
    narrator.step("Start the gateway on the compiled config (budgets in Redis)")
    system.gateway, system.gateway_url = start_gateway(stack, kube, redis, options.workdir)
    narrator.say(
        f"{system.gateway_url} (kvpool gateway --configmap {NAMESPACE} --kube-server "
        f"{kube.url} --redis {redis.url}): it polls the operator's ConfigMap"
    )
    gateway_target = ScrapeTarget(system.gateway_url.removeprefix("http://"), {"role": "gateway"})
    prometheus.set_targets({SCRAPE_JOB: [*targets, gateway_target]})
    warm_up(engines)
    calibrate_flood(narrator, system, options)
    return system


def calibrate_flood(narrator: Narrator, system: System, options: DemoOptions) -> None:
    """Set the batch rate: ``FLOOD_FACTOR`` x what the engines serve when saturated, measured
    now (straight to each engine), so the batch tenant floods whatever this machine's
    speed at the moment; ``--batch-rate`` overrides."""
    if options.batch_rate is not None:
        system.batch_rate = options.batch_rate
        return
    probe = build_batch("", 1.0)
    rates = [asyncio.run(measure_saturated_rate(e.base_url, POOL, probe)) for e in system.engines]
    system.saturated_rate = round(sum(rates), 2)
    system.batch_rate = round(FLOOD_FACTOR * system.saturated_rate, 1)
    narrator.say(
        f"calibration: 8 batch requests at once, straight to each engine, complete at "
        f"{system.saturated_rate:g} requests/s in all; the batch tenant will send "
        f"{FLOOD_FACTOR:g}x that: {system.batch_rate:g}/s"
    )


# --- traffic phases ----------------------------------------------------------------------------


@dataclass(frozen=True)
class PhaseResult:
    """The figures of one traffic phase."""

    tiers: list[TierResult]
    engine: EngineDelta
    duration: float  # seconds of arrivals
    elapsed: float  # seconds from the first request to the last answer (arrivals + drain)


def traffic_classes(system: System, options: DemoOptions) -> list[TrafficClass]:
    """The two tenants' traffic, with their API keys from the manifests."""
    return [
        build_interactive(api_key(system.docs, INTERACTIVE_SECRET), options.interactive_rate),
        build_batch(api_key(system.docs, BATCH_SECRET), system.batch_rate),
    ]


def run_phase(
    system: System,
    options: DemoOptions,
    base_urls: Sequence[str],
    duration: float,
    drain_seconds: float,
    gateway_metrics: bool,
) -> tuple[PhaseResult, list[Sample]]:
    """Drive the traffic at ``base_urls``; measure the engines' counters around it."""
    before = [parse_samples(e.fetch_metrics_text()) for e in system.engines]
    started = time.monotonic()
    records: list[RequestRecord] = asyncio.run(
        drive_traffic(
            base_urls, POOL, traffic_classes(system, options), duration, drain_seconds=drain_seconds
        )
    )
    elapsed = time.monotonic() - started
    after = [parse_samples(e.fetch_metrics_text()) for e in system.engines]
    samples = parse_samples(fetch_text(f"{system.gateway_url}/metrics")) if gateway_metrics else []
    tiers = [build_tier_result(t, records, samples, elapsed) for t in TIERS]
    return PhaseResult(tiers, build_engine_delta(before, after), duration, elapsed), samples


def run_with_kvpool(
    system: System, options: DemoOptions, narrator: Narrator
) -> tuple[PhaseResult, list[Sample], dict[str, float]]:
    """Both tenants through the gateway; returns figures, gateway samples and memory."""
    narrator.step(
        f"Drive traffic through the gateway for {options.duration:.0f} s: interactive chat at "
        f"{options.interactive_rate:g}/s (Poisson, streamed) + batch flood at "
        f"{system.batch_rate:g}/s of ~370-token requests"
    )
    with narrator.timed("traffic"):
        result, samples = run_phase(
            system, options, [system.gateway_url], options.duration, 60.0, gateway_metrics=True
        )
    assert system.gateway is not None
    memory = rss_mib(
        {
            "engines": EngineGroup(system.engines),
            "operator": system.operator,
            "gateway": system.gateway,
            "prometheus": system.prometheus.process,
            "redis": system.redis.process,
        }
    )
    narrator.step("Results with kvpool")
    print(format_table(result.tiers, result.engine), flush=True)
    narrator.say(summarise(result))
    narrator.say(describe_budget_overlap(samples))
    narrator.say("memory (RSS, MiB): " + ", ".join(f"{k} {v:.0f}" for k, v in memory.items()))
    return result, samples, memory


def run_baseline(system: System, options: DemoOptions, narrator: Narrator) -> PhaseResult:
    """The same traffic straight to the engines: no tiers, no floors, engine FCFS."""
    narrator.step(
        f"Baseline: the same traffic for {options.baseline_duration:.0f} s straight to the "
        "engine(s), without kvpool (no admission, no tier priority)"
    )
    with narrator.timed("baseline"):
        result, _ = run_phase(
            system,
            options,
            [e.base_url for e in system.engines],
            options.baseline_duration,
            BASELINE_DRAIN_SECONDS,
            gateway_metrics=False,
        )
    narrator.step("Results without kvpool (requests unfinished after the drain count as FAILED)")
    print(format_table(result.tiers, result.engine), flush=True)
    narrator.say(summarise(result))
    return result


def summarise(result: PhaseResult) -> str:
    """One sentence on what a table shows (computed, not scripted)."""
    by = {t.tier: t for t in result.tiers}
    interactive, batch = by["interactive"], by["batch"]
    served = interactive.admitted / interactive.requests if interactive.requests else 0.0
    return (
        f"interactive: {served:.0%} of {interactive.requests} requests served, TTFT p95 "
        f"{_ms(interactive.ttft_p95)}; batch: {batch.admitted} served at "
        f"{batch.tokens_per_second:g} output tokens/s, {batch.rejected} refused, "
        f"{batch.failed} failed; {result.engine.preemptions} engine preemptions"
    )


def compare(kvpool: PhaseResult, baseline: PhaseResult) -> str:
    """The with/without comparison, tier by tier (computed from the two tables)."""
    with_, without = ({t.tier: t for t in r.tiers} for r in (kvpool, baseline))
    lines = []
    for tier in TIERS:
        a, b = with_[tier], without[tier]
        lines.append(
            f"{tier:<12} TTFT p95 {_ms(a.ttft_p95):>8} with kvpool vs {_ms(b.ttft_p95):>8} "
            f"without; served {a.admitted}/{a.requests} vs {b.admitted}/{b.requests}; "
            f"{a.tokens_per_second:g} vs {b.tokens_per_second:g} output tokens/s"
        )
    lines.append(
        f"engine preemptions: {kvpool.engine.preemptions} in {kvpool.duration:.0f} s with kvpool "
        f"vs {baseline.engine.preemptions} in {baseline.duration:.0f} s without"
    )
    return "\n".join(lines)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


# --- results -----------------------------------------------------------------------------------


def build_results(
    options: DemoOptions,
    narrator: Narrator,
    system: System,
    kvpool: PhaseResult,
    gateway_samples: Sequence[Sample],
    memory: Mapping[str, float],
    baseline: PhaseResult | None,
) -> dict[str, Any]:
    """The JSON document: the kvpool phase at the top level, the baseline beside it."""
    status = system.pool.get("status") or {}
    document: dict[str, Any] = {
        "generated_at": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": " ".join(["python -m e2e.local_demo", *sys.argv[1:]]),
        "duration_seconds": options.duration,
        "elapsed_seconds": round(kvpool.elapsed, 1),
        "engines": options.engines,
        "rates_per_second": {"interactive": options.interactive_rate, "batch": system.batch_rate},
        "engines_saturated_batch_rate": system.saturated_rate,
        "capacity": status.get("capacity"),
        "engine_reported_kv_tokens": [
            e.fetch_cache_config().capacity_tokens for e in system.engines
        ],
        "plan": status.get("plan"),
        "compiled_pool": system.config.pools[0].model_dump(by_alias=True, mode="json"),
        "queue_histogram_tiers": sorted(
            {s[1]["tier"] for s in gateway_samples if s[0] == "kvpool_gateway_queue_seconds_count"}
        ),
        "tiers": {t.tier: _asdict(t) for t in kvpool.tiers},
        "engine": _asdict(kvpool.engine),
        "baseline": None,
        "timings_seconds": {**narrator.timings, "total_until_report": round(narrator.elapsed(), 1)},
        "memory_mib": dict(memory),
    }
    if baseline is not None:
        document["baseline"] = {
            "duration_seconds": baseline.duration,
            "elapsed_seconds": round(baseline.elapsed, 1),
            "drain_seconds": BASELINE_DRAIN_SECONDS,
            "tiers": {t.tier: _asdict(t) for t in baseline.tiers},
            "engine": _asdict(baseline.engine),
        }
    return document


def _asdict(value: Any) -> dict[str, Any]:
    return dataclasses.asdict(value)


def write_results(path: Path, document: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")


def keep_running(narrator: Narrator, system: System) -> None:
    """Print where everything is and wait for Ctrl-C."""
    narrator.step("Everything stays up until Ctrl-C")
    key = api_key(system.docs, INTERACTIVE_SECRET)
    url = system.gateway_url
    narrator.say(
        f"Kubernetes API  {system.kube.url}   "
        f"kubectl --kubeconfig {system.kube.kubeconfig} get kvpool -A\n"
        f"Gateway         {url}   (/metrics, /readyz)\n"
        f"Prometheus      {system.prometheus.url}\n"
        f"Redis           {system.redis.url}\n"
        + "\n".join(f"Engine {i}        {e.base_url}" for i, e in enumerate(system.engines))
        + f"\ntry: curl -N {url}/v1/chat/completions -H 'Content-Type: application/json' "
        f"-H 'Authorization: Bearer {key}' "
        f'-d \'{{"model":"{POOL}","messages":[{{"role":"user","content":"hi"}}],'
        '"stream":true,"max_tokens":16}\''
    )
    with contextlib.suppress(KeyboardInterrupt):
        while True:
            time.sleep(3600)


def run_demo(options: DemoOptions) -> dict[str, Any]:
    """Bring everything up, drive traffic, report, tear everything down."""
    narrator = Narrator()
    options.workdir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        system = bring_up(stack, options, narrator)
        kvpool, samples, memory = run_with_kvpool(system, options, narrator)
        baseline = run_baseline(system, options, narrator) if options.baseline_duration else None
        if baseline is not None:
            narrator.step("With kvpool vs without")
            narrator.say(compare(kvpool, baseline))
        document = build_results(options, narrator, system, kvpool, samples, memory, baseline)
        if options.scaleout:
            document["scaleout"] = run_scaleout(
                stack,
                system,
                narrator.say,
                narrator.step,
                (api_key(system.docs, INTERACTIVE_SECRET), api_key(system.docs, BATCH_SECRET)),
                options.workdir,
            )
        if options.rollout:
            document["rollout"] = run_rollout(
                stack,
                system,
                narrator.say,
                narrator.step,
                api_key(system.docs, BATCH_SECRET),
                options.workdir,
            )
        write_results(options.results, document)
        narrator.say(f"results written to {options.results}")
        if options.keep_running:
            keep_running(narrator, system)
        narrator.step("Tear down (every process stopped)")
    print(f"[{narrator.elapsed():6.1f}s] done.", flush=True)
    return document


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
    except (RuntimeError, TimeoutError) as exc:
        print(
            f"\nlocal demo FAILED: {exc}\n(everything started has been stopped; logs in "
            f"{options.workdir})",
            file=sys.stderr,
            flush=True,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
