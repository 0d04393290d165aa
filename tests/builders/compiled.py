"""Builders of what the operator compiles and the gateway enforces: compiled tiers, rules,
tenants, tier policies, pools, whole admission configs, and the admission requests the
gateway's controllers decide on (unit tests, integration tests, bench).

Kueue-style, stating only what a test is about; totals and shared remainders are derived
the way the planner derives them (shared = total - sum of floors)::

    pool = CompiledPoolBuilder("p").capacity(1000, 10).tier("hi", 400, 4).obj()
    config = (
        AdmissionConfigBuilder()
        .tier("interactive", floor=50, wait=2.0)
        .tier("batch", floor=30)
        .rule("interactive", path_prefix="/v1/chat")
        .pool("tiny", ["http://127.0.0.1:8001"], tokens_per_replica=2048, slots_per_replica=8)
        .tenant("acme", key="sk-acme", tiers=["interactive", "batch"], limits=[(60, 5000)])
        .obj()
    )

:class:`CompiledPoolBuilder` takes token/slot floors as numbers (admission unit tests);
:class:`AdmissionConfigBuilder` takes floors as percents and plans them like the operator
(gateway tests and benchmarks, where the config is written to a file or served).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kvpool.api.admission_config import (
    AdmissionConfig,
    BudgetWindow,
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
from kvpool.domain.api_keys import api_key_digest
from kvpool.domain.planner import plan_floors

KEY_SHA = "0" * 64  # the key digest of tenants whose key no test presents

Reclaim = Literal["Wait", "Preempt"]


def compiled_tier(
    name: str,
    rank: int,
    *,
    wait: float = 5.0,
    reclaim: Reclaim = "Wait",
    engine_priority: int | None = None,
    floor_percent: int = 0,
    lend_percent: int = 100,
    budget_unavailable: Literal["Allow", "Reject"] | None = None,
    ttft: float | None = None,
) -> CompiledTier:
    """A compiled tier; engine priority defaults to the rank; ``ttft`` is its TTFT p95
    target in seconds."""
    return CompiledTier(
        name=name,
        rank=rank,
        floor_percent=floor_percent,
        lend_percent=lend_percent,
        max_queue_wait_seconds=wait,
        engine_priority=rank if engine_priority is None else engine_priority,
        reclaim=reclaim,
        budget_unavailable=budget_unavailable,
        ttft_p95_target_seconds=ttft,
    )


def compiled_rule(
    tier: str,
    *,
    path_prefix: str | None = None,
    host: str | None = None,
    labels: dict[str, str] | None = None,
) -> CompiledRule:
    """A classification rule; ``labels`` is the tenant selector's matchLabels."""
    return CompiledRule(
        tier=tier,
        path_prefix=path_prefix,
        host=host,
        tenant_selector=LabelSelector(match_labels=labels) if labels is not None else None,
    )


def compiled_policy(
    tiers: list[str], rules: list[CompiledRule] | None = None
) -> CompiledTierPolicy:
    """Tier policy ``policy``: ``tiers`` ranked in order (highest priority first)."""
    return CompiledTierPolicy(
        name="policy",
        tiers=[compiled_tier(name, rank) for rank, name in enumerate(tiers)],
        classification=rules or [],
    )


def compiled_tenant(
    name: str,
    tiers: list[str],
    *,
    key_sha256: str = KEY_SHA,
    limits: list[tuple[float, int]] | None = None,
    labels: dict[str, str] | None = None,
    weight: int = 1,
    max_concurrency: int | None = None,
    over_budget: Literal["Reject", "Demote"] = "Reject",
) -> CompiledTenant:
    """A tenant; ``limits`` are (window seconds, tokens) pairs."""
    return CompiledTenant(
        tenant=name,
        key_sha256=key_sha256,
        labels=labels or {},
        tiers=tiers,
        limits=[BudgetWindow(window_seconds=w, tokens=t) for w, t in limits or []],
        weight=weight,
        max_concurrency=max_concurrency,
        over_budget=over_budget,
    )


