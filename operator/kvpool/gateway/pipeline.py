"""The request pipeline: from an API key and a body to an admitted request, and its end.

Why this module exists: the gateway's request path is a chain of pure decisions from
:mod:`kvpool.domain` with the I/O at the edges; this module is that chain, without HTTP
(the handlers are in :mod:`kvpool.gateway.server`), so it reads top to bottom and the
decision benchmark can drive it directly:

1. authenticate (:meth:`RequestPipeline.authenticate`, once, before the body is read):
   ``Authorization: Bearer <key>`` -> its digest (:func:`kvpool.domain.api_keys.api_key_digest`,
   the operator's own) -> tenant. The lookup is by digest and confirmed with a
   constant-time compare; a missing and an unknown key get the same 401 body, so nobody
   learns whether a tenant exists;
2. parse and check the body (:mod:`kvpool.gateway.request`; the caller's ``priority`` is
   dropped), find the pool by ``model`` (404 if unknown);
3. classify (``decide_tier``): tier from path, host and tenant labels; 403 if the tenant
   may not use it;
4. estimate (``decide_estimate``, the engine's rules) with the pool's tokenizer; parsing,
   chat template and tokenization run on worker threads within size and time bounds
   (:mod:`kvpool.gateway.body`), never on the event loop; a long prompt is sized by a
   learned bound instead (:mod:`kvpool.domain.prompt_bound`), which the engine's reported
   prompt tokens correct at step 8;
5. budget: charge the *bound* (prompt + all the engine may generate); over budget -> 429
   with ``Retry-After``, or, for ``overBudget: Demote`` tenants, the next lower tier the
   tenant may use (a demoted request is not charged); Redis down and the tier declares
   ``budgetUnavailable: Reject`` -> 503;
6. route the track (``decide_track``), then admit (``AdmissionController.offer`` via
   the pool's :class:`~kvpool.gateway.pool_runtime.PoolRuntime` from the
   :class:`~kvpool.gateway.registry.PoolRegistry`; it also picks the replica), with the
   tenant's limits as this replica enforces them (:mod:`kvpool.gateway.capacity`);
   Queue -> wait; Reject -> the status of its reason (:mod:`kvpool.gateway.outcomes`);
7. (the handler sends it upstream, :mod:`kvpool.gateway.upstream`);
8. :meth:`RequestPipeline.finish`, always: release the reservation (unless
   :meth:`RequestPipeline.release` gave it back already, when the engine's stream ended),
   settle the budget with what the engine generated (``decide_settlement`` on the
   :class:`~kvpool.gateway.usage.Usage` the upstream reported: its usage; 0 if it never
   got the request; the reservation if the request was cut short), then build one
   :class:`~kvpool.gateway.outcomes.Outcome` that the metrics and the JSON access log
   both read.

Each request reads the :class:`~kvpool.gateway.config_index.ConfigIndex` it was given from
authentication to admission, so a reload in between changes nothing for it.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import json
import logging
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from kvpool.adapters.background import BackgroundTasks
from kvpool.adapters.budget import BudgetStore, BudgetUnavailable, StoreVerdict, budget_subject
from kvpool.api.admission_config import (
    CompiledPool,
    CompiledTenant,
    CompiledTier,
    CompiledTierPolicy,
)
from kvpool.domain.admission import Admit, build_admission_request
from kvpool.domain.api_keys import api_key_digest
from kvpool.domain.budget import (
    BudgetAllow,
    BudgetCharge,
    BudgetDeny,
    decide_settlement,
    format_window,
)
from kvpool.domain.classify import Demoted, TierForbidden, decide_demotion, decide_tier
from kvpool.domain.estimate import (
    REASON_INVALID_MAX_TOKENS,
    REASON_INVALID_N,
    REASON_MAX_TOKENS_TOO_LARGE,
    REASON_PROMPT_TOO_LONG,
    Estimate,
    EstimateRejected,
    PromptSize,
    decide_estimate,
)
from kvpool.domain.routing import NoTrack, decide_track
from kvpool.gateway.body import BodyWorker
from kvpool.gateway.budget_overlap import BudgetOverlap
from kvpool.gateway.capacity import CapacityShare
from kvpool.gateway.config_index import ConfigIndex
from kvpool.gateway.errors import AUTHENTICATION, NOT_FOUND, OVERLOADED, GatewayError
from kvpool.gateway.metrics import GatewayMetrics
from kvpool.gateway.outcomes import (
    REASON_BUDGET_EXCEEDED,
    REASON_BUDGET_UNAVAILABLE,
    Outcome,
    error_for,
)
from kvpool.gateway.pool_runtime import PoolRuntime
from kvpool.gateway.registry import PoolRegistry
from kvpool.gateway.request import Kind, ParsedRequest
from kvpool.gateway.usage import Usage, request_clock

log = logging.getLogger("kvpool.gateway")
access_log = logging.getLogger("kvpool.access")

ESTIMATE_PARAMS = {
    REASON_PROMPT_TOO_LONG: "prompt",
    REASON_INVALID_MAX_TOKENS: "max_tokens",
    REASON_MAX_TOKENS_TOO_LARGE: "max_tokens",
    REASON_INVALID_N: "n",
}
UNAUTHORIZED = GatewayError(401, "invalid_api_key", "invalid or missing API key", AUTHENTICATION)


@dataclass
class PendingCharge:
    """A budget charge still on its way while its request went ahead to the engine."""

    task: asyncio.Task[StoreVerdict]
    tokens: int  # what it charges (the bound)
    policy: CompiledTierPolicy  # for a demotion


REDO_DEMOTED = "budget_demoted"
"""The code of the answer a request sent ahead gets when its verdict demotes it: the
handler admits it again, in its lower tier, and nothing reaches the client before that."""


@dataclass
class Admission:
    """Everything :meth:`RequestPipeline.finish` needs about an admitted request."""

    request_id: str
    tenant: CompiledTenant
    pool: CompiledPool
    tier: CompiledTier
    estimate: Estimate
    admit: Admit
    runtime: PoolRuntime
    charge: BudgetCharge | None
    demoted: bool
    started: float  # request_clock() at arrival
    bounded_bytes: int = 0  # its one prompt's UTF-8 bytes when sized by the bound
    on_first_token: Callable[[], None] | None = None  # ends its replica's prefill hold
    released: bool = False  # its reservation was given back (release() is idempotent)
    pending: PendingCharge | None = None  # sent ahead of its budget verdict, until confirmed
    ahead: bool = False  # it was sent ahead of its budget verdict (the access log says so)


def _demotion(
    deny: BudgetDeny, tenant: CompiledTenant, policy: CompiledTierPolicy, tier: CompiledTier
) -> Demoted | None:
    """The lower tier an over-budget request runs in (``overBudget: Demote``, a request
    that fits the limit at all, a lower tier the tenant may use), or None: refused."""
    if tenant.over_budget != "Demote" or deny.never_fits:
        return None
    demotion = decide_demotion(policy, tenant, tier.name)
    return demotion if isinstance(demotion, Demoted) else None


def _ms(seconds: float | None) -> float | None:
    return round(seconds * 1000, 2) if seconds is not None else None


class RequestPipeline:
    """Steps 1-6 and 8 of one gateway process (no HTTP)."""

    def __init__(
        self,
        store: BudgetStore,
        metrics: GatewayMetrics,
        body: BodyWorker,
        registry: PoolRegistry,
        capacity: CapacityShare,
        tasks: BackgroundTasks,
        *,
        access_log: bool = True,
        wall_clock: Callable[[], float] = time.time,
        overlap: BudgetOverlap | None = None,
    ) -> None:
        """``overlap``: send requests to their engine ahead of their budget verdict where
        its view allows (None: every request waits for its verdict)."""
        self.store = store
        self.overlap = overlap
        self.metrics = metrics
        self.body = body
        self.registry = registry
        self.capacity = capacity
        self.access_log = access_log
        self.wall_clock = wall_clock
        self._tasks = tasks  # budget settlements against a remote store
        self._ids = itertools.count(1)
        self._prefix = f"{os.getpid():x}-{random.getrandbits(24):06x}"

    # -- decisions (steps 1-6) -------------------------------------------------------------

    def authenticate(self, authorization: str | None, index: ConfigIndex) -> CompiledTenant:
        """The tenant of a ``Bearer`` key, or 401 (same answer for missing and unknown)."""
        if not authorization or not authorization.startswith("Bearer "):
            raise UNAUTHORIZED
        digest = api_key_digest(authorization[len("Bearer ") :])
        tenant = index.tenants.get(digest)
        if tenant is None or not any(hmac.compare_digest(d, digest) for d in tenant.key_digests()):
            raise UNAUTHORIZED
        return tenant

    async def _size_prompt(
        self, pool: CompiledPool, parsed: ParsedRequest, prompt: Any, utf8_bytes: int
    ) -> PromptSize:
        """The size of the chat (``prompt`` None) or of one completions prompt: exact, or a
        long prompt's learned bound, worked out off the event loop within the body
        worker's bounds."""
        size = await self.body.size_prompt(pool, parsed, prompt, utf8_bytes)
        method = "bound" if size.bound else "tokenizer" if size.tokens is not None else "fallback"
        self.metrics.estimates.labels(pool.name, method).inc()
        return size

    async def _estimate(self, pool: CompiledPool, parsed: ParsedRequest) -> tuple[Estimate, int]:
        """The estimate, and the UTF-8 bytes of its prompt when it is one prompt sized by
        the bound (0 otherwise: the engine's report of it then teaches nothing new)."""
        if parsed.messages is not None:
            prompts = [await self._size_prompt(pool, parsed, None, parsed.prompt_utf8_bytes)]
        else:
            prompts = [
                await self._size_prompt(pool, parsed, prompt, size)
                for prompt, size in zip(parsed.prompts, parsed.prompt_sizes, strict=True)
            ]
        verdict = decide_estimate(pool, prompts=prompts, max_tokens=parsed.max_tokens, n=parsed.n)
        if isinstance(verdict, EstimateRejected):
            param = ESTIMATE_PARAMS.get(verdict.reason)
            if param == "prompt" and parsed.messages is not None:
                param = "messages"
            raise error_for(verdict.reason, verdict.message, param=param)
        bounded = prompts[0].utf8_bytes if len(prompts) == 1 and prompts[0].bound else 0
        return verdict, bounded

    async def _charge(
        self,
        index: ConfigIndex,
        tenant: CompiledTenant,
        policy: CompiledTierPolicy,
        pool: CompiledPool,
        tier: CompiledTier,
        tokens: int,
    ) -> tuple[BudgetCharge | None, CompiledTier, bool]:
        """Charge the budget: (charge, tier to use, demoted) or an error."""
        if not tenant.limits:
            return None, tier, False
        subject = budget_subject(index.config.namespace, tenant.tenant)
        verdict = await self._reserve(subject, tenant, tier, tokens, self.wall_clock())
        return self._judge(verdict, tenant, policy, pool, tier, tokens)

    async def _reserve(
        self,
        subject: str,
        tenant: CompiledTenant,
        tier: CompiledTier,
        tokens: int,
        now: float,
    ) -> StoreVerdict:
        """The store's verdict on charging ``tokens``, which also updates the view."""
        verdict = await self.store.reserve(
            subject,
            tenant.limits,
            tokens,
            now,
            tier=tier.name,
            when_unavailable=tier.budget_unavailable,
        )
        if self.overlap is not None and not isinstance(verdict, BudgetUnavailable):
            self.overlap.seen(subject, tokens, verdict, now)
        return verdict

    def _judge(
        self,
        verdict: StoreVerdict,
        tenant: CompiledTenant,
        policy: CompiledTierPolicy,
        pool: CompiledPool,
        tier: CompiledTier,
        tokens: int,
    ) -> tuple[BudgetCharge | None, CompiledTier, bool]:
        """What a verdict means for the request: (charge, tier to use, demoted) or an
        error (429 over budget, 503 budget unavailable on a tier that fails closed)."""
        if isinstance(verdict, BudgetAllow):
            for usage in verdict.usage:
                window = format_window(usage.window.window_seconds)
                self.metrics.budget_used.labels(tenant.tenant, window).set(usage.tokens + tokens)
                self.metrics.budget_limit.labels(tenant.tenant, window).set(usage.window.tokens)
            return verdict.charge, tier, False
        if isinstance(verdict, BudgetUnavailable):
            self.metrics.decisions.labels(pool.name, tier.name, "rejected-unavailable").inc()
            raise error_for(
                REASON_BUDGET_UNAVAILABLE, verdict.reason, retry_after=verdict.retry_after
            )
        assert isinstance(verdict, BudgetDeny)
        demotion = _demotion(verdict, tenant, policy, tier)
        if demotion is not None:
            self.metrics.decisions.labels(pool.name, tier.name, "demoted").inc()
            return None, demotion.tier, True
        self.metrics.decisions.labels(pool.name, tier.name, "rejected-budget").inc()
        raise error_for(REASON_BUDGET_EXCEEDED, verdict.reason, retry_after=verdict.retry_after)

    async def admit(
        self,
        index: ConfigIndex,
        tenant: CompiledTenant,
        kind: Kind,
        raw: bytes,
        path: str,
        host: str | None,
        *,
        ahead: bool = True,
    ) -> tuple[Admission, ParsedRequest]:
        """Steps 2-6 for an authenticated ``tenant``: an admitted request (reservation and
        budget charged) or a GatewayError. Its durations count from now (the body is in:
        a client slow to upload is not the engine's time to first token).

        With ``ahead`` (and the pipeline's ``overlap``), a request whose tenant's view
        leaves room is admitted while its budget charge is on its way: it carries the
        charge as ``pending``, and :meth:`confirm_budget` must pass before any byte of
        its answer goes to the client."""
        started = request_clock()
        parsed = await self.body.parse(kind, raw)  # off the event loop, bounded
        pool = index.pools.get(parsed.model)
        if pool is None:
            raise GatewayError(
                404,
                "model_not_found",
                f"the model {parsed.model!r} does not exist",
                NOT_FOUND,
                param="model",
            )
        policy = index.policies.get(pool.tier_policy)
        runtime = self.registry.runtimes.get(pool.name)
        if policy is None or runtime is None:
            raise GatewayError(
                503,
                "pool_not_ready",
                f"model {parsed.model!r} has no admission plan",
                OVERLOADED,
                5.0,
            )
        classified = decide_tier(policy, tenant, path, host)
        if isinstance(classified, TierForbidden):
            self.metrics.decisions.labels(pool.name, classified.tier, "forbidden").inc()
            raise error_for(classified.reason, classified.message)
        tier = classified.tier
        try:
            estimate, bounded_bytes = await self._estimate(pool, parsed)
        except GatewayError:
            self.metrics.decisions.labels(pool.name, tier.name, "rejected-estimate").inc()
            raise
        pending = self._send_ahead(
            index, tenant, policy, tier, estimate.charge_tokens, ahead and parsed.stream
        )
        if pending is None:
            charge, tier, demoted = await self._charge(
                index, tenant, policy, pool, tier, estimate.charge_tokens
            )
        else:
            charge, demoted = None, False
        try:
            track = decide_track(pool, tier.name, random.random())
            if isinstance(track, NoTrack):
                raise error_for(
                    track.reason, f"model {parsed.model!r} has no ready engine", retry_after=2.0
                )
            request_id = f"{self._prefix}-{next(self._ids)}"
            adaptation = self.registry.adaptations.get(pool.name)
            if adaptation is not None:  # reserve what the tier's requests use, not the bound
                estimate = adaptation.reserve(tier.name, estimate)
            enforced = self.capacity.tenant_view(tenant, pool.name)  # this replica's limits
            areq = build_admission_request(
                request_id, enforced, tier.name, estimate, track.track.name
            )
            verdict = await runtime.admit(areq)
            if not isinstance(verdict, Admit):
                if verdict.detail:  # the figures are the operator's, not the tenant's
                    log.info(
                        "request %s of tenant %s to pool %s tier %s rejected (%s): %s",
                        request_id,
                        tenant.tenant,
                        pool.name,
                        verdict.tier,
                        verdict.reason,
                        verdict.detail,
                    )
                raise error_for(
                    verdict.reason, verdict.message, retry_after=verdict.retry_after_seconds
                )
        except BaseException:
            await self._uncharge(charge, pending)
            raise
        admission = Admission(
            request_id=request_id,
            tenant=tenant,
            pool=pool,
            tier=tier,
            estimate=estimate,
            admit=verdict,
            runtime=runtime,
            charge=charge,
            demoted=demoted,
            started=started,
            bounded_bytes=bounded_bytes,
            # its replica's prefill hold ends at the first token
            on_first_token=(
                partial(runtime.first_token, verdict.reservation_id)
                if tier.ttft_p95_target_seconds
                else None
            ),
            pending=pending,
            ahead=pending is not None,
        )
        return admission, parsed

    # -- the budget verdict overlapping the engine's prefill ----------------------------

    def _send_ahead(
        self,
        index: ConfigIndex,
        tenant: CompiledTenant,
        policy: CompiledTierPolicy,
        tier: CompiledTier,
        tokens: int,
        ahead: bool,
    ) -> PendingCharge | None:
        """Start the budget charge without waiting for it, when the tenant's view allows
        (:mod:`kvpool.domain.budget_overlap`); None: the request waits for its verdict.

        Only streams go ahead (``ahead`` is False for the others): a stream's first chunk
        comes after the prefill, so its gate is shut long before the engine did much; a
        non-streaming answer comes whole, so a refusal would waste all of its output."""
        if not tenant.limits or not self.store.remote:
            return None  # nothing to charge, or a verdict made in this process: no wait
        if self.overlap is None or not ahead:
            self.metrics.budget_overlap.labels("off" if self.overlap is None else "waited").inc()
            return None
        subject = budget_subject(index.config.namespace, tenant.tenant)
        now = self.wall_clock()
        decision = self.overlap.decide(subject, tenant.limits, tokens, now)
        if decision != "overlap":
            self.metrics.budget_overlap.labels(decision).inc()
            return None
        self.overlap.sent_ahead(subject, tokens)
        overlap = self.overlap
        task = self._tasks.spawn(
            self._reserve(subject, tenant, tier, tokens, now), "budget charge ahead"
        )
        task.add_done_callback(lambda _: overlap.verdict_in(subject, tokens))
        return PendingCharge(task=task, tokens=tokens, policy=policy)

    async def confirm_budget(self, admission: Admission) -> None:
        """The gate before any byte of a request sent ahead goes to its client: wait for
        its budget verdict. Allowed: the charge is the admission's from now on. Refused:
        the GatewayError of the refusal (429, or 503 where the budget is unavailable and
        the tier fails closed); demoted: a GatewayError coded :data:`REDO_DEMOTED`, on
        which the handler admits the request again. Its engine request is aborted in both
        cases, as for a client that left."""
        pending = admission.pending
        if pending is None:
            return
        verdict = await asyncio.shield(pending.task)  # a client gone leaves the charge on
        admission.pending = None
        tier, tenant = admission.tier, admission.tenant
        if (
            isinstance(verdict, BudgetDeny)
            and _demotion(verdict, tenant, pending.policy, tier) is not None
        ):
            self.metrics.budget_overlap.labels("refused").inc()
            raise GatewayError(409, REDO_DEMOTED, "demoted by its budget after it was sent")
        try:
            charge, _, _ = self._judge(
                verdict, tenant, pending.policy, admission.pool, tier, pending.tokens
            )
        except GatewayError:
            self.metrics.budget_overlap.labels("refused").inc()
            raise
        self.metrics.budget_overlap.labels("overlap").inc()
        admission.charge = charge

    def abandon(self, admission: Admission) -> None:
        """Give back a request that its budget demoted after it was sent ahead (nothing
        reached its client; it is admitted again in its lower tier): its reservation ends
        and nothing is recorded for it."""
        self._give_back(admission, None)

    async def _uncharge(self, charge: BudgetCharge | None, pending: PendingCharge | None) -> None:
        """Take back the charge of a request that was not admitted (or the one on its way)."""
        if charge is not None:
            await self._settle(charge, 0)
        if pending is not None:
            self.metrics.budget_overlap.labels("ended").inc()
            self._settle_pending(pending, 0)

    def _settle_pending(
        self, pending: PendingCharge, charged: int, tenant: str | None = None
    ) -> None:
        """Settle a charge sent ahead whose verdict nobody waited for (the request ended
        before its gate): when the verdict allowed it, at ``charged`` tokens (counted in
        ``tenant``'s charged tokens when given)."""

        async def settle_when_known() -> None:
            verdict = await pending.task
            if not isinstance(verdict, BudgetAllow):
                return
            await self._settle_now(verdict.charge, charged, self.wall_clock())
            if tenant is not None:
                for window in verdict.charge.windows:
                    self.metrics.tokens_charged.labels(tenant, format_window(window)).inc(charged)

        self._tasks.spawn(settle_when_known(), "budget settle")

    # -- step 8 ----------------------------------------------------------------------------

    def release(self, admission: Admission, usage: Usage) -> None:
        """Give the reservation back (once): as soon as the engine is done with the request
        (its stream ended, whatever the client still has to read), else in :meth:`finish`."""
        self._give_back(admission, usage.total(admission.estimate.prompt_tokens) or None)

    def hand_over(self, admission: Admission) -> None:
        """Give the reservation back a few tokens before the stream's certain end
        (:mod:`kvpool.domain.handover`): the request admitted into its place reaches the
        engine about when this one ends. Its final size is not known yet, so it feeds no
        estimate-error sample; the budget is settled in :meth:`finish` as always."""
        self._give_back(admission, None)

    @staticmethod
    def _give_back(admission: Admission, actual_tokens: int | None) -> None:
        """End ``admission``'s reservation, once (``actual_tokens``: its size, if known)."""
        if admission.released:
            return
        admission.released = True
        admission.runtime.release(admission.admit.reservation_id, actual_tokens)

    async def finish(self, admission: Admission, status: int, label: str, usage: Usage) -> Outcome:
        """Release the reservation, settle the budget with ``usage``, then record the
        :class:`Outcome` once (metrics and the access log both read it)."""
        estimate = admission.estimate
        actual = usage.total(estimate.prompt_tokens)
        first = usage.first_token_at
        charge, pending = admission.charge, admission.pending
        reserved = charge.tokens if charge else pending.tokens if pending else None
        charged = 0
        if reserved is not None:
            charged = decide_settlement(usage.settlement(reserved, estimate.prompt_tokens))
        if pending is not None:  # it ended before its gate: settle once its verdict is in
            admission.pending = None
            self.metrics.budget_overlap.labels("ended").inc()
            self._settle_pending(pending, charged, admission.tenant.tenant)
        outcome = Outcome(
            status=status,
            label=label,
            actual_tokens=actual,
            charged_tokens=charged,
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            duration_seconds=request_clock() - admission.started,
            ttft_seconds=(first - admission.started) if first is not None else None,
            upstream_ttft_seconds=(
                first - usage.sent_at if first is not None and usage.sent_at is not None else None
            ),
            engine_reported=usage.reported,
        )
        self.release(admission, usage)
        if admission.bounded_bytes and usage.reported and usage.prompt_tokens:
            self.body.engine_counted(
                admission.pool.name, usage.prompt_tokens, admission.bounded_bytes
            )
        if admission.charge is not None:
            await self._settle(admission.charge, charged)
        self._record(admission, outcome)
        self._adapt(admission, outcome)
        if self.access_log:
            self._access_log(admission, outcome)
        return outcome

    def _record(self, admission: Admission, outcome: Outcome) -> None:
        """The metrics of one finished request."""
        pool, actual = admission.pool.name, outcome.actual_tokens
        if admission.charge is not None:
            for window in admission.charge.windows:
                self.metrics.tokens_charged.labels(
                    admission.tenant.tenant, format_window(window)
                ).inc(outcome.charged_tokens)
        if actual:
            reserved = admission.admit.tokens  # inside the floor or overcommitted above it
            self.metrics.reserved_tokens.labels(pool).inc(reserved)
            self.metrics.actual_tokens.labels(pool).inc(actual)
            self.metrics.bound_tokens.labels(pool).inc(admission.estimate.charge_tokens)
            self.metrics.estimate_error.labels(pool).observe(reserved - actual)

    def _adapt(self, admission: Admission, outcome: Outcome) -> None:
        """Feed the finished request to its pool's learning: output and TTFT samples."""
        pool, tier = admission.pool.name, admission.tier.name
        if outcome.ttft_seconds is not None:
            self.metrics.ttft.labels(pool, tier).observe(outcome.ttft_seconds)
        adaptation = self.registry.adaptations.get(pool)
        if adaptation is None:
            return
        estimate = admission.estimate
        if outcome.label == "ok" and outcome.engine_reported and outcome.completion_tokens:
            adaptation.settled(
                tier,
                outcome.completion_tokens,
                estimate.sequences,
                bound=estimate.output_limit,
                tenant=admission.tenant.tenant,
            )
        if outcome.ttft_seconds is not None:
            limit = adaptation.ttft(tier, outcome.ttft_seconds, admission.runtime.now())
            limiter = adaptation.limiters.get(tier)
            if limiter is not None and limiter.p95 is not None:
                self.metrics.ttft_p95.labels(pool, tier).set(limiter.p95)
            if limit is not None:
                admission.runtime.set_lent_limit(tier, limit)
                self.metrics.lent_limit.labels(pool, tier).set(limit)

    async def _settle(self, charge: BudgetCharge, actual: int) -> None:
        """Settle a charge. A remote store settles in the background: the answer (a
        non-streaming response is sent after this returns) never waits for Redis."""
        if not self.store.remote:
            await self.store.settle(charge, actual, self.wall_clock())
            return
        self._tasks.spawn(self._settle_now(charge, actual, self.wall_clock()), "budget settle")

    async def _settle_now(self, charge: BudgetCharge, actual: int, now: float) -> None:
        try:
            await self.store.settle(charge, actual, now)
        except Exception as exc:  # a settle failure must not fail anything
            log.warning("budget settle failed: %s", exc)

    def _access_log(self, admission: Admission, outcome: Outcome) -> None:
        access_log.info(
            json.dumps(
                {
                    "ts": round(self.wall_clock(), 3),
                    "request_id": admission.request_id,
                    "tenant": admission.tenant.tenant,
                    "tier": admission.tier.name,
                    "pool": admission.pool.name,
                    "replica": admission.admit.replica,
                    "status": outcome.status,
                    "outcome": outcome.label,
                    "admission": admission.admit.outcome,
                    "demoted": admission.demoted,
                    "budget_ahead": admission.ahead,
                    "queue_ms": _ms(admission.admit.queued_seconds),
                    "duration_ms": _ms(outcome.duration_seconds),
                    "ttft_ms": _ms(outcome.ttft_seconds),
                    "upstream_ttft_ms": _ms(outcome.upstream_ttft_seconds),
                    "reserved_tokens": admission.admit.tokens,
                    "bound_tokens": admission.estimate.charge_tokens,
                    "charged_tokens": outcome.charged_tokens,
                    "prompt_tokens": outcome.prompt_tokens,
                    "completion_tokens": outcome.completion_tokens,
                    "tokens": outcome.actual_tokens,
                    "estimated_prompt": admission.estimate.estimated,
                }
            )
        )
