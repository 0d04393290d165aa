"""Where tenant budgets live: in this process, or in Redis shared by every gateway replica.

Both stores implement the algorithm of :mod:`kvpool.domain.budget` (a sliding window of
60 sub-window counters per limit; reserve at admission, settle at the end) and are run
against one table of cases in the tests, so they agree.

- :class:`InMemoryBudgetStore` calls the pure functions directly (one event loop, so
  each call is atomic). Used when the gateway runs without ``--redis``.
- :class:`RedisBudgetStore` runs the same arithmetic in two Lua scripts (``RESERVE``
  and ``SETTLE``), so check-and-charge is atomic across replicas: two gateways that
  receive a burst at the same instant cannot both spend the last tokens. Keys are
  ``<prefix>:{<tenant>}:<window>`` (a hash of counters ``t<bucket>``/``r<bucket>``;
  the ``{tenant}`` hash tag keeps one tenant's keys in one cluster slot) and expire
  one window plus one bucket after their last write.

Redis down (an error or no answer within ``timeout``, 5 ms by default) never makes a
request wait longer than that timeout, and for ``retry_interval`` seconds afterwards
Redis is not asked at all (a circuit breaker), so an outage costs nothing per request.
What happens to the request depends on its tier:

- **fail-open** (default for every tier): the request is charged against a *local
  allowance*, an in-memory budget of ``local_fraction`` (10 %) of each limit per gateway
  process. Availability is kept and the overshoot is bounded (replicas x 10 % per window).
- **fail-closed** (tiers listed in ``fail_closed_tiers``): the verdict is
  :class:`BudgetUnavailable` and the gateway answers 503 with ``Retry-After``.

Either way the ``on_error`` callback (a metric) and a log line record it. Charges made
during the outage settle locally; a Redis charge whose settlement fails stays charged at
its reservation (conservative: the tenant loses at most that reservation's difference).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import redis.asyncio as aioredis

from kvpool.api.admission_config import BudgetWindow
from kvpool.domain.budget import (
    SUB_BUCKETS,
    Bucket,
    BudgetAllow,
    BudgetCharge,
    BudgetVerdict,
    DenyKind,
    WindowUsage,
    assess_usage,
    bucket_index,
    build_deny,
    decide_reserve,
    oldest_live_bucket,
    plan_settlement,
    scale_limits,
)

log = logging.getLogger("kvpool.budget")


@dataclass(frozen=True)
class BudgetUnavailable:
    """The shared budget cannot be consulted and the tier fails closed: answer 503."""

    retry_after: float
    reason: str


StoreVerdict = BudgetVerdict | BudgetUnavailable


class BudgetStore(Protocol):
    """Charges reservations against tenant limits and settles them with the real usage."""

    async def reserve(
        self,
        tenant: str,
        limits: Sequence[BudgetWindow],
        tokens: int,
        now: float,
        tier: str | None = None,
    ) -> StoreVerdict:
        """Charge ``tokens`` (and one request) if every window allows it."""
        ...

    async def settle(self, charge: BudgetCharge, actual_tokens: int, now: float) -> None:
        """Correct a charge to the real usage (0 when nothing was served)."""
        ...

    async def usage(
        self, tenant: str, limits: Sequence[BudgetWindow], now: float
    ) -> list[WindowUsage]:
        """What the tenant has used in each window (for metrics and tests)."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...