def compiled_pool(
    name: str,
    tiers: dict[str, TierAllocation],
    tracks: list[Track],
    *,
    replicas: int,
    total: tuple[int, int],
    per_replica: tuple[int, int],
    lengths: tuple[int, int, int, int, int],
    tier_policy: str,
    **fields: Any,
) -> CompiledPool:
    """A pool whose shared remainder is its total less the tiers' floors; ``total`` and
    ``per_replica`` are (tokens, slots), ``lengths`` is (max model len, prompt mean, prompt
    p95, output mean, output p95); ``fields`` are further CompiledPool fields."""
    max_len, prompt_mean, prompt_p95, output_mean, output_p95 = lengths
    return CompiledPool(
        name=name,
        served_name=name,
        model_version="v1",
        tier_policy=tier_policy,
        max_model_len=max_len,
        prompt_tokens_mean=prompt_mean,
        prompt_tokens_p95=prompt_p95,
        output_tokens_mean=output_mean,
        output_tokens_p95=output_p95,
        replicas=replicas,
        tokens_per_replica=per_replica[0],
        slots_per_replica=per_replica[1],
        total_tokens=total[0],
        total_slots=total[1],
        shared_tokens=total[0] - sum(a.floor_tokens for a in tiers.values()),
        shared_slots=total[1] - sum(a.floor_slots for a in tiers.values()),
        tiers=tiers,
        tracks=tracks,
        **fields,
    )


@dataclass
class _TierSpec:
    name: str
    floor_tokens: int
    floor_slots: int
    lend_tokens: int
    lend_slots: int
    wait: float
    reclaim: Reclaim
    ttft: float | None = None


