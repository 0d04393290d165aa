"""BackgroundTasks keeps its tasks until they end, labels failures, and shuts down cleanly."""

from __future__ import annotations

import asyncio
import logging

import pytest

from kvpool.adapters.background import BackgroundTasks


async def test_a_failure_is_logged_and_counted_under_its_label(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failed: list[str] = []
    tasks = BackgroundTasks(on_failure=failed.append)

    async def boom() -> None:
        raise RuntimeError("engine gone")

    with caplog.at_level(logging.WARNING, logger="kvpool"):
        tasks.spawn(boom(), "publish")
        assert await tasks.wait(timeout=1)
    assert failed == ["publish"]
    assert "'publish' failed" in caplog.text and "engine gone" in caplog.text
    assert len(tasks) == 0


async def test_a_cancelled_task_is_not_a_failure() -> None:
    failed: list[str] = []
    tasks = BackgroundTasks(on_failure=failed.append)
    gate = asyncio.Event()
    tasks.spawn(gate.wait(), "settle")
    assert len(tasks) == 1
    await tasks.cancel()
    assert failed == [] and len(tasks) == 0


async def test_wait_gives_up_at_its_timeout_and_says_so() -> None:
    tasks = BackgroundTasks()
    gate = asyncio.Event()
    task = tasks.spawn(gate.wait(), "slow")
    assert not await tasks.wait(timeout=0.01)
    assert tasks.running() == {task}
    gate.set()
    assert await tasks.wait(timeout=1)


async def test_wait_also_waits_for_work_spawned_meanwhile() -> None:
    tasks = BackgroundTasks()
    done: list[str] = []

    async def second() -> None:
        done.append("second")

    async def first() -> None:
        tasks.spawn(second(), "second")
        done.append("first")

    tasks.spawn(first(), "first")
    assert await tasks.wait(timeout=1)
    assert done == ["first", "second"]
