"""Do gateway replicas sharing a Redis admit as one replica would, whatever the balancer does?

Why this benchmark exists: issue 15. With a static ``--plan-share 100/N`` two replicas with
skewed ingress delivered half the output and starved a tier; capacity leases
(docs/0008) should deliver what one replica does. One real vLLM engine on CPU (the tiny
model, 2,048 KV tokens, 8 sequences, priority scheduling, pinned to core 0; everything
else on core 1), one Redis, and the examples' three tiers with the plan that the planner
makes from manifests (bench/bench_manifests.py, never a hand-written config):

- ``one``                one replica serving everything (the baseline of every ratio);
- ``two-skewed``         two replicas: chat reaches r1, batch and eval reach r0;
- ``two-90-10``          two replicas: every request to r0 with 90 % probability;
- ``four-skewed``        four: chat to r3, batch to r0 and r1, eval to r2;
- ``four-70-10``         four: 70 / 10 / 10 / 10 of every tenant's requests;
- ``four-all-at-one``    four, every request to r0: admission as ``one`` (the others hold
                         nothing), so what it adds is the three other processes on the
                         shared core (their renewals, the bench's scrapes): a control;
- ``one-burdened``       ``one``, with three processes on the shared core burning what
                         four replicas at 70/10/10/10 take beyond one replica's CPU
                         (``--burn-percent`` of the core, in 2 ms bursts): a control that
                         gives the shared core's share of the four-replica chat tail,
                         admission as one;
- ``two-skewed-static``  two-skewed with the old chart's ``--plan-share 50`` (what leases
                         replace).

Scenarios run in interleaved rounds (shuffled each round; the replicas start afresh each
round, one Redis for the whole run). Traffic: Poisson chat sessions (streamed, 16 tokens),
a closed-loop batch flood and eval workers (the mix's lengths), no caller priority (the
gateway sets it). Per scenario: total output tok/s and by tier, chat TTFT p50 / p95 / p99
(bootstrap 95 % interval of the p95 ratio to ``one``), the spread of per-round p95s,
preemptions, and two sampled witnesses of the invariant "the replicas together never admit
more than the plan": the largest sum of the replicas' in-use slots (scraped every 0.25 s;
``--sample-interval``)
and the largest running + waiting count on the engine (``one`` shows what a single
replica does; a ``Preempt`` floor may put more than the plan on the engine by design).
The lease cost: renewals per second per replica, the renewal round trip p50 / p99,
Redis commands per second per replica, and each replica's event-loop lag (the share of
its 50 ms timers late by over 5 / 10 / 25 ms: what a busy shared core or work on the
loop does to every request it relays).

Then a faults run (two replicas, skewed; no ratio): r0 SIGKILLed at a third (its clients
move to r1, as a Service does when the endpoint goes), r2 started at two thirds (a third
of the traffic moves to it); the seconds until the engine runs as many sequences as
before the kill, and until r2's first request streams.

    .venv/bin/python bench/scaleout.py            # 3 rounds of 25 s a scenario (~12 min)
    .venv/bin/python bench/scaleout.py --quick    # 1 round of 10 s (~4 min)

``--engine-scale F`` multiplies the engine (KV tokens and sequences), the mix's peak
concurrency declared to the planner and the load (chat rate, workers) by F: the same
scenarios where a replica's lease holds F times as many requests, which is what a GPU
engine's tens of sequences look like to the leases (docs/0008: fragments shrink with it).

Prints a table and writes bench/results/scaleout.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.engine import EngineConfig, VllmEngine, parse_cache_config_info
from tests.support.gateway import GatewayProcess
from tests.support.redis_server import RedisServer
from tests.support.tiny_model import tiny_model_dir

from bench_manifests import (
    KV_TOKENS,
    MAX_MODEL_LEN,
    MAX_NUM_SEQS,
    MIXES,
    BenchPlan,
    compile_mix,
)
from benchkit import (
    bootstrap_ratio_interval,
    fetch_text,
    histogram_buckets,
    machine_info,
    metric_sums,
    percentile,
    pin_process,
    wait_engine_idle,
    words_text,
    write_results,
)

RESULTS = Path(__file__).resolve().parent / "results" / "scaleout.json"
ENGINE_CORE, CLIENT_CORE = 0, 1
TIERS = ("interactive", "batch", "eval")
WORDS = ["the", "model", "token", "cache", "tier", "floor", "engine", "batch", "queue", "lease"]
LEASE_PERIOD = 0.1  # the gateway's default (--lease-period)
LEASE_TTL = 3.0


# --- scenarios: how many replicas, and where each request goes ----------------------------

Route = Callable[[str, random.Random], int]  # (tier, rng) -> replica index


def by_tier(mapping: dict[str, tuple[int, ...]]) -> Route:
    return lambda tier, rng: rng.choice(mapping[tier])


def weighted(weights: tuple[float, ...]) -> Route:
    return lambda _tier, rng: rng.choices(range(len(weights)), weights)[0]


@dataclass(frozen=True)
class Scenario:
    name: str
    replicas: int
    route: Route
    static_share: int | None = None  # --plan-share (the old chart), else leases
    burdened: bool = False  # CPU burners beside it on the shared core (``one-burdened``)


SCENARIOS = {
    s.name: s
    for s in (
        Scenario("one", 1, lambda _t, _r: 0),
        Scenario("two-skewed", 2, by_tier({"interactive": (1,), "batch": (0,), "eval": (0,)})),
        Scenario("two-90-10", 2, weighted((0.9, 0.1))),
        Scenario("four-skewed", 4, by_tier({"interactive": (3,), "batch": (0, 1), "eval": (2,)})),
        Scenario("four-70-10", 4, weighted((0.7, 0.1, 0.1, 0.1))),
        Scenario("four-all-at-one", 4, lambda _t, _r: 0),
        Scenario("one-burdened", 1, lambda _t, _r: 0, burdened=True),
        Scenario(
            "two-skewed-static",
            2,
            by_tier({"interactive": (1,), "batch": (0,), "eval": (0,)}),
            static_share=50,
        ),
    )
}


# --- what one scenario measured ------------------------------------------------------------


@dataclass
class Tally:
    ttft_ms: list[float] = field(default_factory=list)
    start_ttft_ms: list[float] = field(default_factory=list)  # chats sent while it settles
    round_p95_ms: list[float] = field(default_factory=list)
    tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    refused: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    errors: int = 0
    seconds: float = 0.0
    preemptions: float = 0.0
    max_in_use_slots: float = 0.0  # largest sum over replicas of in-use slots (sampled)
    max_in_use_tokens: float = 0.0  # largest sum over replicas of in-use KV tokens (sampled)
    max_engine_sequences: float = 0.0  # largest running + waiting on the engine (sampled)
    engine_samples: int = 0  # scrapes of the engine's /metrics that answered
    engine_full_samples: int = 0  # of them, with KV usage at the pause mark or above
    replica_samples: int = 0  # replicas' /metrics read, and of them with borrowing paused
    paused_samples: int = 0
    # by the access logs: seconds with any KV reserved, with the replicas' reservations
    # summed above the plan, and above the engine's KV (its usable tokens)
    reserved_seconds: float = 0.0
    reserved_over_plan_seconds: float = 0.0
    reserved_over_kv_seconds: float = 0.0
    engine_kv_tokens: int = 0
    # the replicas' summed in-use KV tokens at each sample that saw new preemptions
    reserved_at_preemption: list[float] = field(default_factory=list)
    ratio_samples: int = 0  # replicas' batch overcommit ratios read, and their sum
    sum_batch_ratio: float = 0.0
    sum_engine_running: float = 0.0  # the engine's running sequences, summed over them
    sum_engine_kv_usage: float = 0.0  # the engine's KV cache usage (0-1), likewise
    samples: int = 0
    sum_in_use_slots: float = 0.0  # summed over samples (for the mean)
    sum_in_use_tokens: float = 0.0
    sum_idle_quiet_tokens: float = 0.0  # leased, unused, on replicas with nothing queued
    sum_idle_waiting_tokens: float = 0.0  # leased, unused, on replicas with requests queued
    renewals: float = 0.0  # lease renewals, summed over replicas
    replica_seconds: float = 0.0  # replicas x seconds (for the per-replica rates)
    redis_commands: float = 0.0
    renewal_buckets: dict[str, float] = field(default_factory=dict)
    # per replica: its event loop's lag timer (every 50 ms), cumulative counts by ``le``
    loop_lag_buckets: dict[int, dict[str, float]] = field(default_factory=dict)
    gateway_cpu_seconds: float = 0.0  # user + system CPU of the replicas, summed
    burner_cpu_seconds: float = 0.0  # of the burners beside them (``one-burdened``)
    # where chats wait, by the replica they reached: their TTFTs, and the deltas of that
    # replica's interactive admission-wait histogram (cumulative counts by le, _sum, _count)
    ttft_ms_by_replica: dict[int, list[float]] = field(default_factory=dict)
    chat_wait_buckets: dict[int, dict[str, float]] = field(default_factory=dict)
    chat_wait_sum: dict[int, float] = field(default_factory=dict)
    # the chats' TTFT as the gateways' access logs give it: arrival to first token, its
    # part from the request's hand-over to the engine, and the admission queue
    gateway_ttft_ms: list[float] = field(default_factory=list)
    upstream_ttft_ms: list[float] = field(default_factory=list)
    # the gateway's own part: arrival to the hand-over, less the admission queue
    before_hand_over_ms: list[float] = field(default_factory=list)
    # budget charges by how they met their engine request (kvpool_gateway_budget_overlap)
    budget_overlap: dict[str, float] = field(default_factory=dict)
    queue_ms: list[float] = field(default_factory=list)
    # by the access logs, every chat of a round (its first seconds too): how many waited
    # over 25 ms for admission, and of the replicas' first chats of a round how many did
    logged_chats: int = 0
    logged_waits: int = 0
    first_chats: int = 0
    first_chat_waits: int = 0
    # output tokens as they stream, by whole second of the round (one list a round): the
    # ramp-up at a round's start apart from the steady state after it
    streamed_by_second: list[list[int]] = field(default_factory=list)
    round_seconds: int = 0  # whole seconds of a round (its load's length)

    def begin_round(self, seconds: float) -> None:
        """A round of ``seconds`` of load starts now."""
        self.streamed_by_second.append([])
        self.round_seconds = int(seconds)


@dataclass
class Load:
    """Traffic of one round: chat sessions on a Poisson schedule, batch and eval loops."""

    plan: BenchPlan
    urls: list[str]  # the replicas, in index order (a killed one is replaced by None)
    route: Route
    tally: Tally
    stop_at: float
    rng: random.Random
    moved: dict[int, int] = field(default_factory=dict)  # a dead replica -> where its clients go
    first_ok_at: dict[int, float] = field(default_factory=dict)  # replica -> first 200 (mono)
    measure_from: float = 0.0  # chats sent before this (perf_counter) are the start's, apart
    started: float = 0.0  # the round's start (monotonic), for the per-second output

    def streamed(self, tokens: int) -> None:
        """``tokens`` output tokens arrived now: count them in the round's second."""
        seconds = self.tally.streamed_by_second[-1]
        second = int(time.monotonic() - self.started)
        while len(seconds) <= second:
            seconds.append(0)
        seconds[second] += tokens

    def target(self, tier: str, rng: random.Random) -> int:
        index = self.route(tier, rng)
        while index in self.moved:
            index = self.moved[index]
        return index

    async def request(self, session: aiohttp.ClientSession, tier: str, rng: random.Random) -> None:
        mix = self.plan.mix
        index = self.target(tier, rng)
        if tier == "interactive":
            path, words, max_tokens = "/v1/chat/completions", mix.chat_first_words, 16
        elif tier == "batch":
            path, max_tokens = "/v1/completions", mix.batch_max_tokens
            words = rng.randint(*mix.batch_prompt_words)
        else:
            path, max_tokens = "/v1/completions", mix.eval_max_tokens
            words = rng.randint(*mix.eval_prompt_words)
        prompt = words_text(rng, words, WORDS)
        body: dict[str, Any] = {
            "model": "tiny",
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
        }
        if tier == "interactive":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        headers = {"Authorization": f"Bearer {self.plan.keys[tier]}"}
        sent = time.perf_counter()
        first: float | None = None
        count = 0
        try:
            timeout = aiohttp.ClientTimeout(total=max(1.0, self.stop_at - time.monotonic() + 20))
            async with session.post(
                self.urls[index] + path, json=body, headers=headers, timeout=timeout
            ) as resp:
                if resp.status != 200:
                    await resp.read()
                    self.tally.refused[tier] += 1
                    await asyncio.sleep(min(float(resp.headers.get("Retry-After", "1")), 0.5))
                    return
                async for line in resp.content:
                    if line.startswith(b"data: {") and (b'"content"' in line or b'"text"' in line):
                        count += 1
                        if self.tally.streamed_by_second:
                            self.streamed(1)
                        if first is None:
                            first = time.perf_counter()
                            self.first_ok_at.setdefault(index, time.monotonic())
        except (aiohttp.ClientError, TimeoutError):
            self.tally.errors += 1
            await asyncio.sleep(0.2)
            return
        self.tally.tokens[tier] += count
        if tier == "interactive" and first is not None:
            self.record_chat(index, sent, first)

    def record_chat(self, index: int, sent: float, first: float) -> None:
        """A chat's TTFT: in the percentiles (by replica too), or the start's apart."""
        ttft = (first - sent) * 1000
        if sent >= self.measure_from:
            self.tally.ttft_ms.append(ttft)
            self.tally.ttft_ms_by_replica.setdefault(index, []).append(ttft)
        else:
            self.tally.start_ttft_ms.append(ttft)

    async def chats(self, session: aiohttp.ClientSession, rate: float) -> None:
        tasks: list[asyncio.Task[None]] = []
        rng = random.Random(self.rng.random())
        next_at = time.monotonic()
        while True:
            next_at += rng.expovariate(rate)
            if next_at >= self.stop_at:
                break
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            tasks.append(asyncio.create_task(self.request(session, "interactive", rng)))
        await asyncio.gather(*tasks)

    async def worker(self, session: aiohttp.ClientSession, tier: str, seed: float) -> None:
        rng = random.Random(seed)
        while time.monotonic() < self.stop_at:
            await self.request(session, tier, rng)