@dataclass
class CompiledPoolBuilder:
    """Fluent builder of a CompiledPool (floors in tokens and slots) and its tiers."""

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

    def capacity(self, tokens: int, slots: int) -> CompiledPoolBuilder:
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
        reclaim: Reclaim = "Wait",
        ttft: float | None = None,
    ) -> CompiledPoolBuilder:
        """Add a tier (highest priority first); lendable defaults to the whole floor;
        ``ttft``: its ttftP95Target (seconds)."""
        self._tiers.append(
            _TierSpec(
                name,
                floor_tokens,
                floor_slots,
                floor_tokens if lend_tokens is None else lend_tokens,
                floor_slots if lend_slots is None else lend_slots,
                wait,
                reclaim,
                ttft,
            )
        )
        return self

    def replicas(self, count: int, ready: bool = True) -> CompiledPoolBuilder:
        """Stable endpoints s0..s{count-1}; per-replica capacity = total / endpoints."""
        endpoints = [
            Endpoint(name=f"s{i}", url=f"http://127.0.0.1:{9000 + i}", ready=ready)
            for i in range(count)
        ]
        self._tracks.append(
            Track(name="stable", revision="rev-stable", weight=100, endpoints=endpoints)
        )
        return self

    def canary(
        self, weight: int, count: int = 1, tiers: list[str] | None = None
    ) -> CompiledPoolBuilder:
        endpoints = [
            Endpoint(name=f"c{i}", url=f"http://127.0.0.1:{9100 + i}") for i in range(count)
        ]
        self._tracks.append(
            Track(name="canary", revision="rev-canary", weight=weight, endpoints=endpoints)
        )
        self._canary_tiers = tiers or []
        return self

    def no_plan(self) -> CompiledPoolBuilder:
        self._plan_ok = False
        return self

    def replica_capacity(self, tokens: int, slots: int) -> CompiledPoolBuilder:
        self.per_replica = (tokens, slots)
        return self

    def obj(self) -> CompiledPool:
        endpoints = sum(len(t.endpoints) for t in self._tracks) or 1
        per_replica = self.per_replica or (
            self.total_tokens // endpoints,
            max(1, self.total_slots // endpoints),
        )
        return compiled_pool(
            self.name,
            {
                t.name: TierAllocation(
                    floor_tokens=t.floor_tokens,
                    floor_slots=t.floor_slots,
                    lendable_tokens=t.lend_tokens,
                    lendable_slots=t.lend_slots,
                )
                for t in self._tiers
            },
            self._tracks,
            replicas=endpoints,
            total=(self.total_tokens, self.total_slots),
            per_replica=per_replica,
            lengths=(self.max_model_len, 256, 1024, 128, self.output_p95),
            tier_policy="policy",
            canary_tiers=self._canary_tiers,
            plan_ok=self._plan_ok,
        )

    def tiers(self) -> list[CompiledTier]:
        return [
            compiled_tier(t.name, rank, wait=t.wait, reclaim=t.reclaim, ttft=t.ttft)
            for rank, t in enumerate(self._tiers)
        ]


@dataclass
class _Tier:
    name: str
    floor: int  # percent
    lend: int
    wait: float
    engine_priority: int | None
    reclaim: Reclaim
    budget_unavailable: Literal["Allow", "Reject"] | None = None
    ttft: float | None = None  # ttftP95Target seconds


@dataclass
class AdmissionConfigBuilder:
    """A compiled admission config with one tier policy ("tiers") under construction; floors
    are percents, planned into tokens and slots per pool like the operator does."""

    namespace: str = "default"
    _tiers: list[_Tier] = field(default_factory=list)
    _rules: list[CompiledRule] = field(default_factory=list)
    _pools: list[CompiledPool] = field(default_factory=list)
    _tenants: list[CompiledTenant] = field(default_factory=list)

    def tier(
        self,
        name: str,
        floor: int,
        *,
        lend: int = 100,
        wait: float = 5.0,
        engine_priority: int | None = None,
        reclaim: Reclaim = "Wait",
        budget_unavailable: Literal["Allow", "Reject"] | None = None,
        ttft: float | None = None,
    ) -> AdmissionConfigBuilder:
        """Add a tier (highest priority first); floor and lend are percents."""
        self._tiers.append(
            _Tier(name, floor, lend, wait, engine_priority, reclaim, budget_unavailable, ttft)
        )
        return self

    def rule(
        self,
        tier: str,
        *,
        path_prefix: str | None = None,
        host: str | None = None,
        labels: dict[str, str] | None = None,
    ) -> AdmissionConfigBuilder:
        self._rules.append(compiled_rule(tier, path_prefix=path_prefix, host=host, labels=labels))
        return self

    def compiled_tiers(self) -> list[CompiledTier]:
        return [
            compiled_tier(
                t.name,
                rank,
                wait=t.wait,
                reclaim=t.reclaim,
                engine_priority=t.engine_priority,
                floor_percent=t.floor,
                lend_percent=t.lend,
                budget_unavailable=t.budget_unavailable,
                ttft=t.ttft,
            )
            for rank, t in enumerate(self._tiers)
        ]

    def pool(
        self,
        served_name: str,
        endpoints: list[str],
        *,
        tokens_per_replica: int = 2048,
        slots_per_replica: int = 8,
        max_model_len: int = 512,
        output_p95: int = 64,
        tokenizer_path: str | Path | None = None,
        canary: list[str] | None = None,
        canary_weight: int = 0,
        canary_tiers: list[str] | None = None,
    ) -> AdmissionConfigBuilder:
        """A pool planned like the operator does: floors are percents of the total, each
        non-zero floor at least one p95 request (prompt p95 = maxModelLen / 2) and one slot."""
        replicas = len(endpoints) + len(canary or [])
        total_tokens = tokens_per_replica * max(1, replicas)
        total_slots = slots_per_replica * max(1, replicas)
        floors_t, floors_s, _, _ = plan_floors(
            [(t.name, t.floor) for t in self._tiers],
            total_tokens,
            total_slots,
            max_model_len // 2 + output_p95,
        )
        tiers = {}
        for t in self._tiers:
            floor_tokens, floor_slots = floors_t[t.name], floors_s[t.name]
            tiers[t.name] = TierAllocation(
                floor_tokens=floor_tokens,
                floor_slots=floor_slots,
                lendable_tokens=floor_tokens * t.lend // 100,
                lendable_slots=floor_slots * t.lend // 100,
            )
        tracks = [
            Track(
                name="stable",
                revision="r1",
                weight=100 - canary_weight,
                endpoints=[
                    Endpoint(name=f"{served_name}-{i}", url=url) for i, url in enumerate(endpoints)
                ],
            )
        ]
        if canary:
            tracks.append(
                Track(
                    name="canary",
                    revision="r2",
                    weight=canary_weight,
                    endpoints=[
                        Endpoint(name=f"{served_name}-canary-{i}", url=url)
                        for i, url in enumerate(canary)
                    ],
                )
            )
        self._pools.append(
            compiled_pool(
                served_name,
                tiers,
                tracks,
                replicas=replicas,
                total=(total_tokens, total_slots),
                per_replica=(tokens_per_replica, slots_per_replica),
                lengths=(max_model_len, 64, max_model_len // 2, output_p95 // 2 or 1, output_p95),
                tier_policy="tiers",
                tokenizer_path=str(tokenizer_path) if tokenizer_path else None,
                canary_tiers=canary_tiers or [],
            )
        )
        return self

    def tenant(
        self,
        name: str,
        *,
        key: str,
        tiers: list[str],
        limits: list[tuple[float, int]] | None = None,
        labels: dict[str, str] | None = None,
        weight: int = 1,
        over_budget: Literal["Reject", "Demote"] = "Reject",
        max_concurrency: int | None = None,
    ) -> AdmissionConfigBuilder:
        """A tenant presenting API key ``key``; ``limits`` are (window seconds, tokens) pairs."""
        self._tenants.append(
            compiled_tenant(
                name,
                tiers,
                key_sha256=api_key_digest(key),
                limits=limits,
                labels=labels,
                weight=weight,
                over_budget=over_budget,
                max_concurrency=max_concurrency,
            )
        )
        return self

    def obj(self) -> AdmissionConfig:
        policy = CompiledTierPolicy(
            name="tiers", tiers=self.compiled_tiers(), classification=self._rules
        )
        return AdmissionConfig(
            namespace=self.namespace,
            tier_policies=[policy],
            pools=self._pools,
            tenants=self._tenants,
        )

    def write(self, path: Path) -> Path:
        """Write the config as the operator would (``config.json``), atomically."""
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.obj().to_json())
        tmp.replace(path)
        return path


def standard_admission_config(endpoints: list[str], **pool: Any) -> AdmissionConfigBuilder:
    """Two tiers (interactive 50 %, batch 30 %), one pool "tiny", tenants acme and bulk."""
    return (
        AdmissionConfigBuilder()
        .tier("interactive", floor=50, wait=5.0)
        .tier("batch", floor=30, wait=5.0)
        .rule("interactive", path_prefix="/v1/chat", labels={"class": "interactive"})
        .pool("tiny", endpoints, **pool)
        .tenant(
            "acme",
            key="sk-acme",
            tiers=["interactive", "batch"],
            labels={"class": "interactive"},
        )
        .tenant("bulk", key="sk-bulk", tiers=["batch"])
    )


def admission_config_with_tenants(count: int, endpoints: int = 1) -> AdmissionConfig:
    """The standard config with ``count`` tenants of ~230 bytes each and ``endpoints`` engines.

    The size issue 18 measured: the config-sharding tests and ``bench/config_scale.py`` both
    build their large configs with it, so the benchmark measures what the tests bound.
    """
    urls = [f"http://10.0.{i // 250}.{i % 250}:8000" for i in range(endpoints)]
    builder = standard_admission_config(urls)
    for i in range(count):
        builder.tenant(
            f"tenant-{i:05d}",
            key=f"sk-{i}",
            tiers=["interactive", "batch"],
            limits=[(3600, 1_000_000)],
            labels={"team": f"team-{i % 40}"},
        )
    return builder.obj()


def tiny_engine_admission_config(
    engine_url: str,
    tokenizer: str | Path,
    *,
    wait: float = 30.0,
    ttft: float | None = None,
    limits: list[tuple[float, int]] | None = None,
) -> AdmissionConfigBuilder:
    """interactive (chat, 50 %, TTFT target ``ttft`` s) and batch (completions, 30 %) over
    one tiny vLLM engine (the ``tiny_engine`` fixture: maxModelLen 512, 2,048 tokens and 8
    slots); tenant acme (key ``sk-acme``) with ``limits``."""
    return (
        AdmissionConfigBuilder()
        .tier("interactive", floor=50, wait=wait, ttft=ttft)
        .tier("batch", floor=30, wait=wait)
        .rule("interactive", path_prefix="/v1/chat")
        .pool(
            "tiny",
            [engine_url],
            tokens_per_replica=2048,
            slots_per_replica=8,
            max_model_len=512,
            output_p95=64,
            tokenizer_path=tokenizer,
        )
        .tenant("acme", key="sk-acme", tiers=["interactive", "batch"], limits=limits)
    )


class AdmissionRequests:
    """Numbered admission requests: ``AdmissionRequests().make("hi", 100)`` -> ids r1, r2..."""

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
        borrow_tokens: int | None = None,
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
            borrow_tokens=borrow_tokens,
        )
