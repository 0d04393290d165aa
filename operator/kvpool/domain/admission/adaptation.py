"""What one pool learns while it runs: output bounds, overcommit, lent limits, engine load.

Why this module exists: the gateway observes three things admission should react to - the
usage of settled requests, the engines' own ``/metrics`` (KV usage, preemptions) and the
time to first token of each tier - and the reactions are pure decisions. This module turns
those observations into the numbers the controller and the reservation use, keeping all
state per pool in one place with no I/O and no clock:

- :meth:`PoolAdaptation.reserve`: the KV reservations of a request (never above its
  bound): for every tier but the top one, prompt + the tier's learned output
  (:class:`~.learning.OutputLearner`) while it starts inside its tier's floor, and prompt +
  that output times the pool's overcommit ratio (:class:`~.learning.OvercommitRatio`) when
  it starts above the floor (the controller picks: a floor is never overcommitted). The top
  tier reserves its full bound: together its requests never need more KV than was
  reserved for them, and the engine preempts the lowest priority first, so a top-tier
  request is never the one preempted;
- :meth:`PoolAdaptation.settled`: feed a finished request's generated tokens, its bound
  and its tenant to its tier;
- :meth:`PoolAdaptation.engines`: one poll of the engines -> the new ratio (lowered only
  while the engines are busy) and whether borrowing must pause (measured usage at or
  above ``pause_usage``; resumes below ``pause_usage - resume_margin``);
- :meth:`PoolAdaptation.tick`: the time passes -> the lent limits that went back to their
  maximum because their protected tier is idle;
- :meth:`PoolAdaptation.ttft`: one TTFT sample of a tier with a ``ttftP95Target`` -> the
  new concurrency lent to the tiers below it (:class:`~.limiter.LentLimiter`), or None.

Worked example (tiers interactive (top, target 0.8 s) and batch; batch has learned a
p95 output of 64, ratio 0.8): a batch request with prompt 400 and ``max_tokens`` 120
reserves 400 + 64 = 464 tokens inside batch's floor, 400 + ceil(64 x 0.8) = 452 above it,
and is charged 520 either way; an interactive request with the same shape reserves its
whole bound, 520 tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from kvpool.api.admission_config import CompiledTier
from kvpool.domain.admission.learning import OutputLearner, OvercommitRatio
from kvpool.domain.admission.limiter import LentLimiter
from kvpool.domain.estimate import Estimate


@dataclass(frozen=True)
class EngineVerdict:
    """What one engine poll decided for the pool."""

    ratio: float  # the overcommit ratio now in force for lower tiers
    pause_borrowing: bool  # measured KV usage is near the target: no new borrowers


@dataclass
class PoolAdaptation:
    """Learned and measured state of one pool (see the module docstring)."""

    tiers: list[CompiledTier]
    lent_maximum: int  # ceiling of the lent limits (the pool's slots)
    learn: bool = True  # False: reserve every request's full bound (the safe reservation)
    pause_usage: float = 0.97  # measured KV usage that pauses borrowing
    resume_margin: float = 0.05
    ratio: OvercommitRatio = field(default_factory=OvercommitRatio)
    learners: dict[str, OutputLearner] = field(default_factory=dict)
    limiters: dict[str, LentLimiter] = field(default_factory=dict)
    paused: bool = False

    def __post_init__(self) -> None:
        self.configure(self.tiers, self.lent_maximum)

    def configure(self, tiers: list[CompiledTier], lent_maximum: int) -> None:
        """Adopt a (new) policy; learned state of tiers that remain is kept."""
        self.tiers = sorted(tiers, key=lambda t: t.rank)
        self.lent_maximum = lent_maximum
        for tier in self.tiers:
            self.learners.setdefault(tier.name, OutputLearner())
            target = tier.ttft_p95_target_seconds
            if target:
                limiter = self.limiters.get(tier.name)
                if limiter is None or limiter.target_seconds != target:
                    self.limiters[tier.name] = LentLimiter(target, lent_maximum)
                else:
                    limiter.resize(lent_maximum)
            else:
                self.limiters.pop(tier.name, None)
        names = {t.name for t in self.tiers}
        for name in [n for n in self.limiters if n not in names]:
            del self.limiters[name]

    @property
    def top(self) -> str | None:
        """The highest-priority tier: its reservations are never overcommitted."""
        return self.tiers[0].name if self.tiers else None

    def ratio_of(self, tier: str) -> float:
        """The fraction of its learned output a request of ``tier`` reserves."""
        return 1.0 if tier == self.top else self.ratio.value

    def reserve(self, tier: str, estimate: Estimate) -> Estimate:
        """``estimate`` with its KV reservations set from what the tier's requests use:
        ``reserve_tokens`` (prompt + learned output) inside the tier's floor,
        ``borrow_tokens`` (prompt + learned output x ratio) above it."""
        if not self.learn or tier == self.top:
            return estimate
        learner = self.learners.get(tier)
        bound = max(1, estimate.output_limit)
        if learner is None or learner.learned(bound) is None:
            return estimate
        per_sequence = learner.reserve_output(bound)
        output = min(estimate.output_tokens, per_sequence * estimate.sequences)
        tokens = min(estimate.tokens, estimate.prompt_tokens + output)
        borrow = min(tokens, estimate.prompt_tokens + self.ratio.reserve(output))
        return replace(estimate, reserve_tokens=tokens, borrow_tokens=borrow)

    def settled(
        self, tier: str, completion_tokens: int, sequences: int, bound: int, tenant: str
    ) -> None:
        """A request of ``tenant`` in ``tier`` finished normally, generating
        ``completion_tokens`` over ``sequences`` of a per-sequence bound ``bound``."""
        learner = self.learners.get(tier)
        if learner is not None and sequences > 0:
            learner.observe(-(-completion_tokens // sequences), bound, tenant)

    def engines(
        self, new_preemptions: int, max_usage: float | None, periods: float = 1.0
    ) -> EngineVerdict:
        """One poll of the pool's engines: preemptions since the last poll, highest usage,
        and how many poll periods it covers (N for one of N gateway replicas)."""
        ratio = self.ratio.observe_poll(new_preemptions, max_usage, periods)
        if max_usage is not None:
            if max_usage >= self.pause_usage:
                self.paused = True
            elif max_usage < self.pause_usage - self.resume_margin:
                self.paused = False
        return EngineVerdict(ratio=ratio, pause_borrowing=self.paused)

    def tick(self, now: float) -> dict[str, int]:
        """The time is ``now`` (called on every engine poll round, answered or not): the
        lent limits that went back to their maximum because their protected tier has been
        idle (tier -> new limit)."""
        return {name: lim.limit for name, lim in self.limiters.items() if lim.idle(now)}

    def ttft(self, tier: str, seconds: float, now: float | None = None) -> int | None:
        """A TTFT sample of ``tier`` (at ``now``): the new lent limit below it if it
        changed, else None."""
        limiter = self.limiters.get(tier)
        if limiter is None or not limiter.observe(seconds, now):
            return None
        return limiter.limit
