"""Does kvpool protect an interactive tenant from a batch flood on one real engine?

Why this benchmark exists: it is the claim of the project. One real vLLM engine on CPU
(tiny model, 2 MiB of KV = 2048 tokens, 16 sequences) serves an **interactive** tenant
(steady Poisson chat, short prompts, 16 output tokens, streamed) and a **batch** tenant
flooding long prompts with long outputs (closed loop, ``--batch-workers`` at once, each
needing ~360 KV tokens: together 1.4x the KV cache). Same seeded arrival
schedule in every scenario:

- ``alone``        the interactive tenant alone, direct (the floor no policy can beat);
- ``batch-alone``  the batch tenant alone, direct (its throughput with the engine to itself);
- ``fcfs``         both direct, engine ``--scheduling-policy fcfs``;
- ``priority``     both direct, engine priority scheduling, interactive priority 0, batch 1;
- ``kvpool``       both through a ``kvpool gateway`` process on the priority engine, its
                   config compiled by the planner from the examples' manifests
                   (bench/bench_manifests.py: interactive floor 50 % lending all, batch
                   30 % lending half; the gateway sets engine priorities and reserves KV
                   per request).

Two engines run (one FCFS, one priority; prefix caching off so repeated prompts do not get
cheaper), and the scenarios run in interleaved rounds (shuffled each round): the machine's
background load drifts by minutes and must hit every scenario alike.

CPU placement (``--pin``, the default on two or more cores): the engines run on core 0, the
load generator and the gateway on core 1. In production the engine computes on a GPU and
the gateway runs on other CPUs; on this CPU-only machine an unpinned gateway competes with
the engine for the same two cores, which measures host CPU contention (the proxy's hop
delayed by the engine's decode threads), not what admission does to the engine.
``--no-pin`` shows that effect: every scenario then shares both cores with everything.

Reported per scenario: interactive TTFT p50/p95 and e2e p50 (client-side), engine queue
time (mean, ``vllm:request_queue_time_seconds``), the gateway's queue time per tier
(kvpool), batch output tokens per second, engine preemptions
(``vllm:num_preemptions_total``), and rejections. Targets (from the issue): through kvpool,
interactive p95 TTFT within 1.5x of ``alone``, while batch keeps at least its floor share
(30 %) of its ``batch-alone`` token throughput.

    .venv/bin/python bench/protection.py            # full: 80 s a scenario in 4 rounds (~8 min)
    .venv/bin/python bench/protection.py --quick    # smoke: 16 s a scenario, 2 rounds (~3 min)
    .venv/bin/python bench/protection.py --tiers three [--quick]   # issue 8's three tiers

``--tiers three`` runs the three-tier scenario of issue 8 against engine priority-only
(bench/protection_tiers.py: examples' TierPolicy, Poisson chat, a 12-worker batch flood,
3 eval workers, a ``ttftP95Target`` sweep), writes bench/results/protection_tiers.json
and, with matplotlib installed, bench/results/protection.png.

Needs the vLLM venv (scripts/ensure-vllm.sh). Starts the two engines one after the other,
only on loopback; every loop is bounded in count and time; everything started is stopped.
Results vary with the machine's load (recorded in the output): compare scenarios of the
same run, not runs. Prints a table and writes bench/results/protection.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.engine import EngineConfig, VllmEngine
from tests.support.gateway import GatewayProcess
from tests.support.tiny_model import tiny_model_dir

from bench_manifests import KEYS, POOL, compile_mix
from benchkit import (
    fetch_text,
    machine_info,
    metric_sums,
    percentile,
    pin_process,
    wait_engine_idle,
    words_text,
    write_results,
)
from protection_tiers import EXAMPLE_TTFT_TARGET, compare, draw, run_three_tiers

RESULTS = Path(__file__).resolve().parent / "results" / "protection.json"
TIERS_RESULTS = Path(__file__).resolve().parent / "results" / "protection_tiers.json"
PLOT = Path(__file__).resolve().parent / "results" / "protection.png"
REPO = Path(__file__).resolve().parent.parent
KV_BYTES = 2 * 1024 * 1024  # 2048 tokens of the tiny model
MAX_NUM_SEQS = 16
INTERACTIVE_KEY, BATCH_KEY = KEYS["interactive"], KEYS["batch"]  # examples/tenants.yaml
BATCH_FLOOR_PERCENT = 30  # examples/tierpolicy.yaml
TARGET_TTFT_RATIO = 1.5

WORDS = [
    "the",
    "a",
    "model",
    "token",
    "cache",
    "tier",
    "floor",
    "budget",
    "engine",
    "batch",
    "gateway",
    "queue",
]


def text(rng: random.Random, words: int) -> str:
    return words_text(rng, words, WORDS)


@dataclass
class Tally:
    """What one scenario observed (summed over its rounds)."""

    ttft_ms: list[float] = field(default_factory=list)
    e2e_ms: list[float] = field(default_factory=list)
    interactive_rejected: int = 0
    interactive_errors: int = 0
    batch_tokens: int = 0  # output tokens streamed to batch clients (partial requests count)
    batch_done: int = 0
    batch_rejected: int = 0
    batch_errors: int = 0
    seconds: float = 0.0
    preemptions: float = 0.0
    engine_queue_sum: float = 0.0
    engine_queue_count: float = 0.0
    gateway_queue: dict[str, list[float]] = field(default_factory=dict)  # tier -> [sum, count]


def labelled(text_: str, name: str, **labels: str) -> float:
    """One labelled sample's value (0 when absent)."""
    for line in text_.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rpartition(" ")[2])
    return 0.0


