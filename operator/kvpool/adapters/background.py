"""Background tasks that are kept, labelled and reported: one way to spawn them.

Why this module exists: a task made with ``asyncio.create_task`` and not referenced may be
garbage-collected before it ends, and its exception is only logged (as "Task exception was
never retrieved") when it is. The operator and the gateway both run work in the
background (status updates, rechecks, budget settlements, tokenizer loads, watchers), and
each needs the same three things: keep a reference until the task ends, say *which* work
failed, and let shutdown wait for (or cancel) what is still running. kopf's
``create_guarded_task`` is the model.

Example::

    tasks = BackgroundTasks(on_failure=lambda label: errors.labels(label).inc())
    tasks.spawn(publish(namespace), "publish")
    ...
    await tasks.wait(timeout=5)   # on shutdown: let them finish, then
    await tasks.cancel()          # cancel the rest
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger("kvpool")


class BackgroundTasks:
    """A set of running tasks, each with a label for its failure log line and metric."""

    def __init__(self, on_failure: Callable[[str], None] | None = None) -> None:
        self._tasks: dict[asyncio.Task[Any], str] = {}
        self._on_failure = on_failure

    def spawn(self, work: Coroutine[Any, Any, Any], label: str) -> asyncio.Task[Any]:
        """Run ``work`` on the running loop; keep it until it ends; log and count a failure
        under ``label`` (a cancelled task is not a failure)."""
        task = asyncio.create_task(work, name=f"kvpool:{label}")
        self._tasks[task] = label
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task[Any]) -> None:
        label = self._tasks.pop(task, "background")
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            return
        log.warning("background work %r failed: %r", label, exc)
        if self._on_failure is not None:
            self._on_failure(label)

    def __len__(self) -> int:
        return len(self._tasks)

    def running(self) -> set[asyncio.Task[Any]]:
        """The tasks that have not ended yet."""
        return set(self._tasks)

    async def wait(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds for every task (also those spawned meanwhile);
        True when none is left."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while self._tasks:
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                return False
            await asyncio.wait(set(self._tasks), timeout=left)
        return True

    async def cancel(self) -> None:
        """Cancel every task and wait until each has ended."""
        tasks = set(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
