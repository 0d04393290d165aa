"""Builders for compiled pools, tiers, tenants and admission requests (unit tests, bench).

Kueue-style: ``PoolBuilder("p").capacity(1000, 10).tier("hi", 400, 4).obj()`` instead of
big literal dicts. Shared remainders and totals are derived the way the planner derives
them (shared = total - sum of floors), so a test states only what it is about.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from kvpool.api.admission_config import (
    CompiledPool,
    CompiledRule,
    CompiledTenant,
    CompiledTier,
    CompiledTierPolicy,
    Endpoint,
    TierAllocation,
    Track,
)
from kvpool.api.common import LabelSelector
from kvpool.domain.admission import AdmissionRequest

KEY_SHA = "0" * 64


def make_tier(
    name: str,
    rank: int,
    *,
    wait: float = 5.0,
    reclaim: Literal["Wait", "Preempt"] = "Wait",
    engine_priority: int | None = None,
    floor_percent: int = 0,
    lend_percent: int = 100,
) -> CompiledTier:
    """A compiled tier; engine priority defaults to the rank."""
    return CompiledTier(
        name=name,
        rank=rank,
        floor_percent=floor_percent,
        lend_percent=lend_percent,
        max_queue_wait_seconds=wait,
        engine_priority=rank if engine_priority is None else engine_priority,
        reclaim=reclaim,
    )


@dataclass
class _TierSpec:
    name: str
    floor_tokens: int
    floor_slots: int
    lend_tokens: int
    lend_slots: int
    wait: float
    reclaim: Literal["Wait", "Preempt"]


@dataclass
class PoolBuilder:
    """Fluent builder of a CompiledPool and its tiers."""

    name: str = "pool"
    total_tokens: int = 1000
    total_slots: int = 10
    max_model_len: int = 4096
    output_p95: int = 512
    per_replica: tuple[int, int] | None = None
    _tiers: list[_TierSpec] = field(default_factory=list)
    _tracks: list[Track] = field(default_factory=list)
    _canary_tiers: list[str] = field(default_factory=list)
    _plan_ok: bool = True

    def capacity(self, tokens: int, slots: int) -> PoolBuilder:
        self.total_tokens, self.total_slots = tokens, slots
        return self

    def tier(
        self,
        name: str,
        floor_tokens: int,
        floor_slots: int,
        *,
        lend_tokens: int | None = None,
        lend_slots: int | None = None,
        wait: float = 5.0,
        reclaim: Literal["Wait", "Preempt"] = "Wait",
    ) -> PoolBuilder:
        """Add a tier (highest priority first); lendable defaults to the whole floor."""
        self._tiers.append(
            _TierSpec(
                name,
                floor_tokens,
                floor_slots,
                floor_tokens if lend_tokens is None else lend_tokens,
                floor_slots if lend_slots is None else lend_slots,
                wait,
                reclaim,
            )
        )
        return self

    def replicas(self, count: int, ready: bool = True) -> PoolBuilder:
        """Stable endpoints s0..s{count-1}; per-replica capacity = total / endpoints."""
        endpoints = [
            Endpoint(name=f"s{i}", url=f"http://127.0.0.1:{9000 + i}", ready=ready)
            for i in range(count)
        ]
        self._tracks.append(
            Track(name="stable", revision="rev-stable", weight=100, endpoints=endpoints)
        )
        return self

    def canary(self, weight: int, count: int = 1, tiers: list[str] | None = None) -> PoolBuilder:
        endpoints = [
            Endpoint(name=f"c{i}", url=f"http://127.0.0.1:{9100 + i}") for i in range(count)
        ]
        self._tracks.append(
            Track(name="canary", revision="rev-canary", weight=weight, endpoints=endpoints)
        )
        self._canary_tiers = tiers or []
        return self

    def no_plan(self) -> PoolBuilder:
        self._plan_ok = False
        return self

    def replica_capacity(self, tokens: int, slots: int) -> PoolBuilder:
        self.per_replica = (tokens, slots)
        return self

    def obj(self) -> CompiledPool:
        endpoints = sum(len(t.endpoints) for t in self._tracks) or 1
        per_t, per_s = self.per_replica or (
            self.total_tokens // endpoints,
            max(1, self.total_slots // endpoints),
        )
        return CompiledPool(
            name=self.name,
            served_name=self.name,
            model_version="v1",
            tier_policy="policy",
            max_model_len=self.max_model_len,
            prompt_tokens_mean=256,
            prompt_tokens_p95=1024,
            output_tokens_mean=128,
            output_tokens_p95=self.output_p95,
            replicas=endpoints,
            tokens_per_replica=per_t,
            slots_per_replica=per_s,
            total_tokens=self.total_tokens,
            total_slots=self.total_slots,
            shared_tokens=self.total_tokens - sum(t.floor_tokens for t in self._tiers),
            shared_slots=self.total_slots - sum(t.floor_slots for t in self._tiers),
            tiers={
                t.name: TierAllocation(
                    floor_tokens=t.floor_tokens,
                    floor_slots=t.floor_slots,
                    lendable_tokens=t.lend_tokens,
                    lendable_slots=t.lend_slots,
                )
                for t in self._tiers
            },
            canary_tiers=self._canary_tiers,
            tracks=self._tracks,
            plan_ok=self._plan_ok,
        )

    def tiers(self) -> list[CompiledTier]:
        return [
            make_tier(t.name, rank, wait=t.wait, reclaim=t.reclaim)
            for rank, t in enumerate(self._tiers)
        ]


def make_tenant(
    name: str,
    tiers: list[str],
    *,
    labels: dict[str, str] | None = None,
    weight: int = 1,
    max_concurrency: int | None = None,
    over_budget: Literal["Reject", "Demote"] = "Reject",
) -> CompiledTenant:
    return CompiledTenant(
        tenant=name,
        key_sha256=KEY_SHA,
        labels=labels or {},
        tiers=tiers,
        weight=weight,
        max_concurrency=max_concurrency,
        over_budget=over_budget,
    )


def make_rule(
    tier: str,
    *,
    path_prefix: str | None = None,
    host: str | None = None,
    labels: dict[str, str] | None = None,
) -> CompiledRule:
    return CompiledRule(
        tier=tier,
        path_prefix=path_prefix,
        host=host,
        tenant_selector=LabelSelector(match_labels=labels) if labels is not None else None,
    )


def make_policy(tiers: list[str], rules: list[CompiledRule] | None = None) -> CompiledTierPolicy:
    return CompiledTierPolicy(
        name="policy",
        tiers=[make_tier(name, rank) for rank, name in enumerate(tiers)],
        classification=rules or [],
    )


class Requests:
    """Numbered admission requests: ``Requests().make("hi", 100)`` -> id r1, r2, ..."""

    def __init__(self) -> None:
        self.count = 0

    def make(
        self,
        tier: str,
        tokens: int,
        slots: int = 1,
        *,
        tenant: str = "t",
        weight: int = 1,
        max_concurrency: int | None = None,
        track: str | None = None,
    ) -> AdmissionRequest:
        self.count += 1
        return AdmissionRequest(
            request_id=f"r{self.count}",
            tenant=tenant,
            tier=tier,
            tokens=tokens,
            slots=slots,
            weight=weight,
            max_concurrency=max_concurrency,
            track=track,
        )
