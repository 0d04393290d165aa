"""The access log line of a request has exactly the fields docs/0004 lists."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.builders import standard_admission_config
from tests.support.gateway import FakeEngine, GatewayClientFactory

DOC = Path(__file__).resolve().parents[2] / "docs" / "0004-gateway.md"


def documented_fields() -> set[str]:
    text = DOC.read_text(encoding="utf-8")
    table = text[text.index("Access log (logger `kvpool.access`") :].split("\n\n")[1]
    rows = [line.split("|")[1] for line in table.splitlines()[2:]]
    return {name for row in rows for name in re.findall(r"`([a-z_]+)`", row)}


async def test_the_access_log_fields_are_the_documented_ones(
    fake_engine: FakeEngine, gateway_client: GatewayClientFactory, caplog: pytest.LogCaptureFixture
) -> None:
    client, _ = await gateway_client(
        standard_admission_config([fake_engine.url]).obj(), access_log=True
    )
    caplog.set_level("INFO", logger="kvpool.access")
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}

    answer = await client.post(
        "/v1/chat/completions", json=body, headers={"Authorization": "Bearer sk-acme"}
    )

    assert answer.status == 200, await answer.text()
    (line,) = [r.getMessage() for r in caplog.records if r.name == "kvpool.access"]
    assert set(json.loads(line)) == documented_fields()


async def test_a_stream_logs_the_engine_part_of_its_time_to_first_token(
    fake_engine: FakeEngine, gateway_client: GatewayClientFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Given an engine that answers after 150 ms, a streamed request's ``upstream_ttft_ms``
    holds those 150 ms and ``ttft_ms`` holds them too, with the gateway's part on top."""
    fake_engine.delay = 0.15
    client, _ = await gateway_client(
        standard_admission_config([fake_engine.url]).obj(), access_log=True
    )
    caplog.set_level("INFO", logger="kvpool.access")
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "stream": True,
    }

    answer = await client.post(
        "/v1/chat/completions", json=body, headers={"Authorization": "Bearer sk-acme"}
    )
    await answer.read()

    assert answer.status == 200
    (line,) = [r.getMessage() for r in caplog.records if r.name == "kvpool.access"]
    record = json.loads(line)
    assert 150 <= record["upstream_ttft_ms"] <= record["ttft_ms"], record