class InMemoryBudgetStore:
    """Budgets of one gateway process (no Redis configured, or Redis's local allowance)."""

    def __init__(self) -> None:
        self._counters: dict[tuple[str, float], dict[int, Bucket]] = {}

    def _buckets(self, tenant: str, window_seconds: float, now: float) -> dict[int, Bucket]:
        buckets = self._counters.setdefault((tenant, window_seconds), {})
        oldest = oldest_live_bucket(now, window_seconds)
        for index in [i for i in buckets if i < oldest]:
            del buckets[index]
        return buckets

    async def reserve(
        self,
        tenant: str,
        limits: Sequence[BudgetWindow],
        tokens: int,
        now: float,
        tier: str | None = None,
    ) -> StoreVerdict:
        return self.reserve_now(tenant, limits, tokens, now)

    def reserve_now(
        self, tenant: str, limits: Sequence[BudgetWindow], tokens: int, now: float
    ) -> BudgetVerdict:
        """The synchronous core of :meth:`reserve`."""
        windows = [(w, self._buckets(tenant, w.window_seconds, now)) for w in limits]
        verdict = decide_reserve(tenant, windows, tokens, now)
        if isinstance(verdict, BudgetAllow):
            for window, buckets in windows:
                index = bucket_index(now, window.window_seconds)
                old = buckets.get(index, Bucket())
                buckets[index] = Bucket(old.tokens + tokens, old.requests + 1)
        return verdict

    async def settle(self, charge: BudgetCharge, actual_tokens: int, now: float) -> None:
        self.settle_now(charge, actual_tokens, now)

    def settle_now(self, charge: BudgetCharge, actual_tokens: int, now: float) -> None:
        """The synchronous core of :meth:`settle`."""
        for step in plan_settlement(charge, actual_tokens, now):
            buckets = self._counters.get((charge.tenant, step.window_seconds))
            if buckets is None:
                continue
            old = buckets.get(step.index, Bucket())
            buckets[step.index] = Bucket(max(0, old.tokens + step.delta), old.requests)

    async def usage(
        self, tenant: str, limits: Sequence[BudgetWindow], now: float
    ) -> list[WindowUsage]:
        return [assess_usage(w, self._buckets(tenant, w.window_seconds, now), now) for w in limits]

    async def close(self) -> None:
        return None


# KEYS: one hash per window.  ARGV: now, tokens, then per window: seconds, tokens, requests
# (-1: no request limit), sub-buckets.  Returns {1, usedTokens1, usedRequests1, ...} or
# {0, windowNumber, retryAfter (string), kind, usedTokens, usedRequests}.
RESERVE_LUA = """
local now = tonumber(ARGV[1])
local tokens = tonumber(ARGV[2])
local used = {}
local worst = nil
for i = 1, #KEYS do
  local base = 2 + (i - 1) * 4
  local w = tonumber(ARGV[base + 1])
  local limit_t = tonumber(ARGV[base + 2])
  local limit_r = tonumber(ARGV[base + 3])
  local g = w / tonumber(ARGV[base + 4])
  local oldest = math.floor((now - w) / g)
  local flat = redis.call('HGETALL', KEYS[i])
  local live_t, live_r, idx = {}, {}, {}
  local sum_t, sum_r = 0, 0
  for j = 1, #flat, 2 do
    local field, value = flat[j], tonumber(flat[j + 1])
    local b = tonumber(string.sub(field, 2))
    if b < oldest then
      redis.call('HDEL', KEYS[i], field)
    else
      if live_t[b] == nil and live_r[b] == nil then table.insert(idx, b) end
      if string.sub(field, 1, 1) == 't' then
        live_t[b] = value; sum_t = sum_t + value
      else
        live_r[b] = value; sum_r = sum_r + value
      end
    end
  end
  used[i] = {sum_t, sum_r}
  local kind, excess, field = nil, 0, nil
  if tokens > limit_t then
    kind = 'never'
  elseif sum_t + tokens > limit_t then
    kind, excess, field = 'tokens', sum_t + tokens - limit_t, live_t
  elseif limit_r >= 0 and sum_r + 1 > limit_r then
    kind, excess, field = 'requests', sum_r + 1 - limit_r, live_r
  end
  if kind ~= nil then
    local retry = w
    if field ~= nil then
      table.sort(idx)
      local freed = 0
      for _, b in ipairs(idx) do
        freed = freed + (field[b] or 0)
        if freed >= excess then
          retry = math.max(0, (b + 1) * g + w - now)
          break
        end
      end
    end
    if worst == nil or retry > worst[2] then
      worst = {i, retry, kind, sum_t, sum_r}
    end
  end
end
if worst ~= nil then
  return {0, worst[1], tostring(worst[2]), worst[3], worst[4], worst[5]}
end
local out = {1}
for i = 1, #KEYS do
  local base = 2 + (i - 1) * 4
  local w = tonumber(ARGV[base + 1])
  local g = w / tonumber(ARGV[base + 4])
  local b = math.floor(now / g)
  redis.call('HINCRBY', KEYS[i], 't' .. b, tokens)
  redis.call('HINCRBY', KEYS[i], 'r' .. b, 1)
  redis.call('PEXPIRE', KEYS[i], math.ceil((w + g) * 1000) + 1000)
  table.insert(out, used[i][1])
  table.insert(out, used[i][2])
end
return out
"""

