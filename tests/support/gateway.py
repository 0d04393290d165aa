"""The gateway and a fake engine as servers, for gateway tests and benchmarks.

- :class:`FakeEngine` is an in-process OpenAI-compatible server (the I/O boundary faked
  for fast gateway tests; the integration tests use real vLLM engines): it records what it
  received and answers completions and chat, streaming or not, with ``usage`` like vLLM.
- :func:`serve_fake_engine` runs one in a child process (benchmarks).
- :class:`GatewayProcess` is ``kvpool gateway`` as a real process (benchmarks use it
  directly); :class:`GatewayProcesses` is what the ``gateway_process`` fixture hands a test
  (tests/conftest.py), and ``GatewayClientFactory`` the type of the ``gateway_client``
  fixture (an in-process gateway behind aiohttp's test server).

The configs they serve come from :mod:`tests.builders.compiled`.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient
from prometheus_client.parser import text_string_to_metric_families

from kvpool.gateway.server import Gateway
from tests.builders import AdmissionConfigBuilder
from tests.support.ports import free_port
from tests.support.processes import ManagedProcess
from tests.support.waiting import StopWaitingError, WaitTimeoutError, wait_until

# The ``gateway_client`` fixture: ``client, gateway = await gateway_client(config, ...)``.
GatewayClientFactory = Callable[..., Awaitable[tuple[TestClient[Any, Any], Gateway]]]


@dataclass
class FakeEngine:
    """A tiny OpenAI-compatible upstream recording the bodies and headers it receives."""

    delay: float = 0.0  # seconds before answering
    chunk_delay: float = 0.0  # seconds between stream chunks
    chunk_bytes: int = 1  # content bytes of each chunk ("x" repeated)
    max_chunks: int = 64  # the most chunks (tokens) one answer has, whatever max_tokens says
    status: int = 200  # non-200: answer this status with an error body
    received: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)  # loop.time() each request came in
    metrics_polls: list[float] = field(default_factory=list)  # loop.time() of each /metrics
    cancelled: int = 0  # requests whose client went away before the answer ended
    metrics_text: str | None = None  # served on /metrics when set (else 404)
    hold: asyncio.Event | None = None  # when set: no answer starts until the event is set
    health_delays: list[float] = field(default_factory=list)  # /health waits the next of these
    health_answers: int = 0  # /health requests answered so far
    in_flight: int = 0  # completion requests being answered now
    max_in_flight: int = 0  # the most at once so far
    _runner: web.AppRunner | None = None
    url: str = ""

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)  # a 100k-token prompt
        app.router.add_post("/v1/completions", self._handle)
        app.router.add_post("/v1/chat/completions", self._handle)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._health)
        return app

    async def _health(self, request: web.Request) -> web.Response:
        if self.health_delays:  # a scripted late answer (then on time)
            await self._takes(self.health_delays.pop(0))
        self.health_answers += 1
        return web.Response(text="")

    @staticmethod
    async def _takes(seconds: float) -> None:
        """The engine's own time for a step (answering, generating a chunk): what this fake
        models, so it is real time - the gateway's timeouts run on real time too."""
        await asyncio.sleep(seconds)

    async def _metrics(self, request: web.Request) -> web.Response:
        self.metrics_polls.append(asyncio.get_running_loop().time())
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
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._answer(request)
        finally:
            self.in_flight -= 1

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        self.arrivals.append(asyncio.get_running_loop().time())
        body = await request.json()
        self.received.append(body)
        self.headers.append(dict(request.headers))
        if self.status != 200:
            return web.json_response(
                {"error": {"message": "engine says no", "code": self.status}}, status=self.status
            )
        try:
            await self._takes(self.delay)
            if self.hold is not None:
                await self.hold.wait()
            chat = request.path.endswith("chat/completions")
            wanted = body.get("max_completion_tokens") if chat else None
            out = max(1, min(int(wanted or body.get("max_tokens") or 4), self.max_chunks))
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
            piece = "x" * self.chunk_bytes
            delta = {"delta": {"content": piece}} if chat else {"text": piece}
            chunk = {"id": "fake", "choices": [{"index": 0, **delta}]}
            event = b"data: " + json.dumps(chunk).encode() + b"\n\n"  # the same each time
            for _ in range(out):
                await response.write(event)
                await self._takes(self.chunk_delay)
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


