"""The schedule credit: future peaks, what a stream may hold, and admission lending the rest.

Tables for :mod:`kvpool.domain.admission.schedule`, admission cases where the credit starts
a request the ledger alone would queue, and two properties against a simulated engine
(every running sequence grows a token a step, the relay's chunk count lags or leads the
truth within its bounds): what the credit lends is never needed by a moment ahead.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool.domain.admission import AdmissionController, Admit, Queue
from kvpool.domain.admission.schedule import (
    DEFAULT_MARGIN,
    Growth,
    future_peak,
    schedule_credit,
)
from kvpool.domain.admission.verdicts import AdmissionRequest
from tests.builders import CompiledPoolBuilder


@dataclass
class Chunks:
    """A stream's relayed chunks (what the gateway's usage meter counts)."""

    chunks: int = 0


def growth(prompt: int, expected: int, chunks: int = 0, bound: int | None = None) -> Growth:
    return Growth(prompt, expected, expected if bound is None else bound, Chunks(chunks))


PEAK_CASES = [
    ("nothing", [], 0),
    ("one-grows-to-its-end", [(300, 100)], 400),
    ("two-alike", [(300, 100), (300, 100)], 800),
    # the docstring's example: the peak is just before the first one ends
    ("staggered", [(380, 21), (340, 61), (200, 100)], 983),
    # a long request alone outlasts short ones: its own end is the peak
    ("long-one-outlasts", [(100, 10), (100, 10), (50, 1000)], 1050),
    ("ended-now", [(500, 0), (100, 50)], 600),
]


@pytest.mark.parametrize(
    ("curves", "peak"), [c[1:] for c in PEAK_CASES], ids=[c[0] for c in PEAK_CASES]
)
def test_future_peak(curves: list[tuple[int, int]], peak: int) -> None:
    assert future_peak(curves) == peak


HOLDING_CASES = [
    # (prompt, expected, bound, chunks, margin) -> (holds now, still to generate)
    ("not-started", (300, 100, 100, 0, 8), (308, 100)),
    ("first-chunk-may-be-the-role", (300, 100, 100, 1, 8), (309, 100)),
    ("midway", (300, 100, 100, 51, 8), (359, 50)),
    ("no-margin", (300, 100, 100, 51, 0), (351, 50)),
    ("past-expected-may-run-to-bound", (300, 100, 400, 151, 0), (451, 250)),
    ("at-its-bound-one-more-step", (300, 100, 100, 200, 0), (500, 1)),
]


@pytest.mark.parametrize(
    ("args", "expected"), [c[1:] for c in HOLDING_CASES], ids=[c[0] for c in HOLDING_CASES]
)
def test_what_a_stream_may_hold(
    args: tuple[int, int, int, int, int], expected: tuple[int, int]
) -> None:
    prompt, output, bound, chunks, margin = args
    assert growth(prompt, output, chunks, bound).holding(margin) == expected


def test_the_docstring_example() -> None:
    running = [
        (400, growth(300, 100, chunks=80)),
        (400, growth(300, 100, chunks=40)),
        (300, growth(200, 100, chunks=0)),
    ]
    assert schedule_credit(running, margin=0) == 117


def test_a_ledger_already_below_the_peak_gets_no_credit() -> None:
    """Reservations overcommitted some other way (smaller than the final size) lend nothing."""
    assert schedule_credit([(350, growth(300, 100, chunks=1))], margin=0) == 0


def test_requests_that_just_started_lend_only_what_ends_before_the_peak() -> None:
    """Two alike requests at their start: the peak is both at their end, no credit; the
    same two, one of them nearly done: most of the done one's output is lendable."""
    assert schedule_credit([(400, growth(300, 100)), (400, growth(300, 100))], margin=0) == 0
    near_end = [(400, growth(300, 100, chunks=91)), (400, growth(300, 100))]
    # h = 391 and 300, r = 10 and 100: peak = max(300 + 100, 691 + 20) = 711
    assert schedule_credit(near_end, margin=0) == 800 - 711


# -- admission lends the credit ------------------------------------------------------------


