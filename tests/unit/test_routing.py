"""Routing: canary only for eligible tiers by weight; least-reserved replica that fits."""

from __future__ import annotations

import pytest

from kvpool.api.admission_config import Endpoint, Track
from kvpool.domain.routing import (
    NoReplica,
    NoTrack,
    ReplicaChoice,
    ReplicaLoad,
    TrackChoice,
    decide_replica,
    decide_track,
)
from tests.builders import CompiledPoolBuilder


def _pool(canary_weight: int | None, canary_tiers: list[str] | None = None, stable: int = 2):
    builder = CompiledPoolBuilder().capacity(3000, 12)
    if stable:
        builder.replicas(stable)
    if canary_weight is not None:
        builder.canary(canary_weight, tiers=canary_tiers)
    return builder.obj()


@pytest.mark.parametrize(
    ("pool", "tier", "draw", "canary"),
    [
        (_pool(10, ["batch"]), "interactive", 0.05, False),
        (_pool(10, ["batch"]), "batch", 0.05, True),
        (_pool(10, ["batch"]), "batch", 0.10, False),
        (_pool(10, ["batch"]), "batch", 0.50, False),
        (_pool(10), "interactive", 0.09, True),
        (_pool(0), "interactive", 0.0, False),
        (_pool(100), "interactive", 0.99, True),
        (_pool(None), "interactive", 0.0, False),
        (_pool(10, stable=0), "interactive", 0.99, True),
    ],
    ids=[
        "ineligible-tier-never-canary",
        "eligible-below-weight",
        "eligible-at-weight-boundary",
        "eligible-above-weight",
        "empty-canary-tiers-means-all",
        "weight-zero",
        "weight-hundred",
        "no-canary-track",
        "stable-down-eligible-falls-back-to-canary",
    ],
)
def test_decide_track(pool, tier, draw, canary) -> None:
    verdict = decide_track(pool, tier, draw)
    assert isinstance(verdict, TrackChoice)
    assert verdict.canary is canary
    assert verdict.track.name == ("canary" if canary else "stable")


@pytest.mark.parametrize(
    ("pool", "tier"),
    [(_pool(10, ["batch"], stable=0), "interactive"), (CompiledPoolBuilder().obj(), "x")],
    ids=["stable-down-ineligible", "no-tracks"],
)
def test_no_track(pool, tier) -> None:
    assert decide_track(pool, tier, 0.0) == NoTrack(pool=pool.name)


def test_canary_share_follows_weight() -> None:
    pool = _pool(25)
    draws = [i / 1000 for i in range(1000)]
    hits = sum(
        1 for d in draws if isinstance(v := decide_track(pool, "x", d), TrackChoice) and v.canary
    )
    assert hits == 250


def test_track_without_ready_endpoint_is_skipped() -> None:
    pool = _pool(None, stable=0).model_copy(
        update={
            "tracks": [
                Track(
                    name="stable",
                    revision="r",
                    weight=100,
                    endpoints=[Endpoint(name="s0", url="http://x", ready=False)],
                )
            ]
        }
    )
    assert isinstance(decide_track(pool, "x", 0.0), NoTrack)


def _load(name, tokens, slots=0, *, ready=True, track="stable", pre_t=0, pre_s=0):
    return ReplicaLoad(name, track, ready, tokens, slots, pre_t, pre_s)


FLEET = [
    _load("r0", 700, 2),
    _load("r1", 200, 1),
    _load("r2", 100, 0, ready=False),
    _load("r3", 200, 3),
    _load("c0", 0, 0, track="canary"),
]


@pytest.mark.parametrize(
    ("tokens", "slots", "track", "allow_preempt", "expected"),
    [
        (300, 1, "stable", False, ReplicaChoice("r1")),
        (300, 1, None, False, ReplicaChoice("c0")),
        (850, 1, "stable", False, NoReplica()),
        (800, 1, "stable", False, ReplicaChoice("r1")),
        (100, 2, "stable", False, ReplicaChoice("r1")),
        (100, 4, "stable", False, NoReplica()),
        (100, 1, "canary", False, ReplicaChoice("c0")),
    ],
    ids=[
        "least-reserved-that-fits",
        "any-track",
        "pool-total-fine-but-no-single-replica",
        "exactly-fills",
        "slots-tie-breaks",
        "no-replica-has-the-slots",
        "track-filter",
    ],
)
def test_decide_replica(tokens, slots, track, allow_preempt, expected) -> None:
    verdict = decide_replica(
        FLEET,
        tokens=tokens,
        slots=slots,
        tokens_per_replica=1000,
        slots_per_replica=4,
        track=track,
        allow_preempt=allow_preempt,
    )
    assert verdict == expected


@pytest.mark.parametrize(
    ("fleet", "allow_preempt", "expected"),
    [
        ([_load("a", 900, 1, pre_t=600, pre_s=1)], False, NoReplica()),
        ([_load("a", 900, 1, pre_t=600, pre_s=1)], True, ReplicaChoice("a", preempts=True)),
        ([_load("a", 900, 1, pre_t=100, pre_s=1)], True, NoReplica()),
        (
            [_load("a", 900, 1, pre_t=600, pre_s=1), _load("b", 600, 1)],
            True,
            ReplicaChoice("b"),
        ),
    ],
    ids=["no-preempt", "preempt-frees-room", "not-enough-preemptible", "prefer-no-preemption"],
)
def test_decide_replica_with_preemption(fleet, allow_preempt, expected) -> None:
    verdict = decide_replica(
        fleet,
        tokens=400,
        slots=1,
        tokens_per_replica=1000,
        slots_per_replica=4,
        allow_preempt=allow_preempt,
    )
    assert verdict == expected