# --- sampling the witnesses ----------------------------------------------------------------


@dataclass(frozen=True)
class ReplicaSample:
    """One replica's figures at one sample (its /metrics)."""

    slots: float = 0.0  # in use, summed over tiers
    tokens: float = 0.0  # in use, summed over tiers
    queued: float = 0.0  # requests waiting for admission
    leased_tokens: float | None = None  # its lease's total (None: it admits without one)
    batch_ratio: float | None = None  # the batch tier's overcommit ratio (1: none)
    paused: bool = False  # borrowing paused (the engines' KV usage near full)


def replica_sample(text: str) -> ReplicaSample:
    """Read one replica's in-use slots and KV tokens, queued requests, leased tokens and
    the batch tier's overcommit ratio."""
    slots = tokens = queued = 0.0
    leased: float | None = None
    ratio: float | None = None
    paused = False
    for line in text.splitlines():
        value = line.rsplit(" ", 1)[-1]
        if line.startswith("kvpool_gateway_overcommit_ratio{") and 'tier="batch"' in line:
            ratio = float(value)
        elif line.startswith("kvpool_gateway_borrowing_paused{"):
            paused = paused or float(value) > 0
        elif line.startswith("kvpool_gateway_queued_requests{"):
            queued += float(value)
        elif line.startswith("kvpool_gateway_lease_capacity{") and (
            'kind="total"' in line and 'dimension="tokens"' in line and 'track="stable"' in line
        ):
            leased = (leased or 0.0) + float(value)
        elif 'kind="in_use"' in line and line.startswith("kvpool_gateway_tier_slots{"):
            slots += float(value)
        elif 'kind="in_use"' in line and line.startswith("kvpool_gateway_tier_tokens{"):
            tokens += float(value)
    return ReplicaSample(slots, tokens, queued, leased, ratio, paused)


