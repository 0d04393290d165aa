"""Rollout reaction time: how fast a bad canary is stopped, in two cases.

Why this benchmark exists: a canary that is worse than stable must be stopped quickly
(docs/0006-rollouts.md). Two cases, each runnable alone (``--cases kv``, ``--cases ttft``):

**KV case** - seconds from a half-KV canary being ready to the rollout paused. The target
is under one measurement interval (the operator's ``--measure-interval``, 15 s): a
controller that only looks at each tick reacts within 0..15 s (7.5 s on average, if the
canary's readiness falls at a random point of the interval); kvpool re-reconciles every
2 s while the KV gate waits for the canary's first measurement. Real parts: the API
emulator, a real Prometheus (1 s scrapes), two vLLM CPU engines of the tiny model (stable
2 MiB of KV = 2,048 tokens, canary 1 MiB = 1,024 tokens), the operator as a process with
``--measure-interval 15s``, in local mode (``--allow-static-endpoints``). Each round: the canary
engine is already scraped under the revision the next spec will have (so it is "ready
and measurable" at once); t0 = the spec change; reaction = until ``status.rollout.phase``
is Paused with KVCapacityShrunk; then the spec is reverted (Idle) for the next round.
Baseline in the same run: the same operator looking only at its ticks
(``KVPOOL_ROLLOUT_RECHECK_SECONDS=0``).

**TTFT case** - seconds from regression onset to the rollout stopped with
``TTFTRegressed``. The canary has the same KV as stable (2 MiB, so the KV gate passes)
but its engine runs ``--max-num-seqs 1`` (stable: 8): under concurrent load its requests
queue in the engine, so its p95 TTFT is several times stable's. The spec change that
starts each round gives a new revision (``args: [--seed=N]``); the engine behind
``kvpool.dev/canary-static-endpoints`` is the slow one - a stand-in for a slower build.
(``--max-num-seqs`` itself is owned by ``spec.engine.maxNumSeqs`` and refused in args;
lowering that field would also shrink the canary's admission plan, so the requests would
wait in the gateway rather than in the engine.) The canary is slow from its first
request, so **regression onset** is defined as the moment the canary gets traffic: the
first instant the benchmark (polling every 0.1 s) sees ``status.rollout`` in stage
Analyzing with the first step's weight (50% of the interactive tier) - the operator's
decision, which the gateway follows once it reloads its ConfigMap
(``first_canary_token_seconds`` records when the canary's first token came).
Reaction = from onset until ``status.rollout`` is Aborted (``onFailure: Abort``) with
reason TTFTRegressed. Load: 8 clients sending interactive completions through the real
gateway (``kvpool gateway``, reading the operator's ConfigMap) for the whole case, so
both tracks get samples. Rollout spec: one step (50%, 10m), ``analysisInterval: 15s``
(the default), ``minSamples: 20``, ``maxTTFTP95Ratio: 1.5``, ``failureLimit: 0``.

The gate cannot react before it has data, so the TTFT reaction is compared, per round,
with two floors measured in the same run:

- ``samples_ready_seconds``: from onset until both engines (read from their own
  ``/metrics``, every 0.25 s) have finished ``minSamples`` requests with a TTFT in the
  window the gate uses (the canary since onset; stable over ``max(elapsed, 30 s)``, the
  operator's shortest window). No analysis, however frequent, can give a verdict earlier.
- ``analysisInterval`` (15 s): a step's first analysis comes one interval after the step
  began, the next ones an interval apart, and the operator reconciles when one falls due
  (not only on its ``--measure-interval`` ticks). So kvpool reacts at the first multiple
  of ``analysisInterval`` after ``samples_ready`` (``periodic_floor_seconds``).

    .venv/bin/python bench/rollout_reaction.py [--cases kv,ttft] [--rounds 5] [--ttft-rounds 3]

Prints the figures and writes bench/results/rollout_reaction.json (the KV case at the top
level, the TTFT case under ``ttft``; a case not run keeps its previous figures).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import math
import os
import re
import statistics
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
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
from tests.support.engine import EngineConfig, VllmEngine  # noqa: E402
from tests.support.kube import KubeApi, resource_path, start_kube_api  # noqa: E402
from tests.support.ports import free_port  # noqa: E402
from tests.support.processes import ManagedProcess  # noqa: E402
from tests.support.prometheus import PrometheusServer, ScrapeTarget  # noqa: E402
from tests.support.tiny_model import tiny_model_dir  # noqa: E402

from benchkit import machine_info, write_results  # noqa: E402
from kvpool.api.modelpool import ModelPool  # noqa: E402
from kvpool.domain.revision import revision_of  # noqa: E402

INTERVAL = 15.0
MP = resource_path("kvpool.dev/v1alpha1", "modelpools", "default", "chat")


def _stable_measured(
    kube: KubeApi, prom: PrometheusServer, target: Callable[[str], ScrapeTarget]
) -> str:
    """Wait for the pool's revision, scrape stable's engine under it, and wait until the
    operator has measured its 2,048 KV tokens; returns the revision."""
    first = _wait(lambda: (kube.client.get(MP).get("status") or {}).get("revision"), 60, "rev")
    prom.set_targets({"vllm": [target(first)]})
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
    return str(first)


def _pool_doc(stable_url: str) -> dict[str, Any]:
    doc = (
        modelpool_manifest("chat")
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


def run_kv(rounds: int, workdir: Path) -> dict[str, Any]:
    """The KV case (module docstring): kvpool against a tick-only operator."""
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
        policy = tierpolicy_manifest().tier("interactive", floor=50).tier("batch", floor=40)
        kube.client.create(
            resource_path("kvpool.dev/v1alpha1", "tierpolicies", "default"), policy.dict()
        )
        doc = _pool_doc(stable.base_url)
        kube.client.create(resource_path("kvpool.dev/v1alpha1", "modelpools", "default"), doc)
        results: dict[str, list[float]] = {}
        for mode, recheck in (("kvpool", "2"), ("tick_only", "0")):
            with _operator(kube, prom, workdir, mode, recheck, ("--allow-static-endpoints",)):
                first = _stable_measured(kube, prom, lambda rev: _target(stable, rev, "stable-0"))
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
def _operator(
    kube: KubeApi,
    prom: PrometheusServer,
    workdir: Path,
    mode: str,
    recheck: str,
    extra: tuple[str, ...] = (),
) -> Any:
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
            *extra,
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


# --- TTFT case ------------------------------------------------------------------------

ANALYSIS_INTERVAL = 15.0
MIN_SAMPLES = 20
MAX_TTFT_RATIO = 1.5
MIN_WINDOW = 30.0  # the operator's shortest analysis window (adapters/prometheus.py)
CLIENTS = 8
API_KEY = "sk-rollout-bench"
TTFT_COUNT = re.compile(r"^vllm:time_to_first_token_seconds_count\{[^}]*\} ([0-9.e+]+)$", re.M)


def _ttft_count(engine: VllmEngine) -> float:
    """Requests the engine has given a first token (its own /metrics)."""
    return sum(float(v) for v in TTFT_COUNT.findall(engine.fetch_metrics_text()))


class _Counts:
    """Both engines' TTFT counts every 0.25 s, with the monotonic time of each reading."""

    def __init__(self, stable: VllmEngine, canary: VllmEngine) -> None:
        self.engines = (stable, canary)
        self.rows: list[tuple[float, float, float]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(OSError):
                stable, canary = (_ttft_count(e) for e in self.engines)
                self.rows.append((time.monotonic(), stable, canary))
            self.stop.wait(0.25)

    def at(self, moment: float) -> tuple[float, float]:
        """The last reading at or before ``moment`` (the first one if none)."""
        before = [r for r in self.rows if r[0] <= moment] or self.rows[:1]
        return before[-1][1], before[-1][2]

    def samples_ready(self, onset: float, until: float) -> float | None:
        """Seconds from onset until both tracks have MIN_SAMPLES in the gate's window."""
        _, canary0 = self.at(onset)
        for t, stable, canary in list(self.rows):
            if t < onset or t > until:
                continue
            window = max(t - onset, MIN_WINDOW)
            stable_then, _ = self.at(t - window)
            if canary - canary0 >= MIN_SAMPLES and stable - stable_then >= MIN_SAMPLES:
                return t - onset
        return None

    def first_canary(self, onset: float) -> float | None:
        """Seconds from onset until the canary gave its first first token."""
        _, canary0 = self.at(onset)
        return next((t - onset for t, _, c in list(self.rows) if t >= onset and c > canary0), None)


class _Load:
    """CLIENTS threads sending interactive completions through the gateway until stopped."""

    def __init__(self, gateway: str) -> None:
        self.gateway = gateway
        self.stop = threading.Event()
        self.statuses: dict[int, int] = {}
        self.lock = threading.Lock()
        self.pool = concurrent.futures.ThreadPoolExecutor(CLIENTS)
        self.futures = [self.pool.submit(self._client) for _ in range(CLIENTS)]

    def _client(self) -> None:
        body = {"model": "tiny", "prompt": "hello " * 20, "max_tokens": 16, "temperature": 0}
        while not self.stop.is_set():
            request = urllib.request.Request(
                f"{self.gateway}/v1/completions",
                data=json.dumps(body).encode(),
                headers={
                    "Content-Type": "application/json",
                    "Authorization": f"Bearer {API_KEY}",
                    "Host": "chat.local",
                },
                method="POST",
            )
            try:
                with urllib.request.urlopen(request, timeout=120) as resp:
                    resp.read()
                    code = int(resp.status)
            except urllib.error.HTTPError as exc:
                code = int(exc.code)
            except OSError:
                code = 0
            with self.lock:
                self.statuses[code] = self.statuses.get(code, 0) + 1
            if code != 200:
                time.sleep(0.2)

    def close(self) -> dict[str, int]:
        self.stop.set()
        for future in self.futures:
            future.result()
        self.pool.shutdown()
        return {str(k): v for k, v in sorted(self.statuses.items())}


def _ttft_setup(kube: KubeApi, stable_url: str) -> dict[str, Any]:
    """Interactive tier (Host chat.local) and batch, a tenant, a pool with a TTFT gate."""
    kube.client.create(
        resource_path("v1", "secrets", "default"),
        apikey_secret_manifest("bench-key", "api-key", API_KEY),
    )
    kube.client.create(
        resource_path("kvpool.dev/v1alpha1", "tenantbudgets", "default"),
        tenantbudget_manifest("bench")
        .tiers("interactive", "batch")
        .limit("1h", 100_000_000)
        .dict(),
    )
    policy = (
        tierpolicy_manifest()
        .tier("interactive", floor=50, lend=100, max_wait="20s")
        .tier("batch", floor=40, lend=50, max_wait="60s")
        .rule("interactive", host="chat.local")
    )
    kube.client.create(
        resource_path("kvpool.dev/v1alpha1", "tierpolicies", "default"), policy.dict()
    )
    doc = _pool_doc(stable_url)
    doc["spec"]["rollout"] = {
        "steps": [{"weight": 50, "pause": "10m"}],
        "gates": {"minSamples": MIN_SAMPLES, "maxTTFTP95Ratio": MAX_TTFT_RATIO},
        "onFailure": "Abort",
        "analysisInterval": f"{ANALYSIS_INTERVAL:g}s",
    }
    kube.client.create(resource_path("kvpool.dev/v1alpha1", "modelpools", "default"), doc)
    return doc


def _gateway(kube: KubeApi, workdir: Path, stack: contextlib.ExitStack) -> str:
    port = free_port()
    gateway = ManagedProcess(
        [
            sys.executable,
            "-m",
            "kvpool.cli",
            "gateway",
            "--configmap",
            "default",
            "--kube-server",
            kube.url,
            "--listen",
            f"127.0.0.1:{port}",
            "--metrics-listen",
            f"127.0.0.1:{free_port()}",
            "--no-access-log",
        ],
        log_path=workdir / "gateway.log",
        env=dict(os.environ),
        cwd=REPO,
    )
    gateway.start()
    stack.callback(gateway.stop)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    _wait(ready, 30, "gateway ready")
    return url


def run_ttft(rounds: int, workdir: Path) -> dict[str, Any]:
    """The TTFT case (module docstring): reaction from onset against the data floor."""
    load_before = os.getloadavg()
    with contextlib.ExitStack() as stack:
        (workdir / "kube").mkdir(parents=True, exist_ok=True)
        kube = stack.enter_context(start_kube_api(workdir / "kube"))
        model = tiny_model_dir()
        engines = []
        for name, seqs in (("stable", 8), ("slow", 1)):
            engine = VllmEngine(
                EngineConfig(
                    model_dir=model,
                    kv_cache_memory_bytes=2 * 2**20,
                    block_size=32,
                    max_num_seqs=seqs,
                ),
                log_path=workdir / f"engine-{name}.log",
            )
            stack.callback(engine.stop)
            engines.append(engine.start())
        stable, canary = engines
        prom = PrometheusServer(workdir / "prom")
        stack.callback(prom.stop)
        prom.start()
        doc = _ttft_setup(kube, stable.base_url)
        stack.enter_context(
            _operator(kube, prom, workdir, "ttft", "2", ("--allow-static-endpoints",))
        )
        first = _stable_measured(kube, prom, lambda rev: _ttft_target(stable, rev, "chat-stable-0"))
        gateway = _gateway(kube, workdir, stack)
        counts = _Counts(stable, canary)
        counts.thread.start()
        stack.callback(counts.stop.set)
        load = _Load(gateway)
        try:
            time.sleep(MIN_WINDOW)  # stable's window holds samples before the first onset
            measured = [
                _ttft_round(kube, prom, doc, stable, canary, first, counts, index)
                for index in range(rounds)
            ]
        finally:
            statuses = load.close()
    return _ttft_summary(measured, statuses, rounds, load_before)


def _ttft_target(engine: VllmEngine, revision: str, pod: str) -> ScrapeTarget:
    track = "stable" if pod.startswith("chat-stable") else "canary"
    return ScrapeTarget(
        engine.target, {**_target(engine, revision, pod).labels, "kvpool_track": track}
    )


def _ttft_round(
    kube: KubeApi,
    prom: PrometheusServer,
    doc: dict[str, Any],
    stable: VllmEngine,
    canary: VllmEngine,
    first: str,
    counts: _Counts,
    index: int,
) -> dict[str, Any]:
    # a new revision; the slowness is the canary engine's own --max-num-seqs 1 (see above)
    args = [f"--seed={index + 1}"]
    new = _revision(doc, args)
    prom.set_targets(
        {
            "vllm": [
                _ttft_target(stable, first, "chat-stable-0"),
                _ttft_target(canary, new, "chat-canary-0"),
            ]
        }
    )
    prom.wait_for(f'vllm:cache_config_info{{kvpool_revision="{new}"}}', timeout=30)
    time.sleep((index * 3.7) % INTERVAL)  # spread the onset over the tick phase
    kube.client.patch(
        MP,
        {
            "metadata": {"annotations": {"kvpool.dev/canary-static-endpoints": canary.base_url}},
            "spec": {"engine": {"args": args}},
        },
    )

    def analyzing() -> bool:
        r = _rollout(kube)
        if r.get("phase") not in (None, "Idle", "Progressing"):
            raise RuntimeError(f"round {index + 1}: stopped before onset: {r}")
        return r.get("stage") == "Analyzing" and int(r.get("weight") or 0) > 0

    try:
        _wait(analyzing, 60, "analyzing")
    except TimeoutError:
        raise TimeoutError(f"round {index + 1}: no onset within 60 s: {_rollout(kube)}") from None
    onset = time.monotonic()
    analyses: list[dict[str, Any]] = []
    seen: str | None = None
    deadline = onset + 240
    while True:
        r = _rollout(kube)
        now = time.monotonic()
        gate = next((g for g in r.get("gates") or [] if g["gate"] == "ttftP95"), None)
        if gate is not None and gate.get("measuredAt") != seen:
            seen = gate.get("measuredAt")
            analyses.append(
                {
                    "seconds": round(now - onset, 2),
                    "verdict": gate["verdict"],
                    "stable_samples": gate.get("stableSamples"),
                    "canary_samples": gate.get("canarySamples"),
                    "ratio": gate.get("ratio"),
                }
            )
        if r.get("phase") in ("Paused", "Aborted"):
            break
        if now > deadline:
            raise TimeoutError(f"round {index + 1}: not stopped within 240 s: {r}")
        time.sleep(0.1)
    reaction = now - onset
    if r.get("reason") != "TTFTRegressed":
        raise RuntimeError(f"round {index + 1}: stopped for another reason: {r}")
    time.sleep(0.5)  # one more engine reading past the verdict
    ready = counts.samples_ready(onset, now)
    first_canary = counts.first_canary(onset)
    periodic = None
    if ready is not None:
        periodic = math.ceil(ready / ANALYSIS_INTERVAL) * ANALYSIS_INTERVAL
    measured = {
        "reaction_seconds": round(reaction, 3),
        "samples_ready_seconds": round(ready, 3) if ready is not None else None,
        "after_samples_seconds": round(reaction - ready, 3) if ready is not None else None,
        "periodic_floor_seconds": periodic,
        "first_canary_token_seconds": None if first_canary is None else round(first_canary, 3),
        "phase": r.get("phase"),
        "reason": r.get("reason"),
        "gate": {k: gate.get(k) for k in ("stable", "canary", "ratio", "threshold")}
        if gate
        else None,
        "gate_samples": {"stable": gate.get("stableSamples"), "canary": gate.get("canarySamples")}
        if gate
        else None,
        "analyses": analyses,
    }
    print(
        f"ttft round {index + 1}: {r.get('phase')} TTFTRegressed {reaction:.2f} s after onset "
        f"(minSamples on both tracks after {ready if ready is None else round(ready, 2)} s; "
        f"ratio {gate.get('ratio') if gate else None}; {len(analyses)} analyses)"
    )
    kube.client.patch(MP, {"spec": {"engine": {"args": []}}})
    _wait(lambda: _rollout(kube).get("phase") == "Idle", 60, "reverted")
    return measured


def _ttft_summary(
    measured: list[dict[str, Any]],
    statuses: dict[str, int],
    rounds: int,
    load_before: tuple[float, float, float],
) -> dict[str, Any]:
    reactions = [m["reaction_seconds"] for m in measured]
    ready = [m["samples_ready_seconds"] for m in measured if m["samples_ready_seconds"] is not None]
    after = [m["after_samples_seconds"] for m in measured if m["after_samples_seconds"] is not None]
    return {
        "what": "seconds from regression onset (the first poll, every 0.1 s, that sees "
        "status.rollout Analyzing with the first step's weight: the canary gets traffic and "
        "is slow from its first request) to status.rollout Aborted/TTFTRegressed",
        "canary": "same KV as stable (2 MiB); its engine runs --max-num-seqs 1 (stable 8); "
        "the spec change is args [--seed=N] (a new revision)",
        "load": f"{CLIENTS} clients, interactive completions (16 tokens) through the gateway",
        "rollout": {
            "steps": [{"weight": 50, "pause": "10m"}],
            "analysisInterval_seconds": ANALYSIS_INTERVAL,
            "minSamples": MIN_SAMPLES,
            "maxTTFTP95Ratio": MAX_TTFT_RATIO,
            "failureLimit": 0,
            "onFailure": "Abort",
        },
        "measure_interval_seconds": INTERVAL,
        "floors": {
            "samples_ready": "seconds from onset until both engines' own /metrics show "
            "minSamples first tokens in the gate's window (canary since onset, stable over "
            "max(elapsed, 30 s)): no analysis can give a verdict earlier",
            "periodic_floor": "an analysis every analysisInterval from onset: the first "
            "multiple of analysisInterval at or after samples_ready",
        },
        "rounds": rounds,
        "per_round": measured,
        "reaction_seconds": reactions,
        "median_seconds": round(statistics.median(reactions), 3),
        "max_seconds": max(reactions),
        "samples_ready_median_seconds": round(statistics.median(ready), 3) if ready else None,
        "after_samples_median_seconds": round(statistics.median(after), 3) if after else None,
        "after_samples_max_seconds": max(after) if after else None,
        "within_samples_ready_plus_one_interval": bool(after) and max(after) <= ANALYSIS_INTERVAL,
        "gateway_statuses": statuses,
        "machine": machine_info(load_before),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="kv,ttft", help="comma-separated: kv, ttft")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per mode (KV case)")
    parser.add_argument("--ttft-rounds", type=int, default=3, help="rounds (TTFT case)")
    args = parser.parse_args()
    cases = {c.strip() for c in args.cases.split(",") if c.strip()}
    if not cases or cases - {"kv", "ttft"}:
        parser.error(f"--cases: expected kv and/or ttft, got {args.cases!r}")
    path = REPO / "bench" / "results" / "rollout_reaction.json"
    result: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    if "kv" in cases:
        with tempfile.TemporaryDirectory(prefix="kvpool-rollout-bench-") as tmp:
            result.update(run_kv(args.rounds, Path(tmp)))
        for mode in ("kvpool", "tick_only"):
            print(
                f"kv {mode}: reaction median {result[mode]['median_seconds']:.2f} s, max "
                f"{result[mode]['max_seconds']:.2f} s (measurement interval {INTERVAL:g} s)"
            )
    if "ttft" in cases:
        with tempfile.TemporaryDirectory(prefix="kvpool-rollout-bench-ttft-") as tmp:
            result["ttft"] = run_ttft(args.ttft_rounds, Path(tmp))
        t = result["ttft"]
        print(
            f"ttft: reaction median {t['median_seconds']:.2f} s (max {t['max_seconds']:.2f} s) "
            f"from onset; minSamples on both tracks after median "
            f"{t['samples_ready_median_seconds']:.2f} s; reaction - samples ready median "
            f"{t['after_samples_median_seconds']:.2f} s (analysisInterval {ANALYSIS_INTERVAL:g} s)"
        )
    print(f"wrote {write_results(path, result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