@dataclass(frozen=True)
class Scenario:
    name: str
    interactive: bool
    batch: bool
    through_gateway: bool
    priorities: bool  # direct requests carry engine priorities


SCENARIOS = {
    "alone": Scenario("alone", True, False, False, True),
    "batch-alone": Scenario("batch-alone", False, True, False, True),
    "priority": Scenario("priority", True, True, False, True),
    "kvpool": Scenario("kvpool", True, True, True, False),
    "fcfs": Scenario("fcfs", True, True, False, False),
}


async def interactive_client(
    session: aiohttp.ClientSession,
    base: str,
    scenario: Scenario,
    tally: Tally,
    schedule: list[tuple[float, str]],
    stop_at: float,
) -> None:
    started = time.monotonic()
    tasks: list[asyncio.Task[None]] = []

    async def one(prompt: str) -> None:
        body: dict[str, Any] = {
            "model": "tiny",
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 16,
            "stream": True,
            "ignore_eos": True,
        }
        if scenario.priorities:
            body["priority"] = 0
        sent = time.perf_counter()
        first: float | None = None
        try:
            async with session.post(
                f"{base}/v1/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {INTERACTIVE_KEY}"},
            ) as resp:
                if resp.status in (429, 503):
                    tally.interactive_rejected += 1
                    await resp.read()
                    return
                if resp.status != 200:
                    tally.interactive_errors += 1
                    await resp.read()
                    return
                async for line in resp.content:
                    if first is None and line.startswith(b"data: ") and b'"content"' in line:
                        first = time.perf_counter()
        except (aiohttp.ClientError, TimeoutError):
            tally.interactive_errors += 1
            return
        done = time.perf_counter()
        tally.ttft_ms.append(((first or done) - sent) * 1000)
        tally.e2e_ms.append((done - sent) * 1000)

    for offset, prompt in schedule:
        wait = started + offset - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        if time.monotonic() >= stop_at:
            break
        tasks.append(asyncio.create_task(one(prompt)))
    if tasks:
        await asyncio.wait(tasks, timeout=max(1.0, stop_at - time.monotonic() + 30))
    for task in tasks:
        task.cancel()


