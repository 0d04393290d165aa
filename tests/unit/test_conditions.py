"""set_condition: lastTransitionTime moves only when the status flips."""

from __future__ import annotations

import pytest

from kvpool.api.common import Condition
from kvpool.domain import conditions as c


def _cond(type_: str, status: str, reason: str = "R", time: str = "t0") -> Condition:
    return Condition.model_validate(
        {"type": type_, "status": status, "reason": reason, "lastTransitionTime": time}
    )


@pytest.mark.parametrize(
    ("before", "status", "reason", "message", "expected_time"),
    [
        ([], "True", c.POOL_READY, "", "t1"),
        ([_cond(c.READY, "True")], "True", c.POOL_READY, "", "t0"),
        ([_cond(c.READY, "False")], "False", c.TIER_POLICY_NOT_FOUND, "new message", "t0"),
        ([_cond(c.READY, "False")], "True", c.POOL_READY, "", "t1"),
        ([_cond(c.READY, "Unknown")], "False", c.REPLICAS_NOT_READY, "", "t1"),
    ],
    ids=["new", "same-status", "new-reason-same-status", "flip", "unknown-to-false"],
)
def test_transition_time_changes_only_on_flip(
    before: list[Condition], status: str, reason: str, message: str, expected_time: str
) -> None:
    after = c.set_condition(before, c.READY, status, reason, message, 3, "t1")  # type: ignore[arg-type]
    ready = c.find_condition(after, c.READY)
    assert ready is not None
    assert (ready.status, ready.reason, ready.message) == (status, reason, message)
    assert ready.last_transition_time == expected_time
    assert ready.observed_generation == 3


def test_other_conditions_keep_their_order_and_content() -> None:
    before = [_cond(c.READY, "True"), _cond(c.DEGRADED, "False"), _cond(c.CAPACITY_SHORT, "False")]
    after = c.set_condition(before, c.DEGRADED, "True", c.REPLICAS_DISAGREE, "x", 1, "t1")
    assert [x.type for x in after] == [c.READY, c.DEGRADED, c.CAPACITY_SHORT]
    assert after[0] == before[0] and after[2] == before[2]
    assert after[1].status == "True"


def test_reasons_are_camel_case_constants() -> None:
    reasons = [v for k, v in vars(c).items() if k.isupper() and isinstance(v, str)]
    assert reasons
    for reason in reasons:
        _cond("X", "True", reason=reason)  # the API pattern accepts it
        assert reason[0].isupper() and " " not in reason
