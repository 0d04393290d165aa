"""The peak window (kvpool.domain.lease.peaks) against its definition: for every key,
the largest tokens and the largest slots of the values observed in the last ``window``
seconds; a key with no observation that recent is gone."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.domain.admission.amount import Amount
from kvpool.domain.lease.peaks import PeakWindow

KEYS = ["interactive", "batch", "eval"]
amounts = st.builds(Amount, st.integers(0, 2000), st.integers(0, 8))
steps = st.lists(
    st.tuples(
        st.floats(0.0, 3.0, allow_nan=False),  # seconds since the last observation
        st.dictionaries(st.sampled_from(KEYS), amounts, max_size=3),
    ),
    max_size=60,
)


def brute_force(history: list[tuple[float, str, Amount]], now: float, window: float):
    out: dict[str, Amount] = {}
    for at, key, value in history:
        if at >= now - window:
            out[key] = out[key].max(value) if key in out else value
    return out


@settings(max_examples=300, deadline=None)
@given(steps=steps, window=st.sampled_from([0.5, 5.0]))
def test_the_window_is_the_largest_of_each_dimension_seen_lately(
    steps: list[tuple[float, dict[str, Amount]]], window: float
) -> None:
    peaks = PeakWindow(window=window)
    history: list[tuple[float, str, Amount]] = []
    now = 0.0
    for gap, values in steps:
        now += gap
        history += [(now, key, value) for key, value in values.items()]
        assert peaks.observe(now, values) == brute_force(history, now, window)