async def batch_worker(
    session: aiohttp.ClientSession,
    base: str,
    scenario: Scenario,
    tally: Tally,
    rng: random.Random,
    stop_at: float,
    max_tokens: int,
) -> None:
    while time.monotonic() < stop_at:
        body: dict[str, Any] = {
            "model": "tiny",
            "prompt": text(rng, 200),
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
        }
        if scenario.priorities:
            body["priority"] = 1
        try:
            remaining = max(0.1, stop_at - time.monotonic())
            async with session.post(
                f"{base}/v1/completions",
                json=body,
                headers={"Authorization": f"Bearer {BATCH_KEY}"},
                timeout=aiohttp.ClientTimeout(total=remaining),
            ) as resp:
                if resp.status in (429, 503):
                    tally.batch_rejected += 1
                    retry = float(resp.headers.get("Retry-After", "1"))
                    await resp.read()
                    await asyncio.sleep(min(retry, 1.0))
                    continue
                if resp.status != 200:
                    tally.batch_errors += 1
                    await resp.read()
                    await asyncio.sleep(0.5)
                    continue
                async for line in resp.content:
                    if line.startswith(b"data: ") and b'"text"' in line:
                        tally.batch_tokens += 1
                tally.batch_done += 1
        except (aiohttp.ClientError, TimeoutError):
            if time.monotonic() < stop_at:
                tally.batch_errors += 1


async def run_round(
    scenario: Scenario,
    engine: VllmEngine,
    gateway: GatewayProcess | None,
    args: argparse.Namespace,
    tally: Tally,
    seconds: float,
) -> None:
    """One round of a scenario (``seconds`` long), added to ``tally``."""
    rng = random.Random(args.seed)
    schedule: list[tuple[float, str]] = []
    t = 0.0
    while t < seconds and len(schedule) < seconds * args.rate * 3:
        t += rng.expovariate(args.rate)
        schedule.append((t, text(rng, 30)))
    base = gateway.url if (scenario.through_gateway and gateway) else engine.base_url
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=seconds + 60)
    ) as session:
        await wait_engine_idle(session, engine.metrics_url, 30)
        before = metric_sums(await fetch_text(session, engine.metrics_url))
        gw_before = await fetch_text(session, gateway.metrics_url) if gateway else ""
        started = time.monotonic()
        stop_at = started + seconds
        jobs: list[Awaitable[None]] = []
        if scenario.interactive:
            jobs.append(interactive_client(session, base, scenario, tally, schedule, stop_at))
        if scenario.batch:
            jobs += [
                batch_worker(
                    session,
                    base,
                    scenario,
                    tally,
                    random.Random(args.seed + i),
                    stop_at,
                    args.batch_output,
                )
                for i in range(args.batch_workers)
            ]
        await asyncio.gather(*jobs)
        tally.seconds += time.monotonic() - started
        await wait_engine_idle(session, engine.metrics_url, 30)
        after = metric_sums(await fetch_text(session, engine.metrics_url))
        gw_after = await fetch_text(session, gateway.metrics_url) if gateway else ""

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    tally.preemptions += delta("vllm:num_preemptions_total")
    tally.engine_queue_sum += delta("vllm:request_queue_time_seconds_sum")
    tally.engine_queue_count += delta("vllm:request_queue_time_seconds_count")
    if scenario.through_gateway:
        for tier in ("interactive", "batch"):
            acc = tally.gateway_queue.setdefault(tier, [0.0, 0.0])
            for i, suffix in enumerate(("_sum", "_count")):
                name = "kvpool_gateway_queue_seconds" + suffix
                acc[i] += labelled(gw_after, name, pool="tiny", tier=tier) - labelled(
                    gw_before, name, pool="tiny", tier=tier
                )


