"""The example of docs/0002 is what ``kvpool compile`` writes, and a gateway serves it.

It used to show one classification rule of four: used as it was, every chat call fell
through to the lowest tier and got ``403 tier_not_allowed``. Now the example is checked
against the compiler's output for examples/, and the real ``kvpool gateway`` started on
the example as printed (only the endpoint moved to a local fake engine) admits a chat
completion of tenant ``chat-product`` as interactive.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import aiohttp

from kvpool.adapters.offline_compile import compile_manifests
from tests.support.gateway import FakeEngine, GatewayProcesses

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "0002-admission-config.md"
CHAT_KEY = "replace-me-chat-product-key"  # examples/tenants.yaml, tenant chat-product


def doc_example() -> dict[str, Any]:
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("## Example") :]
    match = re.search(r"```json\n(.*?)\n```", section, flags=re.DOTALL)
    assert match, "docs/0002 has no ```json example"
    example: dict[str, Any] = json.loads(match.group(1))
    return example


def test_the_example_is_what_kvpool_compile_writes_for_the_examples() -> None:
    example = doc_example()
    (endpoint,) = example["pools"][0]["tracks"][0]["endpoints"]

    compiled = compile_manifests(
        [str(REPO / "examples")],
        endpoints={"llama-8b": f"{endpoint['name']}={endpoint['url']}"},
        key_files={},
        generated_at=example["generatedAt"],
    )

    assert compiled.config is not None, compiled.problems
    full = json.loads(compiled.config.to_json())
    shown = full | {
        "pools": [p for p in full["pools"] if p["name"] == "llama-8b"],
        "tenants": [t for t in full["tenants"] if t["tenant"] == "chat-product"],
    }
    assert example == shown


async def test_a_gateway_on_the_example_admits_a_chat_call_as_interactive(
    tmp_path: Path, fake_engine: FakeEngine, gateway_process: GatewayProcesses
) -> None:
    example = doc_example()
    example["pools"][0]["tracks"][0]["endpoints"][0]["url"] = fake_engine.url
    config = tmp_path / "config.json"
    config.write_text(json.dumps(example))
    gateway = await gateway_process.started(config)

    body = {"model": "llama-8b", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4}  # fmt: skip
    headers = {"Authorization": f"Bearer {CHAT_KEY}"}
    async with aiohttp.ClientSession() as session:
        url = f"{gateway.url}/v1/chat/completions"
        async with session.post(url, json=body, headers=headers) as rsp:
            answer = await rsp.text()
            status = rsp.status

    assert status == 200, answer
    (received,) = fake_engine.received
    assert received["priority"] == 0  # interactive's enginePriority, not eval's 20
