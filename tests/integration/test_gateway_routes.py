"""Every route a real vLLM OpenAI server serves beyond the gateway's is refused with a 404
naming the routes the gateway serves - ``/v1/embeddings`` (an embedding model's engine
serves it) included - instead of aiohttp's
bare ``Not Found``; the gateway's own routes still answer.

Why refused and not passed through: kvpool admits against a plan of KV tokens held by a
request's prompt and output until its last token; an embedding, scoring or tokenizing
call is planned by nothing, and proxying it would put engine load outside admission
(docs/0004, "Limits and choices"). The route list is read from the engine's own
``/openapi.json``, so a vLLM that adds routes is covered too.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from kvpool.gateway.server import SERVED_ROUTES
from tests.builders import tiny_engine_admission_config
from tests.support.engine import VllmEngine
from tests.support.gateway import GatewayClientFactory

pytestmark = pytest.mark.engine

ACME = {"Authorization": "Bearer sk-acme"}


def engine_post_routes(engine: VllmEngine) -> list[str]:
    with urllib.request.urlopen(f"{engine.base_url}/openapi.json", timeout=10) as rsp:
        spec = json.load(rsp)
    return sorted(path for path, ops in spec["paths"].items() if "post" in ops and "{" not in path)


async def test_the_engines_other_routes_get_a_404_naming_the_served_ones(
    tiny_engine: VllmEngine, tiny_tokenizer_json: Path, gateway_client: GatewayClientFactory
) -> None:
    client, _ = await gateway_client(
        tiny_engine_admission_config(tiny_engine.base_url, tiny_tokenizer_json).obj()
    )
    served = {route.split()[1] for route in SERVED_ROUTES}
    # an embedding model's engine serves /v1/embeddings too (this one generates)
    others = sorted({*engine_post_routes(tiny_engine), "/v1/embeddings"} - served)
    assert len(others) > 5 and "/v1/chat/completions" not in others

    for path in others:
        answer = await client.post(path, json={"model": "tiny", "input": "hi"}, headers=ACME)
        error = (await answer.json())["error"]
        assert (answer.status, error["code"], error["type"]) == (
            404, "route_not_supported", "not_found_error"), path  # fmt: skip
        assert all(route in error["message"] for route in SERVED_ROUTES), error["message"]

    chat = await client.post(
        "/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        headers=ACME,
    )
    assert chat.status == 200, await chat.text()
    assert (await client.get("/v1/models", headers=ACME)).status == 200
