"""CPU a proxy spends per request, by prompt size: kvpool's gateway against vllm-router.

Why this benchmark exists: every request of every tenant passes through the gateway, and a
long prompt costs it more than a short one (the body is read and parsed, the prompt is
tokenized for the KV estimate, the body is sent on). Issue 19 asks for the figure at 1k,
10k and 100k-token prompts against ``vllm-router`` (the vLLM project's Rust router,
``--policy cache_aware``, which keeps a radix tree of the prompts it routed) proxying the
same traffic in the same run.

One fake OpenAI-compatible engine (its own process: it answers at once, 16 streamed
tokens, so what is measured is the proxies' work, not an engine's) behind both proxies:

- ``kvpool``: ``kvpool gateway`` with the tiny model's real tokenizer (exact counts, and
  prompts over 16 KiB by the learned bound once 8 were counted, as a pool with
  ``tokenizerPath`` runs; docs/0009) and a plan so large that admission never queues;
- ``vllm-router``: ``vllm-router --policy cache_aware`` over the same engine
  (scripts/ensure-vllm-router.sh installs it).

The config is built with the test builder rather than by the planner: the planner's plan
for the bench engine (maxModelLen 1024) cannot hold a 100k-token prompt, and no request
here ever waits, so the plan's figures take no part in what is measured.

Per prompt size (``--prompt-tokens``, default 1,000 / 10,000 / 100,000 tokens of the tiny
model's tokenizer, distinct prompts of random words), ``--rounds`` rounds in which each
proxy serves the same requests at ``--concurrency`` (the proxies one after the other, the
order alternating): CPU seconds of the proxy's process tree per request (from /proc, so
independent of the machine's load), and the p50 / p99 of the whole request's time, with
the same requests sent directly to the engine as the reference.

    .venv/bin/python bench/proxy_cpu.py            # full (~3 min)
    .venv/bin/python bench/proxy_cpu.py --quick    # smoke (~1 min)

Writes bench/results/proxy_cpu.json and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.gateway import GatewayProcess, serve_fake_engine
from tests.support.ports import free_port
from tests.support.processes import ManagedProcess, descendants

from benchkit import machine_info, write_results
from gateway_overhead import KEY, bench_config, percentile, run_loop, tiny_tokenizer
from router import start_router

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "proxy_cpu.json"
OUTPUT_TOKENS = 16
# 48 made-up words: prompts of random words, so no two share a long prefix
WORDS = [
    a + b
    for a in ("ka", "lo", "mi", "ru", "sen", "ta", "vo", "ze")
    for b in ("ra", "ndo", "mel", "tis", "por", "quin")
]


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its descendants (Linux /proc)."""
    total = 0.0
    for one in (pid, *descendants(pid)):
        try:
            fields = Path(f"/proc/{one}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # it ended meanwhile
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def make_prompts(tokens: int, count: int, tokenizer_path: str, seed: int) -> list[bytes]:
    """``count`` distinct chat bodies whose prompt is ``tokens`` tokens (within 1 %) of the
    tiny model's tokenizer, encoded once (the client's own work stays small)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(tokenizer_path)
    rng = random.Random(seed)
    sample = " ".join(rng.choice(WORDS) for _ in range(2000))
    per_word = len(tokenizer.encode(sample).ids) / 2000
    bodies = []
    for _ in range(count):
        words = [rng.choice(WORDS) for _ in range(int(tokens / per_word))]
        text = " ".join(words)
        while len(tokenizer.encode(text).ids) > tokens * 1.01 and len(words) > 1:
            del words[-max(1, len(words) // 200) :]
            text = " ".join(words)
        body = {
            "model": "tiny",
            "messages": [{"role": "user", "content": text}],
            "max_tokens": OUTPUT_TOKENS,
            "stream": True,
        }
        bodies.append(_json(body))
    return bodies


def _json(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


async def send_all(
    session: aiohttp.ClientSession, base: str, bodies: list[bytes], concurrency: int
) -> tuple[list[float], int]:
    """Every body once, ``concurrency`` at a time: (seconds per request, errors)."""
    queue = list(reversed(bodies))
    times: list[float] = []
    errors = 0
    headers = {"Authorization": KEY, "Content-Type": "application/json"}

    async def worker() -> None:
        nonlocal errors
        while queue:
            body = queue.pop()
            started = time.perf_counter()
            try:
                async with session.post(
                    f"{base}/v1/chat/completions", data=body, headers=headers
                ) as resp:
                    async for _line in resp.content:
                        pass
                    if resp.status != 200:
                        errors += 1
                        continue
            except aiohttp.ClientError:
                errors += 1
                continue
            times.append(time.perf_counter() - started)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return times, errors


async def measure(args: argparse.Namespace, workdir: Path, tokenizer: str) -> dict[str, Any]:
    port = free_port()
    engine = multiprocessing.get_context("fork").Process(
        target=serve_fake_engine, args=(port, 0.0), daemon=True
    )
    engine.start()
    engine_url = f"http://127.0.0.1:{port}"
    largest = max(args.prompt_tokens)
    config = bench_config(engine_url, tokenizer, max_model_len=largest * 2 + 1024)
    gateway = GatewayProcess(
        config.write(workdir / "config.json"),
        workdir / "gateway.log",
        extra_args=("--no-access-log", "--log-level", "WARNING"),
    )
    router: ManagedProcess | None = None
    results: dict[str, Any] = {}
    try:
        gateway.start()
        router, router_url = await start_router([engine_url], workdir)
        proxies = {"kvpool": gateway.process, "vllm-router": router}
        bases = {"kvpool": gateway.url, "vllm-router": router_url}
        timeout = aiohttp.ClientTimeout(total=120)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            for size in args.prompt_tokens:
                count = max(args.concurrency, args.requests_at_1k * 1000 // size)
                bodies = make_prompts(size, count, tokenizer, seed=size)
                cpu = dict.fromkeys(proxies, 0.0)
                times: dict[str, list[float]] = {n: [] for n in ("direct", *proxies)}
                errors = dict.fromkeys(times, 0)
                for base in (engine_url, *bases.values()):  # warm up
                    await send_all(session, base, bodies[: args.concurrency], args.concurrency)
                for round_no in range(args.rounds):
                    order = list(proxies) if round_no % 2 == 0 else list(reversed(proxies))
                    took, errs = await send_all(session, engine_url, bodies, args.concurrency)
                    times["direct"] += took
                    errors["direct"] += errs
                    for name in order:
                        pid = proxies[name].pid
                        before = tree_cpu_seconds(pid)
                        took, errs = await send_all(session, bases[name], bodies, args.concurrency)
                        cpu[name] += tree_cpu_seconds(pid) - before
                        times[name] += took
                        errors[name] += errs
                results[str(size)] = summarise(cpu, times, errors, len(bodies), args.rounds)
                print(f"  {size} tokens: {results[str(size)]}", flush=True)
    finally:
        gateway.stop()
        if router is not None:
            router.stop()
        engine.kill()
        engine.join(timeout=10)
    return results


def summarise(
    cpu: dict[str, float],
    times: dict[str, list[float]],
    errors: dict[str, int],
    requests: int,
    rounds: int,
) -> dict[str, Any]:
    row: dict[str, Any] = {"requests_per_round": requests, "rounds": rounds}
    for name, values in times.items():
        entry: dict[str, Any] = {
            "requests": len(values),
            "errors": errors[name],
            "p50_ms": round(percentile(values, 50) * 1000, 2) if values else None,
            "p99_ms": round(percentile(values, 99) * 1000, 2) if values else None,
        }
        if name in cpu:
            served = requests * rounds
            entry["cpu_ms_per_request"] = round(cpu[name] / served * 1000, 3)
        row[name] = entry
    kv, router = row["kvpool"]["cpu_ms_per_request"], row["vllm-router"]["cpu_ms_per_request"]
    row["cpu_kvpool_vs_router"] = round(kv / router, 2) if router else None
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke: 1 round, fewer requests")
    parser.add_argument(
        "--prompt-tokens", type=int, nargs="+", default=[1000, 10_000, 100_000], metavar="N"
    )
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument(
        "--requests-at-1k",
        type=int,
        default=None,
        help="requests a round at 1k tokens (fewer for longer prompts: the same bytes)",
    )
    parser.add_argument("--rounds", type=int, default=None, help="default 4 (quick: 1)")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    args.rounds = args.rounds or (1 if args.quick else 4)
    args.requests_at_1k = args.requests_at_1k or (100 if args.quick else 400)
    tokenizer = tiny_tokenizer()
    if tokenizer is None:
        print("no cached tiny model: run `make deps` (it builds .cache/tiny-model)")
        return 2
    load_before = os.getloadavg()
    workdir = Path(tempfile.mkdtemp(prefix="kvpool-proxy-cpu-"))
    try:
        sizes = run_loop(measure(args, workdir, tokenizer))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    result = {
        "benchmark": "proxy_cpu",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine_info(load_before),
        "args": {k: str(v) for k, v in vars(args).items()},
        "output_tokens": OUTPUT_TOKENS,
        "sizes": sizes,
    }
    print(
        f"\n{'prompt':>8} {'kvpool cpu':>11} {'router cpu':>11} {'ratio':>6}"
        f" {'direct p50':>11} {'kvpool p50/p99':>15} {'router p50/p99':>15}  (ms)"
    )
    for size, row in sizes.items():
        kv, rt, direct = row["kvpool"], row["vllm-router"], row["direct"]
        print(
            f"{size:>8} {kv['cpu_ms_per_request']:11.2f} {rt['cpu_ms_per_request']:11.2f}"
            f" {row['cpu_kvpool_vs_router'] or 0:6.2f} {direct['p50_ms'] or 0:11.1f}"
            f" {kv['p50_ms'] or 0:7.1f}/{kv['p99_ms'] or 0:<7.1f}"
            f" {rt['p50_ms'] or 0:7.1f}/{rt['p99_ms'] or 0:<7.1f}"
            f"  errors {kv['errors']}/{rt['errors']}"
        )
    print(f"wrote {write_results(args.output, result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
