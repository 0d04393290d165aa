"""The knobs of one gateway process, as ``kvpool gateway``'s flags set them.

Why this module exists: every part of the gateway (the request pipeline, the pool
registry, the engine watcher, the upstream, the HTTP handlers) reads some of these, and
none of them should import another part just to learn its settings. So they live here,
below all of them, and the composition root (:class:`kvpool.gateway.server.Gateway`)
hands each part the settings it was built with.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GatewaySettings:
    """Knobs of one gateway process (from the command line: kvpool.gateway.main)."""

    max_body_bytes: int = 8 * 1024 * 1024  # larger bodies: 413
    upstream_connect_timeout: float = 2.0  # seconds to connect to an engine
    upstream_first_token_timeout: float = 20.0  # a stream's first token must come by then
    upstream_idle_timeout: float = 30.0  # longest pause between two chunks of a stream
    upstream_timeout: float = 600.0  # seconds for a whole non-streaming answer
    set_engine_priority: bool = True  # engines run --scheduling-policy priority
    health_probe_interval: float = 0.5  # seconds between /health probes (0: no probes)
    health_probe_timeout: float = 1.0  # a probe not answered by then is a failure
    access_log: bool = True
    body_timeout: float = 30.0  # seconds to receive the whole body (then 408)
    metrics_on_api_port: bool = False  # also serve /metrics on the API port (tenant data!)
    plan_share_percent: int = 100  # this replica's share of each plan (100/N for N gateways)
    learn_reservations: bool = True  # reserve learned outputs (False: every request's bound)
    engine_poll_seconds: float = 0.25  # all gateways together poll each engine this often
    borrow_pause_usage: float = 0.97  # measured KV usage that pauses borrowing
    handover_tokens: int = 0  # a stream this close to its output bound hands its place on
    budget_overlap: bool = True  # send requests ahead of their budget verdict where safe
