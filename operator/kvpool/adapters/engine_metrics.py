"""Read an engine replica's own ``/metrics``: KV usage, running/waiting, preemptions.

Why this module exists: the admission ledger counts *reservations*; only the engine knows
what its KV cache really holds and whether it preempted. The gateway polls every replica
every few hundred milliseconds (:func:`fetch_engine_load`) to correct the ledger: pause
borrowing when measured usage nears the target, back the overcommit ratio off on
preemptions. A failed poll returns None (the caller keeps its last view and logs it).
"""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

USAGE = "vllm:kv_cache_usage_perc"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
PREEMPTIONS = "vllm:num_preemptions"  # a counter: samples are named ..._total


@dataclass(frozen=True)
class EngineLoad:
    """One reading of one replica."""

    kv_usage: float  # fraction of the KV cache in use, 0..1
    running: int
    waiting: int
    preemptions_total: int  # cumulative since the engine started


def parse_engine_metrics(text: str) -> EngineLoad:
    """The load in a vLLM exposition text (sums over label sets; missing series are 0)."""
    values = {USAGE: 0.0, RUNNING: 0.0, WAITING: 0.0, PREEMPTIONS: 0.0}
    # by sample name: the parser files ``x_total`` under family ``x`` or ``x_total``
    # depending on how the TYPE line names it
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name[: -len("_total")] if sample.name.endswith("_total") else sample.name
            if name == USAGE:
                values[USAGE] = max(values[USAGE], sample.value)
            elif name in values:
                values[name] += sample.value
    return EngineLoad(
        kv_usage=values[USAGE],
        running=int(values[RUNNING]),
        waiting=int(values[WAITING]),
        preemptions_total=int(values[PREEMPTIONS]),
    )


async def fetch_engine_load(
    session: aiohttp.ClientSession, base_url: str, timeout: float = 1.0
) -> EngineLoad | None:
    """GET ``base_url/metrics`` and parse it; None if the replica did not answer."""
    try:
        async with session.get(
            base_url.rstrip("/") + "/metrics", timeout=aiohttp.ClientTimeout(total=timeout)
        ) as resp:
            if resp.status != 200:
                return None
            return parse_engine_metrics(await resp.text())
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
