"""The local demo, run as a user runs it (``python -m e2e.local_demo --quick``), judged by
its JSON results.

Given the whole system on this machine (API emulator, real vLLM CPU engine, Prometheus,
Redis, ``kvpool operator``, ``kvpool gateway``), when an interactive tenant and a batch
flood share the engine for ~30 s, then:

- the ModelPool's capacity is the one the operator *measured* from the engine;
- interactive requests were served, at least as large a share as of the batch flood, and
  with less queueing (the point of the product);
- the gateway's queue-time histogram has observations for both tiers;
- a second gateway replica joins through Redis: skewed ingress serves both tiers within the
  plan, and a killed replica's capacity is back within its lease TTL;
- a rollout to a revision with half the KV cache pauses with KVCapacityShrunk, no batch
  request reaches the canary, and an abort leaves stable-only routing.

Takes ~60-75 s on this 2-core machine (engine start ~20-25 s, traffic 30 s, drain, teardown).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.support.prometheus import prometheus_binary
from tests.support.redis_server import redis_binary
from tests.support.tiny_model import vllm_python

REPO = Path(__file__).resolve().parents[1]
DEMO_TIMEOUT_SECONDS = 420


def run_quick_demo(tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run the demo in --quick mode; on a timeout, SIGTERM it (it tears everything down)."""
    results = tmp_path / "local_demo.json"
    argv = [
        sys.executable,
        "-m",
        "e2e.local_demo",
        "--quick",
        "--workdir",
        str(tmp_path / "work"),
        "--results",
        str(results),
    ]
    proc = subprocess.Popen(
        argv,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        output, _ = proc.communicate(timeout=DEMO_TIMEOUT_SECONDS)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # the demo stops what it started, then exits
            try:
                proc.communicate(timeout=90)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
    return subprocess.CompletedProcess(argv, proc.returncode, output, None), results


@pytest.mark.engine
@pytest.mark.prometheus
@pytest.mark.redis
@pytest.mark.timeout(DEMO_TIMEOUT_SECONDS + 120)
def test_quick_demo_serves_interactive_with_measured_capacity(tmp_path: Path) -> None:
    missing = [
        what
        for what, present in (
            (f"the vLLM venv ({vllm_python()})", vllm_python().exists()),
            ("prometheus", prometheus_binary() is not None),
            ("redis-server", redis_binary() is not None),
            ("kubectl", shutil.which("kubectl") is not None),
        )
        if not present
    ]
    if missing:
        message = f"not installed: {', '.join(missing)} (run `make deps`)"
        if os.environ.get("CI", "").lower() not in ("", "0", "false", "no"):
            pytest.fail(f"CI: {message}", pytrace=False)  # CI must have installed them
        pytest.skip(message)

    completed, results_path = run_quick_demo(tmp_path)

    assert completed.returncode == 0, completed.stdout[-6000:]
    results: dict[str, Any] = json.loads(results_path.read_text())
    assert results["capacity"]["source"] == "Measured", results["capacity"]
    # The planned figure is the engine's own report (its minimum over replicas), not the
    # 4096 tokens the manifest declares.
    reported = min(results["engine_reported_kv_tokens"])
    assert 0 < results["capacity"]["kvTokensPerReplica"] <= reported, results["capacity"]
    interactive, batch = results["tiers"]["interactive"], results["tiers"]["batch"]
    table = completed.stdout[completed.stdout.find("Results with kvpool") :][:3000]
    # Interactive requests succeed: none fails, (nearly) all are served, and at least as
    # large a share of them as of the batch flood, which asks for more than the pool holds.
    assert interactive["requests"] > 0
    assert interactive["failed"] == 0, table
    assert interactive["admitted"] >= 0.8 * interactive["requests"], table
    served = {
        t: f["admitted"] / f["requests"] for t, f in results["tiers"].items() if f["requests"]
    }
    assert served["interactive"] >= served["batch"], table
    assert interactive["ttft_p95"] is not None
    assert batch["output_tokens"] > 0, table
    # The gateway's queue time is measured per tier, and batch waits longer than interactive.
    assert set(results["queue_histogram_tiers"]) >= {"interactive", "batch"}
    for tier, figures in (("interactive", interactive), ("batch", batch)):
        assert figures["queue_observations"] > 0, (tier, figures)
        assert figures["queue_p50"] is not None, (tier, figures)
        assert figures["queue_p95"] is not None, (tier, figures)
    assert interactive["queue_p95"] <= batch["queue_p95"], table
    # The rollout to a half-KV revision pauses at once, keeps batch on stable, and an abort
    # restores stable-only routing.
    rollout = results["rollout"]
    assert (rollout["paused_phase"], rollout["paused_reason"]) == ("Paused", "KVCapacityShrunk")
    assert (rollout["kv_gate"]["stable"], rollout["kv_gate"]["canary"]) == (2048, 1024)
    assert rollout["seconds_from_canary_ready_to_paused"] < 15
    assert rollout["batch_requests_on_stable"] > 0
    assert rollout["batch_requests_reached_canary"] == 0
    assert rollout["after_abort_phase"] == "Aborted"
    assert rollout["after_abort_tracks"]["canary"] == {"weight": 0, "endpoints": 0}
    # A second gateway replica joins through Redis; with batch at one replica and chats at
    # the other, both are served, the two together never hold more slots than the plan,
    # and the killed chat replica's capacity is back with the other within its lease TTL.
    scaleout = results["scaleout"]
    assert scaleout["members"] == 2
    assert scaleout["chats_answered_via_b"] > 0, scaleout
    assert scaleout["chats_answered_via_b"] == scaleout["chats_sent_via_b"], (
        f"chats not answered via b: {scaleout['chats_not_answered_via_b']} "
        f"of {scaleout['chats_sent_via_b']}"
    )
    assert scaleout["batch_answered_via_a"] > 0, scaleout
    assert scaleout["max_sum_in_use_slots"] <= scaleout["plan_slots"], scaleout
    assert scaleout["seconds_to_whole_plan_after_kill"] <= 5, scaleout
