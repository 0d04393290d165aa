"""What the gateway's engine poll costs the engine: chat TTFT with and without it.

Why this benchmark exists: every gateway replica GETs each engine's ``/metrics`` every
``--engine-poll-seconds`` (0.25 s) to correct admission with the engine's own KV usage,
queue and preemptions. vLLM renders its whole exposition (~50 KB; it ignores ``name[]``
filters) on the API server's event loop, the loop that also relays every token. So the
poll is not free for the engine, and it grows with the number of gateway replicas. This
measures it against the baseline that matters, in the same run on the same engine.

One real vLLM CPU engine (the tiny model, 2048 KV tokens, 8 sequences, priority
scheduling) serves a steady background of ``--batch-workers`` closed-loop completions
(~100-token prompts, 64 output tokens) and a Poisson chat load (``--rate`` per second,
short prompts, 8 streamed tokens, TTFT measured at the client). Scenarios, in
``--rounds`` interleaved rounds (shuffled each round: a shared machine's load drifts):

- ``no-poll``: nobody polls ``/metrics`` (the baseline);
- ``poll-1``: one poller every 0.25 s (one gateway replica);
- ``poll-4``: four pollers every 0.25 s each (four gateway replicas, each polling at the
  full rate: what the gateway did before it shared the poll budget);
- ``poll-4-shared``: four pollers every 1 s each (four gateway replicas at a 25 % plan
  share: what the gateway does now, the engine polled every 0.25 s in all).

Reported: the render time and size of one ``/metrics`` answer on the idle engine, and per
scenario chat TTFT p50/p95 with the p95 ratio against ``no-poll`` and its 95 % bootstrap
interval, and the batch output tokens/s with its ratio against ``no-poll``.

    KVPOOL_VLLM_VENV=... .venv/bin/python bench/engine_poll_cost.py           # ~4 min
    KVPOOL_VLLM_VENV=... .venv/bin/python bench/engine_poll_cost.py --quick   # ~1.5 min

Writes bench/results/engine_poll_cost.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.engine import EngineConfig, VllmEngine
from tests.support.tiny_model import tiny_model_dir

from benchkit import (
    bootstrap_ratio_interval,
    machine_info,
    percentile,
    words_text,
    write_results,
)

RESULTS = Path(__file__).resolve().parent / "results" / "engine_poll_cost.json"
POLL_SECONDS = 0.25
SCENARIOS = {  # name -> (pollers, seconds between one poller's polls)
    "no-poll": (0, POLL_SECONDS),
    "poll-1": (1, POLL_SECONDS),
    "poll-4": (4, POLL_SECONDS),
    "poll-4-shared": (4, 4 * POLL_SECONDS),
}
WORDS = ("the", "a", "of", "to", "and", "in", "is", "it", "you", "that", "he", "was", "for")


async def render_times(session: aiohttp.ClientSession, url: str, count: int) -> dict[str, Any]:
    """How long one ``/metrics`` answer takes on the idle engine, and its size."""
    times, size = [], 0
    for _ in range(count):
        started = time.perf_counter()
        async with session.get(url) as resp:
            size = len(await resp.read())
        times.append((time.perf_counter() - started) * 1000)
    return {"p50_ms": percentile(times, 50), "p95_ms": percentile(times, 95), "bytes": size}


async def poller(
    session: aiohttp.ClientSession, url: str, period: float, stop: asyncio.Event, phase: float
) -> int:
    polls = 0
    with contextlib.suppress(TimeoutError):  # pollers out of step, as separate processes are
        await asyncio.wait_for(stop.wait(), phase)
    while not stop.is_set():
        async with session.get(url) as resp:
            await resp.read()
        polls += 1
        with contextlib.suppress(TimeoutError):  # the poll period, or the end
            await asyncio.wait_for(stop.wait(), period)
    return polls


async def batch_worker(
    session: aiohttp.ClientSession, base: str, rng: random.Random, stop: asyncio.Event
) -> int:
    tokens = 0
    while not stop.is_set():
        text = words_text(rng, 100, WORDS)
        body = {
            "model": "tiny",
            "prompt": text,
            "max_tokens": 64,
            "ignore_eos": True,
            "priority": 10,
        }
        async with session.post(f"{base}/v1/completions", json=body) as resp:
            answer = await resp.json()
        tokens += int(answer.get("usage", {}).get("completion_tokens", 0))
    return tokens


async def chat_once(session: aiohttp.ClientSession, base: str, text: str) -> float | None:
    body = {"model": "tiny", "prompt": text, "max_tokens": 8, "stream": True, "priority": 0}
    started = time.perf_counter()
    async with session.post(f"{base}/v1/completions", json=body) as resp:
        if resp.status != 200:
            return None
        async for line in resp.content:
            if line.startswith(b"data:") and b"[DONE]" not in line:
                ttft = (time.perf_counter() - started) * 1000
                await resp.read()
                return ttft
    return None


async def scenario(
    engine: VllmEngine,
    pollers: tuple[int, float],
    seconds: float,
    args: argparse.Namespace,
    seed: int,
) -> dict[str, Any]:
    """One round of one scenario: background batch, Poisson chats, ``pollers`` pollers."""
    rng = random.Random(seed)
    stop = asyncio.Event()
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        workers = [
            asyncio.create_task(
                batch_worker(session, engine.base_url, random.Random(seed + i), stop)
            )
            for i in range(args.batch_workers)
        ]
        count, period = pollers
        phases = random.Random(seed - 1)  # apart from the chats' prompts: the same load
        polls = [
            asyncio.create_task(
                poller(session, engine.metrics_url, period, stop, phases.uniform(0, period))
            )
            for _ in range(count)
        ]
        await asyncio.sleep(1.0)  # the batch load settles before chats are timed
        chats: list[asyncio.Task[float | None]] = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            text = words_text(rng, 12, WORDS)
            chats.append(asyncio.create_task(chat_once(session, engine.base_url, text)))
            await asyncio.sleep(rng.expovariate(args.rate))
        started = time.monotonic()
        ttfts = [t for t in await asyncio.gather(*chats) if t is not None]
        stop.set()
        batch_tokens = sum(await asyncio.gather(*workers))
        poll_count = sum(await asyncio.gather(*polls))
        elapsed = seconds + (time.monotonic() - started) + 1.0
    return {
        "ttft_ms": ttfts,
        "batch_tokens": batch_tokens,
        "seconds": elapsed,
        "polls": poll_count,
    }


async def run(engine: VllmEngine, args: argparse.Namespace) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session:
        render = await render_times(session, engine.metrics_url, 50)
    samples: dict[str, dict[str, Any]] = {
        name: {"ttft_ms": [], "batch_tokens": 0, "seconds": 0.0, "polls": 0} for name in SCENARIOS
    }
    order = random.Random(args.seed)
    per_round = args.duration / args.rounds
    for round_index in range(args.rounds):
        names = list(SCENARIOS)
        order.shuffle(names)
        for name in names:
            result = await scenario(
                engine, SCENARIOS[name], per_round, args, args.seed + 1000 * round_index
            )
            into = samples[name]
            into["ttft_ms"] += result["ttft_ms"]
            for key in ("batch_tokens", "seconds", "polls"):
                into[key] += result[key]
            print(f"round {round_index + 1} {name}: {len(result['ttft_ms'])} chats", flush=True)
    base = samples["no-poll"]["ttft_ms"]
    base_rate = samples["no-poll"]["batch_tokens"] / samples["no-poll"]["seconds"]
    scenarios = {}
    for name, got in samples.items():
        ttfts = got["ttft_ms"]
        p95, base_p95 = percentile(ttfts, 95), percentile(base, 95)
        scenarios[name] = {
            "pollers": SCENARIOS[name][0],
            "poll_period_seconds": SCENARIOS[name][1],
            "chats": len(ttfts),
            "ttft_p50_ms": percentile(ttfts, 50),
            "ttft_p95_ms": p95,
            "ttft_p95_vs_no_poll": round(p95 / base_p95, 3) if p95 and base_p95 else None,
            "ttft_p95_vs_no_poll_interval": bootstrap_ratio_interval(ttfts, base),
            "batch_tokens_per_second": round(got["batch_tokens"] / got["seconds"], 1),
            "batch_vs_no_poll": round(got["batch_tokens"] / got["seconds"] / base_rate, 3),
            "polls_per_second": round(got["polls"] / got["seconds"], 2),
            "ttft_samples_ms": [round(t, 2) for t in ttfts],
        }
    return {"metrics_render": render, "scenarios": scenarios}


def report(result: dict[str, Any]) -> None:
    render = result["metrics_render"]
    print(
        f"\n/metrics on the idle engine: {render['bytes']} bytes, "
        f"p50 {render['p50_ms']:.2f} ms, p95 {render['p95_ms']:.2f} ms"
    )
    print(
        f"{'scenario':13} {'chats':>6} {'p50 ms':>8} {'p95 ms':>8} {'p95 vs none':>20} "
        f"{'batch tok/s':>12} {'polls/s':>8}"
    )
    for name, row in result["scenarios"].items():
        interval = row["ttft_p95_vs_no_poll_interval"]
        ratio = f"{row['ttft_p95_vs_no_poll']:.2f}x" if row["ttft_p95_vs_no_poll"] else "-"
        if interval:
            ratio += f" [{interval[0]:.2f}, {interval[1]:.2f}]"
        print(
            f"{name:13} {row['chats']:>6} {row['ttft_p50_ms']:>8.1f} {row['ttft_p95_ms']:>8.1f} "
            f"{ratio:>20} {row['batch_tokens_per_second']:>9.1f} ({row['batch_vs_no_poll']:.2f}x) "
            f"{row['polls_per_second']:>8.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 20 s a scenario")
    parser.add_argument("--duration", type=float, default=None, help="seconds a scenario (60)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--rate", type=float, default=4.0, help="chats per second")
    parser.add_argument("--batch-workers", type=int, default=4)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    if args.duration is None:
        args.duration = 20.0 if args.quick else 60.0
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="kvpool-poll-") as workdir:
        config = EngineConfig(
            model_dir=tiny_model_dir(),
            served_model_name="tiny",
            block_size=32,
            scheduling_policy="priority",
            extra_args=("--no-enable-prefix-caching",),
        )
        with VllmEngine(config, log_path=Path(workdir) / "vllm.log") as engine:
            result = asyncio.run(run(engine, args))
    result = {
        "benchmark": "engine_poll_cost",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(["bench/engine_poll_cost.py", *sys.argv[1:]]),
        "machine": machine_info(load_before),
        "settings": {k: v for k, v in vars(args).items()},
        **result,
    }
    report(result)
    path = write_results(RESULTS, result)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