def idle_leased(replicas: list[ReplicaSample], plan_tokens: int) -> tuple[float, float]:
    """KV tokens leased but not in use, on replicas with nothing queued and on replicas
    with requests queued (what they hold does not fit the request at their head). A
    replica without a lease holds the whole plan."""
    quiet = waiting = 0.0
    for r in replicas:
        held = plan_tokens if r.leased_tokens is None else r.leased_tokens
        idle = max(0.0, held - r.tokens)
        if r.queued > 0:
            waiting += idle
        else:
            quiet += idle
    return quiet, waiting


async def sample(
    session: aiohttp.ClientSession,
    engine: VllmEngine,
    metrics: list[str],
    tally: Tally,
    stop: asyncio.Event,
    plan_tokens: int,
    interval: float = 0.25,
) -> None:
    """Every ``interval`` seconds: the sum of the replicas' in-use slots and KV tokens, where
    the leased tokens not in use are (:func:`idle_leased`), and the engine's sequences."""
    last_preempted: float | None = None
    while not stop.is_set():
        texts = await asyncio.gather(
            *(fetch_text(session, url) for url in metrics), return_exceptions=True
        )
        used = [replica_sample(t) for t in texts if isinstance(t, str)]
        tally.max_in_use_slots = max(tally.max_in_use_slots, sum(u.slots for u in used))
        tally.max_in_use_tokens = max(tally.max_in_use_tokens, sum(u.tokens for u in used))
        tally.samples += 1
        tally.sum_in_use_slots += sum(u.slots for u in used)
        tally.sum_in_use_tokens += sum(u.tokens for u in used)
        tally.paused_samples += sum(1 for u in used if u.paused)
        tally.replica_samples += len(used)
        ratios = [u.batch_ratio for u in used if u.batch_ratio is not None]
        if ratios:
            tally.ratio_samples += len(ratios)
            tally.sum_batch_ratio += sum(ratios)
        quiet, waiting = idle_leased(used, plan_tokens)
        tally.sum_idle_quiet_tokens += quiet
        tally.sum_idle_waiting_tokens += waiting
        try:
            sums = metric_sums(await fetch_text(session, engine.metrics_url))
        except (aiohttp.ClientError, TimeoutError):
            sums = {}
        sequences = sums.get("vllm:num_requests_running", 0) + sums.get(
            "vllm:num_requests_waiting", 0
        )
        tally.max_engine_sequences = max(tally.max_engine_sequences, sequences)
        if sums:
            tally.engine_samples += 1
            tally.sum_engine_running += sums.get("vllm:num_requests_running", 0)
            tally.sum_engine_kv_usage += sums.get("vllm:kv_cache_usage_perc", 0)
            tally.engine_full_samples += sums.get("vllm:kv_cache_usage_perc", 0) >= PAUSE_USAGE
            preempted = sums.get("vllm:num_preemptions_total", 0)
            if last_preempted is not None and preempted > last_preempted:
                tally.reserved_at_preemption.append(sum(u.tokens for u in used))
            last_preempted = preempted
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)


# --- a round ---------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


BURNERS = 3  # the three replicas ``four-70-10`` has beyond ``one``
BURST_SECONDS = 0.002  # about a lease renewal's CPU, or a relayed request's
# one burner: bursts of busy CPU, each followed by a sleep that makes its share (jittered,
# so that the burners do not beat in step)
BURNER = """
import random, sys, time
burst, share = float(sys.argv[1]), float(sys.argv[2])
while True:
    end = time.perf_counter() + burst
    while time.perf_counter() < end:
        pass
    time.sleep(burst * (1 / share - 1) * random.uniform(0.5, 1.5))
"""


@contextlib.contextmanager
def cpu_burners(percent: float, cpus: set[int]) -> Iterator[list[subprocess.Popen[bytes]]]:
    """:data:`BURNERS` processes on ``cpus`` taking ``percent`` of one core together."""
    share = str(percent / 100 / BURNERS)
    burners = [
        subprocess.Popen([sys.executable, "-c", BURNER, str(BURST_SECONDS), share])
        for _ in range(BURNERS)
    ]
    try:
        for burner in burners:
            os.sched_setaffinity(burner.pid, cpus)
        yield burners
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


def start_gateway(
    plan: BenchPlan,
    redis: RedisServer,
    workdir: Path,
    name: str,
    share: int | None,
    lease_period: float = LEASE_PERIOD,
    flags: tuple[str, ...] = (),
) -> GatewayProcess:
    # the access log is on (chat_times reads it)
    extra = ("--lease-period", str(lease_period), "--lease-ttl", str(LEASE_TTL), *flags)
    extra += ("--plan-share", str(share)) if share is not None else ()
    gateway = GatewayProcess(
        plan.config_path, workdir / f"gateway-{name}.log", redis_url=redis.url, extra_args=extra
    )
    return gateway.start(timeout=30)


PAUSE_USAGE = 0.97  # the gateway's default: measured KV usage that pauses borrowing

