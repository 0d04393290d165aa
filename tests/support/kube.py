"""Run the Kubernetes API emulator for a test, and talk to it (HTTP clients, kubectl, kopf).

The emulator (tests/support/emulator/) serves on a free 127.0.0.1 port from its own
event loop in a background thread, so sync tests, async tests, ``kopf.testing.KopfRunner``
(another thread) and ``kubectl`` (a subprocess) can all use it at once. Usage::

    # pytest: the ``kube_api`` fixture (tests/integration/conftest.py) does this for you.
    with start_kube_api(tmp_path) as kube:            # crds/*.yaml registered (peering=True:
                                                      # also kopf's peering CRDs)
        kube.url                                      # "http://127.0.0.1:41234"
        kube.kubeconfig                               # Path; context namespace "default"
        path = resource_path("kvpool.dev/v1alpha1", "modelpools", "default")
        kube.client.create(path, {"metadata": {"name": "a"}, "spec": {...}})  # -> dict
        kube.client.patch(f"{path}/a/status", {"status": {...}})  # merge-patch
        kube.client.request("PATCH", f"{path}/a", body)  # -> KubeResponse(status, body), no raise
        for event in kube.client.watch(path, resourceVersion="5", timeoutSeconds="1"): ...
        async with kube.async_client() as client: await client.get(f"{path}/a")
        kube.kubectl("get", "mp", "-A")               # CompletedProcess, text output
        kube.connection_info()                        # kopf.ConnectionInfo for @kopf.on.login
        kube.register_crd(crd)                        # serve one more CRD (dict)
        kube.call(lambda emulator: ...)               # run code on the emulator's loop
        kube.emulator.requests                        # kmock's request log (read after the fact)

A kopf operator logs in either with ``@kopf.on.login(registry=r)`` returning
``kube.connection_info()``, or with ``KUBECONFIG=kube.kubeconfig`` and kopf's default
registry. Fault injection uses kmock's DSL on ``kube.emulator`` (e.g.
``kube.emulator["patch", kmock.resource("kvpool.dev", "v1alpha1", "modelpools")] << 503``);
a request a test reaction answers changes no state. At exit, open watches are ended,
the server and thread stop, and :class:`EmulatorCrashError` is raised if the emulator itself
crashed on a request (a bug in the emulator, not an API error it meant to return).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import json
import shutil
import subprocess
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import aiohttp.web
import kopf
import yaml

from tests.support.emulator import KubeEmulator, kopf_peering_crds
from tests.support.timing import loop_turns

REPO = Path(__file__).resolve().parents[2]
CRD_DIR = REPO / "crds"
CONTEXT = "kvpool-emulator"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
T = TypeVar("T")


MAX_REQUEST_BYTES = 3 * 1024 * 1024  # the API server's limit on a request body


class KubeApiError(Exception):
    """A failure status from the API; ``status`` is the HTTP code, ``body`` the Status object."""

    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body


class EmulatorCrashError(AssertionError):
    """The emulator raised while serving a request (a bug in the emulator)."""


@dataclasses.dataclass(frozen=True)
class KubeResponse:
    """An API answer: HTTP status and the decoded JSON body (None if there was none)."""

    status: int
    body: Any

    def ok(self) -> Any:
        """The body, or :class:`KubeApiError` for a 4xx/5xx status."""
        if self.status >= 400:
            raise KubeApiError(self.status, self.body)
        return self.body


def resource_path(
    api_version: str,
    plural: str,
    namespace: str | None = None,
    name: str | None = None,
    subresource: str | None = None,
) -> str:
    """The URL path of a collection or object.

    >>> resource_path("kvpool.dev/v1alpha1", "modelpools", "default", "a", "status")
    '/apis/kvpool.dev/v1alpha1/namespaces/default/modelpools/a/status'
    >>> resource_path("v1", "namespaces")
    '/api/v1/namespaces'
    """
    parts = ["/api/v1" if api_version == "v1" else f"/apis/{api_version}"]
    parts += [f"namespaces/{namespace}"] if namespace else []
    parts += [p for p in (plural, name, subresource) if p]
    return "/".join(parts)


def load_crds(crd_dir: Path = CRD_DIR) -> list[dict[str, Any]]:
    """The CustomResourceDefinition documents in ``crd_dir/*.yaml`` (sorted by file name)."""
    docs = [
        doc for f in sorted(crd_dir.glob("*.yaml")) for doc in yaml.safe_load_all(f.read_text())
    ]
    return [d for d in docs if isinstance(d, dict) and d.get("kind") == "CustomResourceDefinition"]


def _url(base: str, path: str, params: Mapping[str, str] | None) -> str:
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    return f"{base}/{path.lstrip('/')}{query}"


def _decode(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return raw.decode("utf-8", "replace")


class KubeClient:
    """A small blocking client (stdlib only), for sync tests and setup code."""

    def __init__(self, base_url: str, timeout: float = 10.0) -> None:
        self.base_url = base_url
        self.timeout = timeout

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        params: Mapping[str, str] | None = None,
        accept: str = "application/json",
    ) -> KubeResponse:
        """Send one request; never raises for an HTTP status (see :meth:`KubeResponse.ok`)."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": accept, "Content-Type": content_type, "Connection": "close"}
        req = urllib.request.Request(
            _url(self.base_url, path, params), data=data, method=method, headers=headers
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as rsp:
                return KubeResponse(rsp.status, _decode(rsp.read()))
        except urllib.error.HTTPError as e:
            with e:
                return KubeResponse(e.code, _decode(e.read()))

    def get(self, path: str, **params: str) -> Any:
        return self.request("GET", path, params=params).ok()

    def create(self, path: str, body: Mapping[str, Any]) -> Any:
        return self.request("POST", path, body).ok()

    def patch(self, path: str, patch: Mapping[str, Any]) -> Any:
        return self.request("PATCH", path, patch, content_type=MERGE_PATCH).ok()

    def json_patch(self, path: str, ops: list[Mapping[str, Any]]) -> Any:
        return self.request("PATCH", path, ops, content_type=JSON_PATCH).ok()

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path).ok()

    def watch(self, path: str, **params: str) -> Iterator[dict[str, Any]]:
        """Watch events until the server ends the stream (pass ``timeoutSeconds``)."""
        query = {"watch": "true", **params}
        req = urllib.request.Request(
            _url(self.base_url, path, query), headers={"Connection": "close"}
        )
        with urllib.request.urlopen(req, timeout=self.timeout) as rsp:
            for line in rsp:
                if line.strip():
                    yield json.loads(line)


class AsyncKubeClient:
    """The same calls for async tests (aiohttp); use ``async with kube.async_client() as c``."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        params: Mapping[str, str] | None = None,
    ) -> KubeResponse:
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type, "Connection": "close"}
        url = "/" + path.lstrip("/")
        async with self.session.request(
            method, url, data=data, headers=headers, params=params
        ) as rsp:
            return KubeResponse(rsp.status, _decode(await rsp.read()))

    async def get(self, path: str, **params: str) -> Any:
        return (await self.request("GET", path, params=params)).ok()

    async def create(self, path: str, body: Mapping[str, Any]) -> Any:
        return (await self.request("POST", path, body)).ok()

    async def patch(self, path: str, patch: Mapping[str, Any]) -> Any:
        return (await self.request("PATCH", path, patch, content_type=MERGE_PATCH)).ok()

    async def json_patch(self, path: str, ops: list[Mapping[str, Any]]) -> Any:
        return (await self.request("PATCH", path, ops, content_type=JSON_PATCH)).ok()

    async def delete(self, path: str) -> Any:
        return (await self.request("DELETE", path)).ok()

    async def watch(self, path: str, **params: str) -> AsyncIterator[dict[str, Any]]:
        query = {"watch": "true", **params}
        async with self.session.get("/" + path.lstrip("/"), params=query) as rsp:
            async for line in rsp.content:
                if line.strip():
                    yield json.loads(line)


def write_kubeconfig(path: Path, server: str, namespace: str = "default") -> Path:
    """A kubeconfig whose current context points at ``server`` without credentials."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CONTEXT, "cluster": {"server": server}}],
        "users": [{"name": CONTEXT, "user": {}}],
        "contexts": [
            {
                "name": CONTEXT,
                "context": {"cluster": CONTEXT, "user": CONTEXT, "namespace": namespace},
            }
        ],
        "current-context": CONTEXT,
    }
    path.write_text(yaml.safe_dump(config))
    return path


class _EmulatorThread:
    """The emulator's event loop and aiohttp server, in a daemon thread."""

    def __init__(self, emulator_factory: Callable[[], KubeEmulator]) -> None:
        self._factory = emulator_factory
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="kube-emulator", daemon=True
        )
        self._runner: aiohttp.web.ServerRunner | None = None
        self.emulator: KubeEmulator | None = None
        self.port = 0

    def start(self) -> None:
        self._thread.start()
        self.call_async(self._start())

    def call_async(self, coro: Any, timeout: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _start(self) -> None:
        self.emulator = self._factory()
        await self.emulator.__aenter__()

        def request_factory(*args: Any) -> aiohttp.web.BaseRequest:
            # a real API server takes request bodies up to 3 MiB (aiohttp's default: 1 MiB)
            return aiohttp.web.BaseRequest(*args, self._loop, client_max_size=MAX_REQUEST_BYTES)

        server = aiohttp.web.Server(self.emulator, access_log=None, request_factory=request_factory)
        self._runner = aiohttp.web.ServerRunner(server, shutdown_timeout=1.0)
        await self._runner.setup()
        site = aiohttp.web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def _stop(self) -> None:
        if self.emulator is not None:
            await self.emulator.close_watches()
            await loop_turns()  # the watch handlers see it (cleanup waits for them to end)
        if self._runner is not None:
            await self._runner.cleanup()
        if self.emulator is not None:
            await self.emulator.__aexit__(None, None, None)

    def stop(self) -> None:
        try:
            if self._thread.is_alive():
                with contextlib.suppress(concurrent.futures.TimeoutError):
                    self.call_async(self._stop(), timeout=10.0)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10.0)
            if not self._thread.is_alive():
                self._loop.close()


@dataclasses.dataclass(frozen=True)
class KubeApi:
    """A running emulator: where it listens and how to reach it."""

    url: str  # http://127.0.0.1:<port>
    port: int
    kubeconfig: Path
    kubectl_cache: Path
    client: KubeClient
    emulator: KubeEmulator
    _thread: _EmulatorThread = dataclasses.field(repr=False)

    def call(self, fn: Callable[[KubeEmulator], T]) -> T:
        """Run ``fn(emulator)`` on the emulator's loop (the only safe way to touch its state)."""

        async def run() -> T:
            return fn(self.emulator)

        result: T = self._thread.call_async(run())
        return result

    def register_crd(self, crd: Mapping[str, Any]) -> None:
        """Serve one more CRD (e.g. one a test builds itself)."""
        self.call(lambda emulator: emulator.register_crd(crd))

    @contextlib.asynccontextmanager
    async def async_client(self) -> AsyncIterator[AsyncKubeClient]:
        async with aiohttp.ClientSession(self.url) as session:
            yield AsyncKubeClient(session)

    def connection_info(self, namespace: str = "default") -> kopf.ConnectionInfo:
        """What a ``@kopf.on.login`` handler returns to talk to this emulator."""
        return kopf.ConnectionInfo(server=self.url, insecure=True, default_namespace=namespace)

    def kubectl(
        self, *args: str, check: bool = True, timeout: float = 30.0
    ) -> subprocess.CompletedProcess[str]:
        """Run ``kubectl <args>`` against the emulator (own kubeconfig and discovery cache)."""
        kubectl = shutil.which("kubectl")
        if kubectl is None:
            raise FileNotFoundError("kubectl is not installed (expected at /usr/bin/kubectl)")
        cmd = [
            kubectl,
            f"--kubeconfig={self.kubeconfig}",
            f"--cache-dir={self.kubectl_cache}",
            *args,
        ]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=check)


@contextlib.contextmanager
def start_kube_api(
    workdir: Path,
    crds: list[Mapping[str, Any]] | None = None,
    emulator_factory: Callable[[], KubeEmulator] = KubeEmulator,
    peering: bool = False,
) -> Iterator[KubeApi]:
    """Start an emulator serving ``crds`` (default: crds/*.yaml); stop it on exit.

    ``workdir`` receives the kubeconfig and kubectl's cache (use pytest's ``tmp_path``).
    ``peering=True`` also serves kopf's peering CRDs, so kopf runs with peering (without
    them, kopf's auto-detection falls back to standalone).
    """
    served = list(load_crds() if crds is None else crds)
    served += kopf_peering_crds() if peering else []
    thread = _EmulatorThread(emulator_factory)
    try:
        thread.start()
        assert thread.emulator is not None
        url = f"http://127.0.0.1:{thread.port}"
        api = KubeApi(
            url=url,
            port=thread.port,
            kubeconfig=write_kubeconfig(workdir / "kubeconfig", url),
            kubectl_cache=workdir / "kubectl-cache",
            client=KubeClient(url),
            emulator=thread.emulator,
            _thread=thread,
        )
        for crd in served:
            api.register_crd(crd)
        yield api
    finally:
        thread.stop()
    errors = thread.emulator.internal_errors if thread.emulator is not None else []
    if errors:
        raise EmulatorCrashError("the emulator crashed on a request:\n" + "\n".join(errors))
