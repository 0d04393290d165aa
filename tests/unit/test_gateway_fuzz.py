"""Fuzz the gateway's request path: whatever a client sends, the answer is never a 5xx.

Hypothesis generates bodies - arbitrary bytes (non-UTF-8 included), arbitrary JSON,
OpenAI-shaped objects with wrong types, missing or unknown ``model``, odd ``max_tokens``
/ ``n`` / ``stream`` / ``messages`` / ``prompt`` values, deep nesting, oversized bodies -
and sends them over real HTTP to a real gateway (in a background thread) in front of a
fake engine. Every answer must be a 2xx (the request was fine and was served) or a 4xx
with a JSON error body carrying a message; a 500 or a dropped connection fails the test.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from kvpool.adapters.budget import InMemoryBudgetStore
from kvpool.gateway.server import Gateway
from kvpool.gateway.settings import GatewaySettings
from tests.builders import standard_admission_config
from tests.support.gateway import FakeEngine

MAX_BODY = 4096
KEYS = ["Bearer sk-acme", "Bearer sk-bulk", "Bearer sk-chat", "Bearer sk-nope", "", "Basic x"]


class _Servers:
    """A fake engine and a gateway on one event loop in a background thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._stop: asyncio.Event | None = None
        self.error: BaseException | None = None

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._serve())
        except BaseException as exc:
            self.error = exc
            self._ready.set()
        finally:
            self.loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        engine = await FakeEngine().start()
        config = standard_admission_config(
            [engine.url], tokens_per_replica=100_000, slots_per_replica=64
        )
        config.tenant(
            "chatonly", key="sk-chat", tiers=["interactive"], labels={"class": "interactive"}
        )
        gateway = Gateway(
            config.obj(),
            InMemoryBudgetStore(),
            settings=GatewaySettings(
                max_body_bytes=MAX_BODY, access_log=False, metrics_on_api_port=True
            ),
        )
        runner = web.AppRunner(gateway.app(), handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await runner.cleanup()
            await engine.stop()

    def __enter__(self) -> _Servers:
        self._thread.start()
        self._ready.wait(timeout=30)
        if self.error is not None:
            raise self.error
        return self

    def __exit__(self, *exc: object) -> None:
        if self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=30)


@pytest.fixture(scope="module")
def gateway_port() -> Iterator[int]:
    with _Servers() as servers:
        yield servers.port


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
odd_numbers = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=3),
)
messages = st.one_of(
    json_values,
    st.lists(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["user", "system", "assistant"]) | json_values},
            optional={"content": st.text(max_size=200) | json_values},
        ),
        max_size=4,
    ),
)
prompts = st.one_of(
    st.text(max_size=300),
    st.lists(st.text(max_size=20), max_size=3),
    st.lists(st.integers(min_value=-5, max_value=5000), max_size=20),
    json_values,
)
openai_bodies = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(["tiny", "unknown", ""]) | json_values,
        "max_tokens": odd_numbers,
        "max_completion_tokens": odd_numbers,
        "n": odd_numbers,
        "stream": odd_numbers,
        "stream_options": json_values,
        "priority": odd_numbers,
        "messages": messages,
        "prompt": prompts,
    },
)


def _encode(value: Any) -> bytes:
    return json.dumps(value).encode()


