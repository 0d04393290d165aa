"""Builders of compiled admission configs for gateway tests and benchmarks, and a fake engine.

``ConfigBuilder`` writes what the operator would compile, stating only what a test is
about::

    config = (
        ConfigBuilder()
        .tier("interactive", floor=50, wait=2.0)
        .tier("batch", floor=30)
        .rule("interactive", path_prefix="/v1/chat")
        .pool("tiny", ["http://127.0.0.1:8001"], tokens_per_replica=2048, slots_per_replica=8)
        .tenant("acme", key="sk-acme", tiers=["interactive", "batch"], limits=[(60, 5000)])
        .obj()
    )

``FakeEngine`` is an in-process OpenAI-compatible server (the I/O boundary faked for fast
gateway tests; the integration tests use real vLLM engines): it records what it received
and answers completions and chat, streaming or not, with ``usage`` like vLLM does.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from aiohttp import web

from kvpool.api.admission_config import (
    AdmissionConfig,
    BudgetWindow,
    CompiledPool,
    CompiledRule,
    CompiledTenant,
    CompiledTier,
    CompiledTierPolicy,
    Endpoint,
    TierAllocation,
    Track,
)
from kvpool.api.common import LabelSelector
from kvpool.domain.planner import plan_floors
from tests.support.ports import free_port
from tests.support.processes import ManagedProcess


def key_digest(key: str) -> str:
    """SHA-256 hex of an API key (what the config stores)."""
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass
class _Tier:
    name: str
    floor: int  # percent
    lend: int
    wait: float
    engine_priority: int | None
    reclaim: Literal["Wait", "Preempt"]
    budget_unavailable: Literal["Allow", "Reject"] | None = None
    ttft: float | None = None  # ttftP95Target seconds


@dataclass
class ConfigBuilder:
    """A compiled admission config with one tier policy ("tiers") under construction."""

    namespace: str = "default"
    _tiers: list[_Tier] = field(default_factory=list)
    _rules: list[CompiledRule] = field(default_factory=list)
    _pools: list[CompiledPool] = field(default_factory=list)
    _tenants: list[CompiledTenant] = field(default_factory=list)

    def tier(
        self,
        name: str,
        floor: int,
        *,
        lend: int = 100,
        wait: float = 5.0,
        engine_priority: int | None = None,
        reclaim: Literal["Wait", "Preempt"] = "Wait",
        budget_unavailable: Literal["Allow", "Reject"] | None = None,
        ttft: float | None = None,
    ) -> ConfigBuilder:
        """Add a tier (highest priority first); floor and lend are percents."""
        self._tiers.append(
            _Tier(name, floor, lend, wait, engine_priority, reclaim, budget_unavailable, ttft)
        )
        return self

    def rule(
        self,
        tier: str,
        *,
        path_prefix: str | None = None,
        host: str | None = None,
        labels: dict[str, str] | None = None,
    ) -> ConfigBuilder:
        selector = LabelSelector(match_labels=labels) if labels is not None else None
        self._rules.append(
            CompiledRule(tier=tier, path_prefix=path_prefix, host=host, tenant_selector=selector)
        )
        return self

    def compiled_tiers(self) -> list[CompiledTier]:
        return [
            CompiledTier(
                name=t.name,
                rank=rank,
                floor_percent=t.floor,
                lend_percent=t.lend,
                max_queue_wait_seconds=t.wait,
                engine_priority=rank if t.engine_priority is None else t.engine_priority,
                reclaim=t.reclaim,
                budget_unavailable=t.budget_unavailable,
                ttft_p95_target_seconds=t.ttft,
            )
            for rank, t in enumerate(self._tiers)
        ]

    def pool(
        self,
        served_name: str,
        endpoints: list[str],
        *,
        tokens_per_replica: int = 2048,
        slots_per_replica: int = 8,
        max_model_len: int = 512,
        output_p95: int = 64,
        tokenizer_path: str | Path | None = None,
        canary: list[str] | None = None,
        canary_weight: int = 0,
        canary_tiers: list[str] | None = None,
    ) -> ConfigBuilder:
        """A pool planned like the operator does: floors are percents of the total, each
        non-zero floor at least one p95 request (prompt p95 = maxModelLen / 2) and one slot."""
        replicas = len(endpoints) + len(canary or [])
        total_tokens = tokens_per_replica * max(1, replicas)
        total_slots = slots_per_replica * max(1, replicas)
        floors_t, floors_s, _, _ = plan_floors(
            [(t.name, t.floor) for t in self._tiers],
            total_tokens,
            total_slots,
            max_model_len // 2 + output_p95,
        )
        tiers = {}
        for t in self._tiers:
            floor_tokens, floor_slots = floors_t[t.name], floors_s[t.name]
            tiers[t.name] = TierAllocation(
                floor_tokens=floor_tokens,
                floor_slots=floor_slots,
                lendable_tokens=floor_tokens * t.lend // 100,
                lendable_slots=floor_slots * t.lend // 100,
            )
        tracks = [
            Track(
                name="stable",
                revision="r1",
                weight=100 - canary_weight,
                endpoints=[
                    Endpoint(name=f"{served_name}-{i}", url=url) for i, url in enumerate(endpoints)
                ],
            )
        ]
        if canary:
            tracks.append(
                Track(
                    name="canary",
                    revision="r2",
                    weight=canary_weight,
                    endpoints=[
                        Endpoint(name=f"{served_name}-canary-{i}", url=url)
                        for i, url in enumerate(canary)
                    ],
                )
            )
        self._pools.append(
            CompiledPool(
                name=served_name,
                served_name=served_name,
                model_version="v1",
                tier_policy="tiers",
                max_model_len=max_model_len,
                prompt_tokens_mean=64,
                prompt_tokens_p95=max_model_len // 2,
                output_tokens_mean=output_p95 // 2 or 1,
                output_tokens_p95=output_p95,
                tokenizer_path=str(tokenizer_path) if tokenizer_path else None,
                replicas=replicas,
                tokens_per_replica=tokens_per_replica,
                slots_per_replica=slots_per_replica,
                total_tokens=total_tokens,
                total_slots=total_slots,
                shared_tokens=total_tokens - sum(a.floor_tokens for a in tiers.values()),
                shared_slots=total_slots - sum(a.floor_slots for a in tiers.values()),
                tiers=tiers,
                canary_tiers=canary_tiers or [],
                tracks=tracks,
            )
        )
        return self

    def tenant(
        self,
        name: str,
        *,
        key: str,
        tiers: list[str],
        limits: list[tuple[float, int]] | None = None,
        labels: dict[str, str] | None = None,
        weight: int = 1,
        over_budget: Literal["Reject", "Demote"] = "Reject",
        max_concurrency: int | None = None,
    ) -> ConfigBuilder:
        """A tenant; ``limits`` are (window seconds, tokens) pairs."""
        self._tenants.append(
            CompiledTenant(
                tenant=name,
                key_sha256=key_digest(key),
                labels=labels or {},
                tiers=tiers,
                limits=[BudgetWindow(window_seconds=w, tokens=t) for w, t in limits or []],
                weight=weight,
                over_budget=over_budget,
                max_concurrency=max_concurrency,
            )
        )
        return self

    def obj(self) -> AdmissionConfig:
        policy = CompiledTierPolicy(
            name="tiers", tiers=self.compiled_tiers(), classification=self._rules
        )
        return AdmissionConfig(
            namespace=self.namespace,
            tier_policies=[policy],
            pools=self._pools,
            tenants=self._tenants,
        )

    def write(self, path: Path) -> Path:
        """Write the config as the operator would (``config.json``), atomically."""
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.obj().to_json())
        tmp.replace(path)
        return path


def standard_config(endpoints: list[str], **pool: Any) -> ConfigBuilder:
    """Two tiers (interactive 50 %, batch 30 %), one pool "tiny", tenants acme and bulk."""
    return (
        ConfigBuilder()
        .tier("interactive", floor=50, wait=5.0)
        .tier("batch", floor=30, wait=5.0)
        .rule("interactive", path_prefix="/v1/chat", labels={"class": "interactive"})
        .pool("tiny", endpoints, **pool)
        .tenant(
            "acme",
            key="sk-acme",
            tiers=["interactive", "batch"],
            labels={"class": "interactive"},
        )
        .tenant("bulk", key="sk-bulk", tiers=["batch"])
    )


@dataclass
class FakeEngine:
    """A tiny OpenAI-compatible upstream recording the bodies and headers it receives."""

    delay: float = 0.0  # seconds before answering
    chunk_delay: float = 0.0  # seconds between stream chunks
    status: int = 200  # non-200: answer this status with an error body
    received: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    cancelled: int = 0  # requests whose client went away before the answer ended
    metrics_text: str | None = None  # served on /metrics when set (else 404)
    _runner: web.AppRunner | None = None
    url: str = ""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self._handle)
        app.router.add_post("/v1/chat/completions", self._handle)
        app.router.add_get("/metrics", self._metrics)
        return app

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.metrics_text is None:
            raise web.HTTPNotFound()
        return web.Response(text=self.metrics_text, content_type="text/plain")

    async def start(self, port: int = 0) -> FakeEngine:
        self._runner = web.AppRunner(self.app(), handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port, backlog=1024)
        await site.start()
        server = site._server
        assert server is not None and server.sockets  # type: ignore[attr-defined]
        port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.received.append(body)
        self.headers.append(dict(request.headers))
        if self.status != 200:
            return web.json_response(
                {"error": {"message": "engine says no", "code": self.status}}, status=self.status
            )
        try:
            await asyncio.sleep(self.delay)
            chat = request.path.endswith("chat/completions")
            wanted = body.get("max_completion_tokens") if chat else None
            out = max(1, min(int(wanted or body.get("max_tokens") or 4), 64))
            prompt_tokens = 5
            if not body.get("stream"):
                choice = (
                    {"index": 0, "message": {"role": "assistant", "content": "x" * out}}
                    if chat
                    else {"index": 0, "text": "x" * out}
                )
                return web.json_response(
                    {
                        "id": "fake",
                        "object": "chat.completion" if chat else "text_completion",
                        "choices": [choice],
                        "usage": {
                            "prompt_tokens": prompt_tokens,
                            "completion_tokens": out,
                            "total_tokens": prompt_tokens + out,
                        },
                    }
                )
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for _ in range(out):
                delta = {"delta": {"content": "x"}} if chat else {"text": "x"}
                chunk = {"id": "fake", "choices": [{"index": 0, **delta}]}
                await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                await asyncio.sleep(self.chunk_delay)
            if (body.get("stream_options") or {}).get("include_usage"):
                usage = {
                    "id": "fake",
                    "choices": [],
                    "usage": {
                        "prompt_tokens": prompt_tokens,
                        "completion_tokens": out,
                        "total_tokens": prompt_tokens + out,
                    },
                }
                await response.write(b"data: " + json.dumps(usage).encode() + b"\n\n")
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


def serve_fake_engine(port: int, chunk_delay: float = 0.0, delay: float = 0.0) -> None:
    """Run a FakeEngine on ``port`` until killed (for benchmarks, in a child process)."""

    async def main() -> None:
        await FakeEngine(delay=delay, chunk_delay=chunk_delay).start(port)
        await asyncio.Event().wait()

    try:
        import uvloop
    except ImportError:
        asyncio.run(main())
    else:
        uvloop.run(main())


class GatewayProcess:
    """``kvpool gateway`` as a real process (stopped by :meth:`stop`; a context manager)."""

    def __init__(
        self,
        config_path: Path | None,
        log_path: Path,
        *,
        redis_url: str | None = None,
        extra_args: tuple[str, ...] = (),
        configmap: tuple[str, str] | None = None,
    ) -> None:
        """``configmap=(namespace, api_server_url)`` reads the operator's ConfigMap instead
        of ``config_path``."""
        self.port = free_port()
        self.metrics_port = free_port()
        source = (
            ["--configmap", configmap[0], "--kube-server", configmap[1]]
            if configmap is not None
            else ["--config", str(config_path)]
        )
        argv = [
            sys.executable,
            "-m",
            "kvpool.cli",
            "gateway",
            *source,
            "--listen",
            f"127.0.0.1:{self.port}",
            "--metrics-listen",
            f"127.0.0.1:{self.metrics_port}",
            *(["--redis", redis_url] if redis_url else []),
            *extra_args,
        ]
        self.process = ManagedProcess(argv, log_path=log_path, env=os.environ, cwd=log_path.parent)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        """The gateway's /metrics (served on its own port)."""
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def start(self, timeout: float = 30.0) -> GatewayProcess:
        self.process.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.process.running():
                raise RuntimeError(f"gateway exited:\n{self.process.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/readyz", timeout=1) as resp:
                    if resp.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"gateway not ready after {timeout}s:\n{self.process.log_tail()}")

    def stop(self) -> None:
        self.process.stop(timeout=10)

    def log_tail(self, lines: int = 80) -> str:
        return self.process.log_tail(lines)

    def __enter__(self) -> GatewayProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
