"""Who may act, from a Lease (domain/leadership): a table of cases with ids."""

from __future__ import annotations

import pytest

from kvpool.domain.leadership import (
    Acquire,
    Follow,
    LeaseRecord,
    LeaseVerdict,
    Renew,
    decide_lease,
    still_leading,
)

HELD_BY_A = LeaseRecord(holder="a", duration=15.0, renewed_at=100.0, transitions=3)

CASES = [
    ("no-lease-yet", None, "b", 0.0, Acquire(0)),
    ("held-by-me", HELD_BY_A, "a", 200.0, Renew()),
    ("held-by-other-live", HELD_BY_A, "b", 110.0, Follow("a", 5.0)),
    ("held-by-other-at-the-edge", HELD_BY_A, "b", 115.0, Follow("a", 0.0)),
    ("held-by-other-expired", HELD_BY_A, "b", 115.5, Acquire(4)),
    ("released", LeaseRecord("", 1.0, 100.0, 3), "b", 100.0, Acquire(4)),
    ("never-renewed", LeaseRecord("a", 15.0, None, 0), "b", 0.0, Acquire(1)),
]


@pytest.mark.parametrize(
    ("record", "me", "now", "verdict"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_decide_lease(
    record: LeaseRecord | None, me: str, now: float, verdict: LeaseVerdict
) -> None:
    assert decide_lease(record, me, now) == verdict


@pytest.mark.parametrize(
    ("renewed", "now", "leading"),
    [(None, 0.0, False), (100.0, 109.9, True), (100.0, 110.0, False)],
    ids=["never", "within-deadline", "past-deadline"],
)
def test_still_leading(renewed: float | None, now: float, leading: bool) -> None:
    assert still_leading(renewed, now, renew_deadline=10.0) is leading
