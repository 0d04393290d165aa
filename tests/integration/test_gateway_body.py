"""Large bodies never stall the gateway (real ``kvpool gateway`` process, real tokenizer).

Given a gateway process whose pool has the tiny model's tokenizer, when one tenant sends 3
rounds of 4 concurrent chat requests of 7.5 MiB each (just under the 8 MiB body cap), then
``/healthz`` (probed from another process) keeps answering within 100 ms (p99; or 1.5 x
one body's JSON parse on a machine where that is longer), every one
of them gets a clear 4xx (the prompt cannot fit the model), and the gateway's peak RSS
stays under 512 MiB. Before (parse, chat template and tokenization on the event loop), the
same run measured /healthz blocked 26 s and RSS 65 -> 887 MiB.
"""

from __future__ import annotations

import asyncio
import io
import json
import random
import sys
import time
import timeit
from pathlib import Path

import aiohttp
import pytest

from tests.builders import standard_admission_config
from tests.support.gateway import FakeEngine, GatewayProcesses
from tests.support.waiting import wait_until_async

ACME = {"Authorization": "Bearer sk-acme"}
MIB = 1024 * 1024
RSS_LIMIT = 512 * MIB
ROUNDS = 3  # rounds of 4 concurrent maximum bodies

# GET /healthz every 5 ms on one keep-alive connection until stdin closes; print the
# latencies (seconds) as JSON.
PROBE = """
import http.client, json, sys, threading, time
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
conn = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=30)
out = []
print("ready", flush=True)
while not stop.is_set():
    started = time.monotonic()
    conn.request("GET", "/healthz")
    conn.getresponse().read()
    out.append(time.monotonic() - started)
    stop.wait(0.005)  # the probing rate (and an end at once when stdin closes)
print(json.dumps(out))
"""


def big_chat_body(size: int) -> bytes:
    rng = random.Random(7)
    words = ["alpha", "beta", "gamma", "delta", "kv", "pool", "token", "budget", "engine"]
    text = " ".join(rng.choice(words) + str(rng.randrange(100)) for _ in range(size // 8))
    body = {"model": "tiny", "messages": [{"role": "user", "content": text[:size]}]}
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    ("max_model_len", "status"),
    [(512, 413), (131_072, 400)],
    ids=["refused-before-reading", "read-and-parsed-off-the-loop"],
)
async def test_healthz_answers_while_four_maximum_bodies_are_processed(
    tiny_tokenizer_json: Path,
    fake_engine: FakeEngine,
    gateway_process: GatewayProcesses,
    max_model_len: int,
    status: int,
) -> None:
    """512 tokens: no prompt of that model can be 7.5 MiB, the body is refused from its
    Content-Length (413). 131,072 tokens (x 11 bytes, the tokenizer's longest token, x 6
    for JSON escapes: a 9.3 MiB bound, above the 8 MiB cap): each body is read, parsed on
    a worker thread, found longer than any prompt of 131,072 tokens without being
    tokenized, and rejected by the estimate (400)."""
    config = standard_admission_config(
        [fake_engine.url], max_model_len=max_model_len, tokenizer_path=tiny_tokenizer_json
    )
    proc = await gateway_process.started(config, extra_args=("--no-access-log",))
    body = big_chat_body(8 * MIB - 64 * 1024)
    # json.loads holds the GIL for a whole body (C code, no switch interval), so one parse
    # on the worker thread may delay one probe by that long: the bound scales with this
    # machine's parse time (the stall this guards against lasted 26 s)
    parse_seconds = min(timeit.repeat(lambda: json.loads(body), number=1, repeat=3))
    bound = max(0.1, 1.5 * parse_seconds)
    rss_before = proc.process.rss_bytes()
    peak_rss = rss_before
    # the probe is its own process: nothing in this one (the uploads) can delay it
    prober = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        PROBE,
        str(proc.port),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert prober.stdin is not None and prober.stdout is not None
    assert await prober.stdout.readline() == b"ready\n"
    try:
        async with aiohttp.ClientSession() as session:

            async def send() -> tuple[int, dict[str, object]]:
                async with session.post(
                    f"{proc.url}/v1/chat/completions", data=io.BytesIO(body), headers=ACME
                ) as resp:
                    return resp.status, await resp.json()

            async def rounds() -> list[tuple[int, dict[str, object]]]:
                results: list[tuple[int, dict[str, object]]] = []
                for _ in range(ROUNDS):
                    results += await asyncio.gather(*(send() for _ in range(4)))
                return results

            started = time.monotonic()
            sending = asyncio.create_task(rounds())

            def sampled_until_answered() -> bool:
                """One reading of the RSS (every 20 ms) while the rounds run; True at their end."""
                nonlocal peak_rss
                peak_rss = max(peak_rss, proc.process.rss_bytes())
                return sending.done()

            try:
                await wait_until_async(sampled_until_answered, 120, "the rounds", interval=0.02)
            finally:
                sending.cancel()  # a no-op once they ended
            elapsed = time.monotonic() - started
            results = await sending
    finally:
        prober.stdin.close()
        latencies = sorted(json.loads(await prober.stdout.read()))
        await prober.wait()
    rss_after = proc.process.rss_bytes()
    p99 = latencies[max(0, int(len(latencies) * 0.99) - 1)]
    figures = (
        f"{len(latencies)} /healthz probes: p99 {p99 * 1000:.0f} ms (bound {bound * 1000:.0f} "
        f"ms; one parse {parse_seconds * 1000:.0f} ms), max "
        f"{latencies[-1] * 1000:.0f} ms; {ROUNDS} x 4 bodies of {len(body) / MIB:.1f} MiB in "
        f"{elapsed:.2f} s; RSS {rss_before / MIB:.0f} -> peak {peak_rss / MIB:.0f} -> "
        f"{rss_after / MIB:.0f} MiB"
    )
    print(figures, [round(x * 1000) for x in latencies[-5:]])
    assert [code for code, _ in results] == [status] * 4 * ROUNDS, (results[:2], figures)
    assert p99 < bound, figures
    assert peak_rss < RSS_LIMIT, figures
