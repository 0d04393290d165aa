"""The gateway process's HTTP surface under hostile clients (real ``kvpool gateway`` process).

Given a gateway process in front of a fake engine (the engine is irrelevant here):

- ``/metrics`` (tenant names and usage) is not served on the API port, only on the
  separate metrics port;
- a request aiohttp itself refuses (an invalid ``Authorization`` header line) gets the
  gateway's OpenAI-format JSON, and nothing of the key is echoed;
- half-sent headers (slowloris) are closed after the header timeout (before: held for
  aiohttp's 3630 s keep-alive);
- a body that trickles in slower than the body timeout gets 408 JSON.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
import urllib.error
import urllib.request

import pytest

from tests.builders import standard_admission_config
from tests.support.gateway import FakeEngine, GatewayProcess, GatewayProcesses


@pytest.fixture
async def gateway(fake_engine: FakeEngine, gateway_process: GatewayProcesses) -> GatewayProcess:
    config = standard_admission_config([fake_engine.url])
    return await gateway_process.started(config, extra_args=("--body-timeout", "2"))


def get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read().decode()


async def test_metrics_are_not_served_on_the_api_port(gateway: GatewayProcess) -> None:
    status, content_type, body = await asyncio.to_thread(get, f"{gateway.url}/metrics")
    assert status == 404 and content_type.startswith("application/json"), (status, body)
    assert "kvpool_gateway" not in body
    status, _, body = await asyncio.to_thread(get, gateway.metrics_url)
    assert status == 200 and "kvpool_gateway_requests_total" in body


def raw_exchange(port: int, data: bytes, timeout: float = 5.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)


@pytest.mark.parametrize(
    "head",
    [
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-SECRET\x01key\r\n",
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-SECRET"
        + b"k" * 9000
        + b"\r\n",
        b"POST /v1/\x00completions HTTP/1.1\r\nAuthorization: Bearer sk-SECRET\r\n",
    ],
    ids=["control-char-in-authorization", "authorization-too-long", "bad-request-line"],
)
async def test_malformed_http_gets_openai_json_and_echoes_no_key(
    gateway: GatewayProcess, head: bytes
) -> None:
    answer = await asyncio.to_thread(
        raw_exchange, gateway.port, head + b"Content-Length: 2\r\n\r\n{}"
    )
    status_line, _, rest = answer.partition(b"\r\n")
    headers, _, body = rest.partition(b"\r\n\r\n")
    assert status_line.split(b" ")[1].startswith(b"4"), answer[:300]
    assert b"application/json" in headers, answer[:300]
    error = json.loads(body)["error"]
    assert error["code"] == "malformed_http" and error["type"] == "invalid_request_error"
    assert b"SECRET" not in answer, answer[:300]
    assert "SECRET" not in gateway.log_tail(200)


async def test_half_sent_headers_are_closed_after_the_header_timeout(
    gateway: GatewayProcess,
) -> None:
    """20 slowloris connections (a request head that never ends) are all closed by the
    gateway within the 10 s header timeout (+ 3 s slack)."""

    async def slowloris() -> float | None:
        started = time.monotonic()
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
        try:
            writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
            while time.monotonic() - started < 20:
                writer.write(b"X-Slow: 1\r\n")  # one more header line a second
                await writer.drain()
                try:
                    async with asyncio.timeout(1.0):
                        if await reader.read(1024) == b"":
                            return time.monotonic() - started
                except TimeoutError:
                    continue
        except ConnectionError:
            return time.monotonic() - started
        finally:
            writer.close()
        return None

    closed = await asyncio.gather(*(slowloris() for _ in range(20)))
    still_open = sum(1 for t in closed if t is None)
    latest = max((t for t in closed if t is not None), default=None)
    assert still_open == 0 and latest is not None and latest <= 13.0, (
        f"{still_open} of 20 half-sent-header connections still open after 20 s; "
        f"the last closed after {latest} s"
    )


async def test_a_trickling_body_gets_408(gateway: GatewayProcess) -> None:
    def trickle() -> bytes:
        body = json.dumps({"model": "tiny", "prompt": "hello", "max_tokens": 4}).encode()
        head = (
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-acme\r\n"
            b"Content-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
        )
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
            sock.sendall(head + body[:5])  # the rest never comes
            sock.settimeout(10)
            return sock.recv(65536)

    started = time.monotonic()
    answer = await asyncio.to_thread(trickle)
    elapsed = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b'"body_timeout"' in answer
    assert elapsed < 5.0, f"408 after {elapsed:.1f} s with a 2 s body timeout"
