"""kvpool against the peers a user would pick instead, all in one run (issue 19).

Why this benchmark exists: kvpool's claim is protection without giving up throughput, and
that only means something against what a user gets for free, measured on the same
engines in the same run. Every kvpool config here is compiled by the planner from
manifests (bench/bench_manifests.py: the examples' TierPolicy and tenants, a ModelPool
scaled to the bench engine), never written by hand.

Engines (real vLLM on CPU, the tiny model, 2,048 KV tokens, maxNumSeqs 8, maxModelLen
1024, prefix caching on as a user runs it): ``A`` (priority scheduling, pinned to core 0:
``VLLM_CPU_OMP_THREADS_BIND=0`` and the affinity ``taskset -c 0`` gives), ``B`` (priority,
core 1), ``F`` (FCFS, core 0). The load generator, gateways and router float.

Three-tier scenario, the same seeded load in every config (scaled by the engines used):
multi-turn **chat** sessions (interactive; Poisson session starts, 3-5 turns, the history
resent each turn, 16 streamed tokens a turn), a closed-loop **batch** flood
(``--batch-workers`` per engine) and closed-loop **eval** workers (``--eval-workers`` per
engine); lengths from the mix (``--mix``, see bench_manifests.MIXES).

Configs:

- ``chat-alone``   chat only, direct to A (the floor no policy beats);
- ``fcfs``         everyone direct to F (engine FCFS);
- ``priority``     everyone direct to A, callers set vLLM ``priority`` 0/10/20;
- ``kvpool-1``     everyone through a kvpool gateway over A (one-replica plan);
- ``router-2``     everyone through ``vllm-router --policy cache_aware`` over A and B,
                   callers set ``priority`` (scripts/ensure-vllm-router.sh installs it);
- ``kvpool-2``     everyone through a kvpool gateway over A and B (two-replica plan);
- ``capped-<K>``   (``--capped K ...``) priority, with at most K batch and eval requests
                   at the engine at once (one client-side semaphore, no gateway): what any
                   admission that runs K lower-tier sequences could reach at best, so the
                   row set traces the engine's own trade-off between output and chat TTFT.

Rounds (``--rounds`` of ``--seconds`` each, configs shuffled each round: the machine's
load drifts). Reported per config: total output tok/s, output share by tier, chat TTFT
p50/p95/p99 with bootstrap 95 % intervals, the per-round chat p95s (max/min), engine
preemptions, rejections, and for kvpool the gateway's queue time by tier
(``kvpool_gateway_queue_seconds``: where slow chats wait). ``--quiet`` holds /work/.quiet
windows of at most 12 minutes, releasing each for 3 minutes (shared machine protocol).

    .venv/bin/python bench/peers.py                # full: 4 rounds x 60 s a config (~30 min)
    .venv/bin/python bench/peers.py --quick        # smoke: 2 rounds x 12 s
    make bench-peers [QUICK=1] [MIX=long-prompt]

Writes bench/results/peers-<mix>[-quick].json and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.engine import EngineConfig, VllmEngine
from tests.support.gateway import GatewayProcess
from tests.support.processes import ManagedProcess
from tests.support.tiny_model import tiny_model_dir

from bench_manifests import (
    KEYS,
    KV_TOKENS,
    MAX_MODEL_LEN,
    MAX_NUM_SEQS,
    MIXES,
    POOL,
    PRIORITY,
    Mix,
    compile_mix,
)
from benchkit import (
    REPO,
    bootstrap_percentile_interval,
    fetch_text,
    machine_info,
    metric_sums,
    percentile,
    wait_engine_idle,
    words_text,
    write_results,
)
from router import start_router

TIERS = ("interactive", "batch", "eval")
WORDS = ["the", "a", "model", "token", "cache", "tier", "floor", "budget", "engine", "queue"]
QUIET = Path("/work/.quiet")
QUIET_HOLD = 11.5 * 60  # a window is at most 12 minutes ...
QUIET_GAP = 185.0  # ... then at least 3 minutes released
CONFIGS = ("chat-alone", "fcfs", "priority", "kvpool-1", "router-2", "kvpool-2")
# --no-target-variant: kvpool-1 with interactive's ttftP95Target removed (no prefill holds)
NO_TARGET = "kvpool-1-no-target"
# kvpool-1 whose streams hand their place on --handover-tokens before their bound
HANDOVER = "kvpool-1-handover"
VARIANTS = (NO_TARGET, HANDOVER)
CAPPED = "capped-"  # + K: priority with at most K lower-tier requests at the engine
SHARE_BUCKET_SECONDS = 5.0  # the output-share-over-time series (plot_peers.py draws it)


def without_ttft_target(policy: dict[str, Any]) -> None:
    """The examples' TierPolicy with no ttftP95Target (so no prefill holds)."""
    for tier in policy["spec"]["tiers"]:
        tier.pop("ttftP95Target", None)


def configs_of(args: argparse.Namespace) -> tuple[str, ...]:
    capped = tuple(f"{CAPPED}{k}" for k in args.capped)
    if args.configs:
        return (*(c for c in (*CONFIGS, *VARIANTS) if c in args.configs), *capped)
    return (*CONFIGS, NO_TARGET, *capped) if args.no_target_variant else (*CONFIGS, *capped)


