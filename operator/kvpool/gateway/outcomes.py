"""One table from decision reasons to HTTP answers, and the ``Outcome`` of one request.

Why this module exists: the domain's verdicts carry a *reason* (a stable constant that is
also the JSON error ``code`` and a metric label); which HTTP status and OpenAI error type
a reason becomes is the gateway's decision, made here and nowhere else. ``Outcome`` is the
record of how one admitted request ended: built once by the pipeline, then read by the
metrics and the access log, so both always agree.

=====================================  ======  ====================
reason                                 status  OpenAI error type
=====================================  ======  ====================
invalid_max_tokens, invalid_n,         400     invalid_request_error
prompt_too_long, max_tokens_too_large
tier_not_allowed, policy_has_no_tiers  403     permission_error
too_large_for_pool                     413     invalid_request_error
budget_exceeded                        429     rate_limit_error
queue_wait_exceeded,                   503     overloaded_error
queue_deadline_passed, no_capacity_plan,
tier_not_in_pool, no_ready_replica,
tier_removed, pool_removed,
no_ready_endpoint, budget_unavailable
=====================================  ======  ====================
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpool.domain import admission, classify, estimate, routing
from kvpool.gateway.errors import (
    INVALID_REQUEST,
    OVERLOADED,
    PERMISSION,
    RATE_LIMIT,
    GatewayError,
)

REASON_BUDGET_EXCEEDED = "budget_exceeded"
REASON_BUDGET_UNAVAILABLE = "budget_unavailable"
REASON_POOL_REMOVED = "pool_removed"

_BAD = (400, INVALID_REQUEST)
_BUSY = (503, OVERLOADED)

REASON_STATUS: dict[str, tuple[int, str]] = {
    estimate.REASON_INVALID_MAX_TOKENS: _BAD,
    estimate.REASON_INVALID_N: _BAD,
    estimate.REASON_PROMPT_TOO_LONG: _BAD,
    estimate.REASON_MAX_TOKENS_TOO_LARGE: _BAD,
    classify.REASON_TIER_NOT_ALLOWED: (403, PERMISSION),
    classify.REASON_NO_TIERS: (403, PERMISSION),
    admission.REASON_TOO_LARGE_FOR_POOL: (413, INVALID_REQUEST),
    REASON_BUDGET_EXCEEDED: (429, RATE_LIMIT),
    admission.REASON_QUEUE_WAIT: _BUSY,
    admission.REASON_DEADLINE_PASSED: _BUSY,
    admission.REASON_NO_PLAN: _BUSY,
    admission.REASON_UNKNOWN_TIER: _BUSY,
    admission.REASON_NO_READY_REPLICA: _BUSY,
    admission.REASON_TIER_REMOVED: _BUSY,
    REASON_POOL_REMOVED: _BUSY,
    routing.REASON_NO_READY_ENDPOINT: _BUSY,
    REASON_BUDGET_UNAVAILABLE: _BUSY,
}


def status_of(reason: str) -> int:
    """The HTTP status of a decision reason (503 for a reason the table does not know)."""
    return REASON_STATUS.get(reason, _BUSY)[0]


def error_for(
    reason: str,
    message: str,
    *,
    retry_after: float | None = None,
    param: str | None = None,
) -> GatewayError:
    """The OpenAI-format error answering a decision ``reason`` (a 503 without a
    ``retry_after`` says :data:`~kvpool.gateway.errors.DEFAULT_RETRY_AFTER`)."""
    status, kind = REASON_STATUS.get(reason, _BUSY)
    return GatewayError(status, reason, message, kind, retry_after, param)


@dataclass(frozen=True)
class Outcome:
    """How one admitted request ended; metrics and the access log read this, once."""

    status: int  # HTTP status the client got (499: client gone)
    label: str  # ok, engine_rejected, client_gone, client_stalled, engine_stream_broken, <code>
    actual_tokens: int  # prompt + output the engine used (0: nothing known)
    charged_tokens: int  # what the budget was settled with (decide_settlement; 0: no charge)
    prompt_tokens: int | None  # as the engine reported
    completion_tokens: int | None  # as the engine reported (or chunks relayed)
    duration_seconds: float  # arrival to end
    ttft_seconds: float | None  # arrival to the first streamed token (streams only)
    upstream_ttft_seconds: float | None = None  # sent to the engine to its first token
    engine_reported: bool = False  # the token counts are the engine's own usage
