"""The memory trimmer: every request for a trim is followed by one at least ``delay`` later,
trims stay ``interval`` apart, and a burst of requests costs at most two trims."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from kvpool.gateway.memory import MemoryTrimmer
from tests.support.waiting import wait_until_async

DELAY, INTERVAL = 0.02, 0.05


class Recorder:
    """A stand-in for ``malloc_trim``: when it ran (loop time)."""

    def __init__(self) -> None:
        self.at: list[float] = []

    def __call__(self, pad: int) -> int:
        self.at.append(asyncio.get_running_loop().time())
        return 1


async def requested(trimmer: MemoryTrimmer, gaps: list[float]) -> list[float]:
    """Ask for a trim after each gap (seconds; 0 = the same loop tick); when each was asked."""
    loop = asyncio.get_running_loop()
    asked = []
    for gap in gaps:
        if gap:
            await asyncio.sleep(gap)
        trimmer.soon()
        asked.append(loop.time())
    return asked


@pytest.mark.parametrize(
    "gaps",
    [
        pytest.param([0.0], id="one request"),
        pytest.param([0.0] * 100, id="a burst in one tick"),
        pytest.param([0.0, 0.01], id="a second request while the first trim waits"),
        pytest.param([0.0, 0.03, 0.03, 0.03], id="requests spread over the interval"),
        pytest.param([0.0, 0.2], id="two requests far apart"),
    ],
)
async def test_every_request_is_followed_by_a_trim_after_the_delay(gaps: list[float]) -> None:
    recorder = Recorder()
    trimmer = MemoryTrimmer(delay=DELAY, interval=INTERVAL, trim=recorder)
    asked = await requested(trimmer, gaps)
    await wait_until_async(
        lambda: bool(recorder.at) and recorder.at[-1] >= asked[-1] + DELAY,
        5,
        "a trim after the last request",
    )
    assert trimmer.trims == len(recorder.at)
    for when in asked:  # timers fire late, never early
        assert any(at >= when + DELAY for at in recorder.at), (when, recorder.at)
    spacing = [later - earlier for earlier, later in itertools.pairwise(recorder.at)]
    assert all(gap >= INTERVAL for gap in spacing), spacing


async def test_a_burst_costs_at_most_two_trims() -> None:
    recorder = Recorder()
    trimmer = MemoryTrimmer(delay=DELAY, interval=INTERVAL, trim=recorder)
    await requested(trimmer, [0.0] * 300)
    await asyncio.sleep(2 * INTERVAL + 2 * DELAY)
    assert 1 <= len(recorder.at) <= 2, recorder.at


async def test_without_malloc_trim_nothing_is_scheduled() -> None:
    trimmer = MemoryTrimmer(trim=None)
    trimmer.soon()
    assert trimmer._scheduled is None  # no timer wakes the loop for a trim that cannot run
    assert trimmer.trims == 0
