"""A tokenizerPath that blocks or is huge cannot freeze the gateway (issue 18.2).

Real ``kvpool gateway`` process, a real FIFO (a hung NFS/CSI volume blocks an open the same
way), a 256 MiB file and ``/dev/zero``, beside a pool with the tiny model's real
tokenizer. Before the fix, ``Tokenizer.from_file`` ran at start-up, synchronously and
holding the GIL: the gateway blocked on the FIFO's open before it listened, so ``/healthz``
never answered and a restarted pod crash-looped. Now the loads run on threads of their
own, refuse anything but a regular file under the size cap, and the pools whose tokenizer
cannot load serve with the byte estimate and say so.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.builders import AdmissionConfigBuilder
from tests.support.gateway import FakeEngine, GatewayProcess, GatewayProcesses
from tests.support.waiting import WaitTimeoutError, wait_until_async

HUGE_BYTES = 256 * 1024 * 1024


def healthz_seconds(gateway: GatewayProcess, timeout: float = 5.0) -> float:
    """How long ``/healthz`` took to answer 200 (``timeout`` + 1 when it did not)."""
    started = time.monotonic()
    try:
        with urllib.request.urlopen(f"{gateway.url}/healthz", timeout=timeout) as resp:
            ok = resp.status == 200
    except (urllib.error.URLError, OSError):
        ok = False
    return time.monotonic() - started if ok else timeout + 1


def fallback_flags(gateway: GatewayProcess) -> dict[str, float]:
    with urllib.request.urlopen(gateway.metrics_url, timeout=5) as resp:
        text = resp.read().decode()
    return {
        s.labels["pool"]: s.value
        for family in text_string_to_metric_families(text)
        if family.name == "kvpool_gateway_tokenizer_fallback"
        for s in family.samples
    }


def chat(gateway: GatewayProcess, model: str) -> int:
    request = urllib.request.Request(
        f"{gateway.url}/v1/chat/completions",
        data=json.dumps(
            {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        ).encode(),
        headers={"Authorization": "Bearer sk-acme", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        return int(resp.status)


async def test_fifo_device_and_huge_tokenizer_paths_do_not_freeze_the_gateway(
    fake_engine: FakeEngine,
    gateway_process: GatewayProcesses,
    tiny_tokenizer_json: Path,
    tmp_path: Path,
) -> None:
    """Given pools whose tokenizerPath is a FIFO nobody writes, a 256 MiB file and
    /dev/zero, beside one with a real tokenizer, when the gateway starts, then /healthz
    answers at once and keeps answering fast, every pool serves (the three by the byte
    estimate, flagged by kvpool_gateway_tokenizer_fallback), the real tokenizer loads, and
    the gateway's memory does not grow with the huge paths."""
    fifo = tmp_path / "hung" / "tokenizer.json"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    huge = tmp_path / "huge.json"
    with huge.open("wb") as out:
        out.truncate(HUGE_BYTES)  # sparse: large, costs no disk
    paths = {"fifo": fifo, "huge": huge, "zero": Path("/dev/zero"), "tiny": tiny_tokenizer_json}
    config = AdmissionConfigBuilder().tier("batch", floor=80)
    for name, path in paths.items():
        config.pool(name, [fake_engine.url], tokenizer_path=path)
    config.tenant("acme", key="sk-acme", tiers=["batch"])
    gateway = gateway_process.create(config)
    started = time.monotonic()
    await asyncio.to_thread(gateway.process.start)

    async def answered_after() -> float | None:
        """Seconds from the start to a /healthz answered within 1 s (None: not yet)."""
        if await asyncio.to_thread(healthz_seconds, gateway, 1.0) <= 1.0:
            return time.monotonic() - started
        return None

    try:  # within 20 s of the start: the process's own start (imports) included
        answered = await wait_until_async(
            answered_after, 20 - (time.monotonic() - started), "/healthz", interval=0.1
        )
    except WaitTimeoutError:
        raise AssertionError(
            f"/healthz did not answer within {time.monotonic() - started:.0f} s of the start "
            f"with a FIFO tokenizerPath (the gateway is frozen):\n{gateway.log_tail(20)}"
        ) from None
    probes = [await asyncio.to_thread(healthz_seconds, gateway) for _ in range(20)]
    assert max(probes) < 0.5, f"/healthz took up to {max(probes):.2f} s (20 probes)"
    statuses = {name: await asyncio.to_thread(chat, gateway, name) for name in paths}
    assert statuses == dict.fromkeys(paths, 200), statuses
    flags = await asyncio.to_thread(fallback_flags, gateway)
    assert flags == {"fifo": 1, "huge": 1, "zero": 1, "tiny": 0}, flags
    rss = gateway.process.rss_bytes()
    assert rss < 400 * 1024 * 1024, f"gateway RSS {rss / 2**20:.0f} MiB with the huge paths"
    log = gateway.log_tail(200)
    for name in ("fifo", "huge", "zero"):
        assert f"pool {name}: its tokenizer" in log, f"no log line for pool {name}:\n{log}"
    assert "FIFO" in log and "character device" in log and str(HUGE_BYTES) in log, log
    print(
        f"/healthz answered {answered:.2f} s after the start, then at most "
        f"{max(probes) * 1000:.0f} ms; RSS {rss / 2**20:.0f} MiB; flags {flags}"
    )