# a chat "waited" for admission, by the access logs (the histogram's bucket is 0.025 s)
LOGGED_WAIT_MS = 25


def queue_and_engine(tally: Tally) -> list[float]:
    """Each chat's TTFT at the gateway less the gateway's own time before the hand-over
    (parse, size, admit, connect): its admission queue plus the engine's time to the first
    token. What admission across replicas changes, without what the processes sharing
    this machine's one core for gateways add before the hand-over."""
    return [q + u for q, u in zip(tally.queue_ms, tally.upstream_ttft_ms, strict=True)]


def log_sizes(gateways: list[GatewayProcess]) -> dict[Path, int]:
    """Where each gateway's log ends now (a replica's log is appended to every round)."""
    paths = [g.process.log_path for g in gateways]
    return {p: p.stat().st_size if p.exists() else 0 for p in paths}


def chat_times(tally: Tally, logs: dict[Path, int], wall_from: float, wall_to: float) -> None:
    """The interactive streams that arrived in [wall_from, wall_to] by the gateways' access
    logs, each read from the offset given (this round's part): where their time to first
    token went (the gateway's queue, the engine, the rest); and, over all of the round's
    chats, those that waited over 25 ms for admission, the replica's first one apart."""
    for path, offset in logs.items():
        with path.open("rb") as log:
            log.seek(offset)
            text = log.read().decode("utf-8", errors="replace")
        chats: list[tuple[float, float]] = []  # (arrival, queue ms), every chat of the round
        for line in text.splitlines():
            if not line.startswith('{"ts"'):
                continue
            record = json.loads(line)
            ttft, upstream = record.get("ttft_ms"), record.get("upstream_ttft_ms")
            if record.get("tier") != "interactive" or ttft is None or upstream is None:
                continue
            arrived = record["ts"] - record["duration_ms"] / 1000
            chats.append((arrived, record["queue_ms"]))
            if wall_from <= arrived <= wall_to:
                tally.gateway_ttft_ms.append(ttft)
                tally.upstream_ttft_ms.append(upstream)
                tally.queue_ms.append(record["queue_ms"])
                tally.before_hand_over_ms.append(ttft - upstream - record["queue_ms"])
        if chats:
            chats.sort()
            tally.logged_chats += len(chats)
            tally.logged_waits += sum(1 for _, queue in chats if queue > LOGGED_WAIT_MS)
            tally.first_chats += 1
            tally.first_chat_waits += int(chats[0][1] > LOGGED_WAIT_MS)


async def engine_before(
    session: aiohttp.ClientSession, engine: VllmEngine, tally: Tally
) -> dict[str, float]:
    """The engine's metric sums at a round's start; its usable KV tokens into ``tally``."""
    text = await fetch_text(session, engine.metrics_url)
    info = parse_cache_config_info(text)  # one block is vLLM's null block
    tally.engine_kv_tokens = (info.num_gpu_blocks - 1) * info.block_size
    return metric_sums(text)


def reservations_over(tally: Tally, logs: dict[Path, int], plan_tokens: int) -> None:
    """From every request of the round in the gateways' access logs (admitted at arrival
    + queue, ended at ``ts``), the KV tokens all replicas had reserved together over time:
    the seconds it was above zero, above the plan and above the engine's KV. Exact where
    a periodic sample of the replicas' gauges misses requests that last ~0.6 s."""
    events: list[tuple[float, int]] = []
    for path, offset in logs.items():
        with path.open("rb") as log:
            log.seek(offset)
            text = log.read().decode("utf-8", errors="replace")
        for line in text.splitlines():
            if not line.startswith('{"ts"'):
                continue
            record = json.loads(line)
            reserved = record.get("reserved_tokens")
            if record.get("status") != 200 or not reserved:
                continue
            ended = record["ts"]
            admitted = ended - (record["duration_ms"] - record["queue_ms"]) / 1000
            events += [(admitted, reserved), (ended, -reserved)]
    events.sort()
    level, last = 0, None
    for at, change in events:
        if last is not None and level > 0:
            seconds = at - last
            tally.reserved_seconds += seconds
            tally.reserved_over_plan_seconds += seconds if level > plan_tokens else 0.0
            tally.reserved_over_kv_seconds += seconds if level > tally.engine_kv_tokens else 0.0
        level, last = level + change, at


async def redis_commands(redis: RedisServer) -> float:
    client = aioredis.from_url(redis.url)
    try:
        info = await client.info("stats")
        return float(info["total_commands_processed"])
    finally:
        await client.aclose()


async def run_round(
    scenario: Scenario,
    plan: BenchPlan,
    engine: VllmEngine,
    redis: RedisServer,
    args: argparse.Namespace,
    tally: Tally,
    workdir: Path,
    seed: int,
) -> None:
    gateways = await asyncio.gather(
        *(
            asyncio.to_thread(
                start_gateway,
                plan,
                redis,
                workdir,
                f"{scenario.name}-{i}",
                scenario.static_share,
                args.lease_period,
                ("--no-budget-overlap",) if args.no_budget_overlap else (),
            )
            for i in range(scenario.replicas)
        )
    )
    logs = log_sizes(gateways)
    burn = args.burn_percent if scenario.burdened else 0.0
    try:
        async with (
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session,
            contextlib.AsyncExitStack() as stack,
        ):
            await wait_engine_idle(session, engine.metrics_url, 60)
            before = await engine_before(session, engine, tally)
            gw_before = [await fetch_text(session, g.metrics_url) for g in gateways]
            commands = await redis_commands(redis)
            burners = stack.enter_context(cpu_burners(burn, {CLIENT_CORE})) if burn else []
            cpu = sum(cpu_seconds(g.process.pid) for g in gateways)
            burned = sum(cpu_seconds(b.pid) for b in burners)
            started = time.monotonic()
            load = Load(
                plan,
                [g.url for g in gateways],
                scenario.route,
                tally,
                started + args.seconds,
                random.Random(seed),
                measure_from=time.perf_counter() + args.settle,
                started=started,
            )
            tally.begin_round(args.seconds)
            round_start = len(tally.ttft_ms)
            wall_from = time.time() + args.settle
            stop = asyncio.Event()
            sampler = asyncio.create_task(
                sample(
                    session,
                    engine,
                    [g.metrics_url for g in gateways],
                    tally,
                    stop,
                    plan.planned()["total_tokens"],
                    args.sample_interval,
                )
            )
            # chat waits count from here: a chat sent while settling (left out of the
            # TTFTs) is admitted or refused within its tier's maxQueueWait
            chat_wait_from = args.settle + plan.max_queue_wait("interactive")
            settled = asyncio.create_task(gateway_texts_after(session, gateways, chat_wait_from))
            jobs = [load.chats(session, args.chat_rate)]
            jobs += [load.worker(session, "batch", seed * 100 + i) for i in range(args.batch)]
            jobs += [load.worker(session, "eval", seed * 200 + i) for i in range(args.eval)]
            await asyncio.gather(*jobs)
            elapsed = time.monotonic() - started
            wall_to = time.time()
            stop.set()
            await sampler
            tally.gateway_cpu_seconds += sum(cpu_seconds(g.process.pid) for g in gateways) - cpu
            tally.burner_cpu_seconds += sum(cpu_seconds(b.pid) for b in burners) - burned
            await stack.aclose()  # the burners end with the load
            gw_after = [await fetch_text(session, g.metrics_url) for g in gateways]
            gw_settled = await settled
            tally.redis_commands += await redis_commands(redis) - commands
            await wait_engine_idle(session, engine.metrics_url, 60)
            after = metric_sums(await fetch_text(session, engine.metrics_url))
    finally:
        await asyncio.gather(*(asyncio.to_thread(g.stop) for g in gateways))
    chat_times(tally, logs, wall_from, wall_to)
    reservations_over(tally, logs, plan.planned()["total_tokens"])
    tally.seconds += elapsed
    tally.replica_seconds += elapsed * scenario.replicas
    tally.preemptions += after.get("vllm:num_preemptions_total", 0) - before.get(
        "vllm:num_preemptions_total", 0
    )
    round_p95 = percentile(tally.ttft_ms[round_start:], 95)
    if round_p95 is not None:
        tally.round_p95_ms.append(round_p95)
    add_renewals(tally, gw_before, gw_after)
    add_settled(tally, gw_settled, gw_after)


