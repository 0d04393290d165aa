"""``kvpool gateway``: run the admission gateway from a config file or the operator's ConfigMap.

Examples::

    kvpool gateway --config admission.json --listen 127.0.0.1:8080
    kvpool gateway --config admission.json --redis redis://127.0.0.1:6379/0
    kvpool gateway --configmap kvpool-system --redis redis://redis:6379/0   # in a pod
    kvpool gateway -f manifests/ --endpoints llama-8b=http://10.0.0.7:8000  # no operator

Flags are checked as they are parsed (a wrong value is one ``error:`` line and exit 2);
``--fail-closed-tier`` is checked against the first config; an address the gateway cannot
listen on is one line naming it and exit 1.

The config is re-read when it changes (file identity, or the ConfigMap's resourceVersion)
and applied without dropping in-flight requests; a config that does not parse is logged,
counted and ignored. SIGTERM/SIGINT stop accepting, let in-flight requests finish (up to
``--shutdown-timeout``) and exit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Coroutine
from typing import Any

from aiohttp import web

from kvpool.adapters.budget import (
    BudgetStore,
    FailoverBudgetStore,
    FailoverPolicy,
    InMemoryBudgetStore,
    RedisBudgetStore,
)
from kvpool.adapters.budget.redis import DEFAULT_TIMEOUT
from kvpool.adapters.config_source import (
    ConfigError,
    ConfigMapSource,
    FileConfigSource,
    KubeAccess,
)
from kvpool.adapters.lease.store import RedisLeaseStore
from kvpool.adapters.offline_compile import (
    ManifestConfigSource,
    OfflineCompileError,
    parse_endpoint_flags,
    parse_key_file_flags,
)
from kvpool.api.admission_config import AdmissionConfig
from kvpool.domain.lease import LeaseClock
from kvpool.gateway.capacity import CapacityShare, StaticShare
from kvpool.gateway.http import GatewayRunner
from kvpool.gateway.leases import LeaseKeeper
from kvpool.gateway.metrics import GatewayMetrics
from kvpool.gateway.server import Gateway
from kvpool.gateway.settings import GatewaySettings

log = logging.getLogger("kvpool.gateway")
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


def positive_int(text: str) -> int:
    value = int(_number(text, int))
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 1")
    return value


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
    manifests.add_argument(
        "--endpoints",
        action="append",
        default=[],
        metavar="POOL=URL[,URL]",
        help="the engines of a ModelPool (repeatable; default: its kvpool.dev/static-endpoints)",
    )
    manifests.add_argument(
        "--key-file",
        dest="key_files",
        action="append",
        default=[],
        metavar="SECRET/KEY=PATH",
        help="a tenant key's file, for a Secret that is not in the manifests (repeatable)",
    )
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
        help="longest pause between two chunks of a stream, seconds (default 30)",
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
        "--log-level",
        default="INFO",
        type=str.upper,
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
    )


def build_store(args: argparse.Namespace, metrics: GatewayMetrics) -> BudgetStore:
    """The budget store the options ask for."""
    if not args.redis:
        return InMemoryBudgetStore()
    members = getattr(args, "live_replicas", None)
    policy = FailoverPolicy(
        fail_closed_tiers=frozenset(args.fail_closed_tier),
        local_fraction=args.local_budget_fraction,
        failure_threshold=args.redis_failure_threshold,
    )
    return FailoverBudgetStore(
        RedisBudgetStore(args.redis, timeout=args.redis_timeout),
        policy,
        on_error=lambda op, exc: metrics.redis_errors.labels(op).inc(),
        on_fallback=lambda tier, result: metrics.budget_fallback.labels(tier, result).inc(),
        replicas=members,
    )


def build_capacity(
    args: argparse.Namespace, metrics: GatewayMetrics, namespace: str
) -> CapacityShare:
    """Capacity leases with the other replicas when Redis is set (unless --plan-share
    fixes a share), else the whole plan (or the given share)."""
    if not args.redis or args.plan_share is not None:
        return StaticShare(args.plan_share if args.plan_share is not None else 100)
    ttl = args.lease_ttl
    clock = LeaseClock(
        period=args.lease_period,
        lease_ttl=max(ttl - 0.5, ttl * 0.8),
        member_ttl=ttl,
        redis_timeout=args.redis_timeout,
    )
    store = RedisLeaseStore(args.redis, namespace, timeout=args.redis_timeout)
    keeper = LeaseKeeper(store, metrics, member=args.replica_id, clock=clock)
    args.live_replicas = lambda: keeper.members
    log.info("capacity leases in redis as replica %s", keeper.member)
    return keeper


ConfigSource = FileConfigSource | ConfigMapSource | ManifestConfigSource


async def _open_source(args: argparse.Namespace) -> tuple[ConfigSource, AdmissionConfig]:
    """The config source the flags name, and its first config (raises ConfigError)."""
    source: ConfigSource
    if args.manifests:
        source = ManifestConfigSource(
            args.manifests,
            args.endpoint_map,
            args.key_file_map,
            namespace=args.namespace,
            kv_tokens_per_replica=args.kv_tokens_per_replica,
            interval=args.reload_interval,
        )
        config: AdmissionConfig = source.load()
    elif args.config:
        source = FileConfigSource(args.config, interval=args.reload_interval)
        config = source.load()
    else:
        access = (
            KubeAccess(server=args.kube_server, token=args.kube_token)
            if args.kube_server
            else KubeAccess.in_cluster()
        )
        source = ConfigMapSource(args.configmap, access, interval=max(args.reload_interval, 2.0))
        config = await source.load()
    return source, config


async def serve(args: argparse.Namespace) -> int:
    """Run until SIGTERM/SIGINT."""
    source, config = await _open_source(args)
    unknown_tier = _unknown_fail_closed_tier(args.fail_closed_tier, config)
    if unknown_tier is not None:
        print(f"kvpool gateway: error: {unknown_tier}", file=sys.stderr)
        return 2
    metrics = GatewayMetrics()
    settings = GatewaySettings(
        max_body_bytes=args.max_body_bytes,
        upstream_timeout=args.upstream_timeout,
        upstream_first_token_timeout=args.upstream_first_token_timeout,
        upstream_idle_timeout=args.upstream_idle_timeout,
        health_probe_interval=args.health_probe_interval,
        health_probe_timeout=args.health_probe_timeout,
        set_engine_priority=not args.no_engine_priority,
        access_log=not args.no_access_log,
        plan_share_percent=args.plan_share or 100,
        body_timeout=args.body_timeout,
        metrics_on_api_port=args.metrics_on_api_port,
        learn_reservations=not args.no_learn_reservations,
        engine_poll_seconds=args.engine_poll_seconds,
        borrow_pause_usage=args.borrow_pause_usage,
    )
    capacity = build_capacity(args, metrics, config.namespace)
    gateway = Gateway(
        config,
        build_store(args, metrics),
        settings=settings,
        metrics=metrics,
        capacity=capacity,
    )
    runner = GatewayRunner(
        gateway.app(),
        handler_cancellation=True,
        access_log=None,
        shutdown_timeout=args.shutdown_timeout,
        keepalive_timeout=args.header_timeout,
    )
    await runner.setup()
    host, port = args.listen
    metrics_runner: web.AppRunner | None = None
    try:
        await _bind(web.TCPSite(runner, host, port, backlog=1024), "--listen", host, port)
        if args.metrics_listen:
            metrics_runner = web.AppRunner(gateway.metrics_app(), access_log=None)
            await metrics_runner.setup()
            metrics_host, metrics_port = args.metrics_listen
            site = web.TCPSite(metrics_runner, metrics_host, metrics_port)
            await _bind(site, "--metrics-listen", metrics_host, metrics_port)
            log.info("metrics on %s:%d", metrics_host, metrics_port)
    except BindError as error:
        print(f"kvpool gateway: {error}", file=sys.stderr)
        await runner.cleanup()
        if metrics_runner is not None:
            await metrics_runner.cleanup()
        return 1
    log.info(
        "kvpool gateway on %s:%d: %d pools, %d tenants, budgets in %s",
        host,
        port,
        len(config.pools),
        len(config.tenants),
        "redis" if args.redis else "memory",
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watcher = asyncio.create_task(source.watch(gateway.apply_config, gateway.config_rejected))
    try:
        await stop.wait()
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        await runner.cleanup()
        if metrics_runner is not None:
            await metrics_runner.cleanup()
    return 0


class BindError(Exception):
    """An address the gateway cannot listen on (in use, not local, not permitted)."""


async def _bind(site: web.TCPSite, flag: str, host: str, port: int) -> None:
    try:
        await site.start()
    except OSError as error:
        reason = os.strerror(error.errno) if error.errno else str(error)
        raise BindError(f"cannot listen on {host}:{port} ({flag}): {reason}") from None


def _unknown_fail_closed_tier(tiers: list[str], config: AdmissionConfig) -> str | None:
    """Why a ``--fail-closed-tier`` names no tier of the config, or None."""
    known = sorted({t.name for p in config.tier_policies for t in p.tiers})
    for tier in tiers:
        if tier not in known:
            return (
                f"--fail-closed-tier {tier!r} is not a tier of the config "
                f"(tiers: {', '.join(known) or 'none'})"
            )
    return None


def _manifest_flags(args: argparse.Namespace) -> str | None:
    """Parse the -f companions into ``args`` (``endpoint_map``, ``key_file_map``); the
    usage error when one is wrong or given without -f."""
    given = [
        flag
        for flag, value in (
            ("--endpoints", args.endpoints),
            ("--key-file", args.key_files),
            ("--namespace", args.namespace),
            ("--kv-tokens-per-replica", args.kv_tokens_per_replica),
        )
        if value
    ]
    if given and not args.manifests:
        return f"{given[0]} goes with -f MANIFESTS (a --config or --configmap is compiled already)"
    try:
        args.endpoint_map = parse_endpoint_flags(args.endpoints)
        args.key_file_map = parse_key_file_flags(args.key_files)
    except OfflineCompileError as error:
        return str(error)
    return None


def _run_loop(main: Coroutine[Any, Any, int]) -> int:
    """Run on uvloop when it is installed (about half the per-chunk relay cost), else asyncio."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def run(args: argparse.Namespace) -> int:
    """Entry point of ``kvpool gateway``."""
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(message)s" if args.log_level.upper() != "DEBUG" else "%(name)s %(message)s",
        stream=sys.stderr,
    )
    if args.plan_share is not None and not 1 <= args.plan_share <= 100:
        print("kvpool gateway: --plan-share must be 1-100 (percent)", file=sys.stderr)
        return 2
    problem = _manifest_flags(args)
    if problem is not None:
        print(f"kvpool gateway: error: {problem}", file=sys.stderr)
        return 2
    try:
        return _run_loop(serve(args))
    except ConfigError as exc:
        print(f"kvpool gateway: {exc}", file=sys.stderr)
        return 1
