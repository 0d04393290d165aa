"""vllm-router as a peer in the benchmarks: installed on demand, started over given engines.

Why this module exists: the benchmarks that compare kvpool with what a user gets for free
(peers.py, proxy_cpu.py) run the vLLM project's own router, ``vllm-router --policy
cache_aware``, the same way; scripts/ensure-vllm-router.sh installs it into a cached venv.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.ports import free_port
from tests.support.processes import ManagedProcess

REPO = Path(__file__).resolve().parent.parent


def router_binary() -> str:
    """The vllm-router executable (installed by scripts/ensure-vllm-router.sh if needed)."""
    script = REPO / "scripts" / "ensure-vllm-router.sh"
    out = subprocess.run([str(script)], check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


async def start_router(urls: list[str], workdir: Path) -> tuple[ManagedProcess, str]:
    """``vllm-router --policy cache_aware`` over ``urls``, once it answers /health: the
    process and its base URL (its log in ``workdir/router.log``)."""
    port = free_port()
    argv = [router_binary(), "--host", "127.0.0.1", "--port", str(port), "--worker-urls"]
    argv += [*urls, "--policy", "cache_aware"]
    process = ManagedProcess(argv, log_path=workdir / "router.log", env=os.environ, cwd=workdir)
    process.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            try:
                async with session.get(f"{base}/health") as resp:
                    if resp.status == 200:
                        return process, base
            except aiohttp.ClientError:
                pass
            if not process.running():
                break
            await asyncio.sleep(0.5)
    process.stop()
    tail = (workdir / "router.log").read_text()[-2000:]
    raise RuntimeError(f"vllm-router did not become healthy at {base}; its log ends:\n{tail}")
