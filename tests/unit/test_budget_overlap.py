"""Sending a request ahead of its budget verdict: the decision as a table, and the views.

The decision (``decide_overlap``) lets a request go to its engine before its charge is
confirmed only when the tenant's last verdict, recent enough, leaves room for it and for
what was sent ahead already under ``margin`` of every limit. ``BudgetOverlap`` keeps the
views and the requests sent ahead, per budget subject.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvpool.api.admission_config import BudgetWindow
from kvpool.domain.budget import BudgetAllow, BudgetCharge, BudgetDeny, WindowUsage
from kvpool.domain.budget_overlap import Ahead, UsageView, decide_overlap
from kvpool.gateway.budget_overlap import BudgetOverlap

MINUTE = BudgetWindow(window_seconds=60, tokens=1000, requests=10)
DAY = BudgetWindow(window_seconds=86400, tokens=5000)
NOW = 1000.0


def view(*windows: tuple[float, int, int], at: float = NOW) -> UsageView:
    return UsageView(at=at, windows=windows)


M, MD, NONE = [MINUTE], [MINUTE, DAY], Ahead()


@pytest.mark.parametrize(
    ("case", "seen", "limits", "tokens", "ahead", "expected"),
    [
        ("room in every window", view((60, 100, 1), (86400, 100, 1)), MD, 100, NONE, "overlap"),
        ("exactly at the margin", view((60, 700, 1)), M, 100, NONE, "overlap"),
        ("one token past the margin", view((60, 701, 1)), M, 100, NONE, "near-limit"),
        ("the day is tight", view((60, 0, 0), (86400, 3900, 1)), MD, 200, NONE, "near-limit"),
        ("what went ahead counts", view((60, 100, 1)), M, 100, Ahead(601, 1), "near-limit"),
        ("requests past the margin", view((60, 0, 7)), M, 1, Ahead(0, 1), "near-limit"),
        ("requests at the margin", view((60, 0, 6)), M, 1, Ahead(0, 1), "overlap"),
        ("no request limit", view((86400, 0, 10_000)), [DAY], 1, NONE, "overlap"),
        ("no view yet", None, M, 1, NONE, "no-view"),
        ("view too old", view((60, 0, 0), at=NOW - 2.5), M, 1, NONE, "stale"),
        ("view just young enough", view((60, 0, 0), at=NOW - 2.0), M, 1, NONE, "overlap"),
        ("view from the future", view((60, 0, 0), at=NOW + 1), M, 1, NONE, "stale"),
        ("limits gained a window", view((60, 0, 0)), MD, 1, NONE, "no-view"),
        ("a window changed length", view((3600, 0, 0)), M, 1, NONE, "no-view"),
        ("larger than the margin", view((60, 0, 0)), M, 801, NONE, "near-limit"),
    ],
)  # fmt: skip
def test_decide_overlap(
    case: str,
    seen: UsageView | None,
    limits: list[BudgetWindow],
    tokens: int,
    ahead: Ahead,
    expected: str,
) -> None:
    assert decide_overlap(seen, limits, tokens, ahead, NOW) == expected, case


def allow(tokens: int, requests: int = 0, at: float = NOW) -> BudgetAllow:
    charge = BudgetCharge(tenant="ns/t", tokens=100, at=at, windows=(60.0,))
    return BudgetAllow(charge=charge, usage=(WindowUsage(MINUTE, tokens, requests),))


def deny() -> BudgetDeny:
    return BudgetDeny(window=MINUTE, retry_after=10.0, reason="over")


def test_a_view_is_the_usage_after_the_allowed_charge() -> None:
    views = BudgetOverlap()
    assert views.decide("ns/t", [MINUTE], 100, NOW) == "no-view"
    views.seen("ns/t", 100, allow(tokens=500, requests=2), NOW)
    # 500 before + 100 charged = 600; 600 + 100 <= 800, 700 + 100 <= 800, then no more
    assert views.decide("ns/t", [MINUTE], 100, NOW) == "overlap"
    assert views.decide("ns/t", [MINUTE], 201, NOW) == "near-limit"
    assert views.decide("other/t", [MINUTE], 1, NOW) == "no-view"  # per subject


def test_requests_sent_ahead_count_until_their_verdicts_are_in() -> None:
    views = BudgetOverlap()
    views.seen("ns/t", 100, allow(tokens=0), NOW)  # 100 used
    views.sent_ahead("ns/t", 300)
    views.sent_ahead("ns/t", 400)
    assert views.decide("ns/t", [MINUTE], 100, NOW) == "near-limit"  # 100 + 700 + 100 > 800
    views.verdict_in("ns/t", 400)
    assert views.decide("ns/t", [MINUTE], 100, NOW) == "overlap"  # 100 + 300 + 100
    views.verdict_in("ns/t", 300)
    views.verdict_in("ns/t", 300)  # one too many: never below nothing
    views.sent_ahead("ns/t", 100)
    assert views.decide("ns/t", [MINUTE], 600, NOW) == "overlap"  # 100 + 100 + 600 = 800
    assert views.decide("ns/t", [MINUTE], 601, NOW) == "near-limit"


def test_a_refusal_leaves_no_view_until_an_allowed_charge_shows_room() -> None:
    views = BudgetOverlap()
    views.seen("ns/t", 100, allow(tokens=0), NOW)
    views.seen("ns/t", 100, deny(), NOW + 0.1)
    assert views.decide("ns/t", [MINUTE], 1, NOW + 0.2) == "no-view"
    views.seen("ns/t", 100, allow(tokens=100), NOW + 0.3)
    assert views.decide("ns/t", [MINUTE], 1, NOW + 0.4) == "overlap"


def test_a_late_verdict_of_an_earlier_charge_does_not_replace_a_newer_view() -> None:
    views = BudgetOverlap()
    views.seen("ns/t", 100, allow(tokens=650), NOW + 1)  # the later charge's verdict first
    views.seen("ns/t", 100, allow(tokens=0), NOW)  # then the earlier one's
    assert views.decide("ns/t", [MINUTE], 100, NOW + 1.5) == "near-limit"  # 750 + 100 > 800


def test_a_view_ages_out() -> None:
    views = BudgetOverlap(max_age=0.5)
    views.seen("ns/t", 100, allow(tokens=0), NOW)
    assert views.decide("ns/t", [MINUTE], 1, NOW + 0.5) == "overlap"
    assert views.decide("ns/t", [MINUTE], 1, NOW + 0.6) == "stale"


def test_a_verdict_of_the_local_allowance_teaches_nothing() -> None:
    views = BudgetOverlap()
    local = allow(tokens=0)
    local = BudgetAllow(charge=replace(local.charge, origin="local"), usage=local.usage)
    views.seen("ns/t", 100, local, NOW)  # Redis down: the usage is this process's own
    assert views.decide("ns/t", [MINUTE], 1, NOW) == "no-view"