# KEYS: one hash per settlement.  ARGV: per key: bucket, delta.  Counters never go below 0.
SETTLE_LUA = """
for i = 1, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    local field = 't' .. ARGV[2 * i - 1]
    local v = redis.call('HINCRBY', KEYS[i], field, tonumber(ARGV[2 * i]))
    if v < 0 then redis.call('HSET', KEYS[i], field, 0) end
  end
end
return 1
"""

# KEYS: one hash per window.  ARGV: now, then per window: seconds, sub-buckets.
USAGE_LUA = """
local now = tonumber(ARGV[1])
local out = {}
for i = 1, #KEYS do
  local w = tonumber(ARGV[2 * i])
  local g = w / tonumber(ARGV[2 * i + 1])
  local oldest = math.floor((now - w) / g)
  local flat = redis.call('HGETALL', KEYS[i])
  local t, r = 0, 0
  for j = 1, #flat, 2 do
    local b = tonumber(string.sub(flat[j], 2))
    if b >= oldest then
      if string.sub(flat[j], 1, 1) == 't' then t = t + tonumber(flat[j + 1])
      else r = r + tonumber(flat[j + 1]) end
    end
  end
  table.insert(out, t)
  table.insert(out, r)
end
return out
"""

LOCAL_ORIGIN = "local"


@dataclass(frozen=True)
class RedisDownPolicy:
    """What a tier gets while Redis cannot be reached (see the module docstring)."""

    fail_closed_tiers: frozenset[str] = frozenset()  # these tiers answer 503
    local_fraction: float = 0.1  # fail-open allowance per process, as a share of each limit
    retry_interval: float = 1.0  # seconds during which Redis is not asked after an error


def _fmt(value: float) -> str:
    return repr(float(value))


