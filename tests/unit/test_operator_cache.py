"""The operator's cache (secret digests, pod views, parse memo) and its coalescing queue."""

from __future__ import annotations

import asyncio
import base64
import hashlib
from typing import Any

import pytest

from kvpool.adapters.background import BackgroundTasks
from kvpool.api.tierpolicy import TierPolicy
from kvpool.controller.cache import Cache, pod_view, secret_digests
from kvpool.controller.coalescer import Coalescer
from kvpool.domain.compile import PodView
from tests.builders import standard_tierpolicy_manifest
from tests.support.timing import loop_turns
from tests.support.waiting import ManualClock


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize(
    ("secret", "expected"),
    [
        ({"data": {"api-key": _b64("sk-1")}}, {"api-key": hashlib.sha256(b"sk-1").hexdigest()}),
        ({"data": {"api-key": _b64("sk-1\n")}}, {"api-key": hashlib.sha256(b"sk-1").hexdigest()}),
        ({"stringData": {"api-key": "sk-2"}}, {"api-key": hashlib.sha256(b"sk-2").hexdigest()}),
        ({"data": {"api-key": "not base64!"}}, {}),
        ({}, {}),
    ],
    ids=["data-base64", "trailing-newline", "string-data", "malformed-skipped", "empty"],
)
def test_secrets_are_reduced_to_digests(secret: dict[str, Any], expected: dict[str, str]) -> None:
    assert secret_digests(secret) == expected


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        (
            {
                "metadata": {"name": "p", "labels": {"kvpool.dev/track": "canary"}},
                "status": {
                    "podIP": "10.0.0.1",
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            },
            PodView("p", "10.0.0.1", True, "canary"),
        ),
        ({"metadata": {"name": "p"}}, PodView("p", None, False, "stable")),
        (
            {
                "metadata": {"name": "p", "deletionTimestamp": "x"},
                "status": {
                    "podIP": "10.0.0.1",
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            },
            PodView("p", "10.0.0.1", False, "stable"),
        ),
    ],
    ids=["ready-canary", "pending", "terminating-is-not-ready"],
)
def test_pod_views(pod: dict[str, Any], expected: PodView) -> None:
    assert pod_view(pod) == expected


def test_pods_follow_their_pool_label_and_deletion() -> None:
    cache = Cache()
    pod = {
        "metadata": {"name": "p", "labels": {"kvpool.dev/pool": "a"}},
        "status": {"podIP": "10.0.0.1"},
    }
    cache.put_pod(("ns", "p"), pod)
    assert list(cache.pods[("ns", "a")]) == ["p"]
    pod["metadata"]["labels"]["kvpool.dev/pool"] = "b"
    cache.put_pod(("ns", "p"), pod)
    assert (cache.pods[("ns", "a")], list(cache.pods[("ns", "b")])) == ({}, ["p"])
    cache.put_pod(("ns", "p"), None)
    assert cache.pods[("ns", "b")] == {}


def test_checks_are_memoised_per_resource_version() -> None:
    cache = Cache()
    body = standard_tierpolicy_manifest().dict()
    body["metadata"]["resourceVersion"] = "1"
    first = cache.checked(body)
    assert isinstance(first.model, TierPolicy) and cache.checked(body) is first
    body["spec"]["tiers"][0]["floorPercent"] = 20
    body["metadata"]["resourceVersion"] = "2"
    assert cache.checked(body).model.spec.tiers[0].floor_percent == 20  # type: ignore[union-attr]
    body["spec"]["tiers"][0]["floorPercent"] = 95  # floors now sum over 100
    body["metadata"]["resourceVersion"] = "3"
    invalid = cache.checked(body)
    assert invalid.model is None and invalid.findings[0].path == "spec.tiers"


def test_referenced_secrets() -> None:
    cache = Cache()
    cache.put_budget(
        ("ns", "acme"), {"metadata": {"name": "acme"}, "spec": {"apiKeySecretRef": {"name": "k"}}}
    )
    assert cache.referenced_secret("ns", "k")
    assert not cache.referenced_secret("ns", "other") and not cache.referenced_secret("other", "k")
    cache.put_budget(("ns", "acme"), None)
    assert not cache.referenced_secret("ns", "k")


async def test_a_burst_of_requests_costs_at_most_two_runs() -> None:
    runs: list[str] = []
    gate = asyncio.Event()

    async def work(key: str) -> None:
        runs.append(key)
        await gate.wait()

    queue = Coalescer(work)
    first = asyncio.create_task(queue.request("a"))
    await loop_turns()  # the first run starts and waits on the gate
    burst = [asyncio.create_task(queue.request("a")) for _ in range(10)]
    other = asyncio.create_task(queue.request("b"))  # other keys are independent
    await loop_turns()  # the burst is queued behind the first run
    gate.set()
    await asyncio.gather(first, *burst, other)
    assert sorted(runs) == ["a", "a", "b"]


async def test_a_failed_run_lets_the_next_request_run_again() -> None:
    calls = 0

    async def work(key: str) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("API down")

    queue = Coalescer(work)
    with pytest.raises(RuntimeError):
        await queue.request("a")
    await queue.request("a")
    assert calls == 2


async def _settle() -> None:
    """Let every task that can run now run (a few loop turns; nothing waits on time)."""
    await loop_turns(5)


async def test_request_after_runs_once_when_the_time_comes() -> None:
    clock, runs = ManualClock(0.0), []

    async def work(key: str) -> None:
        runs.append((key, clock.monotonic()))

    queue = Coalescer(work, clock=clock)
    queue.request_after("a", 2.0)
    queue.request_after("a", 5.0)  # later than the one pending: changes nothing
    await _settle()
    clock.advance(1.9)
    await _settle()
    assert runs == [], f"ran {runs} before its 2 s"
    clock.advance(0.1)
    await _settle()
    clock.advance(10.0)
    await _settle()
    assert runs == [("a", 2.0)], f"expected one run at 2 s, got {runs}"
    assert queue.delayed("a") is None


async def test_an_earlier_request_after_replaces_the_pending_one() -> None:
    clock, runs = ManualClock(0.0), []

    async def work(key: str) -> None:
        runs.append(clock.monotonic())

    queue = Coalescer(work, clock=clock)
    queue.request_after("a", 10.0)
    queue.request_after("a", 1.0)
    assert queue.delayed("a") == 1.0
    await _settle()
    clock.advance(1.0)
    await _settle()
    clock.advance(20.0)
    await _settle()
    assert runs == [1.0], f"expected one run at 1 s (the 10 s one cancelled), got {runs}"


async def test_a_failed_delayed_request_is_counted_under_its_label() -> None:
    failed: list[str] = []
    clock = ManualClock(0.0)

    async def work(key: str) -> None:
        raise RuntimeError("API down")

    queue = Coalescer(work, clock=clock, tasks=BackgroundTasks(failed.append), label="requeue")
    queue.request_after("a", 1.0)
    await _settle()
    clock.advance(1.0)
    await _settle()
    assert failed == ["requeue"]
    queue.request_after("a", 1.0)  # a failure leaves no pending entry behind
    assert queue.delayed("a") == 2.0
