"""The admission gateway's HTTP side: handlers, lifecycle and config reload.

Why this module exists: it turns HTTP requests into calls of the request pipeline
(:mod:`kvpool.gateway.pipeline`: authenticate, parse, classify, estimate, budget, admit,
and the finish that releases, settles and records one ``Outcome``), proxies the admitted
request to its engine (:mod:`kvpool.gateway.proxy`) with the tier's engine ``priority``
under first-token and idle timeouts (a replica that refuses, times out or fails its health
probes is ejected from routing, :mod:`kvpool.gateway.ejection`),
and answers every error in the OpenAI format (statuses from one table,
:mod:`kvpool.gateway.outcomes`). Liveness, readiness and ``/v1/models`` are served here
too; ``/metrics`` (tenant names and usage) on its own port (:meth:`Gateway.metrics_app`).

:meth:`Gateway.admit` (steps 1-6) and :meth:`Gateway.finish` (step 8) are usable without
HTTP, which is how the decision benchmark measures them.

Config reload: :meth:`Gateway.apply_config` swaps an immutable :class:`ConfigIndex` in one
assignment (a request keeps the index it started with) and reconfigures each pool's
controller (in-flight reservations are kept; pools that left have their waiters rejected).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from kvpool.adapters.budget import BudgetStore
from kvpool.adapters.engine_metrics import fetch_engine_load
from kvpool.adapters.tokenizer import TokenizerCache
from kvpool.api.admission_config import AdmissionConfig, CompiledPool, CompiledTier
from kvpool.domain.admission.adaptation import PoolAdaptation
from kvpool.domain.partition import partition_poll_period, partition_pool
from kvpool.gateway.ejection import ReplicaEjector
from kvpool.gateway.errors import OVERLOADED, SERVER, GatewayError
from kvpool.gateway.loop_lag import watch_loop_lag
from kvpool.gateway.metrics import GatewayMetrics
from kvpool.gateway.pipeline import (
    UNAUTHORIZED,
    Admission,
    ConfigIndex,
    RequestPipeline,
)
from kvpool.gateway.pool_runtime import PoolRuntime
from kvpool.gateway.proxy import (
    StreamBrokenError,
    UpstreamError,
    UpstreamLimits,
    build_upstream_body,
    proxy_request,
)
from kvpool.gateway.request import Kind, bound_upstream_output

__all__ = ["UNAUTHORIZED", "Admission", "ConfigIndex", "Gateway", "GatewaySettings"]

log = logging.getLogger("kvpool.gateway")

ROUTES: dict[str, Kind] = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}


@dataclass(frozen=True)
class GatewaySettings:
    """Knobs of one gateway process (from the command line)."""

    max_body_bytes: int = 8 * 1024 * 1024  # larger bodies: 413
    upstream_connect_timeout: float = 2.0  # seconds to connect to an engine
    upstream_first_token_timeout: float = 20.0  # a stream's first token must come by then
    upstream_idle_timeout: float = 30.0  # longest pause between two chunks of a stream
    upstream_timeout: float = 600.0  # seconds for a whole non-streaming answer
    set_engine_priority: bool = True  # engines run --scheduling-policy priority
    health_probe_interval: float = 0.5  # seconds between /health probes (0: no probes)
    health_probe_timeout: float = 1.0  # a probe not answered by then is a failure
    access_log: bool = True
    body_timeout: float = 30.0  # seconds to receive the whole body (then 408)
    metrics_on_api_port: bool = False  # also serve /metrics on the API port (tenant data!)
    plan_share_percent: int = 100  # this replica's share of each plan (100/N for N gateways)
    learn_reservations: bool = True  # reserve learned outputs (False: every request's bound)
    engine_poll_seconds: float = 0.25  # all gateways together poll each engine this often
    borrow_pause_usage: float = 0.97  # measured KV usage that pauses borrowing


class Gateway(RequestPipeline):
    """The gateway of one process: config, budgets, admission per pool, metrics, HTTP."""

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
        super().__init__(
            config,
            store,
            settings or GatewaySettings(),
            metrics or GatewayMetrics(),
            tokenizers or TokenizerCache(),
            wall_clock,
        )
        self._session: aiohttp.ClientSession | None = None
        self._started = False
        self._watchers: list[asyncio.Task[None]] = []  # engine polls, loop lag
        self._preemptions_seen: dict[str, int] = {}  # replica URL -> last preemption total
        self._kv_usage_series: dict[str, set[str]] = {}  # pool -> replicas with a usage gauge
        self._config_generation = 0  # configs applied (a late tokenizer load is ignored)
        self.metrics.watch_snapshots(
            lambda: [s for r in self.runtimes.values() for s in r.track_snapshots()]
        )
        self.ejector = ReplicaEjector(
            self.metrics,
            lambda: self.runtimes,
            probe_interval=self.settings.health_probe_interval,
            probe_timeout=self.settings.health_probe_timeout,
        )
        self._config_info(config)

    @property
    def upstream_limits(self) -> UpstreamLimits:
        """The upstream timeouts from the settings."""
        s = self.settings
        return UpstreamLimits(
            connect=s.upstream_connect_timeout,
            first_token=s.upstream_first_token_timeout,
            idle=s.upstream_idle_timeout,
            total=s.upstream_timeout,
        )

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Create the controllers and the upstream connection pool (on the running loop)."""
        self._sync_runtimes(self.index)
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self.settings.upstream_connect_timeout
        )
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, enable_cleanup_closed=True)
        self._session = aiohttp.ClientSession(
            timeout=timeout, connector=connector, auto_decompress=False
        )
        self.ejector.start()
        self._started = True
        self._watchers.append(asyncio.create_task(watch_loop_lag(self.metrics.loop_lag)))
        if self.settings.engine_poll_seconds > 0:
            self._watchers.append(asyncio.create_task(self._watch_engines()))

    async def stop(self) -> None:
        """Close the upstream pool and the budget store (after pending settlements)."""
        for watcher in self._watchers:
            watcher.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        self._watchers.clear()
        await self.ejector.stop()
        self.body.close()
        for runtime in self.runtimes.values():
            runtime.close()
        if self._background:
            await asyncio.wait(set(self._background), timeout=5)
        if self._session is not None:
            await self._session.close()
        await self.store.close()

    def apply_config(self, config: AdmissionConfig) -> None:
        """Swap in a new config; in-flight requests keep theirs and their reservations."""
        index = ConfigIndex.build(config, self.settings.plan_share_percent)
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
        # Load each pool's tokenizer now (not on its first request) and say which pools
        # count prompts by the byte estimate. Loading reads and parses files (a large
        # tokenizer.json takes a second): on a worker thread once the loop runs.
        self._config_generation += 1
        paths = {pool.name: pool.tokenizer_path for pool in config.pools}
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # constructing, before the loop: nothing to block yet
            self._flag_tokenizers(self._config_generation, self._load_tokenizers(paths))
            return
        self._in_background(self._load_tokenizers_off_loop(self._config_generation, paths))

    def _load_tokenizers(self, paths: dict[str, str | None]) -> dict[str, bool]:
        return {pool: self.tokenizers.get(path) is not None for pool, path in paths.items()}

    async def _load_tokenizers_off_loop(
        self, generation: int, paths: dict[str, str | None]
    ) -> None:
        self._flag_tokenizers(generation, await asyncio.to_thread(self._load_tokenizers, paths))

    def _flag_tokenizers(self, generation: int, loaded: dict[str, bool]) -> None:
        """Set ``tokenizer_fallback`` per pool, unless a newer config came meanwhile."""
        if generation != self._config_generation:
            return
        self.metrics.tokenizer_fallback.clear()
        for pool, ok in loaded.items():
            self.metrics.tokenizer_fallback.labels(pool).set(0 if ok else 1)

    def _sync_runtimes(self, index: ConfigIndex) -> None:
        names = {p.name for p in index.config.pools}
        for compiled in index.config.pools:
            tiers = index.tiers_of(compiled)
            pool = partition_pool(compiled, self.settings.plan_share_percent)
            runtime = self.runtimes.get(pool.name)
            if runtime is None:
                self.runtimes[pool.name] = PoolRuntime(pool, tiers, self.metrics)
            else:
                runtime.reconfigure(pool, tiers)
            self._sync_adaptation(pool, tiers)
        for name in [n for n in self.runtimes if n not in names]:
            self.runtimes.pop(name).close()
            self.adaptations.pop(name, None)
            self._forget_kv_usage(name, set())
        self.ejector.forget_absent()

    def _sync_adaptation(self, pool: CompiledPool, tiers: list[CompiledTier]) -> None:
        adaptation = self.adaptations.get(pool.name)
        if adaptation is None:
            adaptation = self.adaptations[pool.name] = PoolAdaptation(
                tiers,
                pool.total_slots,
                learn=self.settings.learn_reservations,
                pause_usage=self.settings.borrow_pause_usage,
            )
        else:
            adaptation.configure(tiers, pool.total_slots)
        for tier in tiers:
            self.metrics.overcommit_ratio.labels(pool.name, tier.name).set(
                adaptation.ratio_of(tier.name)
            )
            limiter = adaptation.limiters.get(tier.name)
            if limiter is not None:
                self.metrics.ttft_target.labels(pool.name, tier.name).set(limiter.target_seconds)
                self.metrics.lent_limit.labels(pool.name, tier.name).set(limiter.limit)

    async def _watch_engines(self) -> None:
        """Poll every replica's /metrics; correct admission with what the engines report.

        Each of N gateway replicas polls every N x ``engine_poll_seconds`` (the engines'
        poll budget is shared like the plan), from a random phase so that replicas started
        together do not poll in step."""
        period = partition_poll_period(
            self.settings.engine_poll_seconds, self.settings.plan_share_percent
        )
        await asyncio.sleep(random.uniform(0, period))
        while True:
            await asyncio.sleep(period)
            for name in list(self.runtimes):
                try:
                    await self._poll_pool(name)
                except Exception as exc:  # one bad poll must not end the watch
                    log.warning("engine poll of pool %s failed: %s", name, exc)

    def _forget_kv_usage(self, pool: str, polled: set[str]) -> None:
        """Drop the usage gauges of replicas no longer polled (gone, or not ready)."""
        for replica in self._kv_usage_series.get(pool, set()) - polled:
            with contextlib.suppress(KeyError):  # never set: its polls all failed
                self.metrics.engine_kv_usage.remove(pool, replica)
        if polled:
            self._kv_usage_series[pool] = polled
        else:
            self._kv_usage_series.pop(pool, None)

    async def _poll_pool(self, name: str) -> None:
        runtime, adaptation = self.runtimes.get(name), self.adaptations.get(name)
        if runtime is None or adaptation is None or self._session is None:
            return
        endpoints = [e for track in runtime.pool.tracks for e in track.endpoints if e.ready]
        self._forget_kv_usage(name, {e.name for e in endpoints})
        if not endpoints:
            return
        loads = await asyncio.gather(*(fetch_engine_load(self._session, e.url) for e in endpoints))
        new, usage = 0, None
        for endpoint, load in zip(endpoints, loads, strict=True):
            if load is None:
                self.metrics.engine_poll_errors.labels(name).inc()
                continue
            before = self._preemptions_seen.get(endpoint.url)
            self._preemptions_seen[endpoint.url] = load.preemptions_total
            if before is not None and load.preemptions_total > before:
                new += load.preemptions_total - before
            usage = load.kv_usage if usage is None else max(usage, load.kv_usage)
            self.metrics.engine_kv_usage.labels(name, endpoint.name).set(load.kv_usage)
        if usage is None:
            return  # no engine answered: keep the last view (counted in poll errors)
        if new:
            self.metrics.engine_preemptions.labels(name).inc(new)
        verdict = adaptation.engines(new, usage)
        runtime.set_borrowing_paused(verdict.pause_borrowing)
        self.metrics.borrowing_paused.labels(name).set(1 if verdict.pause_borrowing else 0)
        for tier in adaptation.tiers:
            self.metrics.overcommit_ratio.labels(name, tier.name).set(
                adaptation.ratio_of(tier.name)
            )

    # -- decisions (steps 1-6) -------------------------------------------------------------

    # -- HTTP ------------------------------------------------------------------------------

    async def _read_body(self, request: web.Request) -> bytes:
        """The body, refused (413) before it is read when it is larger than any pool can
        take (:meth:`BodyWorker.body_limit`), and bounded in time (408)."""
        cap = self.settings.max_body_bytes
        limit = await self.body.body_limit(self.index.config.pools, cap)
        too_large = GatewayError(
            413,
            "body_too_large",
            f"the body is larger than {limit} bytes"
            + ("" if limit == cap else ", more than any model of this gateway can take"),
        )
        if request.content_length is not None and request.content_length > limit:
            raise too_large
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.settings.body_timeout):
                while chunk := await request.content.readany():
                    size += len(chunk)
                    if size > limit:
                        raise too_large
                    chunks.append(chunk)
        except TimeoutError as exc:
            raise GatewayError(
                408,
                "body_timeout",
                f"the body did not arrive within {self.settings.body_timeout:g} s",
            ) from exc
        return b"".join(chunks)

    async def handle_completion(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/chat/completions and /v1/completions."""
        kind = ROUTES[request.path]
        self.authenticate(request.headers.get("Authorization"), self.index)  # before the body
        raw = await self._read_body(request)
        admission, parsed = await self.admit(
            kind, raw, request.headers.get("Authorization"), request.path, request.host
        )
        status, label = 500, "error"
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
            replica = admission.admit.replica
            try:
                response = await proxy_request(
                    self._session,
                    request,
                    url.rstrip("/") + request.path,
                    body,
                    stream=parsed.stream,
                    caller_wants_usage=parsed.include_usage,
                    meter=admission.meter,
                    limits=self.upstream_limits,
                    track=lambda d: self.ejector.track(admission.pool.name, replica, d),
                )
            except UpstreamError as exc:
                self.metrics.upstream_errors.labels(admission.pool.name, exc.kind).inc()
                if replica is not None and exc.kind in ("connect", "timeout"):
                    self.ejector.failure(
                        admission.runtime,
                        replica,
                        "refused" if exc.kind == "connect" else "timeout",
                    )
                status, label = exc.status, exc.code
                raise
            except StreamBrokenError as exc:
                self.metrics.upstream_errors.labels(admission.pool.name, "stream_broken").inc()
                if replica is not None and exc.kind == "timeout":
                    self.ejector.failure(admission.runtime, replica, "timeout")
                status, label = 200, "engine_stream_broken"
                return await exc.finish()
            status, label = response.status, "ok" if response.status < 400 else "engine_rejected"
            if admission.meter.client_gone:
                status, label = 499, "client_gone"
            return response
        except asyncio.CancelledError:
            status, label = 499, "client_gone"
            admission.meter.client_gone = True
            raise
        finally:
            self.metrics.in_flight.dec()
            await self.finish(admission, status, label)

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

    def metrics_app(self) -> web.Application:
        """``/metrics`` (and ``/healthz``) for the separate metrics port: tenant names and
        usage are not served to API clients."""
        app = web.Application()
        app.router.add_get("/metrics", self.handle_metrics)
        app.router.add_get("/healthz", self.handle_healthz)
        return app

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
        if self.settings.metrics_on_api_port:
            app.router.add_get("/metrics", self.handle_metrics)

        async def on_startup(_: web.Application) -> None:
            await self.start()

        async def on_cleanup(_: web.Application) -> None:
            await self.stop()

        app.on_startup.append(on_startup)
        app.on_cleanup.append(on_cleanup)
        return app