class RedisBudgetStore:
    """Budgets in Redis, shared by gateway replicas; a local allowance when Redis is down."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 0.005,
        key_prefix: str = "kvpool:budget",
        policy: RedisDownPolicy | None = None,
        on_error: Callable[[str, BaseException], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.timeout = timeout
        self.key_prefix = key_prefix
        self.policy = policy or RedisDownPolicy()
        self._on_error = on_error
        self._clock = clock
        self._redis: Any = aioredis.Redis.from_url(
            url,
            socket_timeout=max(timeout, 0.05),
            socket_connect_timeout=max(timeout, 0.05),
            retry_on_timeout=False,
            health_check_interval=0,
        )
        self._reserve = self._redis.register_script(RESERVE_LUA)
        self._settle = self._redis.register_script(SETTLE_LUA)
        self._usage = self._redis.register_script(USAGE_LUA)
        self._local = InMemoryBudgetStore()
        self._down_until = 0.0
        self.errors = 0

    def key(self, tenant: str, window_seconds: float) -> str:
        """The Redis key of one tenant's window."""
        return f"{self.key_prefix}:{{{tenant}}}:{window_seconds:g}"

    @property
    def available(self) -> bool:
        """False while the circuit breaker keeps Redis out of the request path."""
        return self._clock() >= self._down_until

    def _failed(self, op: str, exc: BaseException) -> None:
        self.errors += 1
        self._down_until = self._clock() + self.policy.retry_interval
        log.warning(
            "redis %s failed (%s: %s); budgets fall back for %.1fs",
            op,
            type(exc).__name__,
            exc or "timeout",
            self.policy.retry_interval,
        )
        if self._on_error is not None:
            self._on_error(op, exc)

    async def _call(self, op: str, script: Any, keys: list[str], args: list[Any]) -> Any:
        return await asyncio.wait_for(script(keys=keys, args=args), timeout=self.timeout)

    async def reserve(
        self,
        tenant: str,
        limits: Sequence[BudgetWindow],
        tokens: int,
        now: float,
        tier: str | None = None,
    ) -> StoreVerdict:
        if not limits:
            return decide_reserve(tenant, [], tokens, now)
        if self.available:
            keys = [self.key(tenant, w.window_seconds) for w in limits]
            args: list[Any] = [_fmt(now), tokens]
            for w in limits:
                args += [_fmt(w.window_seconds), w.tokens, -1 if w.requests is None else w.requests]
                args.append(SUB_BUCKETS)
            try:
                reply = await self._call("reserve", self._reserve, keys, args)
            except (aioredis.RedisError, OSError, TimeoutError) as exc:
                self._failed("reserve", exc)
            else:
                return self._verdict(tenant, limits, tokens, now, reply)
        return self._fallback(tenant, limits, tokens, now, tier)

    def _verdict(
        self,
        tenant: str,
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
                tenant=tenant,
                tokens=tokens,
                at=now,
                windows=tuple(w.window_seconds for w in limits),
            )
            return BudgetAllow(charge=charge, usage=usage)
        window = limits[int(reply[1]) - 1]
        kind: DenyKind = _decode(reply[3])  # type: ignore[assignment]
        used = WindowUsage(window=window, tokens=int(reply[4]), requests=int(reply[5]))
        return build_deny(window, kind, used, tokens, float(_decode(reply[2])))

    def _fallback(
        self,
        tenant: str,
        limits: Sequence[BudgetWindow],
        tokens: int,
        now: float,
        tier: str | None,
    ) -> StoreVerdict:
        if tier is not None and tier in self.policy.fail_closed_tiers:
            return BudgetUnavailable(
                retry_after=max(1.0, self.policy.retry_interval),
                reason=f"budget store unavailable; tier {tier!r} fails closed",
            )
        local_limits = scale_limits(limits, self.policy.local_fraction)
        verdict = self._local.reserve_now(tenant, local_limits, tokens, now)
        if isinstance(verdict, BudgetAllow):
            charge = dataclasses.replace(verdict.charge, origin=LOCAL_ORIGIN)
            return dataclasses.replace(verdict, charge=charge)
        return verdict

    async def settle(self, charge: BudgetCharge, actual_tokens: int, now: float) -> None:
        if charge.origin == LOCAL_ORIGIN:
            self._local.settle_now(charge, actual_tokens, now)
            return
        steps = plan_settlement(charge, actual_tokens, now)
        if not steps or not self.available:
            return
        keys = [self.key(charge.tenant, s.window_seconds) for s in steps]
        args: list[Any] = []
        for s in steps:
            args += [s.index, s.delta]
        try:
            await self._call("settle", self._settle, keys, args)
        except (aioredis.RedisError, OSError, TimeoutError) as exc:
            self._failed("settle", exc)

    async def usage(
        self, tenant: str, limits: Sequence[BudgetWindow], now: float
    ) -> list[WindowUsage]:
        keys = [self.key(tenant, w.window_seconds) for w in limits]
        args: list[Any] = [_fmt(now)]
        for w in limits:
            args += [_fmt(w.window_seconds), SUB_BUCKETS]
        reply = await self._usage(keys=keys, args=args)
        return [
            WindowUsage(window=w, tokens=int(reply[2 * i]), requests=int(reply[2 * i + 1]))
            for i, w in enumerate(limits)
        ]

    async def close(self) -> None:
        await self._redis.aclose()


def _decode(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