def one_replica_pool() -> AdmissionController:
    """1000 tokens, 8 slots, one replica; one tier without a floor (all shared)."""
    builder = CompiledPoolBuilder().capacity(1000, 8).tier("only", 0, 0).replicas(1)
    return AdmissionController(builder.obj(), builder.tiers())


def streamed(rid: str, prompt: int, expected: int, progress: Chunks | None) -> AdmissionRequest:
    g = None if progress is None else Growth(prompt, expected, expected, progress)
    return AdmissionRequest(rid, "t", "only", prompt + expected, growth=g)


@pytest.mark.parametrize("followed", [True, False], ids=["streams-followed", "not-followed"])
def test_the_credit_starts_what_the_ledger_alone_would_queue(followed: bool) -> None:
    """Two 400-token streams, one 90 tokens from its end: 800 of 1000 reserved, but the
    most they will hold at once is 727 (margin 8): a 250-token request fits in the plan at
    every moment ahead, so it starts; without followed streams it waits."""
    ctl = one_replica_pool()
    nearly_done = Chunks()
    assert isinstance(
        ctl.offer(streamed("a", 300, 100, nearly_done if followed else None), 0.0), Admit
    )
    assert isinstance(
        ctl.offer(streamed("b", 300, 100, Chunks() if followed else None), 0.0), Admit
    )
    nearly_done.chunks = 91
    verdict = ctl.offer(AdmissionRequest("c", "t", "only", 250), 1.0)
    if followed:
        assert isinstance(verdict, Admit), verdict
        assert ctl.snapshot().credit_tokens == 800 - 727
    else:
        assert isinstance(verdict, Queue), verdict
        assert ctl.snapshot().credit_tokens == 0


def test_an_end_recomputes_the_credit_and_starts_the_next() -> None:
    """The credit falls with the request that created it, and what waits is judged again."""
    ctl = one_replica_pool()
    a, b = Chunks(), Chunks()
    ctl.offer(streamed("a", 300, 100, a), 0.0)
    ctl.offer(streamed("b", 300, 100, b), 0.0)
    a.chunks = 91
    assert isinstance(ctl.offer(AdmissionRequest("c", "t", "only", 250), 1.0), Admit)
    assert isinstance(ctl.offer(AdmissionRequest("d", "t", "only", 300), 1.0), Queue)
    wakeups = ctl.release("a", 2.0)  # 650 reserved; b alone: no credit
    assert [w.request_id for w in wakeups.admitted] == ["d"]
    assert ctl.snapshot().credit_tokens == 0
    assert ctl.snapshot().in_use_tokens == 950


def test_the_credit_of_a_replica_lets_its_replica_hold_the_request() -> None:
    """Per replica (two of 500 tokens): a request goes where that replica's credit makes
    room for it, though by the ledger neither replica could hold it."""
    builder = CompiledPoolBuilder().capacity(1000, 8).tier("only", 0, 0).replicas(2)
    ctl = AdmissionController(builder.obj(), builder.tiers())
    long_one = Chunks()
    placed = [
        ctl.offer(streamed("a", 300, 100, long_one), 0.0),
        ctl.offer(AdmissionRequest("x", "t", "only", 450), 0.0),  # not followed
        ctl.offer(streamed("b", 10, 90, Chunks()), 0.0),
    ]
    assert [v.replica for v in placed if isinstance(v, Admit)] == ["s0", "s1", "s0"]
    long_one.chunks = 91  # a: h 399, r 10; b: h 18, r 90: peak max(108, 417 + 2 x 10) = 437
    verdict = ctl.offer(AdmissionRequest("c", "t", "only", 60), 1.0)
    # the ledger: s0 500 + 60, s1 450 + 60, both over 500; s0's credit is 500 - 437 = 63
    assert isinstance(verdict, Admit) and verdict.replica == "s0", verdict
    assert [r.credit_tokens for r in ctl.snapshot().replicas] == [63, 0]


# -- properties against a simulated engine ---------------------------------------------------