def summarise(tally: Tally) -> dict[str, Any]:
    """The figures of one scenario."""
    row: dict[str, Any] = {
        "interactive_requests": len(tally.ttft_ms),
        "interactive_ttft_p50_ms": _round(percentile(tally.ttft_ms, 50)),
        "interactive_ttft_p95_ms": _round(percentile(tally.ttft_ms, 95)),
        "interactive_e2e_p50_ms": _round(percentile(tally.e2e_ms, 50)),
        "interactive_rejected": tally.interactive_rejected,
        "interactive_errors": tally.interactive_errors,
        "engine_queue_mean_ms": _round(
            tally.engine_queue_sum / tally.engine_queue_count * 1000
            if tally.engine_queue_count
            else None
        ),
        "batch_requests": tally.batch_done,
        "batch_tokens_per_s": round(tally.batch_tokens / tally.seconds, 2) if tally.seconds else 0,
        "batch_rejected": tally.batch_rejected,
        "batch_errors": tally.batch_errors,
        "preemptions": int(tally.preemptions),
        "seconds": round(tally.seconds, 1),
    }
    for tier, (total, count) in tally.gateway_queue.items():
        row[f"gateway_queue_mean_ms_{tier}"] = _round(total / count * 1000 if count else None)
    return row


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def gateway_config(engine: VllmEngine, workdir: Path) -> Path:
    """The examples' manifests compiled by the planner for this engine (bench_manifests:
    the examples' mix, maxNumSeqs 16, maxModelLen 512): the chat tenant is interactive
    (floor 50 %), the summarizer batch (floor 30 %). Prints the plan; returns the file."""
    plan = compile_mix(
        "examples",
        {POOL: [engine.base_url]},
        workdir,
        tokenizer_path=tiny_model_dir() / "tokenizer.json",
        max_num_seqs=MAX_NUM_SEQS,
        max_model_len=512,
    )
    print(plan.describe(), flush=True)
    return plan.config_path


ENGINE_CORE = 0  # with --pin: engines here ...
CLIENT_CORE = 1  # ... the load generator and the gateway here


def start_engine(policy: str, workdir: Path, pin: bool) -> VllmEngine:
    config = EngineConfig(
        model_dir=tiny_model_dir(),
        served_model_name="tiny",
        kv_cache_memory_bytes=KV_BYTES,
        block_size=32,
        max_num_seqs=MAX_NUM_SEQS,
        max_model_len=512,
        scheduling_policy=policy,
        extra_args=("--no-enable-prefix-caching",),  # repeated prompts must not get cheaper
        extra_env={"VLLM_CPU_OMP_THREADS_BIND": str(ENGINE_CORE)} if pin else {},
    )
    return VllmEngine(config, log_path=workdir / f"vllm-{policy}.log").start()


ORDER = ("alone", "batch-alone", "fcfs", "priority", "kvpool")