def add_settled(tally: Tally, settled: list[str], after: list[str]) -> None:
    """Each replica's chat admission waits and event-loop lag of a round, after its
    settling seconds, from its /metrics then (``settled``) and at the round's end."""
    for index, (b_text, a_text) in enumerate(zip(settled, after, strict=True)):
        wait_b, sum_b = chat_wait(b_text)
        wait_a, sum_a = chat_wait(a_text)
        add_bucket_deltas(tally.chat_wait_buckets.setdefault(index, {}), wait_b, wait_a)
        tally.chat_wait_sum[index] = tally.chat_wait_sum.get(index, 0) + sum_a - sum_b
        add_bucket_deltas(
            tally.loop_lag_buckets.setdefault(index, {}),
            histogram_buckets(b_text, LOOP_LAG),
            histogram_buckets(a_text, LOOP_LAG),
        )


def add_bucket_deltas(
    into: dict[str, float], before: dict[str, float], after: dict[str, float]
) -> None:
    """Add what a histogram's cumulative counts by ``le`` grew by, ``before`` to
    ``after``, to ``into``."""
    for le, value in after.items():
        into[le] = into.get(le, 0) + value - before.get(le, 0)


OVERLAP = re.compile(r'^kvpool_gateway_budget_overlap_total\{result="([a-z-]+)"\} (\S+)$', re.M)


def add_renewals(tally: Tally, before: list[str], after: list[str]) -> None:
    """The lease renewals of a round and their durations, and the budget charges by how
    they met their engine request, from each replica's /metrics ``before`` and ``after``."""
    for b_text, a_text in zip(before, after, strict=True):
        counted = {result: float(value) for result, value in OVERLAP.findall(b_text)}
        for result, value in OVERLAP.findall(a_text):
            grown = float(value) - counted.get(result, 0.0)
            tally.budget_overlap[result] = tally.budget_overlap.get(result, 0.0) + grown
        b, a = metric_sums(b_text), metric_sums(a_text)
        tally.renewals += a.get("kvpool_gateway_lease_renewals_total", 0) - b.get(
            "kvpool_gateway_lease_renewals_total", 0
        )
        add_bucket_deltas(
            tally.renewal_buckets,
            histogram_buckets(b_text, "kvpool_gateway_lease_renewal_seconds"),
            histogram_buckets(a_text, "kvpool_gateway_lease_renewal_seconds"),
        )


CHAT_WAIT = "kvpool_gateway_queue_seconds"
LOOP_LAG = "kvpool_gateway_event_loop_lag_seconds"


def loop_lag_by_replica(tally: Tally) -> dict[str, dict[str, float | None]]:
    """Per replica, the shares of its event loop's 50 ms timers that ran more than 5, 10
    and 25 ms late (after a round's settling seconds): how often anything held the loop
    that relays every request (renewals, the allocation, scrapes, a busy shared core)."""
    return {
        f"r{index}": {
            f"late_over_{bound}ms": _share_over(buckets, str(bound / 1000)) for bound in (5, 10, 25)
        }
        for index, buckets in sorted(tally.loop_lag_buckets.items())
    }


async def gateway_texts_after(
    session: aiohttp.ClientSession, gateways: list[GatewayProcess], delay: float
) -> list[str]:
    """Every gateway's /metrics ``delay`` seconds from now (once the chats of a round's
    settling seconds, which the percentiles leave out, have all been admitted or refused)."""
    await asyncio.sleep(delay)
    return [await fetch_text(session, g.metrics_url) for g in gateways]


def chat_wait(text: str) -> tuple[dict[str, float], float]:
    """One replica's interactive admission waits: cumulative counts by ``le`` and the sum."""
    chat_lines = "\n".join(line for line in text.splitlines() if 'tier="interactive"' in line)
    total = sum(
        float(line.rpartition(" ")[2])
        for line in chat_lines.splitlines()
        if line.startswith(CHAT_WAIT + "_sum{")
    )
    return histogram_buckets(chat_lines, CHAT_WAIT), total


def where_chats_wait(tally: Tally) -> dict[str, dict[str, float | None]]:
    """Per replica the chats reached: their count, TTFT p95, mean admission wait and the
    shares that waited longer than 25 and 100 ms for admission."""
    out: dict[str, dict[str, float | None]] = {}
    for index in sorted(set(tally.ttft_ms_by_replica) | set(tally.chat_wait_buckets)):
        buckets = tally.chat_wait_buckets.get(index, {})
        count = buckets.get("+Inf", 0.0)
        ttfts = tally.ttft_ms_by_replica.get(index, [])
        out[f"r{index}"] = {
            "chats": len(ttfts),
            "ttft_p95_ms": _r(percentile(ttfts, 95)),
            "admission_wait_mean_ms": _per(1000 * tally.chat_wait_sum.get(index, 0.0), count),
            "waited_over_25ms": _share_over(buckets, "0.025"),
            "waited_over_100ms": _share_over(buckets, "0.1"),
        }
    return out


def _share_over(buckets: dict[str, float], bound: str) -> float | None:
    """The share of a histogram's observations above the bucket bound ``bound``."""
    count = buckets.get("+Inf", 0.0)
    return round(1 - buckets.get(bound, 0.0) / count, 3) if count else None


def bucket_quantile(buckets: dict[str, float], q: float) -> float | None:
    """The upper bound of the bucket holding the ``q`` quantile (an upper estimate)."""
    if not buckets:
        return None
    ordered = sorted(buckets.items(), key=lambda kv: float(kv[0]))
    total = ordered[-1][1]
    if total <= 0:
        return None
    for le, count in ordered:
        if count >= q * total:
            return float(le)
    return None


def _per(total: float, count: float) -> float | None:
    """``total / count`` rounded, None when nothing was counted."""
    return _r(total / count) if count else None


STEADY_FROM_SECONDS = 5  # a round's output from this second on is its steady state


