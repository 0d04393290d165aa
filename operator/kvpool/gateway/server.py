"""The admission gateway: the request path from an API key to an engine and back.

Why this module exists: it is the orchestration of the steps of issue 4, each a pure
decision in :mod:`kvpool.domain` with the I/O at the edges:

1. authenticate: ``Authorization: Bearer <key>`` -> SHA-256 -> tenant. The lookup is by
   digest and confirmed with a constant-time compare; a missing and an unknown key get
   the same 401 body, so nobody learns whether a tenant exists;
2. parse and check the body (:mod:`kvpool.gateway.request`; the caller's ``priority`` is
   dropped), find the pool by ``model`` (404 if unknown);
3. classify (``decide_tier``): tier from path, host and tenant labels; 403 if the tenant
   may not use it;
4. estimate (``decide_estimate``) with the pool's tokenizer when there is one;
5. budget: charge the reservation (``BudgetStore.reserve``); over budget -> 429 with
   ``Retry-After``, or, for ``overBudget: Demote`` tenants, the next lower tier the tenant
   may use (``decide_demotion``; a demoted request is not charged - it runs at the lower
   tier's priority and floor instead); Redis down and the tier fails closed -> 503;
6. route the track (``decide_track``), then admit (``AdmissionController.offer`` via
   :class:`~kvpool.gateway.pool_runtime.PoolRuntime`; it also picks the replica);
   Queue -> wait; Reject -> 503/413 with ``Retry-After`` and the reason;
7. proxy (:mod:`kvpool.gateway.proxy`) with the tier's engine ``priority``;
8. finally, always: release the reservation, settle the budget with the real usage (0 if
   the engine did nothing), record metrics and one JSON access-log line.

:meth:`Gateway.admit` (steps 1-6) and :meth:`Gateway.finish` (step 8) are usable without
HTTP, which is how the decision benchmark measures them.

Config reload: :meth:`Gateway.apply_config` swaps an immutable :class:`ConfigIndex` in one
assignment (a request keeps the index it started with) and reconfigures each pool's
controller (in-flight reservations are kept; pools that left have their waiters rejected).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import logging
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from kvpool.adapters.budget_store import BudgetStore, BudgetUnavailable, InMemoryBudgetStore
from kvpool.adapters.tokenizer import TokenizerCache
from kvpool.api.admission_config import (
    AdmissionConfig,
    CompiledPool,
    CompiledTenant,
    CompiledTier,
    CompiledTierPolicy,
)
from kvpool.domain.admission import Admit, build_admission_request
from kvpool.domain.budget import BudgetAllow, BudgetCharge, BudgetDeny, format_window
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
from kvpool.domain.partition import partition_pool
from kvpool.domain.routing import NoTrack, decide_track
from kvpool.gateway.errors import (
    AUTHENTICATION,
    NOT_FOUND,
    OVERLOADED,
    PERMISSION,
    RATE_LIMIT,
    SERVER,
    GatewayError,
)
from kvpool.gateway.metrics import GatewayMetrics
from kvpool.gateway.pool_runtime import PoolRuntime
from kvpool.gateway.proxy import (
    StreamBrokenError,
    UpstreamError,
    UsageMeter,
    build_upstream_body,
    proxy_request,
)
from kvpool.gateway.request import Kind, ParsedRequest, bound_upstream_output, parse_request

log = logging.getLogger("kvpool.gateway")
access_log = logging.getLogger("kvpool.access")

ROUTES: dict[str, Kind] = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}
ESTIMATE_PARAMS = {
    REASON_PROMPT_TOO_LONG: "prompt",
    REASON_INVALID_MAX_TOKENS: "max_tokens",
    REASON_MAX_TOKENS_TOO_LARGE: "max_tokens",
    REASON_INVALID_N: "n",
}
UNAUTHORIZED = GatewayError(401, "invalid_api_key", "invalid or missing API key", AUTHENTICATION)


@dataclass(frozen=True)
class GatewaySettings:
    """Knobs of one gateway process (from the command line)."""

    max_body_bytes: int = 8 * 1024 * 1024  # larger bodies: 413
    upstream_connect_timeout: float = 2.0  # seconds to connect to an engine
    upstream_timeout: float = 600.0  # seconds for a whole engine answer
    set_engine_priority: bool = True  # engines run --scheduling-policy priority
    replica_retry_seconds: float = 2.0  # an unreachable replica rests this long
    access_log: bool = True
    plan_share_percent: int = 100  # this replica's share of each plan (100/N for N gateways)


@dataclass(frozen=True)
class ConfigIndex:
    """One config, indexed for the request path. Immutable: replaced whole on reload."""

    config: AdmissionConfig
    tenants: dict[str, CompiledTenant]  # key sha256 hex -> tenant
    pools: dict[str, CompiledPool]  # served name -> pool
    policies: dict[str, CompiledTierPolicy]  # name -> policy

    @classmethod
    def build(cls, config: AdmissionConfig) -> ConfigIndex:
        """Index a config."""
        return cls(
            config=config,
            tenants={t.key_sha256: t for t in config.tenants},
            pools={p.served_name: p for p in config.pools},
            policies={p.name: p for p in config.tier_policies},
        )

    def tiers_of(self, pool: CompiledPool) -> list[CompiledTier]:
        """The tiers of a pool's policy (empty if the policy is missing)."""
        policy = self.policies.get(pool.tier_policy)
        return list(policy.tiers) if policy is not None else []


