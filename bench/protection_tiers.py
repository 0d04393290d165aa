"""The three-tier scenario of issue 8: kvpool against the engine's own priority scheduling.

Why this module exists: kvpool must beat what a user gets from vLLM alone. One real vLLM
CPU engine (2048 KV tokens, 8 sequences, maxModelLen 512, priority scheduling) serves the
TierPolicy of ``examples/tierpolicy.yaml`` (interactive 50 % lends all and reclaims by
Preempt, batch 30 % lends half, eval 10 %; engine priorities 0/10/20), the gateway's config
compiled by the planner from the examples' manifests (bench/bench_manifests.py, the
examples' mix at maxModelLen 512; the plan is printed):

- a Poisson **chat** tenant (interactive; ~30-word prompts, 16 streamed output tokens);
- a **batch** flood: ``--batch-workers`` (12) closed-loop workers, ~400-token prompts,
  ``max_tokens`` 120 (prompt + max_tokens is often above 512: vLLM clamps, so must kvpool);
- ``--eval-workers`` (3) closed-loop **eval** workers (~200-token prompts, 64 tokens).

Scenarios, each the same seeded load on the same engines, run in ``--rounds`` interleaved
rounds (shuffled each round; the machine's load drifts and must hit every scenario alike):

- ``chat-alone``: the chat tenant alone, direct (the floor no policy can beat);
- ``chat-alone-kvpool``: the chat tenant alone through a kvpool gateway (what the proxy
  hop itself costs, so that the contention kvpool leaves can be told apart from it);
- ``fcfs``: everyone direct on a second engine with FCFS scheduling;
- ``priority``: everyone direct, the caller sets vLLM ``priority`` 0/10/20 (the strongest
  alternative: the engine's own priority scheduling);
- ``kvpool``: everyone through a ``kvpool gateway`` process with that policy
  (``ttftP95Target`` of interactive as in the example, 800 ms);
- ``kvpool-ttft-<ms>``: the same with interactive's ``ttftP95Target`` swept (the trade-off
  between interactive p95 TTFT and batch throughput; drawn in bench/results/protection.png
  with the FCFS and priority-only points when matplotlib is installed).

Reported per scenario: chat TTFT p50/p95 (client side), output tokens/s per tier and in
total (streamed tokens counted at the client), each tier's share of the output tokens,
engine preemptions, rejections. Targets (issue 8), checked against ``priority`` of the
same run: chat p95 TTFT <= 1.5x ``chat-alone`` and <= ``priority``; total output tokens/s
>= 0.9x ``priority``; every backlogged tier >= its floor share of output tokens (never 0);
preemptions <= 10 % of ``priority``'s.

Called from ``bench/protection.py --tiers three`` (which records the machine's load:
compare scenarios of one run, not runs).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from tests.support.engine import EngineConfig, VllmEngine
from tests.support.gateway import GatewayProcess
from tests.support.tiny_model import tiny_model_dir

from bench_manifests import KEYS, POOL, PRIORITY, compile_mix
from benchkit import (
    bootstrap_ratio_interval,
    fetch_text,
    histogram_buckets,
    metric_sums,
    percentile,
    pin_process,
    wait_engine_idle,
    words_text,
)

KV_BYTES = 2 * 1024 * 1024  # 2048 tokens of the tiny model
MAX_NUM_SEQS = 8
MAX_MODEL_LEN = 512
FLOORS = {"interactive": 50, "batch": 30, "eval": 10}
EXAMPLE_TTFT_TARGET = 0.8
WORDS = ["the", "a", "model", "token", "cache", "tier", "floor", "budget", "engine", "queue"]


def _text(rng: random.Random, words: int) -> str:
    return words_text(rng, words, WORDS)


@dataclass
class TierTally:
    tokens: int = 0  # output tokens streamed to this tier's clients
    done: int = 0
    rejected: int = 0
    errors: int = 0


@dataclass
class RunTally:
    ttft_ms: list[float] = field(default_factory=list)
    tiers: dict[str, TierTally] = field(default_factory=lambda: {t: TierTally() for t in KEYS})
    seconds: float = 0.0
    preemptions: float = 0.0
    loop_lag_samples: float = 0.0  # the gateway's event-loop lag timer (gateway scenarios)
    loop_lag_over_5ms: float = 0.0

    def merge(self, other: RunTally) -> None:
        """Add another round of the same scenario."""
        self.ttft_ms += other.ttft_ms
        for tier, counts in other.tiers.items():
            mine = self.tiers[tier]
            mine.tokens += counts.tokens
            mine.done += counts.done
            mine.rejected += counts.rejected
            mine.errors += counts.errors
        self.seconds += other.seconds
        self.preemptions += other.preemptions
        self.loop_lag_samples += other.loop_lag_samples
        self.loop_lag_over_5ms += other.loop_lag_over_5ms


async def _stream(
    session: aiohttp.ClientSession,
    url: str,
    tier: str,
    body: dict[str, Any],
    tally: RunTally,
    timeout: float,
) -> float | None:
    """POST a streamed request; count its output tokens; return its TTFT (s) or None."""
    counts = tally.tiers[tier]
    sent = time.perf_counter()
    first: float | None = None
    try:
        async with session.post(
            url,
            json=body,
            headers={"Authorization": f"Bearer {KEYS[tier]}"},
            timeout=aiohttp.ClientTimeout(total=max(0.1, timeout)),
        ) as resp:
            if resp.status in (429, 503):
                counts.rejected += 1
                await resp.read()
                await asyncio.sleep(min(float(resp.headers.get("Retry-After", "1")), 1.0))
                return None
            if resp.status != 200:
                counts.errors += 1
                await resp.read()
                await asyncio.sleep(0.5)
                return None
            async for line in resp.content:
                if line.startswith(b"data: ") and (b'"content"' in line or b'"text"' in line):
                    if first is None:
                        first = time.perf_counter()
                    counts.tokens += 1
            counts.done += 1
    except (aiohttp.ClientError, TimeoutError):
        counts.errors += 1
        return None
    return (first or time.perf_counter()) - sent


async def _chat(
    session: aiohttp.ClientSession,
    base: str,
    priorities: bool,
    tally: RunTally,
    rate: float,
    seed: int,
    stop_at: float,
) -> None:
    rng = random.Random(seed)
    tasks: list[asyncio.Task[None]] = []

    async def one(prompt: str) -> None:
        body: dict[str, Any] = {
            "model": POOL,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 16,
            "stream": True,
            "ignore_eos": True,
        }
        if priorities:
            body["priority"] = PRIORITY["interactive"]
        ttft = await _stream(session, f"{base}/v1/chat/completions", "interactive", body, tally, 60)
        if ttft is not None:
            tally.ttft_ms.append(ttft * 1000)

    start = time.monotonic()
    offset = 0.0
    while True:
        offset += rng.expovariate(rate)
        wait = start + offset - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        if time.monotonic() >= stop_at:
            break
        tasks.append(asyncio.create_task(one(_text(rng, 30))))
    if tasks:
        await asyncio.wait(tasks, timeout=60)
    for task in tasks:
        task.cancel()


async def _worker(
    session: aiohttp.ClientSession,
    base: str,
    tier: str,
    priorities: bool,
    tally: RunTally,
    words: int,
    max_tokens: int,
    seed: int,
    stop_at: float,
) -> None:
    rng = random.Random(seed)
    while time.monotonic() < stop_at:
        body: dict[str, Any] = {
            "model": POOL,
            "prompt": _text(rng, words),
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
        }
        if priorities:
            body["priority"] = PRIORITY[tier]
        await _stream(
            session, f"{base}/v1/completions", tier, body, tally, stop_at - time.monotonic()
        )


async def run_scenario(
    engine: VllmEngine,
    base: str,
    *,
    chat_only: bool,
    priorities: bool,
    args: argparse.Namespace,
    seconds: float,
) -> RunTally:
    tally = RunTally()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await wait_engine_idle(session, engine.metrics_url, 30)
        before = metric_sums(await fetch_text(session, engine.metrics_url))
        started = time.monotonic()
        stop_at = started + seconds
        jobs = [_chat(session, base, priorities, tally, args.rate, args.seed, stop_at)]
        if not chat_only:
            jobs += [
                _worker(session, base, "batch", priorities, tally, 300, 120, args.seed + i, stop_at)
                for i in range(args.batch_workers)
            ]
            jobs += [
                _worker(
                    session, base, "eval", priorities, tally, 150, 64, args.seed + 100 + i, stop_at
                )
                for i in range(args.eval_workers)
            ]
        await asyncio.gather(*jobs)
        tally.seconds = time.monotonic() - started
        await wait_engine_idle(session, engine.metrics_url, 30)
        after = metric_sums(await fetch_text(session, engine.metrics_url))
        tally.preemptions = after.get("vllm:num_preemptions_total", 0.0) - before.get(
            "vllm:num_preemptions_total", 0.0
        )
    return tally


def summarise(tally: RunTally) -> dict[str, Any]:
    total = sum(t.tokens for t in tally.tiers.values())
    row: dict[str, Any] = {
        "chat_requests": len(tally.ttft_ms),
        "chat_ttft_p50_ms": _r(percentile(tally.ttft_ms, 50)),
        "chat_ttft_p95_ms": _r(percentile(tally.ttft_ms, 95)),
        "total_tokens_per_s": _r(total / tally.seconds if tally.seconds else None),
        "preemptions": int(tally.preemptions),
        "seconds": round(tally.seconds, 1),
        "chat_ttft_samples_ms": [round(v, 2) for v in tally.ttft_ms],
    }
    if tally.loop_lag_samples:
        # share of the gateway's 50 ms timers that ran over 5 ms late (a stalled event loop)
        row["gateway_loop_lag_over_5ms_share"] = _r(
            tally.loop_lag_over_5ms / tally.loop_lag_samples
        )
    for tier, counts in tally.tiers.items():
        row[f"{tier}_tokens_per_s"] = _r(counts.tokens / tally.seconds if tally.seconds else None)
        row[f"{tier}_share"] = _r(counts.tokens / total if total else None)
        row[f"{tier}_rejected"] = counts.rejected
        row[f"{tier}_errors"] = counts.errors
    return row


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def gateway_config(engine: VllmEngine, ttft_target: float | None, workdir: Path, name: str) -> Path:
    """The examples' manifests compiled by the planner for this engine (bench_manifests:
    the examples' mix at maxModelLen 512), interactive's ``ttftP95Target`` set to
    ``ttft_target`` (None: no target); returns the config file. Prints the plan."""

    def set_target(policy: dict[str, Any]) -> None:
        for tier in policy["spec"]["tiers"]:
            if tier["name"] == "interactive":
                tier.pop("ttftP95Target", None)
                if ttft_target is not None:
                    tier["ttftP95Target"] = f"{round(ttft_target * 1000)}ms"

    plan = compile_mix(
        "examples",
        {POOL: [engine.base_url]},
        workdir,
        tokenizer_path=tiny_model_dir() / "tokenizer.json",
        edit_policy=set_target,
        name=name,
        max_model_len=MAX_MODEL_LEN,
    )
    print(f"{name}: {plan.describe()}", flush=True)
    return plan.config_path


def start_engine(
    policy: str, workdir: Path, pin: bool, max_num_batched_tokens: int | None = None
) -> VllmEngine:
    """One engine of the run; ``max_num_batched_tokens`` (every engine alike) bounds the
    tokens of one engine step, so a long prefill is split over several steps."""
    step_budget = (
        ()
        if max_num_batched_tokens is None
        else (f"--max-num-batched-tokens={max_num_batched_tokens}",)
    )
    config = EngineConfig(
        model_dir=tiny_model_dir(),
        served_model_name="tiny",
        kv_cache_memory_bytes=KV_BYTES,
        block_size=32,
        max_num_seqs=MAX_NUM_SEQS,
        max_model_len=MAX_MODEL_LEN,
        scheduling_policy=policy,
        extra_args=("--no-enable-prefix-caching", *step_budget),
        extra_env={"VLLM_CPU_OMP_THREADS_BIND": "0"} if pin else {},
    )
    return VllmEngine(config, log_path=workdir / f"vllm3-{policy}.log").start()


def scenario_plan(
    engines: dict[str, VllmEngine], targets: list[float | None]
) -> list[tuple[str, Any]]:
    """(name, how) of every scenario: ("direct", engine, chat_only, priorities) or
    ("gateway", engine, ttft_target, chat_only)."""
    prio = engines["priority"]
    plan: list[tuple[str, Any]] = [
        ("chat-alone", ("direct", prio, True, True)),
        ("chat-alone-kvpool", ("gateway", prio, EXAMPLE_TTFT_TARGET, True)),
        ("priority", ("direct", prio, False, True)),
        ("fcfs", ("direct", engines["fcfs"], False, False)),
    ]
    for target in targets:
        if target == EXAMPLE_TTFT_TARGET:
            name = "kvpool"
        elif target is None:
            name = "kvpool-no-target"
        else:
            name = f"kvpool-ttft-{target * 1000:g}"
        plan.append((name, ("gateway", prio, target, False)))
    return plan


async def run_through_gateway(
    name: str, how: Any, args: argparse.Namespace, seconds: float, workdir: Path
) -> RunTally:
    """One scenario through a kvpool gateway started for it, with its loop lag."""
    _, engine, target, chat_only = how
    config = gateway_config(engine, target, workdir, name)
    gateway = GatewayProcess(
        config, workdir / f"gateway-{name}.log", extra_args=("--no-access-log",)
    )
    await asyncio.to_thread(gateway.start)
    try:
        tally = await run_scenario(
            engine, gateway.url, chat_only=chat_only, priorities=False, args=args, seconds=seconds
        )
        async with aiohttp.ClientSession() as session:
            lag = histogram_buckets(
                await fetch_text(session, gateway.metrics_url),
                "kvpool_gateway_event_loop_lag_seconds",
            )
        tally.loop_lag_samples = lag.get("+Inf", 0.0)
        tally.loop_lag_over_5ms = lag.get("+Inf", 0.0) - lag.get("0.005", 0.0)
        return tally
    finally:
        await asyncio.to_thread(gateway.stop)


async def run_three_tiers(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Every scenario once (seeded), engines and gateways started and stopped here."""
    engines: dict[str, VllmEngine] = {}
    seconds = args.duration / args.rounds
    results: dict[str, Any] = {}
    try:
        if args.pin:
            os.sched_setaffinity(0, {0})
        for policy in ("priority", "fcfs"):
            engines[policy] = await asyncio.to_thread(
                start_engine, policy, workdir, args.pin, args.max_num_batched_tokens
            )
        if args.pin:
            pin_process({1})  # the load generator and the gateways: never the engines' core
        plan = scenario_plan(engines, [EXAMPLE_TTFT_TARGET, *args.ttft_sweep])
        tallies: dict[str, RunTally] = {name: RunTally() for name, _ in plan}
        order = list(plan)
        shuffle = random.Random(args.seed)
        for round_index in range(args.rounds):
            shuffle.shuffle(order)  # machine load drifts: every scenario sees the same mix
            for name, how in order:
                print(
                    f"three tiers, round {round_index + 1}/{args.rounds}: {name} ({seconds:.0f} s)",
                    flush=True,
                )
                if how[0] == "direct":
                    _, engine, chat_only, priorities = how
                    tally = await run_scenario(
                        engine,
                        engine.base_url,
                        chat_only=chat_only,
                        priorities=priorities,
                        args=args,
                        seconds=seconds,
                    )
                else:
                    tally = await run_through_gateway(name, how, args, seconds, workdir)
                tallies[name].merge(tally)
        for name, how in plan:
            row = summarise(tallies[name])
            if how[0] == "gateway":
                target = how[2]
                row["ttft_target_ms"] = None if target is None else target * 1000
            results[name] = row
    finally:
        for engine in engines.values():
            await asyncio.to_thread(engine.stop)
    return results


