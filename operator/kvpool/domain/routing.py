"""Route an admitted request: which track (stable or canary) and which replica.

Why this module exists: two separate choices with separate failure modes.

**Track.** During a rollout a pool has a ``stable`` and a ``canary`` track. Only tiers in
the pool's ``canaryTiers`` (empty = every tier) may see the canary, and of that eligible
traffic ``weight`` percent goes to it. The choice is a pure function of a random draw in
[0, 1) passed in by the caller, so it is deterministic in tests: canary iff
``draw * 100 < canary.weight``. A track with no ready endpoint is never chosen when the
other has one (a rollout must not turn into an outage); no ready endpoint anywhere ->
:class:`NoTrack` (503).

**Replica.** The pool total can look fine while one engine is full (e.g. 3 x 1000 tokens
free in total but the request needs 1200 on one engine, or all long prompts landed on
replica 0). So admission keeps *per-replica* reservations and a request goes to a ready
replica that can hold it whole, the one with the **least reserved tokens** (ties: fewest
reserved slots, then name - deterministic). None can hold it -> :class:`NoReplica`, and
the admission controller keeps the request queued. With ``allow_preempt`` (a tier whose
``reclaim`` is ``Preempt`` taking back its floor) the tokens/slots that lower-priority
work holds on a replica count as free: the engine's priority scheduler will preempt them.

Worked example (replicas of 1000 tokens / 4 slots)::

    canary weight 10, canaryTiers [batch]:  tier interactive, draw 0.05 -> stable
                                            tier batch,       draw 0.05 -> canary
                                            tier batch,       draw 0.50 -> stable
    reserved r0 = 700 tokens, r1 = 200, r2 = 900 (r2 not ready); request 300 tokens
        -> r1 (least reserved that fits);  request 850 -> NoReplica (r1 has 800 free)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from kvpool.api.admission_config import CompiledPool, Track

SERVICE_UNAVAILABLE = 503
REASON_NO_READY_ENDPOINT = "no_ready_endpoint"
STABLE = "stable"
CANARY = "canary"


@dataclass(frozen=True)
class TrackChoice:
    """The track to use; ``canary`` says whether it is the canary."""

    track: Track  # the chosen track (its ready endpoints are the routing candidates)
    canary: bool  # True if the canary track was chosen


@dataclass(frozen=True)
class NoTrack:
    """No track of the pool has a ready endpoint: answer 503."""

    pool: str
    reason: str = REASON_NO_READY_ENDPOINT
    http_status: int = SERVICE_UNAVAILABLE


TrackVerdict = TrackChoice | NoTrack


@dataclass(frozen=True)
class ReplicaLoad:
    """What is reserved on one replica (a read-only view for :func:`decide_replica`)."""

    name: str  # endpoint name (pod name)
    track: str  # "stable" or "canary"
    ready: bool  # routable
    reserved_tokens: int  # KV tokens reserved by admitted requests on it
    reserved_slots: int  # sequences reserved on it
    preemptible_tokens: int = 0  # of reserved_tokens, held by lower-priority work
    preemptible_slots: int = 0  # of reserved_slots, held by lower-priority work


class ReplicaView(Protocol):
    """What :func:`decide_replica` reads of a replica (:class:`ReplicaLoad` is one)."""

    @property
    def name(self) -> str: ...
    @property
    def track(self) -> str: ...
    @property
    def ready(self) -> bool: ...
    @property
    def reserved_tokens(self) -> int: ...
    @property
    def reserved_slots(self) -> int: ...
    @property
    def preemptible_tokens(self) -> int: ...
    @property
    def preemptible_slots(self) -> int: ...


@dataclass(frozen=True)
class ReplicaChoice:
    """The replica to send the request to."""

    name: str
    preempts: bool = False  # True if it only fits by preempting lower-priority work


@dataclass(frozen=True)
class NoReplica:
    """No ready replica can hold the request now (the controller keeps it queued)."""

    reason: str = "no_replica_fits"


ReplicaVerdict = ReplicaChoice | NoReplica


def has_ready_endpoint(track: Track) -> bool:
    """Whether any endpoint of the track is ready."""
    return any(e.ready for e in track.endpoints)


def canary_eligible(pool: CompiledPool, tier: str) -> bool:
    """Whether a tier may be sent to the canary (``canaryTiers`` empty = every tier)."""
    return not pool.canary_tiers or tier in pool.canary_tiers


def build_track_pool(pool: CompiledPool, track: str) -> CompiledPool | None:
    """The pool as one track's admission controller sees it: that track's endpoints and
    that track's plan (the canary's own plan; stable keeps the pool's). None when the
    pool has no such track, or the track has no plan of its own (canary).

    Each track admits against what *it* holds: a canary with half the KV tokens per
    replica and one replica gets floors over one half-size replica, never stable's.

    >>> # see tests/unit/test_routing.py::test_track_pool_*
    """
    chosen = next((t for t in pool.tracks if t.name == track), None)
    if chosen is None:
        return None
    if track == STABLE or chosen.plan is None:
        if track != STABLE:
            return None
        return pool.model_copy(update={"tracks": [chosen]})
    plan = chosen.plan
    return pool.model_copy(
        update={
            "tracks": [chosen],
            "replicas": plan.replicas,
            "tokens_per_replica": plan.tokens_per_replica,
            "slots_per_replica": plan.slots_per_replica,
            "total_tokens": plan.total_tokens,
            "total_slots": plan.total_slots,
            "shared_tokens": plan.shared_tokens,
            "shared_slots": plan.shared_slots,
            "tiers": dict(plan.tiers),
        }
    )


def decide_track(pool: CompiledPool, tier: str, draw: float) -> TrackVerdict:
    """Stable or canary for one request of ``tier``; ``draw`` is uniform in [0, 1).

    A pool without tracks (config-file mode without endpoints) gets :class:`NoTrack`.
    """
    stable = next((t for t in pool.tracks if t.name == STABLE), None)
    canary = next((t for t in pool.tracks if t.name == CANARY), None)
    stable_ok = stable is not None and has_ready_endpoint(stable)
    canary_ok = (
        canary is not None
        and canary.weight > 0
        and has_ready_endpoint(canary)
        and canary_eligible(pool, tier)
    )
    if canary_ok and canary is not None and (draw * 100 < canary.weight or not stable_ok):
        return TrackChoice(track=canary, canary=True)
    if stable_ok and stable is not None:
        return TrackChoice(track=stable, canary=False)
    return NoTrack(pool=pool.name)


def decide_replica(
    replicas: Sequence[ReplicaView],
    *,
    tokens: int,
    slots: int,
    tokens_per_replica: int,
    slots_per_replica: int,
    track: str | None = None,
    allow_preempt: bool = False,
) -> ReplicaVerdict:
    """The least-loaded ready replica (of ``track``, or any if None) that can hold the request.

    A replica can hold it if ``reserved + request <= per-replica capacity`` for both tokens
    and slots; with ``allow_preempt`` the preemptible part is not counted as reserved,
    and replicas that fit without preemption are preferred.
    """
    best: ReplicaView | None = None
    best_key: tuple[int, int, int, str] | None = None
    best_preempts = False
    for replica in replicas:
        if not replica.ready or (track is not None and replica.track != track):
            continue
        fits = (
            replica.reserved_tokens + tokens <= tokens_per_replica
            and replica.reserved_slots + slots <= slots_per_replica
        )
        preempts = False
        if not fits and allow_preempt:
            preempts = (
                replica.reserved_tokens - replica.preemptible_tokens + tokens <= tokens_per_replica
                and replica.reserved_slots - replica.preemptible_slots + slots <= slots_per_replica
            )
        if not fits and not preempts:
            continue
        key = (int(preempts), replica.reserved_tokens, replica.reserved_slots, replica.name)
        if best_key is None or key < best_key:
            best, best_key, best_preempts = replica, key, preempts
    if best is None:
        return NoReplica()
    return ReplicaChoice(name=best.name, preempts=best_preempts)