def serve_fake_engine(
    port: int,
    chunk_delay: float = 0.0,
    delay: float = 0.0,
    chunk_bytes: int = 1,
    max_chunks: int = 64,
) -> None:
    """Run a FakeEngine on ``port`` until killed (for benchmarks, in a child process)."""

    async def main() -> None:
        engine = FakeEngine(
            delay=delay, chunk_delay=chunk_delay, chunk_bytes=chunk_bytes, max_chunks=max_chunks
        )
        await engine.start(port)
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
        manifests: tuple[str, ...] = (),
    ) -> None:
        """``configmap=(namespace, api_server_url)`` reads the operator's ConfigMap instead
        of ``config_path``; ``manifests`` compiles those paths (``-f``, no operator)."""
        self.port = free_port()
        self.metrics_port = free_port()
        if manifests:
            source = [arg for path in manifests for arg in ("-f", path)]
        elif configmap is not None:
            source = ["--configmap", configmap[0], "--kube-server", configmap[1]]
        else:
            source = ["--config", str(config_path)]
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
        try:
            wait_until(self.ready, timeout, f"gateway {self.url} ready", interval=0.05)
        except WaitTimeoutError:
            self.stop()
            raise RuntimeError(f"gateway not ready after {timeout}s:\n{self.log_tail()}") from None
        return self

    def ready(self) -> bool:
        """Whether ``/readyz`` answers 200 (raises StopWaitingError when the process has exited)."""
        if not self.process.running():
            raise StopWaitingError(f"gateway exited:\n{self.process.log_tail()}")
        try:
            with urllib.request.urlopen(f"{self.url}/readyz", timeout=1) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def config_generated_at(self) -> str | None:
        """``generatedAt`` of the config in force (from ``kvpool_gateway_config_info``): a
        test waits for it to equal the published config's instead of sleeping past a reload."""
        with urllib.request.urlopen(self.metrics_url, timeout=5) as resp:
            text = resp.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "kvpool_gateway_config_info" and sample.value == 1:
                    return sample.labels.get("generated_at")
        return None

    def stop(self) -> None:
        self.process.stop(timeout=10)

    def log_tail(self, lines: int = 80) -> str:
        return self.process.log_tail(lines)

    def __enter__(self) -> GatewayProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class GatewayProcesses:
    """The ``gateway_process`` fixture: starts ``kvpool gateway`` processes for one test,
    each with its own ports, config file and log under ``tmp_dir``; ``register(name,
    gateway)`` is told of each (the fixture stops them all and reports their logs)."""

    def __init__(self, tmp_dir: Path, register: Callable[[str, GatewayProcess], None]) -> None:
        self._tmp_dir = tmp_dir
        self._register = register
        self._count = 0

    def __call__(self, *args: Any, **kwargs: Any) -> GatewayProcess:
        """A started gateway (arguments: :meth:`create`'s)."""
        return self.create(*args, **kwargs).start()

    async def started(self, *args: Any, **kwargs: Any) -> GatewayProcess:
        """The same, started in a thread: the caller's event loop (a FakeEngine on it, say)
        keeps running meanwhile."""
        gateway = self.create(*args, **kwargs)
        return await asyncio.to_thread(gateway.start)

    def create(
        self,
        config: AdmissionConfigBuilder | Path | None = None,
        *,
        configmap: tuple[str, str] | None = None,
        manifests: tuple[str, ...] = (),
        redis_url: str | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> GatewayProcess:
        """A gateway, not started, serving ``config``: a builder (written to a file of its
        own), a config file, or ``None`` with ``configmap=(namespace, api_url)`` or
        ``manifests`` (paths compiled with ``-f``)."""
        index, self._count = self._count, self._count + 1
        if isinstance(config, AdmissionConfigBuilder):
            config = config.write(self._tmp_dir / f"gateway-{index}.json")
        gateway = GatewayProcess(
            config,
            self._tmp_dir / f"gateway-{index}.log",
            redis_url=redis_url,
            extra_args=extra_args,
            configmap=configmap,
            manifests=manifests,
        )
        self._register(f"gateway {index} ({gateway.url})", gateway)
        return gateway
