"""Splitting the compiled config into ConfigMaps that fit the API server, and back."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvpool.api.admission_config import AdmissionConfig, ShardIndex
from kvpool.domain.compile import config_hash
from kvpool.domain.config_shards import (
    NEAR_LIMIT_BYTES,
    OBJECT_LIMIT_BYTES,
    ShardMismatchError,
    assemble_config,
    assess_sizes,
    data_bytes,
    plan_shards,
    shard_of,
)
from tests.builders.compiled import standard_admission_config


def with_tenants(count: int) -> AdmissionConfig:
    builder = standard_admission_config(["http://127.0.0.1:1"])
    for i in range(count):
        builder.tenant(f"t-{i:05d}", key=f"sk-{i}", tiers=["batch"], limits=[(60, 1000)])
    return builder.obj()


def texts(
    config: AdmissionConfig, **kw: int
) -> tuple[AdmissionConfig, ShardIndex | None, dict[str, str]]:
    sharded = plan_shards(config, config_hash(config), **kw)
    index = AdmissionConfig.model_validate_json(sharded.index_text)
    return index, sharded.shard_index, {s.name: s.text for s in sharded.shards}


@pytest.mark.parametrize(
    ("tenants", "inline", "target", "shards"),
    [
        pytest.param(2, 256 * 1024, 256 * 1024, 0, id="small-config-stays-one-document"),
        pytest.param(1200, 256 * 1024, 256 * 1024, 0, id="1200-tenants-under-256-KiB-inline"),
        pytest.param(400, 64 * 1024, 256 * 1024, 1, id="over-inline-one-shard"),
        pytest.param(3000, 256 * 1024, 256 * 1024, 3, id="3000-tenants-three-shards"),
        pytest.param(300, 1024, 8 * 1024, 8, id="small-target-many-shards"),
    ],
)
def test_plan_shards_then_assemble_gives_back_the_config(
    tenants: int, inline: int, target: int, shards: int
) -> None:
    config = with_tenants(tenants)
    index, shard_index, shard_texts = texts(
        config, inline_bytes=inline, target_bytes=target, max_bytes=2 * target
    )
    assert len(shard_texts) == shards
    assert (shard_index is None) == (shards == 0)
    if shard_index is not None:
        assert index.tenants == [] and shard_index.generation == config_hash(config)
        assert sum(r.tenants for r in shard_index.tenant_shards) == len(config.tenants)
    assert assemble_config(index, shard_index, shard_texts) == config


def test_one_changed_tenant_rewrites_one_shard() -> None:
    config = with_tenants(3000)
    _, _, before = texts(config)
    tenants = list(config.tenants)
    tenants[7] = tenants[7].model_copy(update={"weight": 9})
    _, _, after = texts(config.model_copy(update={"tenants": tenants}))
    assert len(set(before) ^ set(after)) == 2


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        pytest.param(lambda t: {}, "is missing", id="shard-missing"),
        pytest.param(
            lambda t: {k: v.replace("t-0", "t-9", 1) for k, v in t.items()},
            "has digest",
            id="shard-content-differs",
        ),
    ],
)
def test_a_shard_set_that_does_not_match_the_index_is_refused(
    edit: Callable[[dict[str, str]], dict[str, str]], message: str
) -> None:
    index, shard_index, shard_texts = texts(with_tenants(3000))
    with pytest.raises(ShardMismatchError, match=message):
        assemble_config(index, shard_index, edit(shard_texts))


def test_shard_of_is_stable_and_spreads() -> None:
    assert shard_of("acme", 9) == shard_of("acme", 9)
    counts = [0] * 4
    for i in range(4000):
        counts[shard_of(f"t-{i}", 4)] += 1
    assert min(counts) > 900, counts


@pytest.mark.parametrize(
    ("largest", "verdict"),
    [
        pytest.param(1000, "ok", id="small"),
        pytest.param(NEAR_LIMIT_BYTES, "ok", id="exactly-900-KiB"),
        pytest.param(NEAR_LIMIT_BYTES + 1, "near", id="above-900-KiB"),
        pytest.param(OBJECT_LIMIT_BYTES, "near", id="exactly-1-MiB"),
        pytest.param(OBJECT_LIMIT_BYTES + 1, "too_large", id="over-1-MiB"),
    ],
)
def test_assess_sizes(largest: int, verdict: str) -> None:
    objects = {"a": {"k": "x" * 10}, "big": {"k": "x" * (largest - 1)}}
    result = assess_sizes(objects)
    assert (result.verdict, result.largest, result.largest_bytes) == (verdict, "big", largest)
    assert data_bytes(objects["big"]) == largest
