"""Where the gateway gets its compiled admission config: a file, or the operator's ConfigMap.

Why this module exists: the gateway must pick up a new plan (new capacity, a canary weight,
a new tenant) without a restart and without dropping in-flight requests. The sources here
only *fetch and parse*; the gateway swaps its config atomically and reconfigures its
admission controllers (in-flight reservations are kept).

- :class:`FileConfigSource` polls the file's identity ``(inode, mtime_ns, size)`` every
  ``interval`` seconds (a ConfigMap mounted as a volume is replaced by a symlink swap, which
  changes the inode; an editor's in-place write changes mtime/size), and parses it again
  when it changed.
- :class:`ConfigMapSource` polls ``GET /api/v1/namespaces/NS/configmaps/NAME`` and parses
  key ``config.json`` only when ``metadata.resourceVersion`` changed (an unchanged poll
  decodes a small index, off the event loop, and nothing else). A sharded config
  (:mod:`kvpool.domain.config_shards`) is assembled from the index and the tenant shards
  it names; shards are content-addressed, so only new ones are read, and a set that does
  not match the index (a publish in progress) is read again on the next poll. In a pod it uses the
  service account (token and CA under ``/var/run/secrets/kubernetes.io/serviceaccount``);
  ``server``/``token`` may be given for tests. Polling (not a watch) keeps it simple and
  robust to API restarts; a 2 s interval is far below how often plans change.

A document that does not parse (bad JSON, unknown ``formatVersion``, a field the contract
does not know) is *not* applied: the gateway keeps the last good config and the
``on_error`` callback (a metric) and a log line say why.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from pydantic import ValidationError

from kvpool.api.admission_config import (
    CONFIGMAP_KEY,
    CONFIGMAP_NAME,
    SHARD_TENANTS_KEY,
    SHARDS_KEY,
    AdmissionConfig,
    ShardIndex,
)
from kvpool.domain.config_shards import ShardMismatchError, assemble_config

log = logging.getLogger("kvpool.config")

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")

OnConfig = Callable[[AdmissionConfig], Awaitable[None] | None]
OnError = Callable[[str], None]


class ConfigError(Exception):
    """The config could not be read or does not follow the contract."""


def parse_config(text: str | bytes, origin: str) -> AdmissionConfig:
    """Parse a compiled admission config document (JSON)."""
    try:
        return AdmissionConfig.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise ConfigError(
            f"{origin}: {where or 'document'}: {first.get('msg')} ({exc.error_count()} error(s))"
        ) from exc


def fetch_config_file(path: str | os.PathLike[str]) -> AdmissionConfig:
    """Read and parse a config file."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}") from exc
    return parse_config(data, str(path))


async def _deliver(on_config: OnConfig, config: AdmissionConfig) -> None:
    result = on_config(config)
    if result is not None:
        await result


class FileConfigSource:
    """A config file, re-read when its identity changes."""

    def __init__(self, path: str | os.PathLike[str], interval: float = 1.0) -> None:
        self.path = Path(path)
        self.interval = interval
        self._identity: tuple[int, int, int] | None = None

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def load(self) -> AdmissionConfig:
        """The current config (raises ConfigError); remembers its identity."""
        identity = self._stat()
        config = fetch_config_file(self.path)
        self._identity = identity
        return config

    def changed(self) -> bool:
        """Whether the file looks different from the last load."""
        identity = self._stat()
        return identity is not None and identity != self._identity

    async def watch(self, on_config: OnConfig, on_error: OnError | None = None) -> None:
        """Poll forever (cancel the task to stop); deliver each new valid config."""
        while True:
            await asyncio.sleep(self.interval)
            if not self.changed():
                continue
            try:
                config = self.load()
            except ConfigError as exc:
                self._identity = self._stat()  # do not re-log the same broken file
                log.error("config not reloaded, keeping the last good one: %s", exc)
                if on_error is not None:
                    on_error(str(exc))
                continue
            log.info("config reloaded from %s", self.path)
            await _deliver(on_config, config)


@dataclass(frozen=True)
class KubeAccess:
    """How to reach the Kubernetes API."""

    server: str
    token: str | None = None
    ca_file: str | None = None

    @classmethod
    def in_cluster(cls) -> KubeAccess:
        """The pod's service account (raises ConfigError outside a cluster)."""
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise ConfigError("not in a cluster: KUBERNETES_SERVICE_HOST is not set")
        token_file = SERVICE_ACCOUNT / "token"
        token = token_file.read_text().strip() if token_file.is_file() else None
        ca = SERVICE_ACCOUNT / "ca.crt"
        host = f"[{host}]" if ":" in host else host
        return cls(
            server=f"https://{host}:{port}",
            token=token,
            ca_file=str(ca) if ca.is_file() else None,
        )