@dataclass
class Sequence:
    """One request as the engine runs it: the truth the gateway's model must bound."""

    prompt: int
    expected: int
    generated: int  # what the engine generated (the truth)
    progress: Chunks  # what the relay counted: within [generated - margin, generated + 1]

    def holds_at(self, step: int) -> int:
        """What it holds ``step`` engine steps from now: 0 once it has ended (the engine
        frees a sequence in the step that generates its last token; one whose last token
        came in an earlier step holds nothing, though its stream may not be released yet)."""
        if self.generated >= self.expected or self.generated + step > self.expected:
            return 0
        return self.prompt + self.generated + step


def truth_peak(running: list[Sequence]) -> int:
    """The most the running sequences really hold at once from now on."""
    horizon = max((s.expected - s.generated for s in running), default=0)
    return max((sum(s.holds_at(step) for s in running) for step in range(horizon + 1)), default=0)


request_shapes = st.tuples(
    st.integers(1, 400), st.integers(1, 200), st.floats(0, 1), st.floats(0, 1)
)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(request_shapes, min_size=1, max_size=12),
    st.lists(st.integers(0, 40), max_size=8),
    st.sampled_from([0, 1, DEFAULT_MARGIN]),
)
def test_the_credit_is_never_needed_by_a_moment_ahead(
    shapes: list[tuple[int, int, float, float]], static: list[int], margin: int
) -> None:
    """Streams at any point of their output, counted with any lag the relay can have
    (one chunk ahead for a role chunk, up to ``margin`` behind): the reservations minus
    the credit bound what they (and the static ones) really hold at every step ahead."""
    running, growing = [], []
    for prompt, expected, done, lag_draw in shapes:
        generated = round(done * expected)
        lag = round(lag_draw * (margin + 1)) - 1  # in [-1, margin]
        chunks = max(0, min(generated + 1, generated - lag))
        seq = Sequence(prompt, expected, generated, Chunks(chunks))
        running.append(seq)
        growing.append((prompt + expected, Growth(prompt, expected, expected, seq.progress)))
    reserved = sum(tokens for tokens, _ in growing) + sum(static)
    credit = schedule_credit(growing, margin)
    assert truth_peak(running) + sum(static) <= reserved - credit


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_admission_never_starts_what_a_moment_ahead_cannot_hold(data: st.DataObject) -> None:
    """A controller fed streams that keep to their expected outputs, an engine advancing
    them a random number of steps between decisions, the relay's count lagging at random,
    and ends released late: what really runs never needs more than the plan, now or at
    any step ahead."""
    total = 1000
    builder = CompiledPoolBuilder().capacity(total, 8).tier("only", 0, 0).replicas(1)
    ctl = AdmissionController(builder.obj(), builder.tiers())
    running: dict[str, Sequence] = {}
    now = 0.0
    for n in range(data.draw(st.integers(5, 40), label="events")):
        now += 0.05
        event = data.draw(st.sampled_from(["offer", "steps", "release"]), label="event")
        if event == "offer":
            prompt = data.draw(st.integers(1, 300), label="prompt")
            expected = data.draw(st.integers(1, 200), label="expected")
            seq = Sequence(prompt, expected, 0, Chunks())
            request = streamed(f"r{n}", prompt, expected, seq.progress)
            verdict = ctl.offer(request, now)
            if isinstance(verdict, Admit):
                running[request.request_id] = seq
            elif isinstance(verdict, Queue):
                ctl.cancel(request.request_id, now)
        elif event == "steps":  # the engine steps every running sequence at once
            steps = data.draw(st.integers(0, 30), label="steps")
            for seq in running.values():
                seq.generated = min(seq.expected, seq.generated + steps)
                lag = data.draw(st.integers(-1, DEFAULT_MARGIN), label="lag")
                seq.progress.chunks = max(0, min(seq.generated + 1, seq.generated - lag))
        elif running:
            ended = [rid for rid, s in running.items() if s.generated == s.expected]
            if ended:
                rid = data.draw(st.sampled_from(ended), label="release")
                ctl.release(rid, now)
                del running[rid]
        assert truth_peak(list(running.values())) <= total