@dataclass
class Admission:
    """Everything :meth:`Gateway.finish` needs about an admitted request."""

    request_id: str
    tenant: CompiledTenant
    pool: CompiledPool
    tier: CompiledTier
    estimate: Estimate
    admit: Admit
    runtime: PoolRuntime
    charge: BudgetCharge | None
    demoted: bool
    started: float
    meter: UsageMeter = field(default_factory=UsageMeter)


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


class Gateway:
    """The gateway of one process: config, budgets, admission per pool, metrics."""

    def __init__(
        self,
        config: AdmissionConfig,
        store: BudgetStore,
        *,
        settings: GatewaySettings | None = None,
        metrics: GatewayMetrics | None = None,
        tokenizers: TokenizerCache | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings or GatewaySettings()
        self.store = store
        self.metrics = metrics or GatewayMetrics()
        self.tokenizers = tokenizers or TokenizerCache()
        self.wall_clock = wall_clock
        self.index = ConfigIndex.build(config)
        self.runtimes: dict[str, PoolRuntime] = {}
        self._ids = itertools.count(1)
        self._prefix = f"{os.getpid():x}-{random.getrandbits(24):06x}"
        self._session: aiohttp.ClientSession | None = None
        self._started = False
        self._background: set[asyncio.Task[None]] = set()  # settlements in flight
        self.metrics.watch_snapshots(lambda: [r.snapshot() for r in self.runtimes.values()])
        self._config_info(config)

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Create the controllers and the upstream connection pool (on the running loop)."""
        self._sync_runtimes(self.index)
        timeout = aiohttp.ClientTimeout(
            total=self.settings.upstream_timeout,
            sock_connect=self.settings.upstream_connect_timeout,
        )
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, enable_cleanup_closed=True)
        self._session = aiohttp.ClientSession(
            timeout=timeout, connector=connector, auto_decompress=False
        )
        self._started = True

    async def stop(self) -> None:
        """Close the upstream pool and the budget store (after pending settlements)."""
        for runtime in self.runtimes.values():
            runtime.close()
        if self._background:
            await asyncio.wait(set(self._background), timeout=5)
        if self._session is not None:
            await self._session.close()
        await self.store.close()

    def apply_config(self, config: AdmissionConfig) -> None:
        """Swap in a new config; in-flight requests keep theirs and their reservations."""
        index = ConfigIndex.build(config)
        self.index = index
        if self._started:
            self._sync_runtimes(index)
        self.metrics.config_reloads.labels("applied").inc()
        self._config_info(config)

    def config_rejected(self, reason: str) -> None:
        """A new config did not parse; the old one stays."""
        self.metrics.config_reloads.labels("rejected").inc()

    def _config_info(self, config: AdmissionConfig) -> None:
        self.metrics.config_info.clear()
        self.metrics.config_info.labels(config.namespace, config.generated_at or "").set(1)

    def _sync_runtimes(self, index: ConfigIndex) -> None:
        names = {p.name for p in index.config.pools}
        for compiled in index.config.pools:
            tiers = index.tiers_of(compiled)
            pool = partition_pool(compiled, self.settings.plan_share_percent)
            runtime = self.runtimes.get(pool.name)
            if runtime is None:
                self.runtimes[pool.name] = PoolRuntime(
                    pool, tiers, self.metrics, self.settings.replica_retry_seconds
                )
            else:
                runtime.reconfigure(pool, tiers)
        for name in [n for n in self.runtimes if n not in names]:
            self.runtimes.pop(name).close()

    # -- decisions (steps 1-6) -------------------------------------------------------------

    def authenticate(self, authorization: str | None, index: ConfigIndex) -> CompiledTenant:
        """The tenant of a ``Bearer`` key, or 401 (same answer for missing and unknown)."""
        if not authorization or not authorization.startswith("Bearer "):
            raise UNAUTHORIZED
        digest = _digest(authorization[len("Bearer ") :].strip())
        tenant = index.tenants.get(digest)
        if tenant is None or not hmac.compare_digest(tenant.key_sha256, digest):
            raise UNAUTHORIZED
        return tenant

    def _count_prompt(self, pool: CompiledPool, parsed: ParsedRequest, prompt: Any) -> int | None:
        """The exact token count of the chat (``prompt`` None) or of one completions prompt."""
        tokenizer = self.tokenizers.get(pool.tokenizer_path)
        count: int | None = None
        if parsed.messages is None and isinstance(prompt, list):
            count = len(prompt)  # token ids: exact without a tokenizer
        elif tokenizer is not None:
            try:
                if parsed.messages is not None:
                    count = tokenizer.count_chat(parsed.messages)
                else:
                    count = tokenizer.count_prompt(prompt)
            except Exception as exc:  # content the tokenizer cannot encode
                log.debug("tokenizer failed on a request: %s", exc)
                count = None
        self.metrics.estimates.labels(
            pool.name, "tokenizer" if count is not None else "fallback"
        ).inc()
        return count

    def _estimate(self, pool: CompiledPool, parsed: ParsedRequest) -> Estimate:
        if parsed.messages is not None:
            prompts = [
                PromptSize(
                    self._count_prompt(pool, parsed, None),
                    parsed.prompt_utf8_bytes,
                    len(parsed.messages),
                )
            ]
        else:
            prompts = [
                PromptSize(self._count_prompt(pool, parsed, prompt), size)
                for prompt, size in zip(parsed.prompts, parsed.prompt_sizes, strict=True)
            ]
        verdict = decide_estimate(pool, prompts=prompts, max_tokens=parsed.max_tokens, n=parsed.n)
        if isinstance(verdict, EstimateRejected):
            param = ESTIMATE_PARAMS.get(verdict.reason)
            if param == "prompt" and parsed.messages is not None:
                param = "messages"
            raise GatewayError(verdict.http_status, verdict.reason, verdict.message, param=param)
        return verdict

    async def _charge(
        self,
        tenant: CompiledTenant,
        policy: CompiledTierPolicy,
        pool: CompiledPool,
        tier: CompiledTier,
        tokens: int,
    ) -> tuple[BudgetCharge | None, CompiledTier, bool]:
        """Charge the budget: (charge, tier to use, demoted) or an error."""
        if not tenant.limits:
            return None, tier, False
        verdict = await self.store.reserve(
            tenant.tenant, tenant.limits, tokens, self.wall_clock(), tier=tier.name
        )
        if not getattr(self.store, "available", True):
            result = "unavailable" if isinstance(verdict, BudgetUnavailable) else "local"
            self.metrics.budget_fallback.labels(tier.name, result).inc()
        if isinstance(verdict, BudgetAllow):
            for usage in verdict.usage:
                window = format_window(usage.window.window_seconds)
                self.metrics.budget_used.labels(tenant.tenant, window).set(usage.tokens + tokens)
            return verdict.charge, tier, False
        if isinstance(verdict, BudgetUnavailable):
            self.metrics.decisions.labels(pool.name, tier.name, "rejected-unavailable").inc()
            raise GatewayError(
                503, "budget_unavailable", verdict.reason, OVERLOADED, verdict.retry_after
            )
        assert isinstance(verdict, BudgetDeny)
        if tenant.over_budget == "Demote" and not verdict.never_fits:
            demotion = decide_demotion(policy, tenant, tier.name)
            if isinstance(demotion, Demoted):
                self.metrics.decisions.labels(pool.name, tier.name, "demoted").inc()
                return None, demotion.tier, True
        self.metrics.decisions.labels(pool.name, tier.name, "rejected-budget").inc()
        raise GatewayError(429, "budget_exceeded", verdict.reason, RATE_LIMIT, verdict.retry_after)

    async def admit(
        self, kind: Kind, raw: bytes, authorization: str | None, path: str, host: str | None
    ) -> tuple[Admission, ParsedRequest]:
        """Steps 1-6: an admitted request (reservation and budget charged) or a GatewayError."""
        index = self.index
        started = asyncio.get_running_loop().time()
        tenant = self.authenticate(authorization, index)
        parsed = parse_request(kind, raw)
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
        runtime = self.runtimes.get(pool.name)
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
            raise GatewayError(403, classified.reason, classified.message, PERMISSION)
        tier = classified.tier
        try:
            estimate = self._estimate(pool, parsed)
        except GatewayError:
            self.metrics.decisions.labels(pool.name, tier.name, "rejected-estimate").inc()
            raise
        charge, tier, demoted = await self._charge(
            tenant, policy, pool, tier, estimate.charge_tokens
        )
        try:
            track = decide_track(pool, tier.name, random.random())
            if isinstance(track, NoTrack):
                raise GatewayError(
                    503,
                    track.reason,
                    f"model {parsed.model!r} has no ready engine",
                    OVERLOADED,
                    2.0,
                )
            request_id = f"{self._prefix}-{next(self._ids)}"
            areq = build_admission_request(
                request_id, tenant, tier.name, estimate, track.track.name
            )
            verdict = await runtime.admit(areq)
            if not isinstance(verdict, Admit):
                raise GatewayError(
                    verdict.http_status,
                    verdict.reason,
                    verdict.message,
                    OVERLOADED,
                    verdict.retry_after_seconds,
                )
        except BaseException:
            if charge is not None:
                await self._settle(charge, 0)
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
        )
        return admission, parsed

    # -- step 8 ----------------------------------------------------------------------------

    async def finish(self, admission: Admission, status: int, outcome: str) -> None:
        """Release the reservation, settle the budget, record metrics and the access log."""
        estimate = admission.estimate
        actual = admission.meter.total(estimate.prompt_tokens)
        admission.runtime.release(admission.admit.reservation_id, actual or None)
        if admission.charge is not None:
            await self._settle(admission.charge, actual)
            for window in admission.charge.windows:
                self.metrics.tokens_charged.labels(
                    admission.tenant.tenant, format_window(window)
                ).inc(actual)
        pool = admission.pool.name
        if actual:
            self.metrics.reserved_tokens.labels(pool).inc(estimate.tokens)
            self.metrics.actual_tokens.labels(pool).inc(actual)
            self.metrics.bound_tokens.labels(pool).inc(estimate.charge_tokens)
            self.metrics.estimate_error.labels(pool).observe(estimate.tokens - actual)
        if self.settings.access_log:
            self._access_log(admission, status, outcome, actual)

    async def _settle(self, charge: BudgetCharge, actual: int) -> None:
        """Settle a charge. A remote store settles in the background: the answer (a
        non-streaming response is sent after this returns) never waits for Redis."""
        if isinstance(self.store, InMemoryBudgetStore):
            await self.store.settle(charge, actual, self.wall_clock())
            return
        task = asyncio.create_task(self._settle_now(charge, actual, self.wall_clock()))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _settle_now(self, charge: BudgetCharge, actual: int, now: float) -> None:
        try:
            await self.store.settle(charge, actual, now)
        except Exception as exc:  # a settle failure must not fail anything
            log.warning("budget settle failed: %s", exc)

    def _access_log(self, admission: Admission, status: int, outcome: str, actual: int) -> None:
        now = asyncio.get_running_loop().time()
        meter = admission.meter
        access_log.info(
            json.dumps(
                {
                    "ts": round(self.wall_clock(), 3),
                    "request_id": admission.request_id,
                    "tenant": admission.tenant.tenant,
                    "tier": admission.tier.name,
                    "pool": admission.pool.name,
                    "replica": admission.admit.replica,
                    "status": status,
                    "outcome": outcome,
                    "admission": admission.admit.outcome,
                    "demoted": admission.demoted,
                    "queue_ms": round(admission.admit.queued_seconds * 1000, 2),
                    "duration_ms": round((now - admission.started) * 1000, 2),
                    "reserved_tokens": admission.estimate.tokens,
                    "prompt_tokens": meter.prompt_tokens,
                    "completion_tokens": meter.completion_tokens,
                    "tokens": actual,
                    "estimated_prompt": admission.estimate.estimated,
                }
            )
        )

    # -- HTTP ------------------------------------------------------------------------------

    async def _read_body(self, request: web.Request) -> bytes:
        limit = self.settings.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise GatewayError(413, "body_too_large", f"the body is larger than {limit} bytes")
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge as exc:
            raise GatewayError(
                413, "body_too_large", f"the body is larger than {limit} bytes"
            ) from exc

    async def handle_completion(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/chat/completions and /v1/completions."""
        kind = ROUTES[request.path]
        self.authenticate(request.headers.get("Authorization"), self.index)  # before the body
        raw = await self._read_body(request)
        admission, parsed = await self.admit(
            kind, raw, request.headers.get("Authorization"), request.path, request.host
        )
        status, outcome = 500, "error"
        self.metrics.in_flight.inc()
        try:
            url = admission.admit.replica_url
            if url is None:
                raise GatewayError(
                    503, "no_endpoint", "the pool lists no engine endpoint", OVERLOADED, 2.0
                )
            priority = admission.tier.engine_priority if self.settings.set_engine_priority else None
            body = build_upstream_body(
                bound_upstream_output(parsed, admission.estimate.output_limit),
                priority,
                parsed.stream,
            )
            assert self._session is not None, "Gateway.start() was not called"
            try:
                response = await proxy_request(
                    self._session,
                    request,
                    url.rstrip("/") + request.path,
                    body,
                    stream=parsed.stream,
                    caller_wants_usage=parsed.include_usage,
                    meter=admission.meter,
                )
            except UpstreamError as exc:
                self.metrics.upstream_errors.labels(admission.pool.name, exc.kind).inc()
                if exc.replica_down and admission.admit.replica is not None:
                    admission.runtime.mark_replica_down(admission.admit.replica)
                status, outcome = exc.status, exc.code
                raise
            except StreamBrokenError as exc:
                self.metrics.upstream_errors.labels(admission.pool.name, "stream_broken").inc()
                status, outcome = 200, "engine_stream_broken"
                return await exc.finish()
            status, outcome = response.status, "ok" if response.status < 400 else "engine_rejected"
            if admission.meter.client_gone:
                status, outcome = 499, "client_gone"
            return response
        except asyncio.CancelledError:
            status, outcome = 499, "client_gone"
            raise
        finally:
            self.metrics.in_flight.dec()
            await self.finish(admission, status, outcome)

    async def handle_models(self, request: web.Request) -> web.Response:
        """GET /v1/models: the pools' served names."""
        index = self.index
        self.authenticate(request.headers.get("Authorization"), index)
        created = 0
        data = [
            {"id": p.served_name, "object": "model", "created": created, "owned_by": "kvpool"}
            for p in index.config.pools
        ]
        return web.json_response({"object": "list", "data": data})

    async def handle_healthz(self, request: web.Request) -> web.Response:
        """Liveness: the process answers."""
        return web.json_response({"status": "ok"})

    async def handle_readyz(self, request: web.Request) -> web.Response:
        """Readiness: a config with at least one pool is loaded."""
        if not self._started or not self.index.config.pools:
            return web.json_response({"status": "no config"}, status=503)
        return web.json_response({"status": "ready", "pools": len(self.index.config.pools)})

    async def handle_metrics(self, request: web.Request) -> web.Response:
        """Prometheus exposition."""
        return web.Response(body=self.metrics.render(), content_type="text/plain", charset="utf-8")

    @web.middleware
    async def _errors(
        self, request: web.Request, handler: Callable[[web.Request], Any]
    ) -> web.StreamResponse:
        route = (
            request.match_info.route.resource.canonical
            if request.match_info.route.resource
            else "other"
        )
        try:
            response: web.StreamResponse = await handler(request)
        except GatewayError as exc:
            response = exc.response()
        except web.HTTPException as exc:
            error = GatewayError(exc.status, exc.reason.lower().replace(" ", "_"), exc.reason)
            if exc.status == 405:
                error = GatewayError(
                    405, "method_not_allowed", f"{request.method} is not allowed here"
                )
            response = error.response()
        except (asyncio.CancelledError, ConnectionError):
            self.metrics.requests.labels(route, "499").inc()
            raise
        except Exception:
            log.exception("unexpected error on %s %s", request.method, request.path)
            response = GatewayError(
                500, "internal_error", "internal gateway error", SERVER
            ).response()
        self.metrics.requests.labels(route, str(response.status)).inc()
        return response

    def app(self) -> web.Application:
        """The aiohttp application (call :meth:`start` on its startup)."""
        app = web.Application(
            middlewares=[self._errors], client_max_size=self.settings.max_body_bytes
        )
        app.router.add_post("/v1/chat/completions", self.handle_completion)
        app.router.add_post("/v1/completions", self.handle_completion)
        app.router.add_get("/v1/models", self.handle_models)
        app.router.add_get("/healthz", self.handle_healthz)
        app.router.add_get("/readyz", self.handle_readyz)
        app.router.add_get("/metrics", self.handle_metrics)

        async def on_startup(_: web.Application) -> None:
            await self.start()

        async def on_cleanup(_: web.Application) -> None:
            await self.stop()

        app.on_startup.append(on_startup)
        app.on_cleanup.append(on_cleanup)
        return app
