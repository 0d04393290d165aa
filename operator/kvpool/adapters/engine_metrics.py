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

USAGE = "vllm:kv_cache_usage_perc"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
PREEMPTIONS = "vllm:num_preemptions_total"  # the counter's sample
_WANTED = (USAGE, RUNNING, WAITING, PREEMPTIONS)


@dataclass(frozen=True)
class EngineLoad:
    """One reading of one replica."""

    kv_usage: float  # fraction of the KV cache in use, 0..1
    running: int
    waiting: int
    preemptions_total: int  # cumulative since the engine started


def parse_engine_metrics(text: str) -> EngineLoad:
    """The load in a vLLM exposition text (sums over label sets; missing series are 0).

    A scan for the four sample names, not a full exposition parse: a vLLM ``/metrics`` is
    ~50 KB of histograms, which ``prometheus_client``'s parser takes ~6 ms to read on the
    gateway's event loop, every poll of every replica; this takes under 0.1 ms.
    Raises ValueError on a wanted sample whose value is not a number.

    >>> parse_engine_metrics('vllm:num_requests_running{engine="0"} 2.0\nvllm:x 1\n')
    EngineLoad(kv_usage=0.0, running=2, waiting=0, preemptions_total=0)
    """
    values = dict.fromkeys(_WANTED, 0.0)
    for line in text.splitlines():
        if not line.startswith(_WANTED):
            continue
        brace = line.find("{")
        if brace >= 0:
            name, rest = line[:brace], line[line.rindex("}") + 1 :]
        else:
            name, _, rest = line.partition(" ")
        if name not in values:
            continue  # a longer name with a wanted prefix (vllm:num_requests_waiting_by_reason)
        fields = rest.split()
        if not fields:
            raise ValueError(f"no value in {line!r}")
        value = float(fields[0])
        values[name] = max(values[name], value) if name == USAGE else values[name] + value
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
