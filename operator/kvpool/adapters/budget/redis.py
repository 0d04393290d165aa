"""Budgets in Redis, shared by every gateway replica (the arithmetic runs in Lua).

Why this module exists: two gateways that receive a burst at the same instant must not
both spend the last tokens, so check-and-charge is one atomic Lua script (``reserve.lua``;
``settle.lua`` corrects a charge, ``usage.lua`` reads). The scripts are package data next
to this module and run the same arithmetic as :mod:`kvpool.domain.budget`; one table of
cases in the tests runs against this store and the in-memory one.

Keys: ``kvpool:budget:{<namespace>/<tenant>}:<window seconds>``, a hash of counters
``t<bucket>``/``r<bucket>``. The ``{...}`` hash tag puts every window of one tenant in one
Redis Cluster slot (a script may only touch keys of one slot); the namespace keeps tenants
of the same name in different namespaces apart. Keys expire one window plus one bucket
after their last write.

This store only talks to Redis: every failure (refused, timed out, script error) is a
:class:`BudgetStoreError`. What a request gets when Redis fails is the business of the
failover wrapper (:mod:`kvpool.adapters.budget.failover`), which owns the circuit breaker.

Timeout: ``DEFAULT_TIMEOUT`` (100 ms) per round trip. At most ``max_connections`` (16)
calls are in flight; the others wait for their turn *outside* the timeout (a burst queueing
behind its own calls is this process's congestion, not a Redis failure: with the wait
inside the timeout, a 200-request burst through a gateway process got 133 spurious 503s on
a fail-closed tier). Measured on the 2-core test machine against a
local redis-server, 200 concurrent reservations (two windows each): slowest call 32-38 ms
from cold connections, 20-28 ms warm (16 connections; 32 and 64 connections were slower
cold: 43-60 and 65 ms). 100 ms leaves a 2.5x margin for a loaded node; a Redis that misses
it is sick, and the failover wrapper opens its breaker after 3 such calls in a row. The
old default (5 ms, unpooled) failed 199 of the same 200 calls ("Too many connections"
and timeouts), which on a fail-closed tier meant 199 spurious 503s.

The timeout is of Redis, not of this process. redis-py's own socket timeout used to be the
same 100 ms, and it fired when *this* event loop stalled with the answer already in the
socket: 40 calls, each with a 200 ms stall of the loop at a different point, failed 5
times ("Timeout reading from ..."). The socket timeout is now a 1 s backstop and only
``asyncio.wait_for`` times the call: 0 of 40, and 0 of ~22,000 calls under a loop stalled
150 ms every 0-50 ms. A hung Redis still fails each call within the timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from importlib import resources
from typing import Any

import redis.asyncio as aioredis

from kvpool.adapters.budget.protocol import (
    BudgetStoreError,
    StoreVerdict,
    UnavailableMode,
)
from kvpool.api.admission_config import BudgetWindow
from kvpool.domain.budget import (
    SUB_BUCKETS,
    BudgetAllow,
    BudgetCharge,
    BudgetVerdict,
    DenyKind,
    WindowUsage,
    build_deny,
    decide_reserve,
    plan_settlement,
)

DEFAULT_TIMEOUT = 0.1
DEFAULT_MAX_CONNECTIONS = 16
KEY_PREFIX = "kvpool:budget"


def load_script(name: str) -> str:
    """The text of one of the package's Lua scripts."""
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def budget_key(subject: str, window_seconds: float, prefix: str = KEY_PREFIX) -> str:
    """The Redis key of one window of a budget subject (``namespace/tenant``).

    >>> budget_key("team-a/shared", 60.0)
    'kvpool:budget:{team-a/shared}:60'
    """
    return f"{prefix}:{{{subject}}}:{window_seconds:g}"


def _fmt(value: float) -> str:
    return repr(float(value))


