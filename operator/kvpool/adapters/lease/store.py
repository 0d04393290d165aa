"""Lease renewals in Redis: membership, claims and grants in one atomic script.

Why this module exists: the gateway replicas find each other and share capacity through
the Redis they already use for budgets. One renewal of one replica is one call of
``renew.lua`` (package data next to this module) for every plan it admits against: the
script records the replica as a member for ``member_ttl`` (Redis's own clock: one clock for
every replica's expiry), forgets members and claims that expired, grants each component
what the other live members do not claim (:func:`kvpool.domain.lease.decide_grant`, its
reference model), stores the caller's claim and report, and returns every live member's
report so the caller can compute its next desired lease.

Keys (one Redis Cluster slot per namespace, by the ``{namespace}`` hash tag)::

    kvpool:lease:{<ns>}:members          hash: member -> expiry (ms)
    kvpool:lease:{<ns>}:epoch            when this Redis first saw a renewal (ms)
    kvpool:lease:{<ns>}:plan:<pool>:<track>   hash: member -> {"claim", "report", "exp"}

Every key expires by itself when no replica renews any more. Nothing here decides what to
do when Redis fails: every failure is a :class:`LeaseStoreError`, and the lease keeper
(:mod:`kvpool.gateway.lease_keeper`) falls back (:mod:`kvpool.domain.lease.fallback`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import redis.asyncio as aioredis

from kvpool.domain.admission.amount import ZERO, Amount
from kvpool.domain.lease import Report, TierDemand

KEY_PREFIX = "kvpool:lease"
DEFAULT_TIMEOUT = 0.1


class LeaseStoreError(Exception):
    """Redis refused, timed out or failed the renewal."""


@dataclass(frozen=True)
class PlanRenewal:
    """What one renewal asks for one plan (a pool's track)."""

    pool: str
    track: str
    groups: Mapping[str, tuple[int, Sequence[str]]]  # LeasePlan.groups()
    desired: Mapping[str, int]  # the lease this replica wants
    held: Mapping[str, int]  # what it still holds, after shrinking to ``desired``
    report: Report  # its demand


@dataclass(frozen=True)
class PlanGrant:
    """The answer for one plan."""

    granted: dict[str, int]  # the new lease (components)
    claim: dict[str, int]  # what Redis now counts as held by this replica
    reports: dict[str, Report]  # every live member's last report, this one's included


@dataclass(frozen=True)
class Renewal:
    """The answer of one renewal."""

    members: int  # live gateway replicas of the namespace, this one included
    warming: bool  # Redis has just started: nobody grows for one member TTL
    plans: list[PlanGrant]  # in the order asked


def encode_report(report: Report) -> dict[str, Any]:
    """A report as compact JSON (what other replicas read back). What requests in flight
    reserve is a key of its own (``h``), so a replica of before, which knows only ``t``
    and ``n``, still reads every tier's figures during a rolling update."""
    return {
        "t": {
            tier: [d.now.tokens, d.now.slots, d.peak.tokens, d.peak.slots]
            + ([d.head_tokens] if d.head_tokens else [])
            for tier, d in report.tiers.items()
        },
        "h": {
            tier: [d.held.tokens, d.held.slots]
            for tier, d in report.tiers.items()
            if not d.held.is_zero
        },
        "n": {tenant: [now, peak] for tenant, (now, peak) in report.tenants.items()},
    } | ({"p": sorted(report.presumed)} if report.presumed else {})


def _int_pairs(raw: Any) -> dict[str, tuple[int, int]]:
    """``{name: [a, b]}`` with two integers each; anything else is left out."""
    if not isinstance(raw, dict):
        return {}
    return {
        name: (v[0], v[1])
        for name, v in raw.items()
        if isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) for x in v)
    }


def decode_report(data: Any) -> Report:
    """The inverse of :func:`encode_report`; anything malformed reads as no demand."""
    if not isinstance(data, dict):
        return Report()
    held = _int_pairs(data.get("h"))  # a replica of before reports none
    tiers: dict[str, TierDemand] = {}
    raw_tiers = data.get("t")
    for tier, v in raw_tiers.items() if isinstance(raw_tiers, dict) else []:
        # 4 figures, or 5 with the head request's tokens (a replica of before reports 4)
        if isinstance(v, list) and len(v) in (4, 5) and all(isinstance(x, int) for x in v):
            head = v[4] if len(v) == 5 else 0
            in_flight = Amount(*held[tier]) if tier in held else ZERO
            tiers[tier] = TierDemand(
                Amount(v[0], v[1]), Amount(v[2], v[3]), head_tokens=head, held=in_flight
            )
    presumed = data.get("p")  # a replica of before marks none (its tiers read as come)
    marked = {t for t in presumed if isinstance(t, str)} if isinstance(presumed, list) else set()
    return Report(
        tiers=tiers, tenants=_int_pairs(data.get("n")), presumed=frozenset(marked & set(tiers))
    )


def _counts(data: Any) -> dict[str, int]:
    if not isinstance(data, dict):
        return {}  # cjson encodes an empty table as {} or []
    return {str(k): int(v) for k, v in data.items() if isinstance(v, int | float)}


