"""What every benchmark records about its run, and how it writes its results file.

The machine is shared and its load drifts, so each result carries the load average
before and after the run next to the figures; results go to ``bench/results/NAME.json``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
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
    """Write ``result`` as indented JSON to ``path``; returns it relative to the repo when
    it is inside it (an ``--output`` elsewhere is returned as given)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    resolved = path.resolve()
    return resolved.relative_to(REPO) if resolved.is_relative_to(REPO) else path


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


def histogram_buckets(text: str, name: str) -> dict[str, float]:
    """Cumulative counts by ``le`` of one histogram (label sets summed), from an exposition."""
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(name + "_bucket{"):
            continue
        labels, _, value = line.rpartition(" ")
        le = labels.split('le="', 1)[1].split('"', 1)[0]
        counts[le] = counts.get(le, 0.0) + float(value)
    return counts


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
    # the smallest value with at least q % of the values at or below it (ceil, not round:
    # round(95.5) is 96 by banker's rounding, which took the 96th of 100 values for p95)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q * len(ordered) / 100) - 1))]


def bootstrap_ratio_interval(
    numerator: Sequence[float],
    denominator: Sequence[float],
    q: float = 95,
    resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float] | None:
    """A 95 % interval of ``percentile(numerator, q) / percentile(denominator, q)``.

    Each sample set is resampled with replacement (a percentile bootstrap), so a p95 ratio
    from ~120 requests a scenario comes with how far it could move from run to run: on a
    shared machine a single p95 is the 6th-worst request and one ratio alone says little.
    None when either side has no samples.
    """
    if not numerator or not denominator:
        return None
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        top = percentile(rng.choices(numerator, k=len(numerator)), q)
        bottom = percentile(rng.choices(denominator, k=len(denominator)), q)
        if top is not None and bottom:
            ratios.append(top / bottom)
    ratios.sort()
    return (
        round(ratios[int(0.025 * (len(ratios) - 1))], 3),
        round(ratios[int(0.975 * (len(ratios) - 1))], 3),
    )


def words_text(rng: random.Random, words: int, vocabulary: Sequence[str]) -> str:
    """``words`` words drawn from ``vocabulary`` (seeded: the same load every run)."""
    return " ".join(rng.choice(vocabulary) for _ in range(words))


def bootstrap_percentile_interval(
    values: Sequence[float], q: float, resamples: int = 2000, seed: int = 0
) -> tuple[float, float] | None:
    """A 95 % percentile-bootstrap interval of ``percentile(values, q)`` (ms in, ms out):
    how far one run's p95 (or p99) could move on a rerun. None without values."""
    if not values:
        return None
    rng = random.Random(seed)
    found = sorted(
        p
        for p in (percentile(rng.choices(values, k=len(values)), q) for _ in range(resamples))
        if p is not None
    )
    return (
        round(found[int(0.025 * (len(found) - 1))], 1),
        round(found[int(0.975 * (len(found) - 1))], 1),
    )
