"""What a tenant reads in an admission error says nothing of the pool's state (issue 18.8).

Before, the 503 of a queue that cannot drain in time said "expected ~2.0s" and the 413
``too_large_for_pool`` gave the tier's capacity ("can hold at most 1000 tokens and 100
slots for one request"): any tenant could probe the pool's load and size. The figures now
go to ``Reject.detail`` (the gateway logs it for the operator) and the message keeps only
what the tenant's own request and policy say (the tier's maximum queue wait).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from kvpool.domain.admission import AdmissionController, Reject
from kvpool.domain.admission.verdicts import Verdict
from tests.builders import AdmissionRequests, CompiledPoolBuilder


def queue_wait_reject() -> tuple[Verdict, set[str]]:
    """lo's 11th queued request cannot start within lo's 5 s maximum wait (the case of
    test_admission's test_while_a_higher_tier_waits_...)."""
    builder = (
        CompiledPoolBuilder()
        .capacity(1000, 100)
        .tier("hi", 0, 0)
        .tier("lo", 200, 20, lend_tokens=0)
    )
    ctl, make = AdmissionController(builder.obj(), builder.tiers()), AdmissionRequests()
    for tier in ["lo"] * 2 + ["hi"] * 8:
        ctl.offer(make.make(tier, 100), 0.0)
    ctl.release("r1", 1.0)
    ctl.offer(make.make("lo", 100), 1.0)
    ctl.offer(make.make("hi", 100), 1.0)
    verdicts = [ctl.offer(make.make("lo", 100), 1.0) for _ in range(12)]
    return verdicts[-1], {"5"}  # the tier's maximum wait is the tenant's policy


def too_large_reject() -> tuple[Verdict, set[str]]:
    builder = CompiledPoolBuilder().capacity(1000, 100).tier("only", 0, 0)
    ctl = AdmissionController(builder.obj(), builder.tiers())
    return ctl.offer(AdmissionRequests().make("only", 5000), 0.0), set()


@pytest.mark.parametrize(
    ("make", "detail_words"),
    [(queue_wait_reject, "expected wait"), (too_large_reject, "holds at most")],
    ids=["queue-wait-503", "too-large-for-pool-413"],
)
def test_tenant_messages_carry_no_pool_figures(
    make: Callable[[], tuple[Verdict, set[str]]], detail_words: str
) -> None:
    verdict, allowed = make()
    assert isinstance(verdict, Reject), verdict
    figures = set(re.findall(r"\d+(?:\.\d+)?", verdict.message)) - allowed
    assert not figures, (
        f"{verdict.reason}: the tenant reads the pool's figures {sorted(figures)} in "
        f"{verdict.message!r}"
    )
    assert detail_words in verdict.detail, verdict.detail  # the operator still gets them
