"""The flags of ``kvpool gateway``, each checked as it is parsed.

Why this module exists: a wrong flag must be one ``error:`` line naming the value and
exit 2, never a traceback at start-up; the parsers (addresses, Redis URLs without echoing a
password, durations, fractions) and the option table live here, apart from
:mod:`kvpool.gateway.main`, which composes the gateway from the parsed values.
"""

from __future__ import annotations

import argparse
import os

from kvpool.adapters.budget.redis import DEFAULT_TIMEOUT
from kvpool.adapters.offline_flags import add_engine_and_key_flags

REDIS_URL_ENV = "KVPOOL_REDIS_URL"  # the chart sets it from gateway.redis.existingSecret


def listen_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8080`` for IPv6) -> (host, port), or a usage error.

    >>> listen_address("127.0.0.1:8080"), listen_address(":9000"), listen_address("[::1]:80")
    (('127.0.0.1', 8080), ('0.0.0.0', 9000), ('::1', 80))
    """
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT (e.g. 0.0.0.0:8080)")
    if not 1 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: port {port} is not in 1-65535")
    return host.strip("[]") or "0.0.0.0", int(port)


def optional_listen_address(text: str) -> tuple[str, int] | None:
    """:func:`listen_address`, or None for '' (off)."""
    return listen_address(text) if text else None


def redis_url(text: str) -> str:
    """A ``redis://``, ``rediss://`` or ``unix://`` URL, or a usage error (never echoing a
    password)."""
    scheme, sep, rest = text.partition("://")
    host = rest.rsplit("@", 1)[-1].split("/", 1)[0]
    if not sep or scheme not in ("redis", "rediss", "unix") or (scheme != "unix" and not host):
        shown = repr(text) if "@" not in text else f"{scheme}://... (password hidden)"
        raise argparse.ArgumentTypeError(
            f"{shown} is not a Redis URL (expected redis://[:PASSWORD@]HOST:PORT/DB, "
            "rediss:// for TLS, or unix:///PATH)"
        )
    return text


def _number(text: str, kind: type[float] | type[int]) -> float:
    try:
        return kind(text)
    except ValueError:
        noun = "a whole number" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None


def positive_seconds(text: str) -> float:
    value = _number(text, float)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be more than 0 seconds")
    return value


def seconds_or_zero(text: str) -> float:
    value = _number(text, float)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be 0 or more seconds")
    return value


def _whole_number(text: str, minimum: int, requirement: str) -> int:
    value = int(_number(text, int))
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{text!r}: must be {requirement}")
    return value


def positive_int(text: str) -> int:
    return _whole_number(text, 1, "at least 1")


def int_or_zero(text: str) -> int:
    return _whole_number(text, 0, "0 or more")


def fraction(text: str) -> float:
    value = _number(text, float)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be between 0 and 1")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``kvpool gateway``."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", metavar="FILE", help="compiled admission config (JSON)")
    source.add_argument(
        "--configmap",
        metavar="NAMESPACE",
        help="read the operator's ConfigMap kvpool-admission in NAMESPACE (in a pod)",
    )
    source.add_argument(
        "-f",
        "--filename",
        dest="manifests",
        action="append",
        metavar="PATH",
        help="compile these manifests (files or directories, repeatable) as the operator "
        "would, at start and whenever one changes: no operator, no cluster",
    )
    manifests = parser.add_argument_group("with -f (see kvpool compile)")
    add_engine_and_key_flags(manifests)
    manifests.add_argument("--namespace", default=None, help="the namespace to serve")
    manifests.add_argument(
        "--kv-tokens-per-replica",
        type=positive_int,
        default=None,
        metavar="N",
        help="plan every pool with this KV capacity per replica instead of its declared one",
    )
    parser.add_argument("--kube-server", help="Kubernetes API URL (default: in-cluster)")
    parser.add_argument("--kube-token", help="bearer token for --kube-server")
    parser.add_argument(
        "--redis",
        metavar="URL",
        default=os.environ.get(REDIS_URL_ENV) or None,
        type=redis_url,
        help=f"shared budgets in Redis (default: ${REDIS_URL_ENV}, which keeps a password out "
        "of the process arguments; unset: budgets in memory)",
    )
    parser.add_argument(
        "--listen",
        default="0.0.0.0:8080",
        type=listen_address,
        metavar="ADDR",
        help="HOST:PORT (default 0.0.0.0:8080)",
    )
    parser.add_argument(
        "--metrics-listen",
        default="0.0.0.0:8081",
        type=optional_listen_address,
        metavar="ADDR",
        help="HOST:PORT serving /metrics, apart from the API (default 0.0.0.0:8081; '' = off)",
    )
    parser.add_argument(
        "--metrics-on-api-port",
        action="store_true",
        help="also serve /metrics on the API port (it names tenants and their usage)",
    )
    parser.add_argument(
        "--header-timeout",
        type=positive_seconds,
        default=10.0,
        help="close a connection whose request head is not complete within this many "
        "seconds of connecting or of the previous answer; also the idle keep-alive "
        "(default 10)",
    )
    parser.add_argument(
        "--body-timeout",
        type=positive_seconds,
        default=30.0,
        help="seconds to receive a whole request body, else 408 (default 30)",
    )
    parser.add_argument(
        "--redis-timeout",
        type=positive_seconds,
        default=DEFAULT_TIMEOUT,
        help=f"seconds per Redis call, incl. waiting for a pooled connection "
        f"(default {DEFAULT_TIMEOUT:g}; a healthy Redis meets it under a 200-request burst)",
    )
    parser.add_argument(
        "--redis-failure-threshold",
        type=positive_int,
        default=3,
        help="consecutive failed Redis calls that open the circuit breaker (default 3)",
    )
    parser.add_argument(
        "--fail-closed-tier",
        action="append",
        default=[],
        metavar="TIER",
        help=(
            "while Redis is down, answer 503 for this tier unless its TierPolicy declares "
            "budgetUnavailable (repeatable; default: Allow with the local allowance)"
        ),
    )
    parser.add_argument(
        "--local-budget-fraction",
        type=fraction,
        default=0.1,
        help="fail-open allowance per process while Redis is down, share of each limit",
    )
    parser.add_argument(
        "--plan-share",
        type=int,
        default=None,
        metavar="PERCENT",
        help=(
            "a fixed share of each pool's plan for this replica, instead of capacity leases "
            "(an explicit override: with --redis the replicas lease capacity from each other "
            "by demand; without --redis the default is 100)"
        ),
    )
    parser.add_argument(
        "--replica-id",
        default=None,
        metavar="ID",
        help="this replica's id among the gateway replicas (default: $POD_NAME or the host "
        "and pid, with a random suffix)",
    )
    parser.add_argument(
        "--lease-period",
        type=positive_seconds,
        default=0.1,
        help="seconds between capacity lease renewals (default 0.1; a waiting request or "
        "another replica's nudge renews sooner)",
    )
    parser.add_argument(
        "--lease-ttl",
        type=positive_seconds,
        default=3.0,
        help="seconds after its last renewal a replica's capacity goes back to the others "
        "(default 3; it stops admitting on its lease half a second before)",
    )
    parser.add_argument("--max-body-bytes", type=positive_int, default=8 * 1024 * 1024)
    parser.add_argument(
        "--upstream-first-token-timeout",
        type=positive_seconds,
        default=20.0,
        help="seconds a stream may wait for its first token (default 20)",
    )
    parser.add_argument(
        "--upstream-idle-timeout",
        type=positive_seconds,
        default=30.0,
        help="longest pause between two chunks of a stream, and longest a write to a "
        "streaming client may take (a client that stops reading is cut), seconds (default 30)",
    )
    parser.add_argument(
        "--upstream-timeout",
        type=positive_seconds,
        default=600.0,
        help="seconds for a whole NON-streaming answer (default 600; a hung engine is "
        "caught earlier by its health probes)",
    )
    parser.add_argument(
        "--health-probe-interval",
        type=seconds_or_zero,
        default=0.5,
        help="seconds between /health probes of every replica; 0 disables (default 0.5)",
    )
    parser.add_argument(
        "--health-probe-timeout",
        type=positive_seconds,
        default=1.0,
        help="a replica whose /health does not answer within this twice in a row is ejected "
        "(default 1)",
    )
    parser.add_argument(
        "--no-engine-priority",
        action="store_true",
        help="do not set the engine 'priority' (engines not in priority scheduling mode)",
    )
    parser.add_argument(
        "--reload-interval", type=positive_seconds, default=1.0, help="seconds between polls"
    )
    parser.add_argument("--shutdown-timeout", type=seconds_or_zero, default=30.0)
    parser.add_argument("--no-access-log", action="store_true")
    parser.add_argument(
        "--no-learn-reservations",
        action="store_true",
        help="reserve every request's full output bound instead of its tier's learned p95",
    )
    parser.add_argument(
        "--engine-poll-seconds",
        type=seconds_or_zero,
        default=0.25,
        help="seconds between polls of each engine's /metrics by all gateway replicas "
        "together: with N live replicas (or --plan-share 100/N) each polls every N times "
        "this (0: never poll)",
    )
    parser.add_argument(
        "--borrow-pause-usage",
        type=fraction,
        default=0.97,
        help="measured engine KV usage (0-1) at which lending to lower tiers pauses",
    )
    parser.add_argument(
        "--handover-tokens",
        type=int_or_zero,
        default=0,
        help="a single-sequence stream with at most this many tokens left before its output "
        "bound hands its reservation to the next request, which reaches the engine about "
        "when it ends (0: at the stream's end; default 0)",
    )
    parser.add_argument(
        "--no-budget-overlap",
        action="store_true",
        help="every request waits for its budget verdict before it goes to its engine "
        "(default: a tenant well within its budget has its request sent while the charge "
        "is on its way, and its answer held until the verdict)",
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        type=str.upper,
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
    )
