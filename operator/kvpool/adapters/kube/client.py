"""A small async Kubernetes client: get, list, create, merge-patch, JSON-patch, delete.

Why it exists: every API call of the operator goes through one aiohttp client with one
connection pool and one failure policy (tested): 429 and 5xx answers and connection errors
are retried with exponential backoff (honouring ``Retry-After``); 404 on a read is None;
other errors raise the typed :mod:`.errors` (:class:`~.errors.ConflictError` on 409) to the
caller, whose reconcile is retried by kopf. The operator writes only with create,
merge-patch (``application/merge-patch+json``) and JSON patch: no PUT/replace and no
server-side apply (see GUIDE.md: the test API server has neither, and neither is needed).
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import Mapping
from typing import Any

import aiohttp

from kvpool.adapters.kube.connection import KubeConnection
from kvpool.adapters.kube.errors import ApiError, NotFoundError, api_error
from kvpool.adapters.kube.resources import Resource

log = logging.getLogger(__name__)

JsonObject = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
USER_AGENT = "kvpool-operator"  # tells the operator's own requests apart in audit logs


class KubeClient:
    """A small async Kubernetes client (create, get, list, patch, delete) with retries."""

    def __init__(
        self, conn: KubeConnection, *, attempts: int = 6, backoff: float = 0.2, timeout: float = 15
    ) -> None:
        self.conn = conn
        self.attempts = attempts
        self.backoff = backoff
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None
        self._closed = False  # after close(): no new session, no retries (shutting down)

    def _ssl(self) -> ssl.SSLContext | bool:
        if not self.conn.server.startswith("https"):
            return False
        if not self.conn.verify:
            return False
        ctx = ssl.create_default_context(cafile=self.conn.ca_file)
        if self.conn.cert_file and self.conn.key_file:
            ctx.load_cert_chain(self.conn.cert_file, self.conn.key_file)
        return ctx

    async def session(self) -> aiohttp.ClientSession:
        if self._closed:
            raise ApiError(0, "the client is closed (the operator is stopping)")
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=self._ssl(), limit=16)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)
        return self._session

    async def close(self) -> None:
        self._closed = True
        if self._session is not None:
            await self._session.close()
            self._session = None

    def headers(self, content_type: str | None) -> dict[str, str]:
        """Request headers: JSON, our User-Agent, the bearer token (re-read if from a file)."""
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        token = self.conn.token
        if self.conn.token_file is not None:
            token = self.conn.token_file.read_text().strip()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str | None = None,
        params: Mapping[str, str] | None = None,
    ) -> JsonObject | None:
        """One API call with retries on 429/5xx/connection errors; 404 -> None; another
        error answer raises its :mod:`.errors` type (409: :class:`ConflictError`)."""
        data = json.dumps(body) if body is not None else None
        ctype = content_type or ("application/json" if body is not None else None)
        delay = self.backoff
        for attempt in range(1, self.attempts + 1):
            try:
                session = await self.session()
                async with session.request(
                    method,
                    self.conn.server + path,
                    data=data,
                    params=params,
                    headers=self.headers(ctype),
                ) as response:
                    text = await response.text()
                    if response.status == 404:
                        return None
                    if response.status < 400:
                        return json.loads(text) if text else {}
                    if response.status not in RETRY_STATUSES or attempt == self.attempts:
                        raise api_error(response.status, f"{method} {path}: {text[:300]}")
                    retry_after = response.headers.get("Retry-After", "")
                    wait = float(retry_after) if retry_after.isdigit() else delay
            except (TimeoutError, aiohttp.ClientConnectionError) as exc:
                if attempt == self.attempts or self._closed:
                    raise ApiError(0, f"{method} {path}: {exc!r}") from exc
                wait = delay
            log.info("kube %s %s: retry %d in %.1fs", method, path, attempt, wait)
            await asyncio.sleep(min(wait, 5.0))
            delay *= 2
        raise AssertionError("unreachable")

    async def get(self, resource: Resource, namespace: str | None, name: str) -> JsonObject | None:
        return await self.request("GET", resource.path(namespace, name))

    async def list_objects(
        self,
        resource: Resource,
        namespace: str | None,
        labels: Mapping[str, str] | None = None,
        selector: str | None = None,
    ) -> list[JsonObject]:
        """Objects of a namespace (None: all), by labels (equality) or a raw selector."""
        if labels:
            selector = ",".join(f"{k}={v}" for k, v in labels.items())
        params = {"labelSelector": selector} if selector else None
        result = await self.request("GET", resource.path(namespace), params=params)
        return list((result or {}).get("items", []))

    async def create(self, resource: Resource, namespace: str, body: JsonObject) -> JsonObject:
        result = await self.request("POST", resource.path(namespace), body)
        if result is None:
            raise NotFoundError(f"namespace {namespace} or {resource.plural} not found")
        return result

    async def merge_patch(
        self, resource: Resource, namespace: str, name: str, patch: JsonObject, sub: str = ""
    ) -> JsonObject | None:
        return await self.request(
            "PATCH", resource.path(namespace, name, sub), patch, content_type=MERGE_PATCH
        )

    async def json_patch(
        self, resource: Resource, namespace: str, name: str, ops: list[JsonObject]
    ) -> JsonObject | None:
        return await self.request(
            "PATCH", resource.path(namespace, name), ops, content_type=JSON_PATCH
        )

    async def delete(self, resource: Resource, namespace: str, name: str) -> bool:
        """Delete an object; False when it was already gone."""
        return await self.request("DELETE", resource.path(namespace, name)) is not None
