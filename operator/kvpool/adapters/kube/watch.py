"""Label-selected list-then-watch of one resource, resumed and relisted as needed.

Why it exists: kopf filters labels on the client side, so it would list and watch every
Secret and Pod the RBAC allows; :class:`LabelWatch` sends the selector to the API server,
which sends nothing else (the operator's Secret and Pod watches,
:mod:`kvpool.controller.watches`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp

from kvpool.adapters.kube.client import JsonObject, KubeClient
from kvpool.adapters.kube.errors import ApiError, api_error
from kvpool.adapters.kube.resources import Resource

log = logging.getLogger(__name__)

WatchHandler = Callable[[str, JsonObject], Awaitable[None]]
ListHandler = Callable[[list[JsonObject]], Awaitable[None]]


class WatchExpiredError(Exception):
    """The API server no longer has the resourceVersion a watch resumed from (410 Gone)."""


@dataclass
class LabelWatch:
    """List, then watch, the objects of one resource that match a label selector.

    Why not kopf's watch: kopf filters labels on the client side, so it would list and
    watch every Secret and Pod the RBAC allows; here the selector goes to the API server,
    which sends nothing else. :meth:`prime` lists (the caller fills its cache before
    acting); :meth:`follow` watches from the listed resourceVersion forever, relisting on
    410 Gone or a broken stream (``on_list`` then receives the complete current set, so a
    deletion missed meanwhile is not kept).
    """

    client: KubeClient
    resource: Resource
    namespace: str | None  # None: all namespaces
    selector: str  # labelSelector, e.g. "kvpool.dev/api-key"
    on_event: WatchHandler  # (ADDED | MODIFIED | DELETED, object)
    on_list: ListHandler  # the complete matching set after a (re)list
    timeout: int = 300  # seconds the server keeps one watch request open
    resource_version: str | None = None

    async def prime(self) -> None:
        """List the matching objects and hand them to ``on_list``."""
        listing = await self.client.request(
            "GET", self.resource.path(self.namespace), params={"labelSelector": self.selector}
        )
        listing = listing or {}
        self.resource_version = str((listing.get("metadata") or {}).get("resourceVersion", ""))
        await self.on_list(list(listing.get("items", [])))

    async def follow(self) -> None:
        """Watch until cancelled, resuming after each server timeout, relisting when needed."""
        delay = 0.5
        while True:
            try:
                if self.resource_version is None:
                    await self.prime()
                await self._watch_once()
                delay = 0.5
            except WatchExpiredError:
                self.resource_version = None
            except (ApiError, aiohttp.ClientError, TimeoutError, ValueError) as exc:
                log.info("watch %s (%s): %r; relisting", self.resource.plural, self.selector, exc)
                self.resource_version = None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)

    async def _watch_once(self) -> None:
        params = {
            "watch": "true",
            "labelSelector": self.selector,
            "resourceVersion": self.resource_version or "",
            "timeoutSeconds": str(self.timeout),
            "allowWatchBookmarks": "true",
        }
        session = await self.client.session()
        timeout = aiohttp.ClientTimeout(total=None, sock_read=self.timeout + 30)
        url = self.client.conn.server + self.resource.path(self.namespace)
        headers = self.client.headers(None)
        async with session.get(url, params=params, headers=headers, timeout=timeout) as rsp:
            if rsp.status == 410:
                raise WatchExpiredError()
            if rsp.status >= 400:
                raise api_error(rsp.status, (await rsp.text())[:300])
            async for line in rsp.content:
                if not line.strip():
                    continue
                event = json.loads(line)
                obj = event.get("object") or {}
                kind = event.get("type")
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise WatchExpiredError()
                    raise api_error(int(obj.get("code") or 0), str(obj.get("message")))
                version = (obj.get("metadata") or {}).get("resourceVersion")
                if version:
                    self.resource_version = str(version)
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    await self.on_event(kind, obj)
