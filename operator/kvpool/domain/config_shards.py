"""Splitting the compiled admission config into ConfigMaps that each fit an API server.

Why it exists: a ConfigMap holds at most 1 MiB of data (the API server answers 422
"Too long" above it), and a tenant costs ~230 bytes of compiled config, so one document
for 5,000 tenants cannot be published at all; below the limit, a reader that must fetch
and parse the whole document to learn that nothing changed stalls its event loop. So a
config larger than :data:`INLINE_BYTES` is published as

- the *index* ``kvpool-admission``: ``config.json`` with the pools and tier policies (its
  ``tenants`` empty) and ``shards.json`` (:class:`~kvpool.api.admission_config.ShardIndex`)
  naming the tenant shards and the generation (the whole config's hash);
- *tenant shards* ``kvpool-admission-tenants-<digest>``: each a JSON list of tenants under
  ``tenants.json``. A tenant goes to shard ``sha256(tenant) mod N`` (stable: one changed
  tenant rewrites one shard), with ``N`` chosen so a shard holds about
  :data:`SHARD_TARGET_BYTES`. A shard's name carries its content's digest, so a shard is
  never rewritten in place: a reader that holds an index finds exactly the shards it names
  (or a 404 while an old one is being collected, and tries again), never a mixed set.

A config up to :data:`INLINE_BYTES` stays one document, exactly as ``kvpool compile``
writes it. Worked example: 10,000 tenants of ~250 bytes (2.5 MB in one document) -> N = 10
shards of 240-265 KB each plus an index of ~1 KB (the standard test config's pool and
policy); :func:`assemble_config` of the index and the nine
shards gives back the compiled config, equal to what ``kvpool compile`` prints.

Pure: no I/O; :mod:`kvpool.controller.publisher` writes the objects and
:mod:`kvpool.adapters.config_source` reads them.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from pydantic import TypeAdapter

from kvpool.api.admission_config import (
    SHARD_NAME_PREFIX,
    AdmissionConfig,
    CompiledTenant,
    ShardIndex,
    TenantShardRef,
)

OBJECT_LIMIT_BYTES: Final = 1024 * 1024  # the API server's limit on a ConfigMap's data
NEAR_LIMIT_BYTES: Final = 900 * 1024  # above this an object is "near the limit": warn
INLINE_BYTES: Final = 256 * 1024  # a config up to this size stays one document
SHARD_TARGET_BYTES: Final = 256 * 1024  # what one tenant shard should hold, about
SHARD_MAX_BYTES: Final = 512 * 1024  # a shard above this (hash skew) means one shard more

TENANT_LIST: Final = TypeAdapter(list[CompiledTenant])


class ShardMismatchError(ValueError):
    """The shards read do not match the index (a publish in progress, or a hand edit)."""


@dataclass(frozen=True)
class TenantShard:
    """One tenant shard to publish."""

    name: str  # the ConfigMap's name, kvpool-admission-tenants-<first 16 hex of sha256>
    text: str  # tenants.json: the JSON list of this shard's tenants
    sha256: str  # of text
    tenants: int  # how many


@dataclass(frozen=True)
class ShardedConfig:
    """What to publish for one config: the index's two texts and the tenant shards."""

    index_text: str  # config.json of the index (the whole config when not sharded)
    shard_index: ShardIndex | None  # shards.json; None: one document, no shards
    shards: tuple[TenantShard, ...]


def dump_tenants(tenants: Sequence[CompiledTenant]) -> str:
    """The canonical JSON of a list of tenants (the same field spelling as ``to_json``)."""
    return TENANT_LIST.dump_json(list(tenants), by_alias=True, exclude_none=True).decode()


def parse_tenants(text: str | bytes) -> list[CompiledTenant]:
    """A shard's tenants (raises pydantic.ValidationError)."""
    return TENANT_LIST.validate_json(text)


def shard_of(tenant: str, count: int) -> int:
    """Which of ``count`` shards a tenant goes to: stable across publishes and processes.

    >>> shard_of("acme", 1)
    0
    >>> shard_of("acme", 9) == shard_of("acme", 9)
    True
    """
    return int.from_bytes(hashlib.sha256(tenant.encode()).digest()[:8], "big") % count