class ConfigMapSource:
    """The operator's ConfigMap, polled through the Kubernetes API."""

    def __init__(
        self,
        namespace: str,
        access: KubeAccess,
        name: str = CONFIGMAP_NAME,
        key: str = CONFIGMAP_KEY,
        interval: float = 2.0,
    ) -> None:
        self.namespace = namespace
        self.name = name
        self.key = key
        self.access = access
        self.interval = interval
        self._version: str | None = None
        self._shards: dict[str, str] = {}  # tenant shards held: name -> tenants.json

    @property
    def url(self) -> str:
        """The ConfigMap's API URL."""
        base = self.access.server.rstrip("/")
        return f"{base}/api/v1/namespaces/{self.namespace}/configmaps/{self.name}"

    def _session(self) -> aiohttp.ClientSession:
        headers = {"Accept": "application/json"}
        if self.access.token:
            headers["Authorization"] = f"Bearer {self.access.token}"
        ssl_ctx: ssl.SSLContext | bool = True
        if self.access.ca_file:
            ssl_ctx = ssl.create_default_context(cafile=self.access.ca_file)
        connector = aiohttp.TCPConnector(ssl=ssl_ctx)
        timeout = aiohttp.ClientTimeout(total=10)
        return aiohttp.ClientSession(headers=headers, connector=connector, timeout=timeout)

    def _url_of(self, name: str) -> str:
        base = self.access.server.rstrip("/")
        return f"{base}/api/v1/namespaces/{self.namespace}/configmaps/{name}"

    async def _get(self, session: aiohttp.ClientSession, name: str) -> dict[str, Any]:
        """One ConfigMap, decoded off the event loop (raises ConfigError)."""
        origin = f"configmap {self.namespace}/{name}"
        try:
            async with session.get(self._url_of(name)) as resp:
                if resp.status == 404 and name != self.name:
                    raise ConfigError(f"{origin}: not found (a publish in progress? read again)")
                if resp.status != 200:
                    raise ConfigError(f"{origin}: HTTP {resp.status}")
                raw = await resp.read()
            doc = await asyncio.to_thread(json.loads, raw)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise ConfigError(f"{origin}: {type(exc).__name__}: {exc}") from exc
        if not isinstance(doc, dict):
            raise ConfigError(f"{origin}: not a JSON object")
        return doc

    async def fetch(
        self, session: aiohttp.ClientSession, known: str | None = None
    ) -> tuple[str | None, AdmissionConfig | None]:
        """The index's resourceVersion and the parsed config, or ``(version, None)`` when
        the resourceVersion is ``known`` (nothing parsed then). Raises ConfigError."""
        origin = f"configmap {self.namespace}/{self.name}"
        doc = await self._get(session, self.name)
        version = (doc.get("metadata") or {}).get("resourceVersion")
        if known is not None and version == known:
            return version, None
        data = doc.get("data") or {}
        text = data.get(self.key)
        if not isinstance(text, str):
            raise ConfigError(f"{origin}: no key {self.key!r}")
        index = await asyncio.to_thread(parse_config, text, origin)
        shards_text = data.get(SHARDS_KEY)
        if shards_text is None:
            self._shards = {}
            return version, index
        try:
            shard_index = ShardIndex.model_validate_json(shards_text)
        except ValidationError as exc:
            raise ConfigError(f"{origin}: {SHARDS_KEY}: {exc.errors()[0].get('msg')}") from exc
        texts = {}
        for ref in shard_index.tenant_shards:
            cached = self._shards.get(ref.name)
            if cached is None:
                shard = await self._get(session, ref.name)
                cached = (shard.get("data") or {}).get(SHARD_TENANTS_KEY)
                if not isinstance(cached, str):
                    raise ConfigError(f"configmap {self.namespace}/{ref.name}: no tenants")
            texts[ref.name] = cached
        try:
            config = await asyncio.to_thread(assemble_config, index, shard_index, texts)
        except (ShardMismatchError, ValidationError) as exc:
            raise ConfigError(f"{origin}: tenant shards: {exc}") from exc
        self._shards = texts  # shards are content-addressed: a name's text never changes
        return version, config

    async def load(self) -> AdmissionConfig:
        """Fetch once (for start-up)."""
        async with self._session() as session:
            version, config = await self.fetch(session)
        assert config is not None
        self._version = version
        return config

    async def watch(self, on_config: OnConfig, on_error: OnError | None = None) -> None:
        """Poll forever (cancel the task to stop); deliver each new valid config.

        An unchanged index (same resourceVersion) is not parsed and no shard is read; a
        changed one reads only the shards not already held.
        """
        async with self._session() as session:
            while True:
                await asyncio.sleep(self.interval)
                try:
                    version, config = await self.fetch(session, self._version)
                except ConfigError as exc:
                    log.error("config not reloaded, keeping the last good one: %s", exc)
                    if on_error is not None:
                        on_error(str(exc))
                    continue
                if config is None or (version is not None and version == self._version):
                    continue
                self._version = version
                log.info("config reloaded from configmap %s/%s", self.namespace, self.name)
                await _deliver(on_config, config)
