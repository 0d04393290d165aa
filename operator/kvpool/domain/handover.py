"""When a stream that is about to end may hand its place to the next request.

Why this module exists: a reservation ends when the engine's stream ends, and the request
admitted into its place then takes a few engine steps more to reach the engine (the
gateway's call, the engine's front end, its next step). Meanwhile the engine runs one
sequence fewer than the plan allows: on the bench engine the gateway held 5.6 slots on
average while the engine ran 5.1 (docs/0009). A single-sequence stream with an output
bound cannot run longer than that bound, so once it has relayed nearly all of it, its end
is a few steps away whatever the model does (an end-of-sequence only comes sooner). From
then its reservation may go to the next request, which reaches the engine about when it
ends.

The count is in relayed chunks. A chunk carries at least one token, except the few that
carry none (a chat stream's first chunk names the role; ``echo`` sends the prompt), so
``chunks - NON_TOKEN_CHUNKS`` never exceeds the tokens generated, and a stream is handed
over only when it certainly has at most ``handover_tokens`` tokens to go.
"""

from __future__ import annotations

NON_TOKEN_CHUNKS = 2  # chunks of a stream that may carry no token (role, echo)


def handover_chunk(output_bound: int | None, handover_tokens: int) -> int | None:
    """The number of relayed chunks from which a single-sequence stream bounded to
    ``output_bound`` tokens has at most ``handover_tokens`` tokens left (None: never, as
    when there is no bound, or handover is off, or the bound is not above it)."""
    if output_bound is None or handover_tokens <= 0 or output_bound <= handover_tokens:
        return None
    return output_bound - handover_tokens + NON_TOKEN_CHUNKS
