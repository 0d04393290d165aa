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
        learner.observe(sample, bound=bound)
    assert learner.reserve_output(bound) == expected


# (tenant, bound, output, count) batches observed in order; then the bound asked for.
LEARNER_TENANT_CASES = [
    ("cheap-requests-say-nothing-of-larger-bounds", [("a", 1, 1, 200)], 400, 400),
    ("samples-at-the-bound-are-learned", [("a", 1, 1, 200), ("b", 400, 64, 20)], 400, 64),
    ("samples-at-a-larger-bound-count", [("b", 500, 64, 20)], 400, 64),
    ("never-above-the-request-bound", [("b", 500, 300, 20)], 100, 100),
    (
        "a-flooding-tenant-weighs-as-much-as-one-other",
        [("b", 400, 64, 20), ("a", 400, 1, 200)],
        400,
        64,
    ),
    (
        "tenants-weigh-equally-not-by-volume",
        [("b", 400, 300, 20), ("a", 400, 10, 190), ("c", 400, 20, 10)],
        400,
        300,
    ),
    ("too-few-samples-at-the-bound", [("b", 400, 64, 19), ("a", 1, 1, 200)], 400, 400),
]


@pytest.mark.parametrize(
    ("batches", "bound", "expected"),
    [case[1:] for case in LEARNER_TENANT_CASES],
    ids=[case[0] for case in LEARNER_TENANT_CASES],
)
def test_output_learner_by_bound_and_tenant(
    batches: list[tuple[str, int, int, int]], bound: int, expected: int
) -> None:
    """Issue 18.4: one tenant's cheap requests must not set the reservation of another
    tenant's larger ones."""
    learner = OutputLearner(quantile=0.95, window=200, min_samples=20)
    for tenant, allowed, output, count in batches:
        for _ in range(count):
            learner.observe(output, bound=allowed, tenant=tenant)
    got = learner.reserve_output(bound)
    assert got == expected, f"a request allowed {bound} reserves {got} output tokens"


def test_output_learner_learns_as_soon_as_enough_samples_are_allowed_the_bound() -> None:
    """A request asked before the 20th sample must not keep "not learned" cached."""
    learner = OutputLearner(quantile=0.95, window=200, min_samples=20, refresh=1000)
    for _ in range(19):
        learner.observe(3, bound=507, tenant="b")
        assert learner.reserve_output(507) == 507
    learner.observe(3, bound=507, tenant="b")
    assert learner.reserve_output(507) == 3


def test_output_learner_cache_never_lags_on_the_unsafe_side() -> None:
    """A cached quantile may be a few samples old, but a sample above it clears it."""
    learner = OutputLearner(quantile=0.5, window=200, min_samples=20, refresh=1000)
    for _ in range(20):
        learner.observe(10, bound=400, tenant="b")
    assert learner.reserve_output(400) == 10
    for _ in range(30):
        learner.observe(300, bound=400, tenant="b")
    assert learner.reserve_output(400) == 300


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
        ratio.observe_poll(preemptions, max_usage=0.9)
    assert ratio.value == pytest.approx(expected)
    assert ratio.reserve(64) >= 1


@pytest.mark.parametrize(
    ("periods", "polls", "expected"),
    [
        (1, [0] * 20, 0.80),
        (4, [0] * 5, 0.80),
        (4, [0] * 20, 0.5),
        (4, [0] * 5 + [2], 0.90),
        (2.5, [0] * 4, 0.90),
    ],
    ids=[
        "one-replica-one-step-a-poll",
        "one-of-four-replicas-creeps-as-far-in-the-same-time",
        "never-below-the-minimum",
        "a-preemption-backs-off-once-a-poll",
        "a-period-that-is-not-whole",
    ],
)
def test_overcommit_ratio_creeps_by_time_not_by_poll(
    periods: float, polls: list[int], expected: float
) -> None:
    """One of N gateway replicas polls the engines every N periods and sees every
    preemption: a quiet, busy poll of it creeps N steps, so four replicas' ratios move
    with time as one replica's does (docs/0008)."""
    ratio = OvercommitRatio(minimum=0.5, step=0.01, backoff=0.1)
    for preemptions in polls:
        ratio.observe_poll(preemptions, max_usage=0.9, periods=periods)
    assert ratio.value == pytest.approx(expected)


@pytest.mark.parametrize(
    ("usages", "expected"),
    [
        ([0.0] * 100, 1.0),
        ([0.3] * 100, 1.0),
        ([0.9] * 20 + [0.0] * 100, 0.8),
        ([0.9] * 20, 0.8),
    ],
    ids=[
        "idle-polls-are-no-evidence",
        "a-light-load-is-no-evidence",
        "the-ratio-holds-while-idle",
        "busy-quiet-polls-lower-it",
    ],
)
def test_overcommit_ratio_falls_only_while_the_engines_are_busy(
    usages: list[float], expected: float
) -> None:
    """Issue 18.4: an idle poll is not "no preemptions" (the old ratio fell to 0.5 while the
    pool sat idle, so the first burst after a quiet period overcommitted most)."""
    adaptation = PoolAdaptation([_tier("interactive", 0), _tier("batch", 1)], 16)
    for usage in usages:
        adaptation.engines(0, usage)
    got = adaptation.ratio_of("batch")
    assert got == pytest.approx(expected), f"ratio {got} after {len(usages)} polls"


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