def streamed_rates(tally: Tally) -> tuple[float | None, float | None, list[float]]:
    """Output tokens a second as they streamed: over a round's first
    ``STEADY_FROM_SECONDS`` (its ramp-up: every replica and worker starts at once), over
    the rest of its load (the steady state), and the mean of every second over the rounds."""
    rounds = [r + [0] * (tally.round_seconds - len(r)) for r in tally.streamed_by_second]
    if not rounds or tally.round_seconds <= STEADY_FROM_SECONDS:
        return None, None, []
    ramp = sum(sum(r[:STEADY_FROM_SECONDS]) for r in rounds)
    steady = sum(sum(r[STEADY_FROM_SECONDS : tally.round_seconds]) for r in rounds)
    longest = max(len(r) for r in rounds)
    by_second = [
        round(sum(r[i] for r in rounds if i < len(r)) / len(rounds), 1) for i in range(longest)
    ]
    return (
        round(ramp / (STEADY_FROM_SECONDS * len(rounds)), 1),
        round(steady / ((tally.round_seconds - STEADY_FROM_SECONDS) * len(rounds)), 1),
        by_second,
    )


def summarise(tally: Tally, baseline: Tally | None) -> dict[str, Any]:
    output = sum(tally.tokens.values())
    ramp_rate, steady_rate, by_second = streamed_rates(tally)
    queued_and_engine = queue_and_engine(tally)
    row: dict[str, Any] = {
        "output_tokens_per_s": round(output / tally.seconds, 1) if tally.seconds else 0.0,
        "ramp_output_tokens_per_s": ramp_rate,
        "steady_output_tokens_per_s": steady_rate,
        "output_by_second": by_second,
        "share_by_tier": {t: round(tally.tokens[t] / output, 3) if output else 0.0 for t in TIERS},
        "chats": len(tally.ttft_ms),
        "chat_ttft_p50_ms": _r(percentile(tally.ttft_ms, 50)),
        "chat_ttft_p95_ms": _r(percentile(tally.ttft_ms, 95)),
        "chat_ttft_p99_ms": _r(percentile(tally.ttft_ms, 99)),
        "round_p95_ms": [_r(v) for v in tally.round_p95_ms],
        "start_chats": len(tally.start_ttft_ms),
        "start_chat_ttft_max_ms": _r(max(tally.start_ttft_ms, default=0.0)),
        "refused": tally.refused,
        "errors": tally.errors,
        "preemptions": int(tally.preemptions),
        "max_sum_in_use_slots": tally.max_in_use_slots,
        "max_sum_in_use_tokens": tally.max_in_use_tokens,
        "max_engine_sequences": tally.max_engine_sequences,
        "mean_batch_overcommit_ratio": _per(tally.sum_batch_ratio, tally.ratio_samples),
        "mean_engine_running": _per(tally.sum_engine_running, tally.engine_samples),
        "engine_full_percent": _per(100 * tally.engine_full_samples, tally.engine_samples),
        "borrowing_paused_percent": _per(100 * tally.paused_samples, tally.replica_samples),
        "reserved_at_preemption_tokens": [round(v) for v in tally.reserved_at_preemption],
        "reserved_over_plan_percent": _per(
            100 * tally.reserved_over_plan_seconds, tally.reserved_seconds
        ),
        "reserved_over_engine_kv_percent": _per(
            100 * tally.reserved_over_kv_seconds, tally.reserved_seconds
        ),
        "mean_engine_kv_usage": _per(100 * tally.sum_engine_kv_usage, tally.engine_samples),
        "mean_sum_in_use_slots": _per(tally.sum_in_use_slots, tally.samples),
        "mean_sum_in_use_tokens": _per(tally.sum_in_use_tokens, tally.samples),
        "mean_idle_tokens_quiet_replicas": _per(tally.sum_idle_quiet_tokens, tally.samples),
        "mean_idle_tokens_waiting_replicas": _per(tally.sum_idle_waiting_tokens, tally.samples),
        "budget_overlap": {k: round(v) for k, v in sorted(tally.budget_overlap.items())},
        "renewals_per_s_per_replica": _per(tally.renewals, tally.replica_seconds),
        "redis_commands_per_s_per_replica": _per(tally.redis_commands, tally.replica_seconds),
        "burner_cpu_percent": _per(100 * tally.burner_cpu_seconds, tally.seconds),
        "gateway_cpu_percent_per_replica": _per(
            100 * tally.gateway_cpu_seconds, tally.replica_seconds
        ),
        "renewal_p50_ms": _r(_ms(bucket_quantile(tally.renewal_buckets, 0.5))),
        "renewal_p99_ms": _r(_ms(bucket_quantile(tally.renewal_buckets, 0.99))),
        "chats_by_replica": where_chats_wait(tally),
        "loop_lag_by_replica": loop_lag_by_replica(tally),
        "chat_waits_by_access_log": {
            "chats": tally.logged_chats,
            "waited_over_25ms": tally.logged_waits,
            "replica_rounds_with_a_chat": tally.first_chats,
            "first_chat_waited_over_25ms": tally.first_chat_waits,
        },
        "chat_ttft_at_gateway_ms": {
            name: {f"p{q}": _r(percentile(values, q)) for q in (50, 95, 99)}
            for name, values in (
                ("arrival_to_first_token", tally.gateway_ttft_ms),
                ("engine_to_first_token", tally.upstream_ttft_ms),
                ("admission_queue", tally.queue_ms),
                ("before_hand_over", tally.before_hand_over_ms),
                ("queue_and_engine", queued_and_engine),
            )
        },
    }
    if baseline is not None and baseline.seconds and sum(baseline.tokens.values()):
        base_rate = sum(baseline.tokens.values()) / baseline.seconds
        row["output_vs_one"] = round(output / tally.seconds / base_rate, 3)
        base_ramp, base_steady, _ = streamed_rates(baseline)
        for key, here, there in (
            ("ramp_output_vs_one", ramp_rate, base_ramp),
            ("steady_output_vs_one", steady_rate, base_steady),
        ):
            row[key] = round(here / there, 3) if here and there else None
        p95, base_p95 = percentile(tally.ttft_ms, 95), percentile(baseline.ttft_ms, 95)
        row["chat_p95_vs_one"] = _r(p95 / base_p95) if p95 and base_p95 else None
        base = queue_and_engine(baseline)
        for q in (95, 99):
            here, there = percentile(queued_and_engine, q), percentile(base, q)
            row[f"queue_and_engine_p{q}_vs_one"] = _r(here / there) if here and there else None
        row["chat_p95_vs_one_interval"] = bootstrap_ratio_interval(
            tally.ttft_ms, baseline.ttft_ms, 95
        )
    return row


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


# --- faults ------------------------------------------------------------------------------------


