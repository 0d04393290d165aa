"""Learned output reservation, adaptive overcommit, TTFT limiter, and the controller's
hooks they drive (borrowing pause, lent limits): tables of cases."""

from __future__ import annotations

import pytest

from kvpool.api.admission_config import CompiledTier
from kvpool.domain.admission import (
    AdmissionController,
    Admit,
    Amount,
    Queue,
    build_admission_request,
)
from kvpool.domain.admission.adaptation import PoolAdaptation
from kvpool.domain.admission.learning import OutputLearner, OvercommitRatio
from kvpool.domain.admission.limiter import LentLimiter
from kvpool.domain.estimate import Estimate
from tests.builders import AdmissionRequests, CompiledPoolBuilder, compiled_tenant


@pytest.mark.parametrize(
    ("samples", "bound", "expected"),
    [
        ([64] * 10, 120, 120),
        ([64] * 20, 120, 64),
        ([64] * 20, 30, 30),
        (list(range(1, 101)), 500, 95),
        ([10] * 150 + [100] * 60, 500, 100),
        ([100] * 60 + [10] * 200, 500, 10),
    ],
    ids=[
        "not-learned-yet-reserves-the-bound",
        "learned-quantile",
        "never-above-the-request-bound",
        "p95-of-1-to-100",
        "a-tail-of-5pct-or-more-is-reserved",
        "old-samples-leave-the-window",
    ],
)
def test_output_learner(samples: list[int], bound: int, expected: int) -> None:
    learner = OutputLearner(quantile=0.95, window=200, min_samples=20)
    for sample in samples:
        learner.observe(sample)
    assert learner.reserve_output(bound) == expected


@pytest.mark.parametrize(
    ("polls", "expected"),
    [
        ([0] * 20, 0.80),
        ([0] * 100, 0.5),
        ([0] * 20 + [3], 1.0),
        ([0] * 40 + [1], 0.85),
    ],
    ids=[
        "creeps-down-while-quiet",
        "never-below-the-minimum",
        "backs-off-on-preemption",
        "partial",
    ],
)
def test_overcommit_ratio(polls: list[int], expected: float) -> None:
    ratio = OvercommitRatio(minimum=0.5, step=0.01, backoff=0.25)
    for preemptions in polls:
        ratio.observe_poll(preemptions)
    assert ratio.value == pytest.approx(expected)
    assert ratio.reserve(64) >= 1


@pytest.mark.parametrize(
    ("batches", "limits"),
    [
        ([0.25, 0.15, 0.09, 0.05, 0.05], [4, 2, 2, 3, 4]),
        ([0.05] * 3, [8, 8, 8]),
        ([1.0] * 5, [4, 2, 1, 0, 0]),
    ],
    ids=["docstring-example", "never-above-the-maximum", "down-to-the-minimum"],
)
def test_lent_limiter_aimd(batches: list[float], limits: list[int]) -> None:
    limiter = LentLimiter(target_seconds=0.1, maximum=8, window=10, interval=10)
    seen = []
    for ttft in batches:
        for _ in range(10):
            limiter.observe(ttft)
        seen.append(limiter.limit)
    assert seen == limits


def _pool() -> CompiledPoolBuilder:
    """hi 400/4 (never lends), lo 200/2; shared 400/4: lo borrows only the shared part."""
    return (
        CompiledPoolBuilder()
        .capacity(1000, 10)
        .tier("hi", 400, 4, lend_tokens=0, lend_slots=0)
        .tier("lo", 200, 2)
    )