valid_bodies = st.fixed_dictionaries(
    {
        "model": st.just("tiny"),
        "messages": st.lists(
            st.fixed_dictionaries(
                {"role": st.sampled_from(["user", "system"]), "content": st.text(max_size=100)}
            ),
            min_size=1,
            max_size=3,
        ),
        "prompt": st.text(max_size=200),
    },
    optional={
        "max_tokens": st.integers(min_value=1, max_value=40),
        "stream": st.booleans(),
        "n": st.integers(min_value=1, max_value=2),
    },
)
# Request shapes the engine serves (issue 8.1/9.1): missing or null max_tokens, n > 1,
# best_of, lists of prompts (strings and token ids), stream_options.
shaped_bodies = st.fixed_dictionaries(
    {
        "model": st.just("tiny"),
        "prompt": st.one_of(
            st.text(max_size=50),
            st.lists(st.text(max_size=30), min_size=1, max_size=4),
            st.lists(
                st.lists(st.integers(min_value=0, max_value=2000), min_size=1, max_size=600),
                min_size=1,
                max_size=3,
            ),
        ),
        "messages": st.lists(
            st.fixed_dictionaries({"role": st.just("user"), "content": st.text(max_size=60)}),
            min_size=1,
            max_size=2,
        ),
    },
    optional={
        "max_tokens": st.none() | st.integers(min_value=-1, max_value=600),
        "max_completion_tokens": st.none() | st.integers(min_value=0, max_value=600),
        "n": st.none() | st.integers(min_value=0, max_value=12),
        "best_of": st.integers(min_value=1, max_value=4),
        "stream": st.booleans(),
        "stream_options": st.none() | st.fixed_dictionaries({"include_usage": st.booleans()}),
    },
)

FIELDS = [
    "model",
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "stream",
]


def _mutate(body: dict[str, Any], field: str, value: Any, delete: bool) -> bytes:
    """A valid body with one field removed or given an odd value."""
    body = dict(body)
    if delete:
        body.pop(field, None)
    else:
        body[field] = value
    return _encode(body)


mutated_bodies = st.builds(
    _mutate,
    valid_bodies,
    st.sampled_from(FIELDS),
    st.sampled_from(["unknown", "tiny "]) | odd_numbers | json_values,
    st.booleans(),
)


bodies = st.one_of(
    valid_bodies.map(_encode),
    shaped_bodies.map(_encode),
    shaped_bodies.map(_encode),
    mutated_bodies,
    mutated_bodies,
    st.binary(max_size=300),
    json_values.map(_encode),
    openai_bodies.map(_encode),
    st.integers(min_value=1, max_value=5000).map(lambda n: b"[" * n + b"]" * n),
    st.just(b'{"model": "tiny", "prompt": "' + b"x" * (MAX_BODY + 10) + b'"}'),
    st.text(max_size=50).map(lambda t: ('{"model": "tiny", "prompt": "' + t).encode()),
    st.just(b'{"model": "tiny", "prompt": "a", "max_tokens": NaN}'),
    st.just(b'{"model": "tiny", "prompt": "\xff\xfe"}'),
)


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    path=st.sampled_from(["/v1/completions", "/v1/chat/completions"]),
    auth=st.sampled_from(KEYS[:3] * 4 + KEYS),
    body=bodies,
)
def test_request_path_never_answers_5xx(
    gateway_port: int, path: str, auth: str, body: bytes
) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", gateway_port, timeout=30)
    try:
        headers = {"Content-Type": "application/json"}
        if auth:
            headers["Authorization"] = auth
        conn.request("POST", path, body=body, headers=headers)
        resp = conn.getresponse()
        payload = resp.read()
    finally:
        conn.close()
    event(f"HTTP {resp.status}")
    assert resp.status < 500, (resp.status, payload[:300])
    if resp.status >= 400:
        assert resp.getheader("Content-Type", "").startswith("application/json")
        error = json.loads(payload)["error"]
        assert isinstance(error["message"], str) and error["message"]


def test_after_the_fuzz_nothing_is_reserved_or_in_flight(gateway_port: int) -> None:
    """Runs after the fuzz (file order): every reservation of every shape was released."""
    conn = http.client.HTTPConnection("127.0.0.1", gateway_port, timeout=30)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    held = [
        line
        for line in text.splitlines()
        if (
            line.startswith("kvpool_gateway_tier_tokens{")
            or line.startswith("kvpool_gateway_tier_slots{")
        )
        and ('kind="in_use"' in line or 'kind="borrowed"' in line or 'kind="queued"' in line)
        and float(line.rsplit(" ", 1)[1]) != 0
    ]
    assert not held, held
    assert "kvpool_gateway_in_flight 0.0" in text