async def faults(
    plan: BenchPlan, engine: VllmEngine, redis: RedisServer, args: argparse.Namespace, workdir: Path
) -> dict[str, Any]:
    """Two replicas (chat to r1, batch and eval to r0); r0 SIGKILLed at a third, r2 added
    at two thirds (a third of every tier's traffic)."""
    seconds = max(30.0, args.seconds * 1.5)
    r0, r1 = await asyncio.gather(
        *(
            asyncio.to_thread(start_gateway, plan, redis, workdir, f"faults-{i}", None)
            for i in (0, 1)
        )
    )
    gateways = [r0, r1]
    tally = Tally()
    result: dict[str, Any] = {}
    route = SCENARIOS["two-skewed"].route
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            await wait_engine_idle(session, engine.metrics_url, 60)
            started = time.monotonic()
            load = Load(plan, [r0.url, r1.url], route, tally, started + seconds, random.Random(5))
            jobs = [load.chats(session, args.chat_rate)]
            jobs += [load.worker(session, "batch", 900 + i) for i in range(args.batch)]
            jobs += [load.worker(session, "eval", 950 + i) for i in range(args.eval)]
            running = asyncio.gather(*jobs)

            async def engine_sequences() -> float:
                sums = metric_sums(await fetch_text(session, engine.metrics_url))
                return sums.get("vllm:num_requests_running", 0)

            await asyncio.sleep(seconds / 3)
            level = max([await engine_sequences() for _ in range(3)])
            killed = time.monotonic()
            os.kill(r0.process.pid, signal.SIGKILL)
            load.moved[0] = 1  # r0's clients reconnect to r1 (the Service drops the endpoint)
            recovered = None
            while time.monotonic() - killed < 15:
                if await engine_sequences() >= level:
                    recovered = time.monotonic() - killed
                    break
                await asyncio.sleep(0.05)
            result["sigkill"] = {"running_before": level, "seconds_to_same_running": _r(recovered)}
            await asyncio.sleep(max(0.0, started + 2 * seconds / 3 - time.monotonic()))
            r2 = await asyncio.to_thread(start_gateway, plan, redis, workdir, "faults-2", None)
            gateways.append(r2)
            load.urls.append(r2.url)
            joined = time.monotonic()
            load.route = lambda tier, rng: 2 if rng.random() < 1 / 3 else route(tier, rng)
            while 2 not in load.first_ok_at and time.monotonic() - joined < 15:
                await asyncio.sleep(0.02)
            first = load.first_ok_at.get(2)
            result["join"] = {"seconds_to_first_stream": _r(first - joined if first else None)}
            await running
    finally:
        for gateway in gateways:
            await asyncio.to_thread(gateway.stop)
    result["errors"] = tally.errors
    result["refused"] = tally.refused
    return result


# --- the run -------------------------------------------------------------------------------


def start_engine(workdir: Path, scale: int) -> VllmEngine:
    config = EngineConfig(
        model_dir=tiny_model_dir(),
        served_model_name="tiny",
        kv_cache_memory_bytes=KV_TOKENS * scale * 1024,
        block_size=32,
        max_num_seqs=MAX_NUM_SEQS * scale,
        max_model_len=MAX_MODEL_LEN,
        scheduling_policy="priority",
        extra_args=("--no-enable-prefix-caching",),
        extra_env={"VLLM_CPU_OMP_THREADS_BIND": str(ENGINE_CORE)},
    )
    return VllmEngine(config, log_path=workdir / "vllm.log").start()


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    os.sched_setaffinity(0, {ENGINE_CORE})  # the engine inherits this
    scale = args.engine_scale
    engine = await asyncio.to_thread(start_engine, workdir, scale)
    pin_process({CLIENT_CORE})  # the load generator, Redis and the gateways
    redis = RedisServer(workdir / "redis").start()
    mix = MIXES[args.mix]
    plan = compile_mix(
        replace(mix, peak={tier: n * scale for tier, n in mix.peak.items()}),
        {"tiny": [engine.base_url]},
        workdir,
        tokenizer_path=tiny_model_dir() / "tokenizer.json",
        kv_tokens=KV_TOKENS * scale,
        max_num_seqs=MAX_NUM_SEQS * scale,
    )
    print(plan.describe(), flush=True)
    names = [n for n in SCENARIOS if n in args.scenarios]
    tallies = {n: Tally() for n in names}
    try:
        if args.warmup > 0:  # a cold engine's first seconds are no scenario's figure
            print(f"warm-up: {args.warmup:.0f} s on one replica, not measured", flush=True)
            warm = argparse.Namespace(**{**vars(args), "seconds": args.warmup})
            await run_round(SCENARIOS["one"], plan, engine, redis, warm, Tally(), workdir, 0)
        order = list(names)
        shuffle = random.Random(args.seed)
        for round_index in range(args.rounds):
            shuffle.shuffle(order)
            for name in order:
                print(f"round {round_index + 1}/{args.rounds}: {name}", flush=True)
                await run_round(
                    SCENARIOS[name],
                    plan,
                    engine,
                    redis,
                    args,
                    tallies[name],
                    workdir,
                    args.seed + round_index,
                )
        fault_result = await faults(plan, engine, redis, args, workdir) if args.faults else None
    finally:
        redis.stop()
        await asyncio.to_thread(engine.stop)
    baseline = tallies.get("one")
    return {
        "plan": plan.planned(),
        "scenarios": {n: summarise(tallies[n], baseline if n != "one" else None) for n in names},
        "faults": fault_result,
    }