def _decode(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisBudgetStore:
    """Budgets in Redis; raises :class:`BudgetStoreError` when Redis does not answer."""

    remote = True

    def __init__(
        self,
        url: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        key_prefix: str = KEY_PREFIX,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
    ) -> None:
        self.url = url
        self.timeout = timeout
        self.key_prefix = key_prefix
        # A blocking pool: a burst waits for a free connection (bounded by ``timeout``)
        # instead of failing with "Too many connections".
        self._pool = pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=None,
            # a backstop only (``timeout`` bounds each call, in ``_call``): redis-py times
            # its reads with timers of this loop, which fire at once after a stall of this
            # process, whereas ``wait_for`` first looks whether the answer came in meanwhile
            socket_timeout=max(2 * timeout, 1.0),
            socket_connect_timeout=max(2 * timeout, 1.0),
            retry_on_timeout=False,
            health_check_interval=0,
        )
        self._redis: Any = aioredis.Redis(connection_pool=pool)
        self._slots = asyncio.Semaphore(max_connections)  # calls holding a connection
        self._reserve = self._redis.register_script(load_script("reserve.lua"))
        self._settle = self._redis.register_script(load_script("settle.lua"))
        self._usage = self._redis.register_script(load_script("usage.lua"))

    def key(self, subject: str, window_seconds: float) -> str:
        """The Redis key of one subject's window."""
        return budget_key(subject, window_seconds, self.key_prefix)

    async def _call(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        # Wait for a connection first, outside the timeout: a burst queueing behind its own
        # calls is this process's congestion, not Redis failing. Only the round trip is
        # timed (a hung Redis still fails each call within ``timeout``, and the failover
        # wrapper's breaker then stops the queue at once).
        async with self._slots:
            try:
                return await asyncio.wait_for(script(keys=keys, args=args), timeout=self.timeout)
            except (aioredis.RedisError, OSError, TimeoutError) as exc:
                message = str(exc) or f"no answer within {self.timeout * 1000:g} ms"
                raise BudgetStoreError(f"{type(exc).__name__}: {message}") from exc

    async def reserve(
        self,
        subject: str,
        limits: Sequence[BudgetWindow],
        tokens: int,
        now: float,
        tier: str | None = None,
        when_unavailable: UnavailableMode | None = None,
    ) -> StoreVerdict:
        if not limits:
            return decide_reserve(subject, [], tokens, now)
        keys = [self.key(subject, w.window_seconds) for w in limits]
        args: list[Any] = [_fmt(now), tokens]
        for w in limits:
            args += [_fmt(w.window_seconds), w.tokens, -1 if w.requests is None else w.requests]
            args.append(SUB_BUCKETS)
        reply = await self._call(self._reserve, keys, args)
        return self._verdict(subject, limits, tokens, now, reply)

    def _verdict(
        self,
        subject: str,
        limits: Sequence[BudgetWindow],
        tokens: int,
        now: float,
        reply: list[Any],
    ) -> BudgetVerdict:
        if int(reply[0]) == 1:
            usage = tuple(
                WindowUsage(window=w, tokens=int(reply[1 + 2 * i]), requests=int(reply[2 + 2 * i]))
                for i, w in enumerate(limits)
            )
            charge = BudgetCharge(
                tenant=subject,
                tokens=tokens,
                at=now,
                windows=tuple(w.window_seconds for w in limits),
            )
            return BudgetAllow(charge=charge, usage=usage)
        window = limits[int(reply[1]) - 1]
        kind: DenyKind = _decode(reply[3])  # type: ignore[assignment]
        used = WindowUsage(window=window, tokens=int(reply[4]), requests=int(reply[5]))
        return build_deny(window, kind, used, tokens, float(_decode(reply[2])))

    async def settle(self, charge: BudgetCharge, actual_tokens: int, now: float) -> None:
        steps = plan_settlement(charge, actual_tokens, now)
        if not steps:
            return
        keys = [self.key(charge.tenant, s.window_seconds) for s in steps]
        args: list[Any] = []
        for s in steps:
            args += [s.index, s.delta]
        await self._call(self._settle, keys, args)

    async def usage(
        self, subject: str, limits: Sequence[BudgetWindow], now: float
    ) -> list[WindowUsage]:
        keys = [self.key(subject, w.window_seconds) for w in limits]
        args: list[Any] = [_fmt(now)]
        for w in limits:
            args += [_fmt(w.window_seconds), SUB_BUCKETS]
        reply = await self._call(self._usage, keys, args)
        return [
            WindowUsage(window=w, tokens=int(reply[2 * i]), requests=int(reply[2 * i + 1]))
            for i, w in enumerate(limits)
        ]

    async def close(self) -> None:
        await self._redis.aclose()
        await self._pool.disconnect()
