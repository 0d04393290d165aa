"""The scale-out part of the local demo: a second gateway replica, skewed ingress, a kill.

Why it exists: a platform team runs several gateway replicas behind a balancer that does
not spread tenants evenly. kvpool's replicas find each other in Redis and lease the plan
by demand (docs/0008-gateway-scale-out.md). The demo starts a second ``kvpool gateway`` on
the same ConfigMap and Redis (nobody sets a replica count), sends all batch traffic to one
replica and all chat traffic to the other, samples both replicas' leases and in-use slots
(together never above the plan), then SIGKILLs the chat replica and times how long the
batch replica takes to hold the whole plan again (its lease TTL, 3 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from e2e.components import POOL, start_gateway, wait_until
from e2e.report import parse_samples, percentile
from e2e.traffic import build_batch, build_interactive, drive_traffic

SKEW_SECONDS = 10.0


def replica_figures(url: str) -> dict[str, float]:
    """One replica's live membership, leased slots and in-use slots (its /metrics)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=2) as resp:
        samples = parse_samples(resp.read().decode())
    figures = {"members": 0.0, "leased_slots": 0.0, "in_use_slots": 0.0}
    for name, labels, value in samples:
        if name == "kvpool_gateway_lease_members":
            figures["members"] = value
        elif (
            name == "kvpool_gateway_lease_capacity"
            and labels.get("kind") == "total"
            and labels.get("dimension") == "slots"
            and labels.get("track") == "stable"
        ):
            figures["leased_slots"] += value
        elif name == "kvpool_gateway_tier_slots" and labels.get("kind") == "in_use":
            figures["in_use_slots"] += value
    return figures


class Sampler:
    """Samples every replica's figures every 0.25 s on a thread until stopped."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.rows: list[list[dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            with contextlib.suppress(OSError):
                self.rows.append([replica_figures(u) for u in self.urls])


def run_scaleout(
    stack: contextlib.ExitStack,
    system: Any,
    say: Callable[[str], None],
    step: Callable[[str], None],
    keys: tuple[str, str],
    workdir: Path,
) -> dict[str, Any]:
    """The scale-out story; returns the ``scaleout`` section of the results. ``keys``: the
    interactive and the batch tenant's API keys."""
    plan_slots = system.config.pools[0].total_slots
    batch_url = system.gateway_url
    step("Scale-out: a second gateway replica on the same ConfigMap and Redis (no replica count)")
    second, chat_url = start_gateway(stack, system.kube, system.redis, workdir, "gateway-b")
    wait_until(
        lambda: all(replica_figures(u)["members"] == 2 for u in (batch_url, chat_url)),
        15,
        "both replicas see two members",
        second,
    )
    say(f"{chat_url} joined: both replicas count 2 members in Redis and lease the plan")

    step(f"Skewed ingress for {SKEW_SECONDS:g} s: batch only to replica A, chats only to B")
    interactive_key, batch_key = keys
    with Sampler([batch_url, chat_url]) as sampler:
        batch, chats = asyncio.run(
            _skewed(batch_url, chat_url, interactive_key, batch_key, system.batch_rate)
        )
    sums = [sum(r["in_use_slots"] for r in row) for row in sampler.rows]
    leased = [[r["leased_slots"] for r in row] for row in sampler.rows]
    ttfts = [r.ttft * 1000 for r in chats if r.status == 200 and r.ttft is not None]
    result: dict[str, Any] = {
        "members": 2,
        "plan_slots": plan_slots,
        "batch_answered_via_a": sum(1 for r in batch if r.status == 200),
        "batch_sent_via_a": len(batch),
        "chats_answered_via_b": len(ttfts),
        "chats_sent_via_b": len(chats),
        # the chats not answered, as "status error" (a refusal's code, or the exception)
        "chats_not_answered_via_b": [
            f"{r.status} {r.error}" for r in chats if r.status != 200 or r.ttft is None
        ],
        "chat_ttft_p95_ms": _round(percentile(ttfts, 0.95)),
        "max_sum_in_use_slots": max(sums, default=0.0),
        "mean_leased_slots_a_b": [
            round(sum(x[i] for x in leased) / len(leased), 2) if leased else None for i in range(2)
        ],
    }
    say(
        f"replica A: {result['batch_answered_via_a']}/{len(batch)} batch answered; replica B: "
        f"{len(ttfts)}/{len(chats)} chats, p95 TTFT {result['chat_ttft_p95_ms']} ms; "
        f"leased slots on average A {result['mean_leased_slots_a_b'][0]}, "
        f"B {result['mean_leased_slots_a_b'][1]} (interactive's lent floor counts on both: "
        f"B takes it back by preemption); in use together at most "
        f"{result['max_sum_in_use_slots']:g} of the plan's {plan_slots}"
    )

    step("SIGKILL replica B: its capacity returns to A within the lease TTL (3 s)")
    killed = time.monotonic()
    second.kill()
    wait_until(
        lambda: replica_figures(batch_url)["leased_slots"] >= plan_slots,
        15,
        "replica A leasing the whole plan",
        system.gateway,
    )
    result["seconds_to_whole_plan_after_kill"] = round(time.monotonic() - killed, 2)
    say(
        f"replica A leases all {plan_slots} slots again "
        f"{result['seconds_to_whole_plan_after_kill']:.1f} s after B was killed"
    )
    return result


async def _skewed(
    batch_url: str, chat_url: str, interactive_key: str, batch_key: str, batch_rate: float
) -> tuple[list[Any], list[Any]]:
    batch, chats = await asyncio.gather(
        drive_traffic(
            [batch_url], POOL, [build_batch(batch_key, batch_rate)], SKEW_SECONDS, seed=21
        ),
        drive_traffic(
            [chat_url], POOL, [build_interactive(interactive_key, 1.5)], SKEW_SECONDS, seed=22
        ),
    )
    return batch, chats


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)