def compare(scenarios: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets, kvpool against priority-only of the same run."""
    alone, prio, kv = scenarios["chat-alone"], scenarios["priority"], scenarios["kvpool"]

    def ratio(a: float | None, b: float | None) -> float | None:
        return None if a is None or not b else round(a / b, 3)

    ttft_alone = ratio(kv["chat_ttft_p95_ms"], alone["chat_ttft_p95_ms"])
    via_gateway = scenarios.get("chat-alone-kvpool", {}).get("chat_ttft_p95_ms")
    ttft_prio = ratio(kv["chat_ttft_p95_ms"], prio["chat_ttft_p95_ms"])
    throughput = ratio(kv["total_tokens_per_s"], prio["total_tokens_per_s"])
    preempt = ratio(kv["preemptions"], prio["preemptions"]) if prio["preemptions"] else None
    shares = {t: kv[f"{t}_share"] for t in ("batch", "eval")}

    def interval(other: dict[str, Any]) -> tuple[float, float] | None:
        return bootstrap_ratio_interval(
            kv["chat_ttft_samples_ms"], other.get("chat_ttft_samples_ms") or []
        )

    return {
        "kvpool_chat_p95_over_alone": ttft_alone,
        "kvpool_chat_p95_over_alone_ci95": interval(alone),
        "kvpool_chat_p95_over_alone_through_kvpool": ratio(kv["chat_ttft_p95_ms"], via_gateway),
        "kvpool_chat_p95_over_alone_through_kvpool_ci95": interval(
            scenarios.get("chat-alone-kvpool", {})
        ),
        "kvpool_chat_p95_over_priority": ttft_prio,
        "kvpool_chat_p95_over_priority_ci95": interval(prio),
        "kvpool_total_tokens_over_priority": throughput,
        "kvpool_preemptions_over_priority": preempt,
        "kvpool_tier_shares": shares,
        "priority_tier_shares": {t: prio[f"{t}_share"] for t in ("batch", "eval")},
        "targets": {
            "chat_p95_le_1_5x_alone": ttft_alone is not None and ttft_alone <= 1.5,
            "chat_p95_le_priority": ttft_prio is not None and ttft_prio <= 1.0,
            "total_tokens_ge_0_9x_priority": throughput is not None and throughput >= 0.9,
            "every_backlogged_tier_ge_floor_share": all(
                (shares[t] or 0) >= FLOORS[t] / 100 for t in shares
            ),
            "preemptions_le_10pct_priority": (
                kv["preemptions"] <= 0.1 * prio["preemptions"] if prio["preemptions"] else None
            ),
        },
    }


def draw(scenarios: dict[str, Any], path: Path) -> Path | None:
    """interactive p95 TTFT against batch tokens/s: the sweep, FCFS and priority-only."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot (pip install matplotlib)")
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    sweep = sorted(
        (row for name, row in scenarios.items() if name.startswith("kvpool")),
        key=lambda r: float(r.get("ttft_target_ms") or 1e9),
    )
    ax.plot(
        [r["batch_tokens_per_s"] for r in sweep],
        [r["chat_ttft_p95_ms"] for r in sweep],
        "o",
        label="kvpool (ttftP95Target sweep)",
    )
    for index, row in enumerate(sweep):
        target = row.get("ttft_target_ms")
        ax.annotate(
            "no target" if target is None else f"{target:g} ms",
            (row["batch_tokens_per_s"], row["chat_ttft_p95_ms"]),
            textcoords="offset points",
            xytext=(4, (-12, 6, 18)[index % 3]),  # staggered: neighbours do not overlap
            fontsize=8,
        )
    for name, marker in (("priority", "s"), ("fcfs", "^")):
        row = scenarios[name]
        ax.plot(row["batch_tokens_per_s"], row["chat_ttft_p95_ms"], marker, label=name)
    alone = scenarios["chat-alone"]["chat_ttft_p95_ms"]
    if alone:
        ax.axhline(alone, linestyle=":", color="grey", label="chat alone")
        ax.axhline(1.5 * alone, linestyle="--", color="grey", label="1.5x alone")
    via = scenarios.get("chat-alone-kvpool", {}).get("chat_ttft_p95_ms")
    if via:
        ax.axhline(via, linestyle="-.", color="tab:blue", label="chat alone via kvpool")
    ax.set_xlabel("batch output tokens/s")
    ax.set_ylabel("interactive p95 TTFT (ms)")
    ax.set_yscale("log")
    ax.set_title("Three tiers on one vLLM CPU engine (2048 KV tokens, 8 seqs)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