def print_table(result: dict[str, Any]) -> None:
    print(f"\nplan: {result['plan']}")
    header = (
        f"{'scenario':19} {'tok/s':>7} {'x one':>6} {'int/bat/eval %':>15} {'p50':>6} {'p95':>6}"
        f" {'p99':>6} {'p95 rounds':>14} {'preempt':>7} {'Σslots':>6} {'Σtok':>5} {'eng':>4}"
        f" {'mean Σtok':>9} {'idle q/w':>9} {'ren/s':>6} {'rtt99':>6} {'cpu%':>5}"
    )
    print(header)
    for name, row in result["scenarios"].items():
        share = "/".join(f"{100 * row['share_by_tier'][t]:.0f}" for t in TIERS)
        rounds = row["round_p95_ms"]
        spread = f"{min(rounds):.0f}-{max(rounds):.0f}" if rounds else "-"
        print(
            f"{name:19} {row['output_tokens_per_s']:7.0f} {row.get('output_vs_one', 1.0):6.2f}"
            f" {share:>15} {row['chat_ttft_p50_ms'] or 0:6.0f} {row['chat_ttft_p95_ms'] or 0:6.0f}"
            f" {row['chat_ttft_p99_ms'] or 0:6.0f} {spread:>14} {row['preemptions']:7d}"
            f" {row['max_sum_in_use_slots']:6.0f} {row['max_sum_in_use_tokens']:5.0f}"
            f" {row['max_engine_sequences']:4.0f}"
            f" {row['mean_sum_in_use_tokens'] or 0:9.0f}"
            f" {row['mean_idle_tokens_quiet_replicas'] or 0:4.0f}"
            f"/{row['mean_idle_tokens_waiting_replicas'] or 0:<4.0f}"
            f" {row['renewals_per_s_per_replica'] or 0:6.1f} {row['renewal_p99_ms'] or 0:6.1f}"
            f" {row['gateway_cpu_percent_per_replica'] or 0:5.0f}"
        )
    print(
        f"output as it streamed, tok/s (x one): a round's first {STEADY_FROM_SECONDS} s"
        " (every replica and worker starts at once) | the rest of its load"
    )
    for name, row in result["scenarios"].items():
        print(
            f"  {name:19} {row['ramp_output_tokens_per_s'] or 0:7.0f}"
            f" ({row.get('ramp_output_vs_one') or 1.0:.2f})"
            f" | {row['steady_output_tokens_per_s'] or 0:7.0f}"
            f" ({row.get('steady_output_vs_one') or 1.0:.2f});"
            f" the engine's mean running sequences {row['mean_engine_running'] or 0:.2f},"
            f" KV usage {row['mean_engine_kv_usage'] or 0:.0f} %;"
            f" batch overcommit ratio {row['mean_batch_overcommit_ratio'] or 0:.2f};"
            f" engine KV >= {PAUSE_USAGE:.0%} in {row['engine_full_percent'] or 0:.1f} %"
            f" of samples, borrowing paused in {row['borrowing_paused_percent'] or 0:.1f} %;"
            f" reserved above the plan {row['reserved_over_plan_percent'] or 0:.1f} % of the"
            f" time, above the engine's KV {row['reserved_over_engine_kv_percent'] or 0:.1f} %"
        )
    print("the gateway's own time before a chat's hand-over, ms p50/p95/p99; budget charges:")
    for name, row in result["scenarios"].items():
        own = row["chat_ttft_at_gateway_ms"]["before_hand_over"]
        print(
            f"  {name:19} {own['p50'] or 0:.1f}/{own['p95'] or 0:.1f}/{own['p99'] or 0:.1f};"
            f" {row['budget_overlap']}"
        )
    print("where chats wait (by the replica they reached):")
    for name, row in result["scenarios"].items():
        print(f"  {name:19} {row['chats_by_replica']}")
    print("event-loop timers late by more than 5 / 10 / 25 ms, % (by replica):")
    for name, row in result["scenarios"].items():
        lags = " ".join(
            f"{replica} " + "/".join(f"{100 * (v or 0):.1f}" for v in shares.values())
            for replica, shares in row["loop_lag_by_replica"].items()
        )
        print(f"  {name:19} {lags}")
    print(
        "chats that waited over 25 ms for admission, every chat of a round (access logs),"
        " and of each replica's first chat of a round:"
    )
    for name, row in result["scenarios"].items():
        logged = row["chat_waits_by_access_log"]
        print(
            f"  {name:19} {logged['waited_over_25ms']} of {logged['chats']};"
            f" first chats {logged['first_chat_waited_over_25ms']}"
            f" of {logged['replica_rounds_with_a_chat']}"
        )
    print(
        "where chat TTFT goes (p50/p95/p99 ms): at the client | at the gateway (arrival to"
        " first token) | from the hand-over to the engine | the admission queue | queue"
        " + engine (p95, p99 x one)"
    )
    for name, row in result["scenarios"].items():
        parts = row["chat_ttft_at_gateway_ms"]
        cells = [
            "/".join(f"{row[f'chat_ttft_p{q}_ms'] or 0:.0f}" for q in (50, 95, 99)),
            *(
                "/".join(f"{parts[k][f'p{q}'] or 0:.0f}" for q in (50, 95, 99))
                for k in (
                    "arrival_to_first_token",
                    "engine_to_first_token",
                    "admission_queue",
                    "queue_and_engine",
                )
            ),
        ]
        if row.get("queue_and_engine_p95_vs_one") is not None:
            cells[-1] += (
                f" ({row['queue_and_engine_p95_vs_one']:.2f}x,"
                f" {row['queue_and_engine_p99_vs_one'] or 0:.2f}x)"
            )
        print(f"  {name:19} " + " | ".join(f"{c:>12}" for c in cells))
    if result.get("faults"):
        print(f"faults: {result['faults']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="1 round of 10 s a scenario")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=25.0, help="a round of a scenario")
    parser.add_argument("--mix", default="examples", choices=("examples", "long-prompt"))
    parser.add_argument("--chat-rate", type=float, default=4.0, help="chats per second")
    parser.add_argument("--batch", type=int, default=8, help="batch workers (closed loop)")
    parser.add_argument("--eval", type=int, default=3, help="eval workers (closed loop)")
    parser.add_argument("--scenarios", nargs="*", default=list(SCENARIOS))
    parser.add_argument("--no-faults", dest="faults", action="store_false")
    parser.add_argument(
        "--sample-interval",
        type=float,
        default=0.25,
        help="seconds between scrapes of every replica's and the engine's /metrics",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        help="keep the engine's and gateways' logs (access logs included) here",
    )
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument(
        "--burn-percent",
        type=float,
        default=32.0,
        help="CPU (%% of one core) the burners of one-burdened take together: by default"
        " what four replicas at 70/10/10/10 took beyond one replica's (4 x 12 - 16 %%)",
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=2.0,
        help="seconds at a round's start whose chats are reported apart (start_chat_*), not in"
        " the TTFT percentiles: every worker starts at once there",
    )
    parser.add_argument(
        "--warmup", type=float, default=10.0, help="seconds of unmeasured load first (0: none)"
    )
    parser.add_argument(
        "--lease-period",
        type=float,
        default=LEASE_PERIOD,
        metavar="SECONDS",
        help=f"the gateways' --lease-period (default {LEASE_PERIOD}, the gateway's default)",
    )
    parser.add_argument(
        "--no-budget-overlap",
        action="store_true",
        help="the gateways' --no-budget-overlap: every request waits for its budget verdict",
    )
    parser.add_argument(
        "--engine-scale",
        type=int,
        default=1,
        metavar="F",
        help="engine KV tokens and sequences, declared peaks and load times F (1-8; default 1)",
    )
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    if not 0.02 <= args.lease_period <= 1:
        parser.error(f"--lease-period {args.lease_period}: give seconds from 0.02 to 1")
    if not 1 <= args.engine_scale <= 8:
        parser.error(f"--engine-scale {args.engine_scale}: give a whole number from 1 to 8")
    args.chat_rate *= args.engine_scale
    args.batch *= args.engine_scale
    args.eval *= args.engine_scale
    if args.quick:
        args.rounds, args.seconds = 1, 10.0
        if args.output == RESULTS:
            args.output = RESULTS.with_name("scaleout-quick.json")
    unknown = set(args.scenarios) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenario(s) {sorted(unknown)}: choose from {list(SCENARIOS)}")
    if (os.cpu_count() or 1) < 2:
        parser.error("needs two cores: the engine on one, gateways and load on the other")
    load_before = os.getloadavg()
    with contextlib.ExitStack() as stack:
        if args.workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kvpool-sc-")))
        else:
            workdir = args.workdir
            workdir.mkdir(parents=True, exist_ok=True)
        result = asyncio.run(run(args, workdir))
    result["args"] = {k: str(v) for k, v in vars(args).items()}
    result["machine"] = machine_info(load_before)
    print_table(result)
    path = write_results(args.output, result)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