def test_lent_limit_holds_borrowers_but_never_a_floor() -> None:
    builder = _pool()
    ctl, reqs = AdmissionController(builder.obj(), builder.tiers()), AdmissionRequests()
    ctl.set_lent_limit("hi", 1, 0.0)
    own = [reqs.make("lo", 100) for _ in range(2)]
    assert all(ctl.offer(r, 0.0).outcome == "admitted" for r in own)  # its floor
    first = reqs.make("lo", 100)
    assert ctl.offer(first, 0.0).outcome == "borrowed"
    second = reqs.make("lo", 100)
    assert isinstance(ctl.offer(second, 0.0), Queue)  # 1 borrower already runs
    assert ctl.borrowed_below("hi") == 1

    wake = ctl.set_lent_limit("hi", 2, 1.0)  # the limiter gives it back

    assert [a.request_id for a in wake.admitted] == [second.request_id]
    ctl.release(first.request_id, 2.0)
    ctl.release(second.request_id, 2.0)
    assert ctl.borrowed_below("hi") == 0


def test_paused_borrowing_resumes_with_wakeups() -> None:
    builder = _pool()
    ctl, reqs = AdmissionController(builder.obj(), builder.tiers()), AdmissionRequests()
    ctl.set_borrowing_paused(True, 0.0)
    inside = reqs.make("lo", 200, 2)
    assert isinstance(ctl.offer(inside, 0.0), Admit)
    borrower = reqs.make("lo", 100)
    assert isinstance(ctl.offer(borrower, 0.0), Queue)

    wake = ctl.set_borrowing_paused(False, 1.0)

    assert [a.request_id for a in wake.admitted] == [borrower.request_id]
    snap = ctl.snapshot()
    assert Amount(snap.in_use_tokens, snap.in_use_slots) == Amount(300, 3)


def _tier(name: str, rank: int) -> CompiledTier:
    return CompiledTier(
        name=name,
        rank=rank,
        floor_percent=40,
        lend_percent=100,
        max_queue_wait_seconds=5.0,
        engine_priority=rank,
        reclaim="Wait",
    )


@pytest.mark.parametrize(
    ("tier", "learned", "learn", "ratio_polls", "expected"),
    [
        ("interactive", [64] * 30, True, [], (520, 520)),
        ("batch", [64] * 30, True, [], (400 + 64, 400 + 64)),
        ("batch", [64] * 30, True, [0] * 20, (400 + 64, 400 + 52)),
        ("batch", [64] * 30, True, [0] * 200, (400 + 64, 400 + 32)),
        ("batch", [64] * 30, True, [0] * 20 + [3], (400 + 64, 400 + 64)),
        ("batch", [], True, [], (520, 520)),
        ("batch", [64] * 30, False, [], (520, 520)),
        ("batch", [500] * 30, True, [], (520, 520)),
    ],
    ids=[
        "top-tier-reserves-its-whole-bound-never-preempted",
        "lower-tier-reserves-prompt-plus-learned-p95",
        "quiet-engines-lower-the-ratio-above-the-floor-only",
        "the-ratio-stops-at-its-minimum",
        "a-preemption-backs-the-ratio-off",
        "nothing-learned-yet-reserves-the-bound",
        "learning-off-reserves-the-bound",
        "never-above-the-request-bound",
    ],
)
def test_reservation_by_tier(
    tier: str,
    learned: list[int],
    learn: bool,
    ratio_polls: list[int],
    expected: tuple[int, int],
) -> None:
    """Prompt 400, max_tokens 120 (charged 520): (reserved inside the tier's floor, above
    it); the top tier is never overcommitted, and a floor never is either."""
    adaptation = PoolAdaptation([_tier("interactive", 0), _tier("batch", 1)], 16, learn=learn)
    for sample in learned:
        adaptation.settled(tier, sample, 1)
    for preemptions in ratio_polls:
        adaptation.engines(preemptions, 0.5)
    estimate = Estimate(prompt_tokens=400, output_tokens=120, output_limit=120)

    reserved = adaptation.reserve(tier, estimate)
    request = build_admission_request("r1", compiled_tenant("t", [tier]), tier, reserved)
    assert (request.tokens, request.borrowing_tokens) == expected
    assert adaptation.reserve(tier, estimate).charge_tokens == 520
