"""The admission gateway of one process: its parts wired together, and its HTTP handlers.

Why this module exists: it is the composition root. :class:`Gateway` builds and holds
the parts, each in its own module, and turns HTTP requests into calls of them:

- the :class:`~kvpool.gateway.pipeline.RequestPipeline` (authenticate, parse, classify,
  estimate, budget, admit, and the finish that releases, settles and records one
  ``Outcome``);
- the :class:`~kvpool.gateway.registry.PoolRegistry` (each pool's runtime, learned state
  and tokenizer, synced on every config);
- the :class:`~kvpool.gateway.engine_watcher.EngineWatcher` (the engines' ``/metrics``);
- the :class:`~kvpool.gateway.upstream.Upstream` (relays a request to its engine under
  first-token and idle timeouts and classifies how it ended; a replica that refuses, times
  out or fails its health probes is ejected from routing, :mod:`kvpool.gateway.ejection`);
- the :class:`~kvpool.gateway.capacity.CapacityShare` (this replica's share of the plans).

Every error is answered in the OpenAI format (statuses from one table,
:mod:`kvpool.gateway.outcomes`). Liveness, readiness and ``/v1/models`` are served here
too; ``/metrics`` (tenant names and usage) on its own port (:meth:`Gateway.metrics_app`).

Config reload: :meth:`Gateway.apply_config` swaps an immutable
:class:`~kvpool.gateway.config_index.ConfigIndex` in one assignment (a request keeps the
index it started with) and syncs the registry (in-flight reservations are kept; pools
that left have their waiters rejected).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import aiohttp
from aiohttp import web

from kvpool.adapters.background import BackgroundTasks
from kvpool.adapters.budget import BudgetStore
from kvpool.adapters.engine_metrics import fetch_engine_load
from kvpool.adapters.tokenizer import TokenizerCache
from kvpool.api.admission_config import AdmissionConfig
from kvpool.domain.handover import handover_chunk
from kvpool.gateway.body import BodyWorker
from kvpool.gateway.budget_overlap import BudgetOverlap
from kvpool.gateway.capacity import CapacityShare, StaticShare
from kvpool.gateway.config_index import ConfigIndex
from kvpool.gateway.ejection import ReplicaEjector
from kvpool.gateway.engine_watcher import EngineWatcher
from kvpool.gateway.errors import NOT_FOUND, OVERLOADED, SERVER, GatewayError
from kvpool.gateway.loop_lag import watch_loop_lag
from kvpool.gateway.memory import MemoryTrimmer
from kvpool.gateway.metrics import GatewayMetrics
from kvpool.gateway.pipeline import REDO_DEMOTED, Admission, RequestPipeline
from kvpool.gateway.registry import PoolRegistry
from kvpool.gateway.request import (
    Kind,
    ParsedRequest,
    build_upstream_body,
    upstream_output_bound,
)
from kvpool.gateway.settings import GatewaySettings
from kvpool.gateway.upstream import (
    CLIENT_STALLED,
    AiohttpUpstream,
    Upstream,
    UpstreamCall,
    UpstreamLimits,
    UpstreamResult,
)
from kvpool.gateway.usage import UsageMeter

log = logging.getLogger("kvpool.gateway")

ROUTES: dict[str, Kind] = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}
SETTLE_ON_STOP_SECONDS = 5.0  # how long stop() waits for background settlements


# The OpenAI routes the gateway admits. vLLM's server has more (embeddings, responses,
# tokenize, pooling, score, rerank...): they are refused, since the plans kvpool admits
# against describe generation (KV tokens held by prompts and outputs until the last token)
# and an embedding or scoring engine holds no output; a route kvpool does not plan for
# must not reach an engine around the admission (docs/0004, "Limits and choices").
SERVED_ROUTES = ("POST /v1/chat/completions", "POST /v1/completions", "GET /v1/models")


def route_not_supported(method: str, path: str) -> GatewayError:
    """The 404 of a route the gateway does not serve, naming the ones it does.

    >>> route_not_supported("POST", "/v1/embeddings").message.split(";")[0]
    "POST /v1/embeddings is not a route of kvpool's gateway"
    """
    return GatewayError(
        404,
        "route_not_supported",
        f"{method} {path} is not a route of kvpool's gateway; it serves "
        f"{', '.join(SERVED_ROUTES)} (plus /healthz, /readyz); other vLLM routes such as "
        "/v1/embeddings are not admitted: kvpool plans engine capacity for generation",
        NOT_FOUND,
    )


class Gateway:
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
        capacity: CapacityShare | None = None,
        upstream: Upstream | None = None,
    ) -> None:
        """``capacity`` defaults to the settings' static ``plan_share_percent``;
        ``upstream`` to the real one (an aiohttp session opened by :meth:`start`)."""
        self.settings = settings = settings or GatewaySettings()
        self.store = store
        self.metrics = metrics = metrics or GatewayMetrics()
        self.tokenizers = tokenizers = tokenizers or TokenizerCache()
        self.wall_clock = wall_clock
        self.capacity = capacity or StaticShare(settings.plan_share_percent)
        self.tasks = BackgroundTasks()  # settlements, tokenizer loads: awaited on stop
        self._watchers = BackgroundTasks()  # loop lag, engine polls: cancelled on stop
        self.index = ConfigIndex.build(config)
        self.registry = PoolRegistry(
            metrics,
            self.capacity,
            tokenizers,
            self.tasks,
            learn_reservations=settings.learn_reservations,
            borrow_pause_usage=settings.borrow_pause_usage,
        )
        self.capacity.attach(lambda: self.registry.runtimes, self.registry.refresh_capacity)
        self.capacity.configure(config)
        self.body = BodyWorker(tokenizers)
        self.pipeline = RequestPipeline(
            store,
            metrics,
            self.body,
            self.registry,
            self.capacity,
            self.tasks,
            access_log=settings.access_log,
            wall_clock=wall_clock,
            overlap=BudgetOverlap() if settings.budget_overlap else None,
        )
        self.watcher = EngineWatcher(
            self.registry,
            metrics,
            self.capacity,
            self._fetch_engine_load,
            settings.engine_poll_seconds,
        )
        self.ejector = ReplicaEjector(
            metrics,
            lambda: self.registry.runtimes,
            probe_interval=settings.health_probe_interval,
            probe_timeout=settings.health_probe_timeout,
        )
        self.upstream = upstream
        self.trimmer = MemoryTrimmer(on_trim=metrics.memory_trims.inc)  # cut clients' buffers
        self._session: aiohttp.ClientSession | None = None  # the engines' connection pool
        self._started = False
        metrics.watch_snapshots(self.registry.track_snapshots)
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
        """Create the runtimes and the engines' connection pool (on the running loop)."""
        self._sync(self.index)
        self.registry.load_tokenizers(self.index.config)  # follow the loads on the loop
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self.settings.upstream_connect_timeout
        )
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, enable_cleanup_closed=True)
        self._session = aiohttp.ClientSession(
            timeout=timeout, connector=connector, auto_decompress=False
        )
        if self.upstream is None:
            self.upstream = AiohttpUpstream(self._session, self.upstream_limits)
        self.ejector.start()
        self._started = True
        self._watchers.spawn(watch_loop_lag(self.metrics.loop_lag), "loop lag")
        if self.settings.engine_poll_seconds > 0:
            self._watchers.spawn(self.watcher.run(), "engine polls")
        self._watchers.spawn(self.capacity.run(), "capacity share")

    async def stop(self) -> None:
        """Close the upstream pool and the budget store (after pending settlements)."""
        await self._watchers.cancel()
        self.trimmer.cancel()
        await self.ejector.stop()
        self.body.close()
        self.registry.close()
        await self.tasks.wait(timeout=SETTLE_ON_STOP_SECONDS)
        if self._session is not None:
            await self._session.close()
        # every request has ended and its engine connection is closed: what this
        # replica held is released, so its share goes back to the others now instead
        # of when its claims expire (a rolling update or scale-down would otherwise
        # leave that capacity idle for up to the lease TTL)
        await self.capacity.leave()
        await self.store.close()

    def apply_config(self, config: AdmissionConfig) -> None:
        """Swap in a new config; in-flight requests keep theirs and their reservations."""
        index = ConfigIndex.build(config)
        self.index = index
        self.capacity.configure(config)
        if self._started:
            self._sync(index)
        self.metrics.config_reloads.labels("applied").inc()
        self._config_info(config)

    def config_rejected(self, reason: str) -> None:
        """A new config did not parse; the old one stays."""
        self.metrics.config_reloads.labels("rejected").inc()

    def _sync(self, index: ConfigIndex) -> None:
        for pool in self.registry.sync(index):
            self.watcher.forget_pool(pool)
        self.ejector.forget_absent()

    def _config_info(self, config: AdmissionConfig) -> None:
        self.metrics.config_info.clear()
        self.metrics.config_info.labels(config.namespace, config.generated_at or "").set(1)
        self.registry.load_tokenizers(config)

    async def _fetch_engine_load(self, url: str) -> Any:
        if self._session is None:
            return None
        return await fetch_engine_load(self._session, url)

    # -- HTTP ------------------------------------------------------------------------------

    async def _read_body(self, request: web.Request, index: ConfigIndex) -> bytes:
        """The body, refused (413) before it is read when it is larger than any pool can
        take (:meth:`BodyWorker.body_limit`), and bounded in time (408)."""
        cap = self.settings.max_body_bytes
        limit = await self.body.body_limit(index.config.pools, cap)
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
        index = self.index  # this request's config, from authentication to admission
        tenant = self.pipeline.authenticate(request.headers.get("Authorization"), index)
        raw = await self._read_body(request, index)  # only for a known tenant
        kind = ROUTES[request.path]
        admission, parsed = await self.pipeline.admit(
            index, tenant, kind, raw, request.path, request.host
        )
        response = await self._relay(request, admission, parsed)
        if response is None:  # sent ahead, then demoted by its budget: admit it again
            admission, parsed = await self.pipeline.admit(
                index, tenant, kind, raw, request.path, request.host, ahead=False
            )
            response = await self._relay(request, admission, parsed)
            assert response is not None, "a request that waited for its verdict is never redone"
        return response

    async def _relay(
        self, request: web.Request, admission: Admission, parsed: ParsedRequest
    ) -> web.StreamResponse | None:
        """Send an admitted request and finish it; None when its budget verdict demoted it
        after it was sent ahead (nothing reached the client; it is given back, unrecorded)."""
        meter = UsageMeter()  # written by the upstream; read here if it ends without a result
        status, label, usage = 500, "error", None
        self.metrics.in_flight.inc()
        try:
            result = await self._send(self._call(request, admission, parsed, meter), admission)
            status, label, usage = result.status, result.label, result.usage
            return None if label == REDO_DEMOTED else result.response
        except asyncio.CancelledError:  # the client went away: aiohttp cancelled the handler
            status, label = 499, CLIENT_STALLED if meter.client_stalled else "client_gone"
            raise
        finally:
            self.metrics.in_flight.dec()
            if label == REDO_DEMOTED:
                self.pipeline.abandon(admission)
            else:
                if label != "ok":  # cut, broken or timed out: its buffers may be large
                    self.trimmer.soon()
                await self.pipeline.finish(admission, status, label, usage or meter.usage())

    def _call(
        self, request: web.Request, admission: Admission, parsed: ParsedRequest, meter: UsageMeter
    ) -> UpstreamCall:
        """The upstream call of an admitted request (503 if its pool lists no endpoint)."""
        url = admission.admit.replica_url
        if url is None:
            raise GatewayError(
                503, "no_endpoint", "the pool lists no engine endpoint", OVERLOADED, 2.0
            )
        priority = admission.tier.engine_priority if self.settings.set_engine_priority else None
        bound = upstream_output_bound(parsed, admission.estimate.output_limit)
        single = parsed.stream and parsed.n == 1 and len(parsed.prompts) <= 1
        return UpstreamCall(
            url=url.rstrip("/") + request.path,
            body=build_upstream_body(parsed, admission.estimate.output_limit, priority),
            stream=parsed.stream,
            caller_wants_usage=parsed.include_usage,
            client=request,
            on_first_token=admission.on_first_token,
            track=partial(self.ejector.track, admission.pool.name, admission.admit.replica),
            meter=meter,
            # the engine is done: the reservation goes back before the client reads the rest
            on_engine_done=lambda: self.pipeline.release(admission, meter.usage()),
            handover_at=(handover_chunk(bound, self.settings.handover_tokens) if single else None),
            on_handover=partial(self.pipeline.hand_over, admission),
            gate=(
                partial(self.pipeline.confirm_budget, admission)
                if admission.pending is not None
                else None
            ),
        )

    async def _send(self, call: UpstreamCall, admission: Admission) -> UpstreamResult:
        """Relay the call; report how it failed (metrics, outlier ejection)."""
        assert self.upstream is not None, "Gateway.start() was not called"
        result = await self.upstream.send(call)
        if result.error_kind is not None:
            self.metrics.upstream_errors.labels(admission.pool.name, result.error_kind).inc()
        replica = admission.admit.replica
        if replica is not None and result.replica_fault is not None:
            self.ejector.failure(admission.runtime, replica, result.replica_fault)
        return result

    async def handle_models(self, request: web.Request) -> web.Response:
        """GET /v1/models: the pools' served names."""
        index = self.index
        self.pipeline.authenticate(request.headers.get("Authorization"), index)
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
        unready = self.capacity.unready_reason()
        if unready is not None:
            return web.json_response({"status": unready}, status=503)
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
            if exc.status == 404:
                error = route_not_supported(request.method, request.path)
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