def _build_shard(tenants: list[CompiledTenant]) -> TenantShard:
    text = dump_tenants(tenants)
    digest = hashlib.sha256(text.encode()).hexdigest()
    return TenantShard(f"{SHARD_NAME_PREFIX}{digest[:16]}", text, digest, len(tenants))


def plan_shards(
    config: AdmissionConfig,
    generation: str,
    inline_bytes: int = INLINE_BYTES,
    target_bytes: int = SHARD_TARGET_BYTES,
    max_bytes: int = SHARD_MAX_BYTES,
) -> ShardedConfig:
    """How to publish ``config``: one document when small, else an index and tenant shards.

    Tenants keep their order inside a shard; :func:`assemble_config` restores the
    compiler's order (by tenant name, stable). Empty shards are not published.
    """
    whole = config.to_json()
    if len(whole.encode()) <= inline_bytes or not config.tenants:
        return ShardedConfig(whole, None, ())
    tenant_bytes = len(dump_tenants(config.tenants).encode())
    count = max(1, math.ceil(tenant_bytes / target_bytes))
    while True:
        buckets: list[list[CompiledTenant]] = [[] for _ in range(count)]
        for tenant in config.tenants:
            buckets[shard_of(tenant.tenant, count)].append(tenant)
        shards = tuple(_build_shard(b) for b in buckets if b)
        if max(len(s.text.encode()) for s in shards) <= max_bytes or count >= len(config.tenants):
            break
        count += 1
    index = config.model_copy(update={"tenants": []}).to_json()
    refs = [TenantShardRef(name=s.name, sha256=s.sha256, tenants=s.tenants) for s in shards]
    return ShardedConfig(index, ShardIndex(generation=generation, tenant_shards=refs), shards)


def assemble_config(
    index: AdmissionConfig, shard_index: ShardIndex | None, shard_texts: Mapping[str, str]
) -> AdmissionConfig:
    """The whole config from the index and the texts of the shards it names.

    Raises :class:`ShardMismatchError` when a named shard is missing or its text does not
    hash to the digest the index gives (then the reader keeps its last good config and
    reads again), and pydantic.ValidationError when a shard does not parse.
    """
    if shard_index is None:
        return index
    tenants: list[CompiledTenant] = list(index.tenants)
    for ref in shard_index.tenant_shards:
        text = shard_texts.get(ref.name)
        if text is None:
            raise ShardMismatchError(f"tenant shard {ref.name} is missing")
        digest = hashlib.sha256(text.encode()).hexdigest()
        if digest != ref.sha256:
            raise ShardMismatchError(
                f"tenant shard {ref.name} has digest {digest[:16]}, the index names "
                f"{ref.sha256[:16]} (a publish in progress, or edited by hand)"
            )
        tenants.extend(parse_tenants(text))
    tenants.sort(key=lambda t: t.tenant)
    return index.model_copy(update={"tenants": tenants})


@dataclass(frozen=True)
class SizeVerdict:
    """The largest object of a publish and whether it fits: ``ok``, ``near`` or ``too_large``."""

    verdict: str
    largest: str  # the object's name
    largest_bytes: int

    @property
    def publishable(self) -> bool:
        """Whether the API server would take every object."""
        return self.verdict != "too_large"


def data_bytes(data: Mapping[str, str]) -> int:
    """A ConfigMap's data size as the API server counts it (keys and values, in bytes)."""
    return sum(len(k.encode()) + len(v.encode()) for k, v in data.items())


def assess_sizes(objects: Mapping[str, Mapping[str, str]]) -> SizeVerdict:
    """Whether each ConfigMap (name -> data) fits the API server's 1 MiB limit.

    | largest object        | verdict    |
    |-----------------------|------------|
    | up to 900 KiB         | ok         |
    | 900 KiB .. 1 MiB      | near       |
    | over 1 MiB            | too_large  |
    """
    sizes = {name: data_bytes(data) for name, data in objects.items()}
    name = max(sizes, key=lambda n: sizes[n])
    largest = sizes[name]
    if largest > OBJECT_LIMIT_BYTES:
        return SizeVerdict("too_large", name, largest)
    if largest > NEAR_LIMIT_BYTES:
        return SizeVerdict("near", name, largest)
    return SizeVerdict("ok", name, largest)