async def run_all(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Both engines up (one after the other), then rounds of every scenario, interleaved.

    Background load on a shared machine drifts by minutes; interleaving short rounds (in a
    shuffled order each round) makes every scenario see the same mix of it.
    """
    engines: dict[str, VllmEngine] = {}
    gateway: GatewayProcess | None = None
    tallies = {name: Tally() for name in ORDER}
    try:
        if args.pin:  # the engine processes inherit this affinity
            os.sched_setaffinity(0, {ENGINE_CORE})
        for policy in ("priority", "fcfs"):
            engines[policy] = await asyncio.to_thread(start_engine, policy, workdir, args.pin)
        if args.pin:  # from here on: this process and the gateway it starts
            pin_process({CLIENT_CORE})  # the load generator and the gateway
        config_path = gateway_config(engines["priority"], workdir)
        gateway = GatewayProcess(
            config_path, workdir / "gateway.log", extra_args=("--no-access-log",)
        )
        await asyncio.to_thread(gateway.start)
        order = list(ORDER)
        shuffle = random.Random(args.seed)
        for round_index in range(args.rounds):
            shuffle.shuffle(order)
            for name in order:
                scenario = SCENARIOS[name]
                engine = engines["fcfs" if name == "fcfs" else "priority"]
                seconds = args.duration / args.rounds
                print(
                    f"round {round_index + 1}/{args.rounds}: {name} ({seconds:.0f} s)", flush=True
                )
                await run_round(scenario, engine, gateway, args, tallies[name], seconds)
    finally:
        if gateway is not None:
            await asyncio.to_thread(gateway.stop)
        for engine in engines.values():
            await asyncio.to_thread(engine.stop)
    return {name: summarise(tallies[name]) for name in ORDER}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 16 s a scenario")
    parser.add_argument("--duration", type=float, default=None, help="seconds a scenario (80)")
    parser.add_argument("--rate", type=float, default=2.0, help="interactive requests/s")
    parser.add_argument("--batch-workers", type=int, default=8)
    parser.add_argument("--batch-output", type=int, default=100)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (4)")
    parser.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=(os.cpu_count() or 1) >= 2,
        help="engines on core 0, load generator and gateway on core 1 (default on >= 2 cores)",
    )
    parser.add_argument("--tiers", choices=("two", "three"), default="two")
    parser.add_argument("--eval-workers", type=int, default=3, help="three tiers: eval workers")
    parser.add_argument(
        "--ttft-sweep",
        default="10,15,25,none",
        help="three tiers: interactive ttftP95Target values (ms, or none) besides the example's",
    )
    parser.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="three tiers: every engine's step budget (vLLM's default when unset); results "
        "go to protection_tiers_batched<N>.json, without the plot",
    )
    args = parser.parse_args()
    if args.tiers == "three":
        return main_three(args)
    if args.duration is None:
        args.duration = 16.0 if args.quick else 80.0
    if args.rounds is None:
        args.rounds = 2 if args.quick else 4
    load_before = os.getloadavg()
    workdir = Path(tempfile.mkdtemp(prefix="kvpool-protection-"))
    try:
        scenarios = asyncio.run(run_all(args, workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    alone_p95 = scenarios["alone"]["interactive_ttft_p95_ms"]
    kv_p95 = scenarios["kvpool"]["interactive_ttft_p95_ms"]
    batch_alone = scenarios["batch-alone"]["batch_tokens_per_s"]
    kv_batch = scenarios["kvpool"]["batch_tokens_per_s"]
    ttft_ratio = kv_p95 / alone_p95 if alone_p95 and kv_p95 else None
    batch_share = kv_batch / batch_alone if batch_alone else None
    result = {
        "benchmark": "protection",
        "quick": args.quick,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine_info(load_before),
        "params": {
            "duration_s": args.duration,
            "interactive_rate_per_s": args.rate,
            "batch_workers": args.batch_workers,
            "batch_output_tokens": args.batch_output,
            "kv_tokens": KV_BYTES // 1024,
            "max_num_seqs": MAX_NUM_SEQS,
            "seed": args.seed,
            "rounds": args.rounds,
            "pinned": args.pin,
            "max_num_batched_tokens": args.max_num_batched_tokens,
        },
        "scenarios": scenarios,
        "comparison": {
            "kvpool_ttft_p95_over_alone": None if ttft_ratio is None else round(ttft_ratio, 2),
            "kvpool_batch_share_of_alone": None if batch_share is None else round(batch_share, 2),
            "ttft_target_met": ttft_ratio is not None and ttft_ratio <= TARGET_TTFT_RATIO,
            "batch_floor_met": batch_share is not None and batch_share >= BATCH_FLOOR_PERCENT / 100,
        },
    }
    cols = (
        ("ttft p50", "interactive_ttft_p50_ms"),
        ("ttft p95", "interactive_ttft_p95_ms"),
        ("eng queue", "engine_queue_mean_ms"),
        ("batch tok/s", "batch_tokens_per_s"),
        ("preempt", "preemptions"),
        ("i-rej", "interactive_rejected"),
        ("b-rej", "batch_rejected"),
    )
    print(f"{'scenario':12}" + "".join(f"{c:>12}" for c, _ in cols))
    for name in ORDER:
        row = scenarios[name]
        cells = "".join(f"{'-' if row.get(key) is None else row[key]:>12}" for _, key in cols)
        print(f"{name:12}{cells}")
    kv = scenarios["kvpool"]
    print(
        f"kvpool gateway queue (mean ms): interactive {kv.get('gateway_queue_mean_ms_interactive')}"
        f", batch {kv.get('gateway_queue_mean_ms_batch')}"
    )
    comparison = result["comparison"]
    print(
        f"kvpool interactive p95 TTFT / alone: {comparison['kvpool_ttft_p95_over_alone']}"
        f" (target <= {TARGET_TTFT_RATIO}: {'met' if comparison['ttft_target_met'] else 'MISSED'})"
    )
    print(
        f"kvpool batch tokens/s / batch alone: {comparison['kvpool_batch_share_of_alone']}"
        f" (target >= {BATCH_FLOOR_PERCENT / 100}: "
        f"{'met' if comparison['batch_floor_met'] else 'MISSED'})"
    )
    print(f"wrote {write_results(RESULTS, result)}")
    return 0


def main_three(args: argparse.Namespace) -> int:
    """Issue 8's three tiers: kvpool against engine priority-only, and the TTFT sweep."""
    if args.duration is None:
        args.duration = 20.0 if args.quick else 30.0
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    if args.batch_workers == 8:  # the two-tier default: the flood has 12
        args.batch_workers = 12
    sweep: list[float | None] = []
    for raw in args.ttft_sweep.split(","):
        value = raw.strip().lower()
        if not value:
            continue  # --ttft-sweep "": no sweep, the example's target only
        target = None if value == "none" else float(value) / 1000
        if target != EXAMPLE_TTFT_TARGET:
            sweep.append(target)
    args.ttft_sweep = sweep
    load_before = os.getloadavg()
    workdir = Path(tempfile.mkdtemp(prefix="kvpool-protection3-"))
    try:
        scenarios = asyncio.run(run_three_tiers(args, workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    comparison = compare(scenarios)
    result = {
        "benchmark": "protection_tiers",
        "quick": args.quick,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine_info(load_before),
        "load_after": [round(v, 2) for v in os.getloadavg()],
        "params": {
            "duration_s": args.duration,
            "chat_rate_per_s": args.rate,
            "batch_workers": args.batch_workers,
            "eval_workers": args.eval_workers,
            "kv_tokens": 2048,
            "max_num_seqs": 8,
            "seed": args.seed,
            "rounds": args.rounds,
            "pinned": args.pin,
            "max_num_batched_tokens": args.max_num_batched_tokens,
        },
        "scenarios": scenarios,
        "comparison": comparison,
    }
    cols = (
        ("chat p50", "chat_ttft_p50_ms"),
        ("chat p95", "chat_ttft_p95_ms"),
        ("total t/s", "total_tokens_per_s"),
        ("batch t/s", "batch_tokens_per_s"),
        ("eval t/s", "eval_tokens_per_s"),
        ("eval shr", "eval_share"),
        ("preempt", "preemptions"),
        ("rejected", "batch_rejected"),
    )
    print(f"{'scenario':16}" + "".join(f"{c:>11}" for c, _ in cols))
    for name, row in scenarios.items():
        cells = "".join(f"{'-' if row.get(key) is None else row[key]:>11}" for _, key in cols)
        print(f"{name:16}{cells}")
    for key, value in comparison.items():
        print(f"{key}: {value}")
    if args.max_num_batched_tokens is not None:
        variant = TIERS_RESULTS.with_name(
            f"protection_tiers_batched{args.max_num_batched_tokens}.json"
        )
        print(f"wrote {write_results(variant, result)}")
        return 0
    print(f"wrote {write_results(TIERS_RESULTS, result)}")
    plot = draw(scenarios, PLOT)
    if plot is not None:
        print(f"wrote {plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