def test_a_slow_sample_counts_in_one_decrease_only() -> None:
    """Issue 18.3: 3 slow first tokens out of 50 took the lent limit 20 -> 0 (a 50-sample
    window decided every 10 samples halved five times on the same slow samples)."""
    limiter = LentLimiter(target_seconds=0.1, maximum=20, window=50, interval=10)
    seen = []
    for index in range(50):
        limiter.observe(1.0 if index < 3 else 0.05)
        if index % 10 == 9:
            seen.append(limiter.limit)
    assert seen[0] == 10, f"limits {seen}: the slow samples halve the limit once"
    assert seen[-1] >= 10, f"limits {seen}: 3 slow samples of 50 took the limit 20 -> {seen[-1]}"


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        ([("slow", 20, 0.0), ("tick", 4.9)], 2),
        ([("slow", 20, 0.0), ("tick", 5.0)], 8),
        ([("slow", 20, 0.0), ("tick", 5.0), ("slow", 10, 6.0)], 4),
        ([("slow", 20, 0.0), ("fast", 1, 4.0), ("tick", 8.9)], 2),
        ([("tick", 100.0)], 8),
    ],
    ids=[
        "not-idle-yet",
        "idle-for-idle-seconds-throttles-nobody",
        "slow-again-after-idle-starts-from-the-maximum",
        "a-sample-restarts-the-idle-clock",
        "never-sampled",
    ],
)
def test_an_idle_protected_tier_throttles_nobody(events: list[tuple], expected: int) -> None:
    """Issue 18.3: the limit stayed 0 with the protected tier idle (batch held to its floor
    in an idle pool); with no sample for ``idle_seconds`` it goes back to the maximum."""
    adaptation = PoolAdaptation([_tier("interactive", 0, ttft=0.1), _tier("batch", 1)], 8)
    for event in events:
        if event[0] == "tick":
            adaptation.tick(event[1])
        else:
            kind, count, now = event
            for _ in range(count):
                adaptation.ttft("interactive", 1.0 if kind == "slow" else 0.01, now)
    got = adaptation.limiters["interactive"].limit
    assert got == expected, f"lent limit {got} after {events}"


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


def _protected_pool(ttft: float | None) -> CompiledPoolBuilder:
    """hi (with a ttftP95Target ``ttft``) 400/4 never lends, lo 200/2; shared 400/4."""
    return (
        CompiledPoolBuilder()
        .capacity(1000, 10)
        .tier("hi", 400, 4, lend_tokens=0, lend_slots=0, ttft=ttft)
        .tier("lo", 200, 2)
    )


@pytest.mark.parametrize(
    ("new_ttft", "lifted"),
    [(None, True), (0.8, True), (0.5, False)],
    ids=["target-removed-lifts-it", "target-changed-lifts-it", "same-target-keeps-it"],
)
def test_a_reconfigure_that_removes_or_changes_the_target_lifts_the_lent_limit(
    new_ttft: float | None, lifted: bool
) -> None:
    """Issue 18.3: the lent limit survived a reload that removed the target; only a restart
    cleared it, and lo's borrowers stayed queued in an idle pool."""
    before = _protected_pool(0.5)
    ctl, reqs = AdmissionController(before.obj(), before.tiers()), AdmissionRequests()
    ctl.set_lent_limit("hi", 0, 0.0)
    for _ in range(2):
        assert ctl.offer(reqs.make("lo", 100), 0.0).outcome == "admitted"  # its floor
    borrower = reqs.make("lo", 100)
    assert isinstance(ctl.offer(borrower, 0.0), Queue)

    after = _protected_pool(new_ttft)
    wake = ctl.reconfigure(after.obj(), after.tiers(), 1.0)

    started = [a.request_id for a in wake.admitted]
    assert started == ([borrower.request_id] if lifted else []), (
        f"lent limits {ctl._lending.limits} after a reload to target {new_ttft}: started {started}"
    )


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


def _tier(name: str, rank: int, ttft: float | None = None) -> CompiledTier:
    return CompiledTier(
        name=name,
        rank=rank,
        floor_percent=40,
        lend_percent=100,
        max_queue_wait_seconds=5.0,
        engine_priority=rank,
        reclaim="Wait",
        ttft_p95_target_seconds=ttft,
    )


@pytest.mark.parametrize(
    ("tier", "learned", "learn", "ratio_polls", "expected"),
    [
        ("interactive", [64] * 30, True, [], (520, 520)),
        ("batch", [64] * 30, True, [], (400 + 64, 400 + 64)),
        ("batch", [64] * 30, True, [0] * 20, (400 + 64, 400 + 52)),
        ("batch", [64] * 30, True, [0] * 200, (400 + 64, 400 + 32)),
        ("batch", [64] * 30, True, [0] * 20 + [3], (400 + 64, 400 + 58)),  # 0.8 -> 0.9
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
        adaptation.settled(tier, sample, 1, bound=120, tenant="t")
    for preemptions in ratio_polls:
        adaptation.engines(preemptions, 0.9)
    estimate = Estimate(prompt_tokens=400, output_tokens=120, output_limit=120)

    reserved = adaptation.reserve(tier, estimate)
    request = build_admission_request("r1", compiled_tenant("t", [tier]), tier, reserved)
    assert (request.tokens, request.borrowing_tokens) == expected
    assert adaptation.reserve(tier, estimate).charge_tokens == 520