class RedisLeaseStore:
    """Renews leases in Redis (one script call per renewal, for every plan)."""

    def __init__(
        self,
        url: str,
        namespace: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        key_prefix: str = KEY_PREFIX,
    ) -> None:
        self.timeout = timeout
        self.prefix = f"{key_prefix}:{{{namespace}}}"
        # a backstop only: ``timeout`` bounds each call (see adapters/budget/redis.py: a
        # stall of this loop must not read as a Redis failure)
        self._redis: Any = aioredis.Redis.from_url(
            url,
            socket_timeout=max(2 * timeout, 1.0),
            socket_connect_timeout=max(2 * timeout, 1.0),
            retry_on_timeout=False,
            health_check_interval=0,
        )
        script = resources.files(__package__).joinpath("renew.lua").read_text(encoding="utf-8")
        self._renew = self._redis.register_script(script)

    def plan_key(self, pool: str, track: str) -> str:
        """The hash of one plan's members."""
        return f"{self.prefix}:plan:{pool}:{track}"

    async def renew(
        self, member: str, plans: Sequence[PlanRenewal], *, member_ttl: float
    ) -> Renewal:
        """One renewal of ``member`` for ``plans``; raises :class:`LeaseStoreError`."""
        keys = [self.plan_key(p.pool, p.track) for p in plans]
        keys += [f"{self.prefix}:members", f"{self.prefix}:epoch"]
        request = {
            "plans": [
                {
                    "groups": [[cap, list(members)] for cap, members in p.groups.values()],
                    "desired": dict(p.desired),
                    "held": dict(p.held),
                    "report": encode_report(p.report),
                }
                for p in plans
            ]
        }
        args: list[str | int] = [
            member,
            int(member_ttl * 1000),
            json.dumps(request, separators=(",", ":")),
        ]
        try:
            raw = await asyncio.wait_for(self._renew(keys=keys, args=args), self.timeout)
        except (aioredis.RedisError, OSError, TimeoutError) as exc:
            message = str(exc) or f"no answer within {self.timeout * 1000:g} ms"
            raise LeaseStoreError(f"{type(exc).__name__}: {message}") from exc
        try:
            answer = json.loads(raw)
            grants = [
                PlanGrant(
                    granted=_counts(plan.get("granted")),
                    claim=_counts(plan.get("claim")),
                    reports={
                        m: decode_report(r)
                        for m, r in (
                            plan["reports"].items() if isinstance(plan.get("reports"), dict) else []
                        )
                    },
                )
                for plan in answer["plans"] or []
            ]
            return Renewal(
                members=int(answer["members"]), warming=bool(answer["warming"]), plans=grants
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise LeaseStoreError(f"unexpected answer from the lease script: {exc}") from exc

    async def leave(self, member: str, plans: Sequence[tuple[str, str]]) -> None:
        """Forget ``member``'s claims on ``plans`` (pool, track) and its membership at once
        (it stopped, its requests ended), and nudge the others to renew; raises
        :class:`LeaseStoreError`. Without it they are forgotten a member TTL later."""
        keys = [self.plan_key(pool, track) for pool, track in plans]
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                for key in keys:
                    pipe.hdel(key, member)
                pipe.hdel(f"{self.prefix}:members", member)
                pipe.publish(self.nudge_channel, member)
                await asyncio.wait_for(pipe.execute(), self.timeout)
        except (aioredis.RedisError, OSError, TimeoutError) as exc:
            message = str(exc) or f"no answer within {self.timeout * 1000:g} ms"
            raise LeaseStoreError(f"{type(exc).__name__}: {message}") from exc

    @property
    def nudge_channel(self) -> str:
        """The pub/sub channel on which replicas ask each other to renew now."""
        return f"{self.prefix}:nudge"

    async def nudge(self, member: str, urgent_hops: int = 0) -> None:
        """Ask the other replicas to renew now (someone waits, or capacity was given up);
        best effort: a lost nudge only means the next periodic renewal. ``urgent_hops``:
        how many more rounds of nudges may skip the renewals' wake gap (a request of a
        ``Preempt`` tier waits; see :class:`~kvpool.gateway.leases.LeaseKeeper`)."""
        message = f"{member} {urgent_hops}" if urgent_hops > 0 else member
        try:
            await asyncio.wait_for(self._redis.publish(self.nudge_channel, message), self.timeout)
        except (aioredis.RedisError, OSError, TimeoutError) as exc:
            raise LeaseStoreError(f"{type(exc).__name__}: {exc}") from exc

    async def listen(self, member: str, on_nudge: Callable[[int], None]) -> None:
        """Call ``on_nudge(urgent_hops)`` for every other replica's nudge until cancelled;
        raises :class:`LeaseStoreError` when the subscription breaks (the caller retries)."""
        pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(self.nudge_channel)
            while True:
                message = await pubsub.get_message(timeout=1.0)
                if message is None:
                    continue
                data = message.get("data")
                if isinstance(data, bytes):
                    data = data.decode("utf-8", "replace")
                sender, hops = str(data), 0
                head, _, tail = sender.rpartition(" ")
                if head and tail.isdigit():  # "<member> <urgent hops>"
                    sender, hops = head, int(tail)
                if sender != member:
                    on_nudge(hops)
        except (aioredis.RedisError, OSError) as exc:
            raise LeaseStoreError(f"{type(exc).__name__}: {exc}") from exc
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()

    async def close(self) -> None:
        """Close the connections."""
        await self._redis.aclose()
