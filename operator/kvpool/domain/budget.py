"""Tenant token budgets: a bucketed sliding window, charged at admission, settled at the end.

Why this module exists: a budget must hold against *concurrent bursts*. Gateways that
charge a tenant after the response ends let fifty parallel requests all pass the check
before any of them is counted. Here a request is charged its whole *reservation*
(prompt tokens + output reservation) when it is admitted, and the charge is *settled*
(corrected to the real usage) when the response ends. The only overshoot left is the
difference between a settled usage and its reservation, which is at most one in-flight
reservation when output reservations are honest (``max_tokens`` bounds the output).

The algorithm: a sliding window kept as ``SUB_BUCKETS`` (60) sub-window counters.
For a window of ``W`` seconds the bucket width is ``g = W / 60``; a charge made at time
``t`` goes to bucket ``floor(t / g)``. At time ``now`` every bucket
``b >= floor((now - W) / g)`` counts in full. Every charge made within the last ``W``
seconds is therefore always counted (a charge is counted for ``W`` to ``W + g``
seconds: conservative by at most one bucket, 1/60 of the window). So, unlike a fixed
window (which lets a tenant spend its budget at 11:59:59 and again at 12:00:00, a 2x
burst) and unlike the two-bucket weighted counter (which assumes the previous window
was spent evenly and can let nearly 2x through over one window), the usage seen here
is never below the true sliding-window usage: **no window of W seconds ever holds
more than the limit** (plus settlement differences). Memory is bounded: at most 61
counters per tenant and window, whatever the traffic (a sliding *log* of every charge
would grow with the request rate; a 30-day window would hold millions of entries).

``Retry-After`` is exact for this model: walk the live buckets oldest first until the
freed tokens cover the excess; bucket ``b`` stops counting at ``(b + 1) * g + W``.

Worked example (limit 1000 tokens per 60 s, so g = 1 s)::

    t=10.2  reserve 600  -> bucket 10 = 600               usage 600  Allow
    t=30.0  reserve 500  -> 600 + 500 > 1000               Deny, retry at (10+1)*1+60 = 71.0,
                                                           i.e. Retry-After 41.0 s
    t=30.0  settle the first charge with 150 actual tokens -> bucket 10 = 150
    t=30.0  reserve 500  -> 150 + 500 <= 1000              Allow, bucket 30 = 500
    t=70.5  usage = buckets >= floor(10.5) = 10 -> 650     (the t=10.2 charge still counts)
    t=71.0  usage = buckets >= 11 -> 500                   (it has left the window)

The same arithmetic runs in Redis as Lua scripts (``kvpool.adapters.budget.redis``) so
several gateway replicas share one budget; this module is the reference the in-memory
store uses and the one both stores are tested against.

Everything here is pure: the caller passes ``now`` (seconds since the epoch) and the
bucket counters it read; the verdicts say what to write.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from kvpool.api.admission_config import BudgetWindow

PRIMARY_ORIGIN = "primary"
"""The origin of a charge made by the store itself (not the failover's local allowance)."""

SUB_BUCKETS = 60
"""Sub-window counters per window; the window is exact to 1/SUB_BUCKETS (conservative)."""


@dataclass(frozen=True)
class Bucket:
    """What one sub-window counter holds."""

    tokens: int = 0  # tokens charged (reservations, corrected by settlements)
    requests: int = 0  # requests started


def bucket_width(window_seconds: float) -> float:
    """Seconds one sub-window counter covers."""
    return window_seconds / SUB_BUCKETS


def bucket_index(at: float, window_seconds: float) -> int:
    """The counter a charge made at ``at`` goes to.

    >>> bucket_index(10.2, 60.0)
    10
    """
    return math.floor(at / bucket_width(window_seconds))


def oldest_live_bucket(now: float, window_seconds: float) -> int:
    """The oldest counter that still counts at ``now`` (every newer one counts too).

    >>> oldest_live_bucket(70.5, 60.0)
    10
    """
    return math.floor((now - window_seconds) / bucket_width(window_seconds))


def bucket_expiry(index: int, window_seconds: float) -> float:
    """The time at which counter ``index`` stops counting.

    >>> bucket_expiry(10, 60.0)
    71.0
    """
    return (index + 1) * bucket_width(window_seconds) + window_seconds


@dataclass(frozen=True)
class WindowUsage:
    """What a tenant has used in one window at one moment."""

    window: BudgetWindow
    tokens: int
    requests: int


def assess_usage(window: BudgetWindow, buckets: Mapping[int, Bucket], now: float) -> WindowUsage:
    """Tokens and requests counted in ``window`` at ``now`` (stale counters are ignored)."""
    oldest = oldest_live_bucket(now, window.window_seconds)
    tokens = requests = 0
    for index, bucket in buckets.items():
        if index >= oldest:
            tokens += bucket.tokens
            requests += bucket.requests
    return WindowUsage(window=window, tokens=tokens, requests=requests)


@dataclass(frozen=True)
class BudgetCharge:
    """A reservation charged to a tenant: what settle needs to correct it later."""

    tenant: str
    tokens: int  # tokens reserved (charged) at admission
    at: float  # when it was charged (selects the counter in every window)
    windows: tuple[float, ...]  # window lengths (seconds) the charge was made in
    origin: str = PRIMARY_ORIGIN  # or "local": the failover store's allowance (Redis down)


@dataclass(frozen=True)
class BudgetAllow:
    """Within budget: charge ``charge`` (add its tokens and one request to each window)."""

    charge: BudgetCharge
    usage: tuple[WindowUsage, ...]  # usage before this charge, per window


@dataclass(frozen=True)
class BudgetDeny:
    """Over budget in ``window``; it may fit again after ``retry_after`` seconds."""

    window: BudgetWindow
    retry_after: float  # seconds; the window length when the request can never fit
    reason: str  # for the caller's error message
    never_fits: bool = False  # the request alone is larger than the limit


BudgetVerdict = BudgetAllow | BudgetDeny


def _retry_after(
    window: BudgetWindow,
    buckets: Mapping[int, Bucket],
    excess: int,
    now: float,
    field: str,
) -> float:
    """Seconds until enough of the oldest live counters expire to free ``excess``."""
    oldest = oldest_live_bucket(now, window.window_seconds)
    freed = 0
    for index in sorted(i for i in buckets if i >= oldest):
        freed += getattr(buckets[index], field)
        if freed >= excess:
            return max(0.0, bucket_expiry(index, window.window_seconds) - now)
    return window.window_seconds


def decide_reserve(
    tenant: str,
    windows: Sequence[tuple[BudgetWindow, Mapping[int, Bucket]]],
    tokens: int,
    now: float,
) -> BudgetVerdict:
    """Whether a reservation of ``tokens`` fits every window of the tenant.

    ``windows`` pairs each limit with the counters read for it. All windows must allow
    the request; the deny with the longest wait wins (retrying earlier would fail).

    >>> w = BudgetWindow(window_seconds=60, tokens=1000)
    >>> decide_reserve("a", [(w, {10: Bucket(600, 1)})], 500, now=30.0).retry_after
    41.0
    >>> type(decide_reserve("a", [(w, {10: Bucket(150, 1)})], 500, now=30.0)).__name__
    'BudgetAllow'
    """
    usages: list[WindowUsage] = []
    worst: BudgetDeny | None = None
    for window, buckets in windows:
        usage = assess_usage(window, buckets, now)
        usages.append(usage)
        deny = _deny_for(window, buckets, usage, tokens, now)
        if deny is not None and (worst is None or deny.retry_after > worst.retry_after):
            worst = deny
    if worst is not None:
        return worst
    charge = BudgetCharge(
        tenant=tenant, tokens=tokens, at=now, windows=tuple(w.window_seconds for w, _ in windows)
    )
    return BudgetAllow(charge=charge, usage=tuple(usages))


def _deny_for(
    window: BudgetWindow,
    buckets: Mapping[int, Bucket],
    usage: WindowUsage,
    tokens: int,
    now: float,
) -> BudgetDeny | None:
    if tokens > window.tokens:
        return build_deny(window, "never", usage, tokens, window.window_seconds)
    if usage.tokens + tokens > window.tokens:
        excess = usage.tokens + tokens - window.tokens
        retry = _retry_after(window, buckets, excess, now, "tokens")
        return build_deny(window, "tokens", usage, tokens, retry)
    if window.requests is not None and usage.requests + 1 > window.requests:
        excess = usage.requests + 1 - window.requests
        retry = _retry_after(window, buckets, excess, now, "requests")
        return build_deny(window, "requests", usage, tokens, retry)
    return None


DenyKind = Literal["never", "tokens", "requests"]


def build_deny(
    window: BudgetWindow, kind: DenyKind, usage: WindowUsage, tokens: int, retry_after: float
) -> BudgetDeny:
    """The deny verdict for ``kind`` (also used by the Redis store, whose Lua decides)."""
    label = format_window(window.window_seconds)
    if kind == "never":
        reason = f"request needs {tokens} tokens, more than the {label} budget of {window.tokens}"
    elif kind == "tokens":
        reason = (
            f"token budget exceeded: {usage.tokens} of {window.tokens} tokens used "
            f"in the last {label}, this request needs {tokens}"
        )
    else:
        reason = f"request budget exceeded: {usage.requests} of {window.requests} in {label}"
    return BudgetDeny(
        window=window, retry_after=retry_after, reason=reason, never_fits=kind == "never"
    )


@dataclass(frozen=True)
class Settlement:
    """How to correct one window's counter when a charge settles."""

    window_seconds: float
    index: int  # the counter the charge went to
    delta: int  # tokens to add (negative: refund); the counter never goes below zero


def plan_settlement(charge: BudgetCharge, actual_tokens: int, now: float) -> list[Settlement]:
    """Corrections that turn a reservation into the real usage.

    Counters that already left their window are not touched (nothing to correct).

    >>> c = BudgetCharge("a", tokens=600, at=10.2, windows=(60.0,))
    >>> plan_settlement(c, 150, now=30.0)
    [Settlement(window_seconds=60.0, index=10, delta=-450)]
    >>> plan_settlement(c, 150, now=71.0)
    []
    """
    delta = max(0, actual_tokens) - charge.tokens
    if delta == 0:
        return []
    out: list[Settlement] = []
    for window_seconds in charge.windows:
        index = bucket_index(charge.at, window_seconds)
        if index >= oldest_live_bucket(now, window_seconds):
            out.append(Settlement(window_seconds=window_seconds, index=index, delta=delta))
    return out


def scale_limits(limits: Sequence[BudgetWindow], fraction: float) -> list[BudgetWindow]:
    """Limits shrunk to ``fraction`` (at least 1 token): the local allowance when Redis is down.

    >>> scale_limits([BudgetWindow(window_seconds=60, tokens=1000)], 0.1)[0].tokens
    100
    """
    return [
        BudgetWindow(
            window_seconds=w.window_seconds,
            tokens=max(1, int(w.tokens * fraction)),
            requests=None if w.requests is None else max(1, int(w.requests * fraction)),
        )
        for w in limits
    ]


def format_window(seconds: float) -> str:
    """A window length as people write it.

    >>> format_window(3600), format_window(90), format_window(86400 * 30)
    ('1h', '90s', '30d')
    """
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


@dataclass(frozen=True)
class RequestEnd:
    """What the gateway knows about a request's usage when it ends."""

    reserved: int  # tokens charged at admission (the bound the engine can generate)
    reported: int | None  # prompt + completion from the engine's final ``usage``, if seen
    observed: int  # prompt + output the gateway relayed (content chunks), 0 if none
    sent: bool  # the request reached the engine (False: refused before it was sent)
    client_aborted: bool  # the caller went away before the answer ended


def decide_settlement(end: RequestEnd) -> int:
    """The tokens a request is finally charged: what the engine generated, never nothing.

    - the engine's own ``usage`` was seen -> exactly that;
    - the request never reached the engine (connection refused) -> 0, nothing ran;
    - the caller aborted: the engine ran for an unknown time and keeps generating until it
      notices, so what was relayed is only a lower bound (and 0 for a non-streaming
      request). The reservation - the most the engine can generate for the request -
      stays charged (or what was relayed, if more). Otherwise aborting right before the
      answer would be unlimited free compute;
    - otherwise (an engine rejection, an engine that failed or timed out mid-way) -> what
      the caller was given: the tenant did not cut it short and is not charged for the
      engine's failure.

    Worked example (reservation 140 = prompt 40 + max_tokens 100)::

        non-streaming, finished, usage 40 + 37       -> 77
        non-streaming, client aborted after 1 s      -> 140  (was 0: free compute)
        stream, client aborted after 12 chunks       -> 140  (52 relayed, more generated)
        stream, engine died after 12 chunks          -> 52
        connection refused                           -> 0

    >>> decide_settlement(RequestEnd(140, None, 0, sent=True, client_aborted=True))
    140
    >>> decide_settlement(RequestEnd(140, 77, 77, sent=True, client_aborted=False))
    77
    """
    if end.reported is not None:
        return max(0, end.reported)
    if not end.sent:
        return 0
    if end.client_aborted:
        return max(end.reserved, end.observed)
    return max(0, end.observed)
