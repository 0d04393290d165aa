"""Reserve what requests will use: a learned output bound and an adaptive overcommit ratio.

Why this module exists: reserving every request's full output bound (``max_tokens`` or the
rest of the context) is safe but wastes the KV cache on tokens that are rarely generated,
which is what costs the throughput against an engine that reserves nothing. Two pure,
clock-free pieces decide a smaller *KV reservation*; the *budget charge* never shrinks
(it stays the request's full bound, see :mod:`kvpool.domain.estimate`).

**OutputLearner** (per pool and tier): the outputs of settled requests (tokens generated
per sequence), each with the bound it was allowed (its per-sequence ``max_tokens``) and
its tenant. A request with bound ``B`` reserves ``min(B, q-quantile)`` output tokens per
sequence, where the quantile is taken only over samples whose bound was at least ``B``
(a request allowed 1 token says nothing about one allowed 400) and every tenant weighs
the same however many requests it sent (a tenant cannot set the reservation of the others
by volume). Each tenant keeps its last ``window`` samples; the ``tenants`` most recently
seen are kept. With fewer than ``min_samples`` such samples the request reserves its bound.

**OvercommitRatio** (per pool): the fraction of the learned output that requests of
*lower* tiers reserve when they start above their tier's floor (on borrowed or shared
capacity; inside its floor a request reserves its whole learned output). It starts at 1
(no overcommit), creeps down by ``step`` on every engine poll that saw no preemption
*while the engines were busy* (measured KV usage at least ``busy_usage``: an idle engine
cannot preempt, so its quiet is no evidence), to at least ``minimum``, and jumps back up by
``backoff`` on every poll that saw one (the known practice of SGLang's ``new_token_ratio``,
which retracts and raises the ratio when the cache runs out). Where the ratio settles
above ``minimum``, the busy polls that saw a preemption are ``step / (step + backoff)`` of
them: 9 % at the defaults. The earlier backoff of 0.25 (3.8 %) held one engine at 0.91x
the output of the engine's own priority scheduling with 48 preemptions in 4 minutes
against its 1,365; 0.1 gave 0.98x and 1.01x with 67 and 70 (docs/0009, "The overcommit's
backoff").
With N gateway replicas each polls the engines every N periods and sees every preemption
(the engines' counters are the pool's), so a quiet poll creeps ``N x step``: over the
same time the ratio creeps as one replica's would. With one step a poll, the batch ratio
of four replicas averaged 0.95 where one replica's averaged 0.67 on the same engine and
load: each reserved more for its borrowers than one replica did (docs/0008).
The top tier always reserves its full learned output: its requests run at the highest
engine priority and are never the ones preempted.

Worked example (q 0.95, window 200, min 20):

    tenant a: 200 requests, bound 1, output 1  ->  reserve_output(400) -> 400 (no sample
                                                   allowed 400: nothing is known)
    tenant b: 20 requests, bound 400, output 64 -> reserve_output(400) -> 64
    tenant a: 200 requests, bound 400, output 1 -> reserve_output(400) -> 64 (a and b weigh
                                                   the same: b's outputs hold the top 50 %)
    ratio 1.0 -> 20 busy quiet polls at step 0.01 -> 0.80: reserves ceil(64 x 0.8) = 52
    idle polls (usage below busy_usage)           -> 0.80 (unchanged)
    one poll with preemptions (backoff 0.1)       -> 0.90
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field


@dataclass
class OutputLearner:
    """A high quantile of settled outputs per sequence, by bound, tenants weighed equally."""

    quantile: float = 0.95  # of observed outputs per sequence
    window: int = 200  # settled requests remembered per tenant
    min_samples: int = 20  # fewer samples allowed at least the bound: reserve the bound
    tenants: int = 16  # tenants remembered (the most recently seen)
    refresh: int = 16  # observations a cached quantile stays valid for
    _by_tenant: OrderedDict[str, deque[tuple[int, int]]] = field(default_factory=OrderedDict)
    _cache: dict[int, int | None] = field(default_factory=dict)  # bound -> learned (None: no)
    _since_refresh: int = 0

    def observe(self, output_per_sequence: int, bound: int, tenant: str = "") -> None:
        """A settled request of ``tenant`` generated this many tokens per sequence, of a
        per-sequence bound of ``bound``."""
        samples = self._by_tenant.get(tenant)
        if samples is None:
            samples = self._by_tenant[tenant] = deque(maxlen=self.window)
            if len(self._by_tenant) > self.tenants:
                self._by_tenant.popitem(last=False)
        else:
            self._by_tenant.move_to_end(tenant)
        output, allowed = max(0, output_per_sequence), max(1, bound)
        samples.append((allowed, output))
        self._since_refresh += 1
        # a cached figure may lag ``refresh`` samples behind, never on the unsafe side: a
        # sample above a cached quantile (the reservation would be too small) clears it
        if (
            self._since_refresh >= self.refresh
            or len(self._cache) > 64
            or any(v is not None and output > v for v in self._cache.values())
        ):
            self._cache.clear()
            self._since_refresh = 0
        else:  # "not learned" for a bound changes only with a sample allowed as much
            for key in [k for k, v in self._cache.items() if v is None and k <= allowed]:
                del self._cache[key]

    def learned(self, bound: int) -> int | None:
        """The quantile for a request allowed ``bound`` tokens a sequence (None: fewer than
        ``min_samples`` samples were allowed at least as much)."""
        if bound in self._cache:
            return self._cache[bound]
        eligible: list[tuple[int, float]] = []
        for samples in self._by_tenant.values():
            outputs = [output for allowed, output in samples if allowed >= bound]
            if outputs:
                weight = 1.0 / len(outputs)
                eligible.extend((output, weight) for output in outputs)
        result: int | None = None
        if len(eligible) >= self.min_samples:
            eligible.sort()
            total = sum(weight for _, weight in eligible)
            goal, acc = self.quantile * total, 0.0
            result = eligible[-1][0]
            for output, weight in eligible:
                acc += weight
                if acc >= goal - 1e-9:
                    result = output
                    break
            result = max(1, result)
        self._cache[bound] = result
        return result

    def reserve_output(self, bound: int) -> int:
        """Output tokens per sequence to reserve for a request whose bound is ``bound``."""
        learned = self.learned(bound)
        return bound if learned is None else min(bound, learned)


@dataclass
class OvercommitRatio:
    """The fraction of their learned output that lower tiers reserve (1 = no overcommit)."""

    minimum: float = 0.5  # never reserve less than this fraction
    step: float = 0.01  # creep down per quiet engine poll while the engines are busy
    backoff: float = 0.1  # jump up per engine poll that saw preemptions
    busy_usage: float = 0.5  # measured KV usage from which a quiet poll is evidence
    value: float = 1.0

    def observe_poll(
        self, preemptions: int, max_usage: float | None = None, periods: float = 1.0
    ) -> float:
        """One poll of the engines: ``preemptions`` new since the last poll, the highest
        measured KV usage (None: unknown, counted as busy), over ``periods`` poll periods
        (a gateway replica of N polls every N periods: its quiet poll creeps N steps)."""
        if preemptions > 0:
            self.value = min(1.0, self.value + self.backoff)
        elif max_usage is None or max_usage >= self.busy_usage:
            self.value = max(self.minimum, self.value - self.step * periods)
        return self.value

    def reserve(self, output: int) -> int:
        """Output tokens a lower-tier request reserves of its learned ``output``."""
        return max(1, math.ceil(output * self.value)) if output > 0 else 0
