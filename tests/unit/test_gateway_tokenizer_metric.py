"""The gateway says which pools count prompts by the byte estimate (no loadable tokenizer).

``kvpool_gateway_tokenizer_fallback{pool}`` is 1 for a pool without ``tokenizerPath`` or
with a path where nothing loads (a volume not mounted into the gateway), 0 once the pool's
tokenizer loads; it follows config reloads and forgets removed pools. Real tokenizer file
(the tiny model's), real Gateway object; no I/O beyond reading the file.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kvpool.adapters import tokenizer as tokenizer_module
from kvpool.adapters.budget import InMemoryBudgetStore
from kvpool.gateway.server import Gateway
from kvpool.gateway.settings import GatewaySettings
from tests.builders import AdmissionConfigBuilder
from tests.support.waiting import wait_until_async


def config(**tokenizers: str | Path | None) -> AdmissionConfigBuilder:
    builder = AdmissionConfigBuilder().tier("interactive", 50).tier("batch", 20)
    for pool, path in tokenizers.items():
        builder.pool(pool, ["http://127.0.0.1:9"], tokenizer_path=path)
    return builder


def fallback(gateway: Gateway, pool: str) -> float | None:
    return gateway.metrics.registry.get_sample_value(
        "kvpool_gateway_tokenizer_fallback", {"pool": pool}
    )


async def test_pools_without_a_loadable_tokenizer_are_flagged(
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

    # loads run in the background (none blocks the gateway): the flags follow them
    await wait_until_async(
        lambda: fallback(gateway, "chat") == fallback(gateway, "folder") == 0, 10, "the loads"
    )
    assert fallback(gateway, "unmounted") == 1
    assert fallback(gateway, "undeclared") == 1


async def test_a_reload_updates_the_flags_and_drops_removed_pools(
    tiny_tokenizer_json: Path,
) -> None:
    gateway = Gateway(
        config(chat=None, old=None).obj(),
        InMemoryBudgetStore(),
        settings=GatewaySettings(access_log=False),
    )
    assert fallback(gateway, "chat") == 1

    gateway.apply_config(config(chat=tiny_tokenizer_json).obj())

    assert fallback(gateway, "old") is None
    await wait_until_async(lambda: fallback(gateway, "chat") == 0, 10, "the load")


def _gated_fetch(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Make every tokenizer load wait for the returned gate (a slow volume, on demand)."""
    real = tokenizer_module.fetch_tokenizer
    gate = threading.Event()

    def gated(path: str, **kwargs: Any) -> tokenizer_module.LoadedTokenizer | None:
        assert gate.wait(10), "the test never opened the gate"
        return real(path, **kwargs)

    monkeypatch.setattr(tokenizer_module, "fetch_tokenizer", gated)
    return gate


async def test_a_slow_tokenizer_load_does_not_stall_the_event_loop(
    tiny_tokenizer_json: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A config reload loads tokenizers on a worker thread: apply_config returns while the
    load is still blocked (loaded inline, it would wait for the gate for 10 s)."""
    gate = _gated_fetch(monkeypatch)
    gateway = Gateway(
        config(chat=None).obj(), InMemoryBudgetStore(), settings=GatewaySettings(access_log=False)
    )
    started = time.monotonic()
    gateway.apply_config(config(chat=tiny_tokenizer_json).obj())
    assert time.monotonic() - started < 1.0, "apply_config waited for the tokenizer load"
    assert fallback(gateway, "chat") != 0  # not loaded yet
    gate.set()
    await wait_until_async(lambda: fallback(gateway, "chat") == 0, 10, "the tokenizer loads")


async def test_a_late_tokenizer_load_does_not_overwrite_a_newer_config(
    tiny_tokenizer_json: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = _gated_fetch(monkeypatch)
    gateway = Gateway(
        config(old=None).obj(), InMemoryBudgetStore(), settings=GatewaySettings(access_log=False)
    )
    gateway.apply_config(config(old=tiny_tokenizer_json).obj())  # its load waits at the gate
    gateway.apply_config(config(new=None).obj())  # nothing to load
    await wait_until_async(lambda: fallback(gateway, "new") == 1, 10, "the new config's flags")
    gate.set()
    await gateway.tasks.wait()  # the older config's load has finished
    assert fallback(gateway, "new") == 1
    assert fallback(gateway, "old") is None, "the older config's late load came back"
