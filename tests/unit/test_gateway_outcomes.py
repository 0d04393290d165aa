"""The one reason -> HTTP status table: every decision reason of the domain is in it."""

from __future__ import annotations

import json
from types import ModuleType

import pytest

from kvpool.domain import admission, classify, estimate, routing
from kvpool.gateway.outcomes import REASON_STATUS, error_for, status_of


def _reasons(module: ModuleType) -> list[str]:
    return [v for k, v in vars(module).items() if k.startswith("REASON_") and isinstance(v, str)]


@pytest.mark.parametrize(
    "module", [admission, classify, estimate, routing], ids=lambda m: m.__name__
)
def test_every_domain_reason_has_a_status(module: ModuleType) -> None:
    missing = [r for r in _reasons(module) if r not in REASON_STATUS]
    assert not missing


@pytest.mark.parametrize(
    ("reason", "status", "retry_after"),
    [
        (estimate.REASON_PROMPT_TOO_LONG, 400, None),
        (classify.REASON_TIER_NOT_ALLOWED, 403, None),
        (admission.REASON_TOO_LARGE_FOR_POOL, 413, None),
        ("budget_exceeded", 429, None),
        (admission.REASON_QUEUE_WAIT, 503, "1"),
        ("something_new", 503, "1"),
    ],
    ids=["estimate-400", "forbidden-403", "never-fits-413", "budget-429", "busy-503", "unknown"],
)
def test_error_for_answers_openai_json(reason: str, status: int, retry_after: str | None) -> None:
    error = error_for(reason, "why")
    assert (error.status, status_of(reason)) == (status, status)
    body = json.loads(error.response().body)  # type: ignore[arg-type]
    assert body["error"]["code"] == reason and body["error"]["message"] == "why"
    assert error.headers().get("Retry-After") == retry_after