def lower_tier_cap(name: str) -> int | None:
    """K of a ``capped-<K>`` config, else None."""
    return int(name.removeprefix(CAPPED)) if name.startswith(CAPPED) else None


@dataclass
class Tally:
    """One config's counts (one round, or the rounds merged)."""

    ttft_ms: list[float] = field(default_factory=list)
    tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    rejected: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    # requests still streaming when the round ended (its timeout): not errors
    cut: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    seconds: float = 0.0
    preemptions: float = 0.0
    round_p95_ms: list[float] = field(default_factory=list)
    gateway_queue: dict[str, dict[str, float]] = field(default_factory=dict)  # tier -> le -> n
    gateway_queue_sum: dict[str, float] = field(default_factory=dict)
    samples: list[dict[str, float]] = field(default_factory=list)  # every 0.5 s, see sample()
    # output tokens by tier in SHARE_BUCKET_SECONDS buckets, one list a round
    timeline: list[list[dict[str, int]]] = field(default_factory=list)
    started: float = 0.0  # time.monotonic() at the round's start

    def add_output(self, tier: str, tokens: int) -> None:
        """``tokens`` streamed to a ``tier`` request that just ended (now)."""
        self.tokens[tier] += tokens
        if not self.timeline:
            return
        bucket = int((time.monotonic() - self.started) // SHARE_BUCKET_SECONDS)
        rounds = self.timeline[-1]
        while len(rounds) <= bucket:
            rounds.append(dict.fromkeys(TIERS, 0))
        rounds[bucket][tier] += tokens

    def merge(self, other: Tally) -> None:
        self.timeline += other.timeline
        self.ttft_ms += other.ttft_ms
        for tier in TIERS:
            self.tokens[tier] += other.tokens[tier]
            self.rejected[tier] += other.rejected[tier]
            self.errors[tier] += other.errors[tier]
            self.cut[tier] += other.cut[tier]
        self.seconds += other.seconds
        self.preemptions += other.preemptions
        self.samples += other.samples
        p95 = percentile(other.ttft_ms, 95)
        if p95 is not None:
            self.round_p95_ms.append(round(p95, 2))
        for tier, buckets in other.gateway_queue.items():
            mine = self.gateway_queue.setdefault(tier, {})
            for le, n in buckets.items():
                mine[le] = mine.get(le, 0.0) + n
            self.gateway_queue_sum[tier] = self.gateway_queue_sum.get(tier, 0.0) + (
                other.gateway_queue_sum.get(tier, 0.0)
            )


class QuietWindows:
    """/work/.quiet held at most ~12 minutes at a time, then released for 3 minutes."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.since = 0.0

    @staticmethod
    def _wait_for_others() -> None:
        """Another holder's window: wait until it is gone (polled every 20 s)."""
        while QUIET.exists() and not QUIET.read_text().startswith("bench19"):
            print(f"waiting: /work/.quiet held ({QUIET.read_text().strip()})", flush=True)
            time.sleep(20)

    def _hold(self) -> None:
        self._wait_for_others()
        until = time.strftime("%H:%M", time.gmtime(time.time() + 12 * 60))
        QUIET.write_text(f"bench19 until {until}\n")
        self.since = time.monotonic()

    def begin(self) -> None:
        if self.enabled:
            self._hold()

    def release(self) -> None:
        """Remove the window if it is ours (never another holder's)."""
        if self.enabled and QUIET.exists() and QUIET.read_text().startswith("bench19"):
            QUIET.unlink(missing_ok=True)

    async def room_for(self, seconds: float) -> None:
        """Before a config of ``seconds``: release and re-take the window when it would end
        inside the config."""
        if not self.enabled or time.monotonic() - self.since + seconds + 30 < QUIET_HOLD:
            return
        self.release()
        print(f"quiet window released for {QUIET_GAP:.0f} s", flush=True)
        await asyncio.sleep(QUIET_GAP)
        self._hold()


async def _stream(
    session: aiohttp.ClientSession,
    url: str,
    key: str,
    tier: str,
    body: dict[str, Any],
    tally: Tally,
    timeout: float,
) -> tuple[float | None, str]:
    """POST a streamed request; count its output tokens; (TTFT s or None, text). A
    request the round's end cuts (``timeout``, the time left in the round, runs out) is
    counted as cut, not as an error."""
    sent = time.perf_counter()
    round_ends = time.monotonic() + timeout
    first: float | None = None
    pieces = 0
    try:
        async with session.post(
            url,
            json=body,
            headers={"Authorization": f"Bearer {key}"},
            timeout=aiohttp.ClientTimeout(total=max(0.1, timeout)),
        ) as resp:
            if resp.status in (429, 503):
                tally.rejected[tier] += 1
                await resp.read()
                await asyncio.sleep(min(float(resp.headers.get("Retry-After", "1")), 1.0))
                return None, ""
            if resp.status != 200:
                tally.errors[tier] += 1
                await resp.read()
                await asyncio.sleep(0.5)
                return None, ""
            async for line in resp.content:
                if line.startswith(b"data: ") and (b'"content"' in line or b'"text"' in line):
                    if first is None:
                        first = time.perf_counter()
                    pieces += 1
            tally.add_output(tier, pieces)
    except TimeoutError:
        (tally.cut if time.monotonic() >= round_ends - 0.05 else tally.errors)[tier] += 1
        return None, ""
    except aiohttp.ClientError:
        tally.errors[tier] += 1
        return None, ""
    return (first or time.perf_counter()) - sent, " ".join(["reply"] * pieces)


@dataclass(frozen=True)
class Load:
    """What one config sends (per-engine figures times the engines it uses)."""

    mix: Mix
    sessions_per_s: float
    batch_workers: int
    eval_workers: int
    chat_only: bool
    priorities: bool  # callers set vLLM's `priority` (direct and router configs)
    keys: dict[str, str]
    seed: int
    lower_tier_cap: int | None = None  # at most this many batch and eval requests at once


async def chat_sessions(
    session: aiohttp.ClientSession, base: str, load: Load, tally: Tally, stop_at: float
) -> None:
    rng = random.Random(load.seed)
    mix = load.mix
    tasks: list[asyncio.Task[None]] = []

    async def one(session_seed: int) -> None:
        srng = random.Random(session_seed)
        messages = [{"role": "user", "content": words_text(srng, mix.chat_first_words, WORDS)}]
        for _ in range(srng.randint(3, 5)):
            if time.monotonic() >= stop_at:
                return
            body: dict[str, Any] = {
                "model": POOL,
                "messages": messages,
                "max_tokens": mix.chat_max_tokens,
                "stream": True,
                "ignore_eos": True,
            }
            if load.priorities:
                body["priority"] = PRIORITY["interactive"]
            ttft, reply = await _stream(
                session,
                f"{base}/v1/chat/completions",
                load.keys["interactive"],
                "interactive",
                body,
                tally,
                60,
            )
            if ttft is None:
                return
            tally.ttft_ms.append(ttft * 1000)
            messages = [
                *messages,
                {"role": "assistant", "content": reply},
                {"role": "user", "content": words_text(srng, mix.chat_turn_words, WORDS)},
            ]
            await asyncio.sleep(srng.uniform(0.3, 1.0))  # the user reads and types

    start = time.monotonic()
    offset = 0.0
    while True:
        offset += rng.expovariate(load.sessions_per_s)
        wait = start + offset - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        if time.monotonic() >= stop_at:
            break
        tasks.append(asyncio.create_task(one(rng.randrange(1 << 30))))
    if tasks:
        await asyncio.wait(tasks, timeout=60)
    for task in tasks:
        task.cancel()


async def worker(
    session: aiohttp.ClientSession,
    base: str,
    tier: str,
    load: Load,
    tally: Tally,
    seed: int,
    stop_at: float,
    cap: asyncio.Semaphore | None = None,
) -> None:
    rng = random.Random(seed)
    mix = load.mix
    words, max_tokens = (
        (mix.batch_prompt_words, mix.batch_max_tokens)
        if tier == "batch"
        else (mix.eval_prompt_words, mix.eval_max_tokens)
    )
    while time.monotonic() < stop_at:
        body: dict[str, Any] = {
            "model": POOL,
            "prompt": words_text(rng, rng.randint(*words), WORDS),
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
        }
        if load.priorities:
            body["priority"] = PRIORITY[tier]
        async with cap or contextlib.nullcontext():
            await _stream(
                session,
                f"{base}/v1/completions",
                load.keys[tier],
                tier,
                body,
                tally,
                stop_at - time.monotonic(),
            )


def queue_histograms(text: str) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """tier -> le -> cumulative count, and tier -> sum, of kvpool_gateway_queue_seconds."""
    buckets: dict[str, dict[str, float]] = {}
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("kvpool_gateway_queue_seconds"):
            continue
        labels, _, value = line.rpartition(" ")
        if 'tier="' not in labels:
            continue
        tier = labels.split('tier="', 1)[1].split('"', 1)[0]
        if labels.startswith("kvpool_gateway_queue_seconds_bucket{"):
            le = labels.split('le="', 1)[1].split('"', 1)[0]
            tier_buckets = buckets.setdefault(tier, {})
            tier_buckets[le] = tier_buckets.get(le, 0.0) + float(value)
        elif labels.startswith("kvpool_gateway_queue_seconds_sum{"):
            sums[tier] = sums.get(tier, 0.0) + float(value)
    return buckets, sums


async def sample(
    session: aiohttp.ClientSession,
    engines: list[VllmEngine],
    gateway_metrics: str | None,
    tally: Tally,
    stop_at: float,
) -> None:
    """Every 0.5 s: the engines' running and waiting sequences and KV usage, and for kvpool
    the gateway's slots and tokens in use and its queued requests - whether capacity
    stands empty while requests wait."""
    while time.monotonic() < stop_at - 0.5:
        await asyncio.sleep(0.5)
        point: dict[str, float] = {"running": 0.0, "waiting": 0.0, "kv_usage": 0.0}
        for engine in engines:
            sums = metric_sums(await fetch_text(session, engine.metrics_url))
            point["running"] += sums.get("vllm:num_requests_running", 0.0)
            point["waiting"] += sums.get("vllm:num_requests_waiting", 0.0)
            point["kv_usage"] += sums.get("vllm:kv_cache_usage_perc", 0.0) / len(engines)
        if gateway_metrics:
            text = await fetch_text(session, gateway_metrics)
            point["gw_tokens_in_use"] = labelled_sum(text, "kvpool_gateway_pool_tokens", "in_use")
            point["gw_tokens_total"] = labelled_sum(text, "kvpool_gateway_pool_tokens", "total")
            point["gw_slots_in_use"] = labelled_sum(text, "kvpool_gateway_tier_slots", "in_use")
            sums = metric_sums(text)
            point["gw_queued"] = sums.get("kvpool_gateway_queued_requests", 0.0)
            ratios = [
                float(line.rpartition(" ")[2])
                for line in text.splitlines()
                if line.startswith("kvpool_gateway_overcommit_ratio{") and 'tier="batch"' in line
            ]
            if ratios:
                point["gw_overcommit_ratio_batch"] = min(ratios)
        tally.samples.append(point)


def labelled_sum(text: str, name: str, kind: str) -> float:
    """The sum of ``name``'s samples with ``kind="..."`` on the stable track."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and f'kind="{kind}"' in line and 'track="stable"' in line:
            total += float(line.rpartition(" ")[2])
    return total


async def run_config(
    base: str,
    engines: list[VllmEngine],
    load: Load,
    seconds: float,
    gateway_metrics: str | None,
) -> Tally:
    tally = Tally()
    scale = len(engines)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        for engine in engines:
            await wait_engine_idle(session, engine.metrics_url, 30)
        before = [metric_sums(await fetch_text(session, e.metrics_url)) for e in engines]
        queue_before = (
            queue_histograms(await fetch_text(session, gateway_metrics))
            if gateway_metrics
            else ({}, {})
        )
        started = time.monotonic()
        stop_at = started + seconds
        tally.started, tally.timeline = started, [[]]
        jobs = [
            chat_sessions(session, base, load, tally, stop_at),
            sample(session, engines, gateway_metrics, tally, stop_at),
        ]
        if not load.chat_only:
            cap = asyncio.Semaphore(load.lower_tier_cap) if load.lower_tier_cap else None
            jobs += [
                worker(session, base, "batch", load, tally, load.seed + 1 + i, stop_at, cap)
                for i in range(load.batch_workers * scale)
            ]
            jobs += [
                worker(session, base, "eval", load, tally, load.seed + 1000 + i, stop_at, cap)
                for i in range(load.eval_workers * scale)
            ]
        await asyncio.gather(*jobs)
        tally.seconds = time.monotonic() - started
        for engine in engines:
            await wait_engine_idle(session, engine.metrics_url, 30)
        after = [metric_sums(await fetch_text(session, e.metrics_url)) for e in engines]
        tally.preemptions = sum(
            a.get("vllm:num_preemptions_total", 0.0) - b.get("vllm:num_preemptions_total", 0.0)
            for a, b in zip(after, before, strict=True)
        )
        if gateway_metrics:
            buckets, sums = queue_histograms(await fetch_text(session, gateway_metrics))
            for tier, tier_buckets in buckets.items():
                old = queue_before[0].get(tier, {})
                tally.gateway_queue[tier] = {
                    le: n - old.get(le, 0.0) for le, n in tier_buckets.items()
                }
                tally.gateway_queue_sum[tier] = sums.get(tier, 0.0) - queue_before[1].get(tier, 0.0)
    return tally


def summarise(tally: Tally, engines: int) -> dict[str, Any]:
    total = sum(tally.tokens.values())
    per_s = (lambda n: round(n / tally.seconds, 1)) if tally.seconds else (lambda n: None)
    row: dict[str, Any] = {
        "engines": engines,
        "chat_requests": len(tally.ttft_ms),
        "total_tokens_per_s": per_s(total),
        "preemptions": int(tally.preemptions),
        "seconds": round(tally.seconds, 1),
        "round_chat_p95_ms": tally.round_p95_ms,
        "round_p95_max_over_min": (
            round(max(tally.round_p95_ms) / min(tally.round_p95_ms), 2)
            if tally.round_p95_ms and min(tally.round_p95_ms) > 0
            else None
        ),
    }
    for q in (50, 95, 99):
        value = percentile(tally.ttft_ms, q)
        row[f"chat_ttft_p{q}_ms"] = None if value is None else round(value, 1)
        row[f"chat_ttft_p{q}_ci95_ms"] = bootstrap_percentile_interval(tally.ttft_ms, q)
    for tier in TIERS:
        row[f"{tier}_tokens_per_s"] = per_s(tally.tokens[tier])
        row[f"{tier}_share"] = round(tally.tokens[tier] / total, 3) if total else None
        row[f"{tier}_rejected"] = tally.rejected[tier]
        row[f"{tier}_errors"] = tally.errors[tier]
        row[f"{tier}_cut_at_round_end"] = tally.cut[tier]
    if tally.gateway_queue:
        queue: dict[str, Any] = {}
        for tier, buckets in tally.gateway_queue.items():
            count = buckets.get("+Inf", 0.0)
            queue[tier] = {
                "requests": int(count),
                "mean_ms": round(tally.gateway_queue_sum.get(tier, 0.0) / count * 1000, 2)
                if count
                else None,
                "share_over_ms": {
                    f"{float(le) * 1000:g}": round(1 - n / count, 3)
                    for le, n in sorted(buckets.items(), key=lambda kv: float(kv[0]))
                    if le != "+Inf" and count
                },
            }
        row["gateway_queue"] = queue
    if tally.samples:
        keys = sorted({k for point in tally.samples for k in point})
        row["sampled_means"] = {
            k: round(sum(p.get(k, 0.0) for p in tally.samples) / len(tally.samples), 3)
            for k in keys
        }
        if "gw_queued" in keys:  # requests waited while the engines ran fewer than 8 each
            waiting = [p for p in tally.samples if p["gw_queued"] > 0]
            row["sampled_gateway_queued_share"] = round(len(waiting) / len(tally.samples), 3)
            row["sampled_engine_running_while_gateway_queued"] = (
                round(sum(p["running"] for p in waiting) / len(waiting), 2) if waiting else None
            )
    row["chat_ttft_samples_ms"] = [round(v, 2) for v in tally.ttft_ms]
    row["output_by_tier_over_time"] = {
        "bucket_seconds": SHARE_BUCKET_SECONDS,
        "rounds": tally.timeline,
    }
    return row


def start_engine(name: str, policy: str, core: int | None, workdir: Path) -> VllmEngine:
    """One engine, pinned to ``core`` (its process inherits this thread's affinity, as
    ``taskset -c`` would set it) with vLLM's OpenMP threads bound there too."""
    config = EngineConfig(
        model_dir=tiny_model_dir(),
        served_model_name=POOL,
        kv_cache_memory_bytes=KV_TOKENS * 1024,
        block_size=32,
        max_num_seqs=MAX_NUM_SEQS,
        max_model_len=MAX_MODEL_LEN,
        scheduling_policy=policy,
        extra_env={"VLLM_CPU_OMP_THREADS_BIND": str(core)} if core is not None else {},
    )
    every = set(range(os.cpu_count() or 1))
    if core is not None:
        os.sched_setaffinity(0, {core})
    try:
        return VllmEngine(config, log_path=workdir / f"vllm-{name}.log").start()
    finally:
        os.sched_setaffinity(0, every)


async def run_all(
    args: argparse.Namespace,
    workdir: Path,
    quiet: QuietWindows,
    on_round: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    mix = MIXES[args.mix]
    engines: dict[str, VllmEngine] = {}
    gateways: dict[str, GatewayProcess] = {}
    router: ManagedProcess | None = None
    result: dict[str, Any] = {"plans": {}}
    try:
        pin = (os.cpu_count() or 1) >= 2
        for name, policy, core in (("A", "priority", 0), ("B", "priority", 1), ("F", "fcfs", 0)):
            engines[name] = await asyncio.to_thread(
                start_engine, name, policy, core if pin else None, workdir
            )
            print(f"engine {name} ({policy}, core {core}) at {engines[name].base_url}", flush=True)
        tokenizer = tiny_model_dir() / "tokenizer.json"
        bases: dict[str, tuple[str, list[VllmEngine], str | None]] = {
            "chat-alone": (engines["A"].base_url, [engines["A"]], None),
            "fcfs": (engines["F"].base_url, [engines["F"]], None),
            "priority": (engines["A"].base_url, [engines["A"]], None),
        }
        configs = configs_of(args)
        for name in configs:
            if lower_tier_cap(name):
                bases[name] = bases["priority"]
        quiet_log: tuple[str, ...] = ("--no-access-log",)
        kvpools = [
            ("kvpool-1", ["A"], None, quiet_log),
            ("kvpool-2", ["A", "B"], None, quiet_log),
            (NO_TARGET, ["A"], without_ttft_target, quiet_log),
            (HANDOVER, ["A"], None, (*quiet_log, "--handover-tokens", str(args.handover_tokens))),
        ]
        for name, used, edit, extra in [k for k in kvpools if k[0] in configs]:
            plan = compile_mix(
                mix,
                {POOL: [engines[e].base_url for e in used]},
                workdir / name,
                tokenizer_path=tokenizer,
                edit_policy=edit,
            )
            print(f"{name}: " + plan.describe(), flush=True)
            result["plans"][name] = plan.planned()
            gateway = GatewayProcess(
                plan.config_path, workdir / f"gateway-{name}.log", extra_args=extra
            )
            await asyncio.to_thread(gateway.start)
            gateways[name] = gateway
            bases[name] = (gateway.url, [engines[e] for e in used], gateway.metrics_url)
        if "router-2" in configs:
            router, router_url = await start_router(
                [engines["A"].base_url, engines["B"].base_url], workdir
            )
            bases["router-2"] = (router_url, [engines["A"], engines["B"]], None)
        keys = result["keys"] = dict(KEYS)  # what every compiled plan gives its tenants
        tallies = {name: Tally() for name in configs}
        order = list(configs)
        shuffle = random.Random(args.seed)
        loads: list[list[float]] = []
        for round_index in range(args.rounds):
            shuffle.shuffle(order)
            for name in order:
                await quiet.room_for(args.seconds)
                base, used_engines, gw_metrics = bases[name]
                load = Load(
                    mix=mix,
                    sessions_per_s=args.sessions * len(used_engines),
                    batch_workers=args.batch_workers,
                    eval_workers=args.eval_workers,
                    chat_only=name == "chat-alone",
                    priorities=not name.startswith("kvpool") and name != "fcfs",
                    keys=keys,
                    seed=args.seed + round_index,
                    lower_tier_cap=lower_tier_cap(name),
                )
                print(f"round {round_index + 1}/{args.rounds}: {name}", flush=True)
                tally = await run_config(base, used_engines, load, args.seconds, gw_metrics)
                tallies[name].merge(tally)
                loads.append([round(x, 2) for x in os.getloadavg()])
            result["rounds_completed"] = round_index + 1
            result["loadavg_per_config"] = loads
            on_round(
                {
                    **result,
                    "configs": {n: summarise(tallies[n], len(bases[n][1])) for n in configs},
                }
            )
        result["loadavg_per_config"] = loads
        result["configs"] = {
            name: summarise(tallies[name], len(bases[name][1])) for name in configs
        }
    finally:
        if router is not None:
            await asyncio.to_thread(router.stop)
        for gateway in gateways.values():
            await asyncio.to_thread(gateway.stop)
        for engine in engines.values():
            await asyncio.to_thread(engine.stop)
    return result


def compare(configs: dict[str, Any]) -> dict[str, Any]:
    """Issue 19's targets: kvpool-1 against priority, kvpool-2 against router-2."""

    def ratio(a: float | None, b: float | None) -> float | None:
        return None if a is None or not b else round(a / b, 3)

    alone = configs.get("chat-alone", {})
    out: dict[str, Any] = {}
    pairs = [("kvpool-1", "priority"), ("kvpool-2", "router-2")]
    pairs += [(variant, "priority") for variant in VARIANTS]
    for kv_name, peer_name in pairs:
        if kv_name not in configs or peer_name not in configs:  # --configs left one out
            continue
        kv, peer = configs[kv_name], configs[peer_name]
        upper = (kv["chat_ttft_p95_ci95_ms"] or [None, None])[1]
        output = ratio(kv["total_tokens_per_s"], peer["total_tokens_per_s"])
        out[f"{kv_name}_vs_{peer_name}"] = {
            "output_ratio": output,
            "chat_p95_ms": [kv["chat_ttft_p95_ms"], peer["chat_ttft_p95_ms"]],
            "chat_p95_over_alone": ratio(kv["chat_ttft_p95_ms"], alone.get("chat_ttft_p95_ms")),
            "preemptions": [kv["preemptions"], peer["preemptions"]],
            "targets": {
                "output_ge_0_95x_peer": output is not None and output >= 0.95,
                "chat_p95_le_peer": (kv["chat_ttft_p95_ms"] or 1e9)
                <= (peer["chat_ttft_p95_ms"] or 0),
                "chat_p95_ci_upper_le_peer_and_1_5x_alone": upper is not None
                and upper <= (peer["chat_ttft_p95_ms"] or 0)
                and upper <= 1.5 * (alone.get("chat_ttft_p95_ms") or 0),
                "eval_ge_5pct": (kv["eval_share"] or 0) >= 0.05,
                "batch_ge_30pct": (kv["batch_share"] or 0) >= 0.30,
                "preemptions_le_10pct_peer": kv["preemptions"] <= 0.1 * peer["preemptions"],
            },
        }
    frontier = engine_frontier(configs)
    if frontier:
        out["engine_frontier"] = frontier
    return out


def engine_frontier(configs: dict[str, Any]) -> dict[str, Any] | None:
    """The ``capped-<K>`` rows against priority and chat alone: the output and chat TTFT an
    admission running K lower-tier requests could reach at best on this engine, the least
    chat p95 (x alone) among those with output >= 0.95x priority's, and kvpool-1 beside
    them. None without capped rows, priority or chat alone."""
    peer, alone = configs.get("priority"), configs.get("chat-alone")
    capped = sorted((k, row) for n, row in configs.items() if (k := lower_tier_cap(n)))
    if not capped or not peer or not alone or not peer["total_tokens_per_s"]:
        return None
    alone_p95 = alone["chat_ttft_p95_ms"] or 0.0

    def point(row: dict[str, Any]) -> dict[str, Any]:
        return {
            "output_ratio": round(row["total_tokens_per_s"] / peer["total_tokens_per_s"], 3),
            "chat_p95_ms": row["chat_ttft_p95_ms"],
            "chat_p99_ms": row["chat_ttft_p99_ms"],
            "chat_p95_over_alone": round(row["chat_ttft_p95_ms"] / alone_p95, 2)
            if alone_p95 and row["chat_ttft_p95_ms"]
            else None,
            "preemptions": row["preemptions"],
        }

    points = {str(k): point(row) for k, row in capped}
    full = [p["chat_p95_over_alone"] for p in points.values() if p["output_ratio"] >= 0.95]
    return {
        "by_lower_tier_cap": points,
        "least_chat_p95_over_alone_at_0_95x_output": min(
            (x for x in full if x is not None), default=None
        ),
        "kvpool-1": point(configs["kvpool-1"]) if "kvpool-1" in configs else None,
    }


def print_table(configs: dict[str, Any]) -> None:
    def cell(row: dict[str, Any], key: str) -> str:
        value = row.get(key)
        return "-" if value is None else f"{value}"

    def ci(row: dict[str, Any], q: int) -> str:
        value, interval = row.get(f"chat_ttft_p{q}_ms"), row.get(f"chat_ttft_p{q}_ci95_ms")
        if value is None:
            return "-"
        return f"{value:.0f} [{interval[0]:.0f}-{interval[1]:.0f}]" if interval else f"{value:.0f}"

    head = (
        f"{'config':11}{'eng':>4}{'tok/s':>8}{'int%':>6}{'bat%':>6}{'eval%':>6}"
        f"{'p50 [ci]':>16}{'p95 [ci]':>18}{'p99 [ci]':>18}{'p95 max/min':>12}{'preempt':>8}"
    )
    print(head)
    for name, row in configs.items():
        shares = "".join(
            f"{'-' if row[f'{t}_share'] is None else round(100 * row[f'{t}_share']):>6}"
            for t in TIERS
        )
        print(
            f"{name:11}{row['engines']:>4}{cell(row, 'total_tokens_per_s'):>8}{shares}"
            f"{ci(row, 50):>16}{ci(row, 95):>18}{ci(row, 99):>18}"
            f"{cell(row, 'round_p95_max_over_min'):>12}{row['preemptions']:>8}"
        )
    for name, row in configs.items():
        for tier, queue in (row.get("gateway_queue") or {}).items():
            over = {k: v for k, v in queue["share_over_ms"].items() if float(k) in (5, 25, 100)}
            print(
                f"{name} gateway queue {tier}: {queue['requests']} requests, mean "
                f"{queue['mean_ms']} ms, share waiting over ms {over}"
            )


def print_samples(configs: dict[str, Any]) -> None:
    for name, row in configs.items():
        means = row.get("sampled_means")
        if means:
            extra = (
                f", gateway queued in {row['sampled_gateway_queued_share']:.0%} of samples,"
                f" engines then running {row['sampled_engine_running_while_gateway_queued']}"
                if "sampled_gateway_queued_share" in row
                else ""
            )
            print(f"{name} sampled means {means}{extra}")


def print_markdown(configs: dict[str, Any]) -> None:
    """The report's table (docs/0009), straight from the figures."""

    def ci(row: dict[str, Any], q: int) -> str:
        value, interval = row.get(f"chat_ttft_p{q}_ms"), row.get(f"chat_ttft_p{q}_ci95_ms")
        if value is None:
            return "-"
        return f"{value:.0f} ({interval[0]:.0f}-{interval[1]:.0f})" if interval else f"{value:.0f}"

    print(
        "| config | engines | output tok/s | interactive / batch / eval share | chat TTFT p50 "
        "(95 % CI) | p95 (95 % CI) | p99 (95 % CI) | per-round p95 max/min | preemptions |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, row in configs.items():
        shares = " / ".join(
            "-" if row[f"{t}_share"] is None else f"{100 * row[f'{t}_share']:.0f} %" for t in TIERS
        )
        rounds = row["round_chat_p95_ms"]
        spread = (
            f"{max(rounds):.0f} / {min(rounds):.0f} = {row['round_p95_max_over_min']}"
            if rounds
            else "-"
        )
        print(
            f"| {name} | {row['engines']} | {row['total_tokens_per_s']} | {shares} | "
            f"{ci(row, 50)} ms | {ci(row, 95)} ms | {ci(row, 99)} ms | {spread} | "
            f"{row['preemptions']} |"
        )


def print_frontier(frontier: dict[str, Any]) -> None:
    """The engine's trade-off (capped-K rows) with kvpool-1 beside it."""
    print("| lower-tier cap K | output x priority | chat p95 (x alone) | chat p99 | preemptions |")
    print("|---|---|---|---|---|")
    rows = [(f"capped-{k}", p) for k, p in frontier["by_lower_tier_cap"].items()]
    if frontier["kvpool-1"]:
        rows.append(("kvpool-1", frontier["kvpool-1"]))
    for name, p in rows:
        print(
            f"| {name} | {p['output_ratio']} | {p['chat_p95_ms']} ms "
            f"({p['chat_p95_over_alone']}) | {p['chat_p99_ms']} ms | {p['preemptions']} |"
        )
    print(
        "least chat p95 x alone with output >= 0.95x priority: "
        f"{frontier['least_chat_p95_over_alone_at_0_95x_output']}"
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke: 2 rounds x 12 s")
    parser.add_argument("--mix", choices=sorted(MIXES), default="examples")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (4)")
    parser.add_argument("--seconds", type=float, default=None, help="a config a round (60)")
    parser.add_argument("--sessions", type=float, default=0.5, help="chat sessions/s an engine")
    parser.add_argument("--batch-workers", type=int, default=12, help="an engine")
    parser.add_argument("--eval-workers", type=int, default=3, help="an engine")
    parser.add_argument("--seed", type=int, default=19)
    parser.add_argument(
        "--output", type=Path, default=None, help="results file (peers-<mix>[-quick].json)"
    )
    parser.add_argument(
        "--configs",
        nargs="+",
        choices=(*CONFIGS, *VARIANTS),
        default=None,
        help="run only these configs; the comparison covers the pairs present",
    )
    parser.add_argument(
        "--capped",
        nargs="+",
        type=int,
        default=[],
        metavar="K",
        help="also run capped-K: priority with at most K batch and eval requests at the "
        f"engine (1-{MAX_NUM_SEQS}; the engine's own output / chat TTFT trade-off)",
    )
    parser.add_argument(
        "--handover-tokens",
        type=int,
        default=8,
        help=f"{HANDOVER}'s gateway --handover-tokens (default 8)",
    )
    parser.add_argument(
        "--no-target-variant",
        action="store_true",
        help=f"also run {NO_TARGET}: interactive without ttftP95Target (no prefill holds)",
    )
    parser.add_argument(
        "--finish-by",
        metavar="HH:MM",
        default=None,
        help="UTC time to be done by: shortens --seconds to fit (recorded in the results)",
    )
    parser.add_argument(
        "--quiet",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="hold /work/.quiet windows (12 min, then 3 min released) while measuring",
    )
    args = parser.parse_args()
    if any(not 1 <= k <= MAX_NUM_SEQS for k in args.capped):
        parser.error(f"--capped: each K must be 1-{MAX_NUM_SEQS} (the engine's sequences)")
    args.rounds = args.rounds or (2 if args.quick else 4)
    args.seconds = args.seconds or (12.0 if args.quick else 60.0)
    args.quiet = args.quiet and QUIET.parent.is_dir()
    return args


def main() -> int:
    args = parse_args()
    load_before = os.getloadavg()
    workdir = Path(tempfile.mkdtemp(prefix="kvpool-peers-"))
    suffix = "-quick" if args.quick else ""
    path = args.output or REPO / "bench" / "results" / f"peers-{args.mix}{suffix}.json"

    def document(measured: dict[str, Any]) -> dict[str, Any]:
        configs = measured["configs"]
        return {
            "benchmark": "peers",
            "quick": args.quick,
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": machine_info(load_before),
            "params": {
                "mix": args.mix,
                "rounds": args.rounds,
                "seconds": args.seconds,
                "chat_sessions_per_s_per_engine": args.sessions,
                "batch_workers_per_engine": args.batch_workers,
                "eval_workers_per_engine": args.eval_workers,
                "kv_tokens": KV_TOKENS,
                "max_num_seqs": MAX_NUM_SEQS,
                "max_model_len": MAX_MODEL_LEN,
                "seed": args.seed,
                "finish_by": args.finish_by,
                "no_target_variant": args.no_target_variant,
                "handover_tokens": args.handover_tokens,
            },
            **{k: v for k, v in measured.items() if k != "configs"},
            "configs": configs,
            "comparison": compare(configs),
        }

    def on_round(measured: dict[str, Any]) -> None:  # a run cut short keeps its rounds
        write_results(path, document(measured))
        print(f"round {measured['rounds_completed']} written to {path}", flush=True)

    quiet = QuietWindows(args.quiet)
    quiet.begin()
    if args.finish_by:  # a fixed end (a shared machine's slot): the seconds that fit
        hour, minute = (int(x) for x in args.finish_by.split(":"))
        now = time.gmtime()
        left = (hour * 60 + minute) * 60 - (now.tm_hour * 3600 + now.tm_min * 60 + now.tm_sec)
        fit = (left - 110) / (args.rounds * len(configs_of(args))) - 9  # engine starts; idle waits
        args.seconds = max(10.0, min(args.seconds, round(fit)))
        print(f"--finish-by {args.finish_by}: {args.rounds} rounds of {args.seconds:.0f} s")
    try:
        measured = asyncio.run(run_all(args, workdir, quiet, on_round))
    finally:
        quiet.release()
        if os.environ.get("KVPOOL_BENCH_KEEP"):
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    result = document(measured)
    print_table(result["configs"])
    print_samples(result["configs"])
    print_markdown(result["configs"])
    for key, value in result["comparison"].items():
        print(f"{key}: {value}")
    if "engine_frontier" in result["comparison"]:
        print_frontier(result["comparison"]["engine_frontier"])
    print(f"wrote {write_results(path, result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
