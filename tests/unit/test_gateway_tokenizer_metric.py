"""The gateway says which pools count prompts by the byte estimate (no loadable tokenizer).

``kvpool_gateway_tokenizer_fallback{pool}`` is 1 for a pool without ``tokenizerPath`` or
with a path where nothing loads (a volume not mounted into the gateway), 0 once the pool's
tokenizer loads; it follows config reloads and forgets removed pools. Real tokenizer file
(the tiny model's), real Gateway object; no I/O beyond reading the file.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from kvpool.adapters import tokenizer as tokenizer_module
from kvpool.adapters.budget import InMemoryBudgetStore
from kvpool.gateway.server import Gateway, GatewaySettings
from tests.builders import AdmissionConfigBuilder


def config(**tokenizers: str | Path | None) -> AdmissionConfigBuilder:
    builder = AdmissionConfigBuilder().tier("interactive", 50).tier("batch", 20)
    for pool, path in tokenizers.items():
        builder.pool(pool, ["http://127.0.0.1:9"], tokenizer_path=path)
    return builder


def fallback(gateway: Gateway, pool: str) -> float | None:
    return gateway.metrics.registry.get_sample_value(
        "kvpool_gateway_tokenizer_fallback", {"pool": pool}
    )


def test_pools_without_a_loadable_tokenizer_are_flagged(
    tiny_tokenizer_json: Path, tmp_path: Path
) -> None:
    gateway = Gateway(
        config(
            chat=tiny_tokenizer_json,
            folder=tiny_tokenizer_json.parent,
            unmounted=tmp_path / "not-mounted" / "tokenizer.json",
            undeclared=None,
        ).obj(),
        InMemoryBudgetStore(),
        settings=GatewaySettings(access_log=False),
    )

    assert fallback(gateway, "chat") == 0
    assert fallback(gateway, "folder") == 0
    assert fallback(gateway, "unmounted") == 1
    assert fallback(gateway, "undeclared") == 1


def test_a_reload_updates_the_flags_and_drops_removed_pools(tiny_tokenizer_json: Path) -> None:
    gateway = Gateway(
        config(chat=None, old=None).obj(),
        InMemoryBudgetStore(),
        settings=GatewaySettings(access_log=False),
    )
    assert fallback(gateway, "chat") == 1

    gateway.apply_config(config(chat=tiny_tokenizer_json).obj())

    assert fallback(gateway, "chat") == 0
    assert fallback(gateway, "old") is None


async def test_a_slow_tokenizer_load_does_not_stall_the_event_loop(
    tiny_tokenizer_json: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A config reload loads tokenizers on a worker thread: the loop keeps serving."""
    real = tokenizer_module.fetch_tokenizer

    def slow_fetch(path: str) -> tokenizer_module.LoadedTokenizer | None:
        time.sleep(1.0)  # a large tokenizer.json on a slow volume
        return real(path)

    monkeypatch.setattr(tokenizer_module, "fetch_tokenizer", slow_fetch)
    gateway = Gateway(
        config(chat=None).obj(), InMemoryBudgetStore(), settings=GatewaySettings(access_log=False)
    )
    loop = asyncio.get_running_loop()
    started = loop.time()
    gateway.apply_config(config(chat=tiny_tokenizer_json).obj())
    await asyncio.sleep(0.01)
    assert loop.time() - started < 0.5, "apply_config blocked the event loop on the tokenizer"
    while fallback(gateway, "chat") != 0:
        assert loop.time() - started < 10, "the tokenizer never finished loading"
        await asyncio.sleep(0.05)


async def test_a_late_tokenizer_load_does_not_overwrite_a_newer_config(
    tiny_tokenizer_json: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = tokenizer_module.fetch_tokenizer

    def slow_fetch(path: str) -> tokenizer_module.LoadedTokenizer | None:
        time.sleep(0.5)
        return real(path)

    monkeypatch.setattr(tokenizer_module, "fetch_tokenizer", slow_fetch)
    gateway = Gateway(
        config(old=None).obj(), InMemoryBudgetStore(), settings=GatewaySettings(access_log=False)
    )
    gateway.apply_config(config(old=tiny_tokenizer_json).obj())  # slow
    gateway.apply_config(config(new=None).obj())  # fast: no tokenizer to load
    await asyncio.sleep(1.0)
    assert fallback(gateway, "new") == 1
    assert fallback(gateway, "old") is None, "the older config's late load came back"
