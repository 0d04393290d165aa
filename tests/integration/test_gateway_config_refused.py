"""The gateway refuses, at load, a hand-written config the operator would never compile
(issue 18.8), and keeps its last good config on a reload.

Before, a budget window of 0 s loaded and every request of the tenant raised
ZeroDivisionError (500), and ``maxConcurrency`` 0 or -1 loaded and admission hung (no
request of the tenant ever started). Each case: the config is refused by the reader with
an error naming the field and the value; when it loads anyway (the defect), one request is
sent to an in-process gateway on it and what happened is the assertion's figure.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from kvpool.adapters.config_source import ConfigError, FileConfigSource, parse_config
from tests.builders import AdmissionConfigBuilder
from tests.support.gateway import FakeEngine, GatewayClientFactory
from tests.support.waiting import wait_until_async


def document(engine: str) -> dict[str, Any]:
    config = (
        AdmissionConfigBuilder()
        .tier("batch", floor=80, wait=5.0)
        .pool("tiny", [engine])
        .tenant("acme", key="sk-acme", tiers=["batch"], limits=[(60.0, 100_000)])
    )
    return config.obj().model_dump(mode="json", by_alias=True, exclude_none=True)


def window_zero(doc: dict[str, Any]) -> None:
    doc["tenants"][0]["limits"][0]["windowSeconds"] = 0


def concurrency(value: int) -> Any:
    def edit(doc: dict[str, Any]) -> None:
        doc["tenants"][0]["maxConcurrency"] = value

    return edit


CASES = [
    (window_zero, "windowSeconds 0"),
    (concurrency(0), "maxConcurrency 0"),
    (concurrency(-1), "maxConcurrency -1"),
]


async def _served(gateway_client: GatewayClientFactory, text: str) -> str:
    """What one request does on a config that loaded (the defect's figure)."""
    client, _ = await gateway_client(parse_config(text, "hand-written.json"))
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 4}
    try:
        async with asyncio.timeout(3):
            resp = await client.post(
                "/v1/completions", json=body, headers={"Authorization": "Bearer sk-acme"}
            )
            return f"the config loaded; a request got {resp.status}: {(await resp.text())[:80]}"
    except TimeoutError:
        return "the config loaded; a request got no answer in 3 s (admission hung)"


@pytest.mark.parametrize(
    ("edit", "named"), CASES, ids=["window-0s", "concurrency-0", "concurrency-minus-1"]
)
async def test_an_invalid_hand_written_config_is_refused_at_load(
    fake_engine: FakeEngine, gateway_client: GatewayClientFactory, edit: Any, named: str
) -> None:
    doc = document(fake_engine.url)
    edit(doc)
    text = json.dumps(doc)
    try:
        parse_config(text, "hand-written.json")
    except ConfigError as error:
        message = str(error)
    else:
        pytest.fail(await _served(gateway_client, text))
    assert message.startswith("hand-written.json: tenants.0.") and named in message, message


async def test_a_reload_with_an_invalid_config_keeps_the_last_good_one(
    fake_engine: FakeEngine, tmp_path: Path
) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(document(fake_engine.url)))
    source = FileConfigSource(path, interval=0.05)
    good = source.load()
    applied: list[object] = []
    errors: list[str] = []
    watch = asyncio.create_task(source.watch(applied.append, errors.append))
    try:
        doc = document(fake_engine.url)
        window_zero(doc)
        path.write_text(json.dumps(doc) + " ")  # another size: a change
        await wait_until_async(lambda: errors or applied, 5, "the changed config reported")
    finally:
        watch.cancel()
    assert applied == [] and len(errors) == 1, (applied, errors)
    assert "windowSeconds 0" in errors[0], errors[0]
    assert good.tenants[0].limits[0].window_seconds == 60.0
