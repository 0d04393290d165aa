"""The schedule credit: what running requests reserve but will never hold at the same time.

Why this module exists: a reservation books a request's final size (prompt + the output
expected of it) from its admission to its end, but on the engine a sequence holds its
prompt plus what it has generated *so far*, and the running sequences end at different
times. Summing final sizes therefore counts, for every request, KV it will only hold at
its very end - while others that end before it have given theirs back. That sum is what
kept a busy engine's KV at 74-76 % under kvpool against 88-90 % under vLLM's own
scheduling (docs/0009), which admits on what is held now and preempts when sequences grow
into each other.

The gateway relays every streamed token, so it knows how far each streamed request is;
with the output each one is expected to produce (learned, or its bound), the most the
running requests will ever hold *at once* - their **future peak** - is a short
computation. The difference between what they reserve and that peak is the **credit**:
capacity the ledger counts as reserved that no future moment needs. Admission lends it
like the shared remainder (:mod:`.feasibility`), so the engine fills up to the plan at its
busiest future moment instead of at the sum of everybody's last moment, and nothing is
preempted as long as the requests keep to their expected outputs.

**With the overcommit ratio.** A borrower may reserve less than its final size already
(prompt + ratio x learned output, :class:`~.learning.OvercommitRatio`, tuned by the
engines' preemptions). The credit is then what its reservation exceeds the peak by, and
0 where the ratio went below it: a replica admits against the *smaller* of its ratio
ledger and its streams' exact peak, so the credit never adds a preemption the ratio would
not have risked.

**The model.** On one engine every running sequence grows by one token a step and frees
everything when it ends. A request that holds ``h`` tokens now and generates ``r`` more
holds ``h + s`` at step ``s`` (``0 <= s <= r``), then nothing. A request that does not
stream (nothing tells how far it is) or runs several sequences is *static*: it holds its
whole reservation until it ends. The most held at once from now on is::

    peak = static + max over the growing requests k of
                      (sum of h_i over those with r_i >= r_k)  +  (how many) x r_k

(the sum is piecewise linear in ``s`` and largest just before one of them ends).

**How far a stream is.** The relay counts content chunks. A chunk may carry several tokens
(vLLM merges outputs a slow reader has not taken), and a chat stream's first chunk may
carry only the role, so the true count ``g`` lies in ``[chunks - 1, chunks + margin]``:
the model takes ``h = prompt + chunks + margin`` and ``r = expected - (chunks - 1)``, each
the side that holds more. A request past its expected output may run to its bound:
``r = bound - (chunks - 1)`` from then on.

Between admissions and ends the credit does not change (as a request grows, its ``h``
rises as fast as its ``r`` falls; the peak only moves when a request ends or starts), so
it is recomputed when one starts or ends on the replica, and when it is older than
:data:`CREDIT_MAX_AGE` (the one change between events: a request running past its
expected output).

Worked example (one replica, three streamed requests, margin 0): prompts 300, 300 and
200, expected outputs 100 each, reserved 400 + 400 + 300 = 1100; 80, 40 and 0 chunks
streamed:

    holds now h = 380, 340, 200;  still to generate r = 21, 61, 100
    peak   = max(380+340+200 + 3x21, 340+200 + 2x61, 200 + 1x100) = max(983, 662, 300) = 983
    credit = 1100 - 983 = 117 tokens that none of the moments ahead needs while these run
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

CREDIT_MAX_AGE = 0.1  # seconds after which a replica's credit is recomputed on its next read
DEFAULT_MARGIN = 8  # tokens a chunk count may lag what the engine generated


class Progress(Protocol):
    """A live count of a request's streamed content chunks (the gateway's usage meter)."""

    @property
    def chunks(self) -> int: ...


@dataclass(frozen=True)
class Growth:
    """How a streamed, single-sequence request grows on its engine."""

    prompt_tokens: int  # what its prompt holds from the start
    expected_output: int  # the output it is expected to produce (learned, or its bound)
    output_bound: int  # the most it may produce (>= expected_output)
    progress: Progress = field(compare=False)  # its streamed chunks so far

    def holding(self, margin: int) -> tuple[int, int]:
        """``(h, r)``: what it may hold now, and how many more tokens it may generate."""
        chunks = self.progress.chunks
        done = max(0, chunks - 1)  # a first chunk may carry only the role
        if done < self.expected_output:
            left = self.expected_output - done
        else:  # past what was expected of it: it may run to its bound
            left = max(1, self.output_bound - done)
        return self.prompt_tokens + chunks + margin, left


def future_peak(curves: Iterable[tuple[int, int]]) -> int:
    """The most ``(h, r)`` growing requests hold at once from now on (0 for none)."""
    ordered = sorted(curves, key=lambda curve: curve[1], reverse=True)
    peak = held = 0
    for count, (now_holds, left) in enumerate(ordered, start=1):
        held += now_holds  # every request that runs at least ``left`` more steps
        peak = max(peak, held + count * left)
    return peak


def schedule_credit(growing: Iterable[tuple[int, Growth]], margin: int = DEFAULT_MARGIN) -> int:
    """What the growing requests ``(reserved tokens, growth)`` of one replica reserve
    beyond their future peak (never negative: a ledger already below it stays)."""
    reserved = 0
    curves: list[tuple[int, int]] = []
    for tokens, growth in growing:
        reserved += tokens
        curves.append(growth.holding(margin))
    return max(0, reserved - future_peak(curves))
