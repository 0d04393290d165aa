"""What every benchmark records about its run, and how it writes its results file.

The machine is shared and its load drifts, so each result carries the load average
before and after the run next to the figures; results go to ``bench/results/NAME.json``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parent.parent


def machine_info(load_before: tuple[float, float, float]) -> dict[str, Any]:
    """CPUs, Python and the load average before (given) and after (now) the run."""
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }


def write_results(path: Path, result: dict[str, Any]) -> Path:
    """Write ``result`` as indented JSON to ``path``; returns it relative to the repo."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path.relative_to(REPO)


def pin_process(cpus: set[int]) -> None:
    """Pin every thread of this process to ``cpus``, and so every process it starts later.

    ``os.sched_setaffinity(0, ...)`` moves only the calling thread: a worker thread of
    ``asyncio.to_thread`` created before keeps the old set, and so does a child process
    started from it (a gateway started that way ran on the engine's core and took its CPU).
    """
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):  # the thread ended meanwhile
            os.sched_setaffinity(int(task), cpus)


def metric_sums(text: str) -> dict[str, float]:
    """Sum of every sample by name (labels ignored), from a Prometheus exposition."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_part, _, value = line.rpartition(" ")
        name = name_part.split("{", 1)[0]
        try:
            sums[name] = sums.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return sums


async def fetch_text(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url) as resp:
        return await resp.text()


async def wait_engine_idle(session: aiohttp.ClientSession, metrics_url: str, limit: float) -> None:
    """Until the engine runs and queues nothing (at most ``limit`` seconds): a scenario
    starts on an engine the previous one has left."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        sums = metric_sums(await fetch_text(session, metrics_url))
        if sums.get("vllm:num_requests_running", 0) + sums.get("vllm:num_requests_waiting", 0) == 0:
            return
        await asyncio.sleep(0.5)


def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank ``q``-th percentile of ``values`` (None when there are none)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))]


def words_text(rng: random.Random, words: int, vocabulary: Sequence[str]) -> str:
    """``words`` words drawn from ``vocabulary`` (seeded: the same load every run)."""
    return " ".join(rng.choice(vocabulary) for _ in range(words))
